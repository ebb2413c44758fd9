"""The one small interface every backend speaks, in numpy.

A backend runs the two graphs of the contract for one batch at a time and keeps the state
between steps (the encoder's cross K/V and source mask, the self-attention cache) itself:

    backend.start(src_ids, src_lengths)          # encoder; a new, empty cache
    next_ids, logits = backend.step(input_ids, min_new_tokens, want_logits, beam_idx)
        # input_ids (B,) int64 at position `steps so far`; next_ids (B,) int64 greedy choices
        # (pad never, end-of-sentence not before min_new_tokens); logits (B, V) float32 or None;
        # beam_idx (B,) int64 or None: row b continues the cache of row beam_idx[b] (None: itself).
        # The cache is reordered where it lives (in place on the host, by the reorder graph on a device).
    backend.max_rows   # optional: the most rows one batch may have (a TensorRT profile's batch)

The decoding loop over it is written once, in session.py, for every strategy (decoding.py).
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

# The self-attention cache of the graph backends is a fixed-capacity buffer updated in place
# (contract.py): this many positions at the first step, doubled whenever a decode fills it.
INITIAL_CAPACITY = 32


class Backend(Protocol):
    name: str

    def start(self, src_ids: np.ndarray, src_lengths: np.ndarray) -> None: ...

    def step(self, input_ids: np.ndarray, min_new_tokens: int, want_logits: bool = False,
             beam_idx: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]: ...
