"""A text request's Result rendered for its door: each source's hypotheses as text, their scores
and token scores, and xform's additions a door may show: each hypothesis' confidence
(confidence.py, with `qe`) and the terms it does not hold (a terminology's: what the length cap
or the target vocabulary left no room for), with the beam a greedy decode was promoted to. One
rendering for translate_batch and the line streams, so a confidence or an unmet term means the
same at every door."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from xform.runtime.decoding.request import Request, Result
from xform.runtime.text.confidence import confidence
from xform.runtime.text.text_request import TextRequest, phrases, required

if TYPE_CHECKING:
    from xform.runtime.text.text_policy import TextPolicy


@dataclass(frozen=True)
class Rendered:
    """One source's translations, best first, and what was asked with them."""
    hypotheses: list[str]
    scores: list[float] = field(default_factory=list)
    token_scores: list[list[float]] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    unmet: list[list[str]] = field(default_factory=list)
    promoted_beams: int | None = None


def render(policy: "TextPolicy", asked: TextRequest, request: Request, result: Result) -> list[Rendered]:
    """Each source's Rendered, in order (`asked`: the text request `request` was converted from)."""
    n = len(result) // request.batch
    options, sources = asked.options, request.sources()
    texts = policy.decode_rows(result.ids, n, sources, asked.texts,
                               result.attention if options.replace_unknowns else None)
    scores = [] if result.scores is None or not options.scores else [float(s) for s in result.scores]
    tokens = [] if result.token_scores is None or options.scores != "tokens" else [
        [float(v) for v, i in zip(tk, r) if i != policy.pad_id] for tk, r in zip(result.token_scores, result.ids)]
    sure = confidences(policy, request, result) if options.qe else []
    missed = unmet(policy, asked, result)
    return [Rendered(texts[k * n:(k + 1) * n], scores[k * n:(k + 1) * n], tokens[k * n:(k + 1) * n],
                     sure[k * n:(k + 1) * n], missed[k * n:(k + 1) * n], result.promoted_beams)
            for k in range(request.batch)]


def generated(policy: "TextPolicy", request: Request, result: Result, row: int, source: int) -> tuple[int, int]:
    """[start, end) of the tokens a hypothesis generated: after its prefix and a forced first token,
    up to and including its end token (or its last token where it has none)."""
    ids = result.ids[row]
    start = len(request.target_prefix[source]) if request.target_prefix is not None else 0
    if request.generation.forced_bos_token_id is not None and start == 0:
        start = 1
    ends = np.flatnonzero(ids[start:] == policy.eos_id)
    if len(ends):
        return start, start + int(ends[0]) + 1
    kept = np.flatnonzero(ids != policy.pad_id)
    return start, int(kept[-1]) + 1 if len(kept) else start


def confidences(policy: "TextPolicy", request: Request, result: Result) -> list[float]:
    """Each hypothesis' confidence (confidence.confidence): its generated tokens' log-probs, its
    source's length and, with two hypotheses or more a source, the agreement of the best two."""
    assert result.token_scores is not None  # a qe request asks for them (text_request.convert)
    n = len(result) // request.batch
    out = []
    for b in range(request.batch):
        spans = [generated(policy, request, result, r, b) for r in range(b * n, (b + 1) * n)]
        hyps = [[int(i) for i in result.ids[r, s:e]] for r, (s, e) in zip(range(b * n, (b + 1) * n), spans)]
        for k, (s, e) in enumerate(spans):
            r = b * n + k
            log_probs = [float(v) for v in result.token_scores[r, s:e]] or [0.0]
            others = [hyps[k], *(h for j, h in enumerate(hyps) if j != k)] if n > 1 else None
            out.append(confidence(log_probs, others, int(request.src_lengths[b]), max(e - s, 1)))
    return out


def unmet(policy: "TextPolicy", asked: TextRequest, result: Result) -> list[list[str]]:
    """Each hypothesis' required strings (text_request.required) whose target ids it does not hold
    contiguously: what the search could not fit within the length cap. Nothing without a
    terminology."""
    if asked.options.terminology is None:
        return []
    n = len(result) // len(asked.sources)
    wanted = [list(zip(required(s, asked.options), phrases(policy, s, asked.options))) for s in asked.sources]
    return [[text for text, ids in wanted[r // n] if ids is None or not holds([int(i) for i in result.ids[r]], ids)]
            for r in range(len(result))]


def holds(row: list[int], phrase: list[int]) -> bool:
    """Whether `phrase` appears contiguously in `row`."""
    k = len(phrase)
    return any(row[i:i + k] == phrase for i in range(len(row) - k + 1))
