"""The logits processors of one decode (transformers' order) and the ids they need.

`Special` (backends/special.py) holds the model's pad, end-of-sentence, banned ids and vocabulary
size; `Processors`
applies repetition penalty, n-gram blocking, bad words, suppressed tokens and the forced and
early end-of-sentence rules to a step's scores, on the host. The strategies (decoding.py) call it.
"""
from __future__ import annotations

import numpy as np

from xform.runtime.backends.special import Special, log_softmax
from xform.runtime.decoding.generation import GenerationConfig

__all__ = ["NEG", "Processors", "Special", "log_softmax"]

NEG = np.float32(-1.0e9)  # transformers' "finished / impossible" offset, added in float32


class Processors:
    """transformers' logits processors for one decode, in its order (generation/utils.py
    `_get_logits_processor`, 4.57): repetition penalty, n-gram blocking, bad words (single ids, with
    the pad and the model's banned ids, and multi-token sequences by their last token),
    end-of-sentence before min_new_tokens, the forced first token, end-of-sentence forced at the last
    step, suppressed tokens. Last, a target prefix forces its tokens whatever the scores say (they
    are transformers' decoder input, never processed).

    Each row's `t` is its count of tokens generated after its prefix (negative inside the prefix)
    and its history the decoder input so far: the start id, its prefix, its generated tokens;
    transformers' `input_ids`, which the repetition controls read."""

    def __init__(self, gen: GenerationConfig, special: Special):
        self.gen, self.special = gen, special
        words = [w for w in gen.bad_words_ids if w != (special.eos,)]  # transformers drops [eos]
        self.blocked = sorted(set(special.blocked) | {w[0] for w in words if len(w) == 1})
        self.sequences = [w for w in words if len(w) > 1]
        self.suppress = sorted(set(gen.suppress_tokens))
        self.history_wanted = gen.repetition_penalty != 1.0 or gen.no_repeat_ngram_size > 0 or bool(self.sequences)
        # what the graphs cannot apply (they ban the pad and banned ids and early end-of-sentence)
        self.host = self.history_wanted or bool(self.suppress) or tuple(self.blocked) != special.blocked

    def __call__(self, scores: np.ndarray, t: np.ndarray, history: np.ndarray | None = None,
                 forced: np.ndarray | None = None) -> np.ndarray:
        """Process (rows, V) scores in place. `t` (rows,), `history` (rows, L) when history_wanted,
        `forced` (rows,) the prefix token a row must take, -1 for none."""
        gen = self.gen
        if history is None:
            if self.history_wanted:
                raise ValueError("the repetition controls (history_wanted) need the decoder input: pass `history`")
            history = np.empty((len(scores), 0), np.int64)  # read by none of the processors set
        if gen.repetition_penalty != 1.0:
            vals = np.take_along_axis(scores, history, 1)
            vals = np.where(vals < 0, vals * gen.repetition_penalty, vals / gen.repetition_penalty)
            np.put_along_axis(scores, history, vals.astype(scores.dtype, copy=False), 1)
        n = gen.no_repeat_ngram_size
        if n > 0 and history.shape[1] >= n:  # an n-gram seen before, and its first n - 1 again
            L = history.shape[1]
            grams = np.lib.stride_tricks.sliding_window_view(history, n, axis=1)  # (rows, L - n + 1, n)
            seen = (grams[:, :, :n - 1] == history[:, None, L - n + 1:]).all(2)
            rows, at = np.nonzero(seen)
            scores[rows, grams[rows, at, n - 1]] = -np.inf
        scores[:, self.blocked] = -np.inf
        for word in self.sequences:
            if len(word) <= history.shape[1]:
                hit = (history[:, history.shape[1] - len(word) + 1:] == word[:-1]).all(1)
                scores[hit, word[-1]] = -np.inf
        scores[t < gen.min_new_tokens, self.special.eos] = -np.inf
        if gen.forced_bos_token_id is not None:
            self.force(scores, t == 0, gen.forced_bos_token_id)
        if gen.forced_eos:
            self.force(scores, t == gen.max_new_tokens - 1, self.special.eos)
        if self.suppress:
            scores[:, self.suppress] = -np.inf
        if forced is not None and (forced >= 0).any():
            rows = np.flatnonzero(forced >= 0)
            scores[rows] = -np.inf
            scores[rows, forced[rows]] = 0.0
        return scores

    @staticmethod
    def force(scores: np.ndarray, rows: np.ndarray, token: int) -> None:
        if rows.any():
            scores[rows] = -np.inf
            scores[rows, token] = 0.0

    def forced_token(self, t: np.ndarray, prefix: np.ndarray) -> np.ndarray:
        """(rows,) the token each row must take this step (its prefix's, the forced first token, or
        the forced end-of-sentence), -1 where the scores decide: what graph-chosen rows obey.
        `prefix`: each row's prefix token at this step, -1 past its prefix (prefix_at)."""
        out = prefix
        if self.gen.forced_bos_token_id is not None:
            out = np.where(t == 0, self.gen.forced_bos_token_id, out)
        if self.gen.forced_eos:
            out = np.where(t == self.gen.max_new_tokens - 1, self.special.eos, out)
        return out
