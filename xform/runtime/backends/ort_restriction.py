"""The ort backend's vocabulary restriction (a bundle exported --with-vocab-map): the restricted
decoder's session, the output table's rows of the batch's subset, and the host rules over the
subset's logits (pad and banned ids never, end-of-sentence not before min_new_tokens) that the
decoder and candidates graphs apply in the graph. A mixin of OrtBackend (ort_backend.py): it
reads and writes the backend's state named below.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import numpy.typing as npt

from xform.contract import RESTRICTED
from xform.errors import InputError
from xform.runtime.backends.special import Special, log_softmax
from xform.runtime.bundle import Bundle


class Restriction:
    """restrict(ids) and what a restricted step needs (OrtBackend's)."""

    bundle: Bundle
    vocab: int
    has_restriction: bool
    restricted: Any | None
    table: dict[str, np.ndarray] | None
    subset: npt.NDArray[np.int64] | None
    sub_logits: np.ndarray
    logits: npt.NDArray[np.float32] | None
    next_ids: np.ndarray
    positions: np.ndarray
    min_new: np.ndarray
    open_session: Callable[[str], Any]

    def restricted_session(self) -> Any:
        """The restricted decoder's session, opened at first use (its weights mapped once with the
        decoder's: manifest shared_weights)."""
        if self.restricted is None:
            self.restricted = self.open_session(RESTRICTED)
        return self.restricted

    def restrict(self, ids: np.ndarray | None) -> None:
        """Decode the next batches over the target ids `ids` only (sorted, unique, int64): the
        restricted decoder's projection over those rows of the output table, the others' logits
        -inf; None: the whole vocabulary again. Call before start()."""
        if ids is None:
            self.subset = None
            return
        if not self.has_restriction:
            raise InputError("a vocabulary restriction needs the restricted decoder: export the bundle with it "
                             "(xform export MODEL -o BUNDLE --with-vocab-map)")
        if self.table is None:
            from safetensors.numpy import load_file
            table = self.bundle.manifest.output_table
            assert table is not None  # Manifest.from_json: the restricted decoder comes with its table
            self.table = load_file(str(self.bundle.file(table)))
            self.restricted_session()
        self.subset = np.ascontiguousarray(ids, np.int64)
        self.sub_weight = np.ascontiguousarray(self.table["weight"][self.subset])
        self.sub_bias = np.ascontiguousarray(self.table["bias"][self.subset])
        self.special = Special.from_config(self.bundle.config)
        self.blocked = self.special.never(self.subset)

    def restricted_outputs(self, subset: npt.NDArray[np.int64], want_logits: bool, candidates: int):
        """What the decoder and candidates graphs give, from the logits of `subset` on the host: the
        next ids (pad and banned ids never, end-of-sentence not before min_new_tokens), each row's
        best candidates (log-softmax over the subset, the same suppressions), or the logits over
        the whole vocabulary (-inf outside the subset)."""
        sub = self.sub_logits
        blocked = self.special.not_now(subset, self.blocked, self.positions < self.min_new)
        if candidates:
            lp = log_softmax(sub)
            lp[blocked] = -np.inf
            k = min(candidates, lp.shape[1])
            top = np.argpartition(-lp, k - 1, axis=1)[:, :k]
            vals = np.take_along_axis(lp, top, 1)
            order = np.argsort(-vals, axis=1, kind="stable")
            top, vals = np.take_along_axis(top, order, 1), np.take_along_axis(vals, order, 1)
            return subset[top[:, 0]], (vals.astype(np.float32), subset[top])
        self.next_ids[:] = subset[np.where(blocked, -np.inf, sub).argmax(1)]
        if not want_logits:
            return self.next_ids.copy(), None
        logits = self.logits
        assert logits is not None  # with a subset, on the host on every device (buffers())
        logits[:, subset] = sub  # -inf elsewhere since start()
        return self.next_ids.copy(), logits.copy()
