"""The model's special ids and the host's log-softmax: what the decoder graphs apply, for a backend
that computes a step's choice on the host (the restricted decoder, ort_restriction.py) and for the
decoding strategies above the backends (decoding/processors.py re-exports both)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xform.config import TransformerConfig


@dataclass(frozen=True)
class Special:
    pad: int
    eos: int
    blocked: tuple[int, ...]  # never generated: the pad id and the model's banned ids
    vocab: int = 0  # the target vocabulary's size (beam search orders candidates by beam x vocab + id)

    @classmethod
    def from_config(cls, config: TransformerConfig) -> "Special":
        return cls(config.pad_id, config.eos_id, config.never_generated, config.tgt_vocab_size)

    # The rules the decoder graphs apply (graphs.py), for a backend computing a step's choice on the
    # host from the logits of a subset of the vocabulary (--vocab-map's restricted decoder).
    def never(self, ids: np.ndarray) -> np.ndarray:
        """Which of `ids` are never generated (`blocked`)."""
        return np.isin(ids, self.blocked)

    def not_now(self, ids: np.ndarray, never: np.ndarray, early: np.ndarray) -> np.ndarray:
        """(rows, len(ids)) bool: the ids a row may not choose this step: `never` (never(ids)) and,
        in the rows still `early` (before their min_new_tokens), end-of-sentence."""
        return never[None, :] | ((ids == self.eos)[None, :] & early[:, None])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float32, as torch computes it: (x - max) - log(sum(exp(x - max)))."""
    x = logits.astype(np.float32, copy=False)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True, dtype=np.float32))
