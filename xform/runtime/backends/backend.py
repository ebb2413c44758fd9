"""The one small interface every backend speaks, in numpy.

A backend runs the graphs of the contract (encoder, decoder, and the small reorder and candidates
graphs) for one batch at a time and keeps the state
between steps (the encoder's cross K/V and source mask, one copy a source, and the
self-attention cache, one row a decoded row: runtime/backends/cache.py) itself:

    backend.start(src_ids, src_lengths, group)   # encoder on the Bs sources; Bs x group rows, the
        # rows of source i being rows i*group .. i*group+group-1 (its beams or samples); an empty cache
    next_ids, logits = backend.step(input_ids, min_new_tokens, want_logits, beam_idx)
        # input_ids (R,) int64 at position `steps so far`; next_ids (R,) int64 greedy choices
        # (pad never, end-of-sentence not before min_new_tokens); logits (R, V) float32 or None;
        # beam_idx (R',) int64 or None: row b continues the cache of row beam_idx[b] (None: itself).
        # R' < R drops rows, whole sources at a time (their `group` rows leave together), and with
        # them the sources' cross K/V and mask. Gathered where the cache lives.
    backend.gather(rows)   # row i continues row rows[i] now (before a join: the pending reorder)
    backend.join(src_ids, src_lengths, group)   # capabilities.join: new sources' rows enter a
        # running batch at position 0, the others going on at theirs
    backend.attention()    # capabilities.attention (a bundle exported --with-attention): the last
        # step's attention output (rows, src_len)
    backend.restrict(ids)  # capabilities.restriction (ONNX Runtime, --with-vocab-map): decode the
        # next batches over target ids `ids` only; None: the whole vocabulary again
    step(..., candidates=K)  # capabilities.candidates: beam candidates ranked by the backend
    backend.capabilities   # which of the optional abilities above it has, and its row limit

The decoding loop over it is written once, in loop.py, for every strategy (decoding.py).
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from xform.contract import Capabilities
from xform.errors import JoinRefused

__all__ = ["INITIAL_CAPACITY", "source_capacity", "Backend", "Capabilities", "JoinRefused", "Restricting"]

# The self-attention cache of the graph backends is a fixed-capacity buffer updated in place
# (contract.py): this many positions at the first step, doubled whenever a decode fills it.
INITIAL_CAPACITY = 32
GREEDY_CAPACITY = 16  # a host cache's first positions for rows that decode a source alone


def source_capacity(src_len: int, limit: int, group: int = 1) -> int:
    """A host cache's first capacity for a batch whose longest source has `src_len` tokens and
    `group` rows a source, at most `limit`. Beams and samples (group > 1): 8 positions more than
    the source, rounded up to 16. A translation is about as long as its source, so most batches
    never grow, and short ones hold no 32 positions they never reach (docs/design.md, "The cache's
    first capacity from the source": beam 4's peak -7%, speed the same). One row a source
    (greedy): GREEDY_CAPACITY. Greedy rows end at their own lengths and leave the batch, so a
    growth copies only the rows still running, while a start at the source's length holds it for
    every row of the batch from the first step (a file's greedy peak -30 to -40 MiB at 16 against
    the source rule, speed the same: docs/benchmarks.md, "Greedy's cache from 16 positions")."""
    if group == 1:
        return max(1, min(limit, GREEDY_CAPACITY))
    return max(1, min(limit, -(-(src_len + 8) // 16) * 16))


class Backend(Protocol):
    """The whole lifecycle the decoding loop (loop.py) uses; the optional parts are named by
    `capabilities` and called only where it says so."""

    name: str

    @property
    def capabilities(self) -> Capabilities: ...

    def start(self, src_ids: np.ndarray, src_lengths: np.ndarray, group: int = 1) -> None: ...

    def step(self, input_ids: np.ndarray, min_new_tokens: int | np.ndarray, want_logits: bool = False,
             beam_idx: np.ndarray | None = None, candidates: int = 0) -> tuple[np.ndarray, Any]: ...

    def gather(self, rows: np.ndarray) -> None: ...

    def join(self, src_ids: np.ndarray, src_lengths: np.ndarray, group: int = 1) -> Any: ...

    def attention(self) -> np.ndarray: ...


@runtime_checkable
class Restricting(Protocol):
    """A backend that can decode over a subset of the target vocabulary (capabilities.restriction)."""

    def restrict(self, ids: np.ndarray | None) -> None: ...
