"""CTranslate2's translate_batch `callback`: a function called with a `GenerationStepResult` for
each token of each example as the loop decodes it, whose True ends that example there.

As CTranslate2's (python/cpp/translator.cc, src/decoding.cc GreedySearch): greedy and sampled
decoding only (beam search decides its tokens at its end: beam_size > 1 is refused); a target
prefix's tokens are steps too (their log-prob 0); `step` counts from 0, `batch_id` is the
example's index in the call (whatever batches max_batch_size makes), `hypothesis_id` the sample
(num_hypotheses > 1), `token` the target vocabulary's piece, `log_prob` the token's log-prob with
return_scores (else None), `is_last` the example's last token (its end token, or its last step);
a True answer ends the example after that token, which its hypothesis keeps. An empty source is
not decoded: no call. What the callback raises, the call raises.

The hook is the greedy strategies' `stop` (decoding/strategies.py), set on a decode through
`Session.run(watch=...)`."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from xform.errors import InputError
from xform.runtime.decoding.loop import Decode
from xform.runtime.decoding.request import GenerationStepResult
from xform.runtime.decoding.strategies import Greedy

NOT_WITH_BEAMS = ("callback: the callback function is not compatible with beam_size > 1 (as in CTranslate2: "
                  "beam search decides its tokens at its end); pass beam_size=1 (greedy or sampling)")


def checked(callback: Any) -> Callable[[GenerationStepResult], Any] | None:
    """translate_batch's `callback`: None, or a callable (anything else refused by name)."""
    if callback is not None and not callable(callback):
        raise InputError(f"callback: a function of one GenerationStepResult (returning True to stop that example), "
                         f"got {type(callback).__name__}")
    return callback


class StepCallback:
    """A translate_batch call's callback over its decodes: `watch(indices)` hooks one decode whose
    sources are the call's examples `indices`."""

    def __init__(self, callback: Callable[[GenerationStepResult], Any], piece: Callable[[int], str], scored: bool):
        self.callback, self.piece, self.scored = callback, piece, scored

    def watch(self, indices: Sequence[int]) -> Callable[[Decode], None]:
        def hook(item: Decode) -> None:
            strategy = item.strategy
            if not isinstance(strategy, Greedy):
                raise InputError(NOT_WITH_BEAMS)
            strategy.stop = lambda s, step, rows, ended: self.stopped(s, step, rows, ended, indices)
        return hook

    def stopped(self, s: Greedy, step: int, rows: np.ndarray, ended: np.ndarray, indices: Sequence[int]) -> np.ndarray:
        """The callback told each running row's token of `step`; the rows it ends."""
        stop = np.zeros(len(rows), bool)
        tokens, last = s.out[rows, step], s.done[rows]
        for k in np.flatnonzero(~ended):
            row = int(rows[k])
            log_prob = float(s.token_scores[row, step]) if self.scored and s.token_scores is not None else None
            token = int(tokens[k])
            answer = self.callback(GenerationStepResult(step, token, self.piece(token), bool(last[k]), log_prob,
                                                        int(indices[row // s.group]), row % s.group))
            stop[k] = bool(answer) and not last[k]
        return stop
