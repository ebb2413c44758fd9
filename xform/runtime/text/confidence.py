"""A confidence for every sentence, from what decoding already computes (DESIGN.md section 9,
issue 56), and what measures its worth: `spearman` (rank correlation, average ranks for ties) and
`sentence_chrf` (sacreBLEU's chrF of one sentence).

**The formula.** For a hypothesis with token log-probabilities lp_1..lp_n (natural log, the end
token's included; each clamped to [FLOOR, 0]):

    mean     = (lp_1 + ... + lp_n) / n
    weakest  = the mean of the K lowest lp_i (all of them when n < K)
    length   = |log((t + 1) / (s + 1)) - typical|      s, t: source and target lengths in tokens
    agree    = token overlap of the best and the second hypothesis:
               2 * |A ∩ B| / (|A| + |B|), A and B their tokens as multisets (1 when both are empty)

    z = BIAS + W_MEAN * mean + W_WEAKEST * weakest - W_LENGTH * length + W_AGREE * (agree - AGREE_NEUTRAL)
    confidence = 1 / (1 + exp(-z))

A term whose inputs are not given is left out (no source length: no length term; fewer than two
hypotheses and no agreement given: no agreement term). The constants (`WEIGHTS`):

    BIAS = 2.5, W_MEAN = 2.0, W_WEAKEST = 0.3, W_LENGTH = 1.5, W_AGREE = 3.0,
    AGREE_NEUTRAL = 0.7, K = 3, FLOOR = -20.0, typical log length ratio = 0.0

They are set by hand to put a fluent hypothesis (mean -0.3, weakest -1.5, lengths as usual,
agreement 0.7) near 0.81, a doubtful one (mean -1, weakest -3) near 0.4 and one decoded from noise
(mean -2, weakest -6) under 0.05; scripts/bench_terminology.py measures their worth (Spearman
against sentence chrF). The score is non-decreasing in every token's log-probability (both `mean`
and `weakest` are), in the agreement, and non-increasing in the length ratio's distance from the
typical one; it lies in [0, 1]. `typical` is the corpus's usual log ratio of target to source
length (`typical_log_ratio` of sentence pairs: their median); 0 says equal lengths. Lengths count
tokens the same way on both sides: by default the target length is n (the end token included), so
a source length should include its end token too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Iterable, Sequence

from xform.errors import InputError, XformError


@dataclass(frozen=True)
class Weights:
    """The formula's constants (module docstring)."""

    bias: float = 2.5
    mean: float = 2.0
    weakest: float = 0.3
    length: float = 1.5
    agree: float = 3.0
    agree_neutral: float = 0.7
    k: int = 3
    floor: float = -20.0


WEIGHTS = Weights()
TYPICAL_LOG_RATIO = 0.0


@dataclass(frozen=True)
class Features:
    """The formula's inputs for one hypothesis; None where not given."""

    mean: float
    weakest: float
    length: float | None = None
    agreement: float | None = None


def token_agreement(a: Sequence[Hashable], b: Sequence[Hashable]) -> float:
    """2 |A ∩ B| / (|A| + |B|) of two token lists as multisets, in [0, 1] (1 when both are empty)."""
    if not a and not b:
        return 1.0
    counts: dict = {}
    for t in a:
        counts[t] = counts.get(t, 0) + 1
    common = 0
    for t in b:
        if counts.get(t, 0) > 0:
            counts[t] -= 1
            common += 1
    return 2.0 * common / (len(a) + len(b))


def features(log_probs: Sequence[float], alternatives: Sequence[Sequence[Hashable]] | None = None,
             source_length: int | None = None, target_length: int | None = None,
             typical_log_ratio: float = TYPICAL_LOG_RATIO, agreement: float | None = None,
             weights: Weights = WEIGHTS) -> Features:
    """The inputs of the formula: `log_probs` the hypothesis' token log-probabilities (end token
    included); `alternatives` the top hypotheses' token lists, best first (agreement of the first
    two); or `agreement` itself in [0, 1]; `source_length` / `target_length` in tokens (target:
    len(log_probs) by default)."""
    values = [float(x) for x in log_probs]
    if not values:
        raise InputError("a confidence needs the hypothesis' token log-probabilities (at least its end token's)")
    if any(math.isnan(x) for x in values):
        raise InputError("a token log-probability is NaN")
    clamped = sorted(min(0.0, max(weights.floor, x)) for x in values)
    mean = sum(clamped) / len(clamped)
    low = clamped[:max(1, min(weights.k, len(clamped)))]
    weakest = sum(low) / len(low)
    length = None
    if source_length is not None:
        t = len(values) if target_length is None else target_length
        if source_length < 0 or t < 0:
            raise InputError(f"lengths must not be negative (source {source_length}, target {t})")
        length = abs(math.log((t + 1) / (source_length + 1)) - typical_log_ratio)
    if agreement is None and alternatives is not None and len(alternatives) >= 2:
        agreement = token_agreement(list(alternatives[0]), list(alternatives[1]))
    if agreement is not None and not 0.0 <= agreement <= 1.0:
        raise InputError(f"an agreement is in [0, 1], not {agreement}")
    return Features(mean, weakest, length, agreement)


def score(f: Features, weights: Weights = WEIGHTS) -> float:
    """The formula's logistic combination of the features, in [0, 1]."""
    z = weights.bias + weights.mean * f.mean + weights.weakest * f.weakest
    if f.length is not None:
        z -= weights.length * f.length
    if f.agreement is not None:
        z += weights.agree * (f.agreement - weights.agree_neutral)
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)  # z very negative: exp(-z) would overflow
    return e / (1.0 + e)


def confidence(log_probs: Sequence[float], alternatives: Sequence[Sequence[Hashable]] | None = None,
               source_length: int | None = None, target_length: int | None = None,
               typical_log_ratio: float = TYPICAL_LOG_RATIO, agreement: float | None = None,
               weights: Weights = WEIGHTS) -> float:
    """A hypothesis' confidence in [0, 1] (the module docstring's formula; arguments as `features`)."""
    return score(features(log_probs, alternatives, source_length, target_length, typical_log_ratio, agreement,
                          weights), weights)


def typical_log_ratio(lengths: Iterable[tuple[int, int]]) -> float:
    """The median of log((t + 1) / (s + 1)) over (source, target) lengths: a corpus's usual ratio."""
    ratios = sorted(math.log((t + 1) / (s + 1)) for s, t in lengths)
    if not ratios:
        return TYPICAL_LOG_RATIO
    mid = len(ratios) // 2
    return ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2


def ranks(xs: Sequence[float]) -> list[float]:
    """1-based ranks, ties given the average of the ranks they span."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the average ranks (as
    scipy.stats.spearmanr computes it); NaN when either side is constant."""
    xs, ys = [float(x) for x in xs], [float(y) for y in ys]
    if len(xs) != len(ys):
        raise InputError(f"a rank correlation needs as many scores as references ({len(xs)} and {len(ys)})")
    if len(xs) < 2:
        raise InputError(f"a rank correlation needs at least 2 pairs, not {len(xs)}")
    if any(math.isnan(v) for v in xs + ys):
        raise InputError("a rank correlation of NaN values")
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return math.nan
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))


_CHRF = None


def sentence_chrf(hypothesis: str, reference: str) -> float:
    """sacreBLEU's chrF (its defaults: character 6-grams, beta 2, on its 0-100 scale) of one
    sentence against one reference."""
    global _CHRF
    if _CHRF is None:
        try:
            from sacrebleu.metrics import CHRF
        except ImportError:
            raise XformError("sentence chrF is sacreBLEU's: pip install 'xform[eval]' (or pip install sacrebleu)"
                             ) from None
        _CHRF = CHRF()
    return float(_CHRF.sentence_score(hypothesis, [reference]).score)
