"""The per-sentence confidence (issue 56): the documented formula, its bounds and its direction in
each input; Spearman's rank correlation against hand-computed values (ties included) and scipy
where it is installed; sentence chrF through sacreBLEU."""
import math
import random

import pytest

from xform.errors import InputError
from xform.runtime.text.confidence import (
    WEIGHTS,
    Features,
    confidence,
    features,
    ranks,
    score,
    sentence_chrf,
    spearman,
    token_agreement,
    typical_log_ratio,
)

FLUENT = [-0.2, -0.1, -0.4, -0.3, -0.05, -1.5, -0.2]


def test_the_formula_as_documented():
    lp = [-0.5, -0.1, -2.0, -0.3, -0.01]
    mean, weakest = sum(lp) / 5, (-2.0 - 0.5 - 0.3) / 3
    length = abs(math.log((5 + 1) / (4 + 1)) - 0.1)
    agree = 2 * 2 / (3 + 3)  # [a b c] and [a b d]
    z = 2.5 + 2.0 * mean + 0.3 * weakest - 1.5 * length + 3.0 * (agree - 0.7)
    got = confidence(lp, alternatives=[["a", "b", "c"], ["a", "b", "d"]], source_length=4, typical_log_ratio=0.1)
    assert got == pytest.approx(1 / (1 + math.exp(-z)), abs=1e-12)
    # terms left out when their inputs are not there
    assert confidence(lp) == pytest.approx(1 / (1 + math.exp(-(2.5 + 2.0 * mean + 0.3 * weakest))), abs=1e-12)
    assert features([-1.0, -3.0]).weakest == -2.0  # fewer tokens than K: all of them


def test_documented_anchor_points():
    assert score(Features(-0.3, -1.5, 0.0, 0.7)) == pytest.approx(0.81, abs=0.01)
    assert score(Features(-1.0, -3.0, 0.0, 0.7)) == pytest.approx(0.40, abs=0.01)
    assert score(Features(-2.0, -6.0, 0.0, 0.7)) < 0.05


def test_bounds_and_extremes():
    rng = random.Random(0)
    for _ in range(500):
        n = rng.randint(1, 40)
        lp = [-rng.expovariate(rng.choice([0.1, 1, 10])) for _ in range(n)]
        c = confidence(lp, source_length=rng.randint(0, 60), agreement=rng.random())
        assert 0.0 <= c <= 1.0
    assert confidence([float("-inf")] * 3, source_length=0, target_length=10 ** 9, agreement=0.0) >= 0.0
    assert confidence([0.0], source_length=0, agreement=1.0) <= 1.0
    assert confidence([1e-9]) == confidence([0.0])  # a log-probability rounded above 0 counts as 0
    for bad in ([], [float("nan")]):
        with pytest.raises(InputError):
            confidence(bad)
    with pytest.raises(InputError):
        confidence(FLUENT, agreement=1.5)


def test_monotonic_in_every_token_log_prob():
    rng = random.Random(1)
    for _ in range(300):
        lp = [-rng.expovariate(1.0) for _ in range(rng.randint(1, 12))]
        i = rng.randrange(len(lp))
        better = list(lp)
        better[i] = lp[i] * rng.random()  # closer to 0
        assert confidence(better, source_length=8) >= confidence(lp, source_length=8)


def test_direction_of_each_feature():
    base = Features(-0.8, -2.5, 0.3, 0.6)
    for name, up in (("mean", True), ("weakest", True), ("length", False), ("agreement", True)):
        lo, hi = (dict(base.__dict__) for _ in range(2))
        hi[name] = lo[name] + 0.2
        assert (score(Features(**hi)) > score(Features(**lo))) == up, name
    # the length term: further from the typical ratio, lower
    near = confidence(FLUENT, source_length=7)
    assert confidence(FLUENT, source_length=20) < near > confidence(FLUENT, source_length=2)
    assert confidence(FLUENT, source_length=14, typical_log_ratio=typical_log_ratio([(14, 7)])) > \
        confidence(FLUENT, source_length=14)


def test_agreement_of_the_top_hypotheses():
    assert token_agreement([1, 2, 2, 3], [2, 2, 3, 4]) == pytest.approx(2 * 3 / 8)
    assert token_agreement([], []) == 1.0 and token_agreement([1], []) == 0.0
    same = confidence(FLUENT, alternatives=[[5, 6, 7], [5, 6, 7]])
    differ = confidence(FLUENT, alternatives=[[5, 6, 7], [8, 9]])
    assert differ < confidence(FLUENT) < same
    assert confidence(FLUENT, alternatives=[[5, 6, 7]]) == confidence(FLUENT)  # one hypothesis: no term


def test_noise_scores_below_fluent():
    noise = [-3.1, -5.2, -2.4, -6.8, -4.0, -2.2, -7.5, -3.3]
    assert confidence(noise, source_length=8) < 0.05 < 0.7 < confidence(FLUENT, source_length=7)


def test_weights_are_the_documented_constants():
    assert (WEIGHTS.bias, WEIGHTS.mean, WEIGHTS.weakest, WEIGHTS.length, WEIGHTS.agree, WEIGHTS.agree_neutral,
            WEIGHTS.k, WEIGHTS.floor) == (2.5, 2.0, 0.3, 1.5, 3.0, 0.7, 3, -20.0)
    import xform.runtime.text.confidence as module
    for said in ("BIAS = 2.5", "W_MEAN = 2.0", "W_WEAKEST = 0.3", "W_LENGTH = 1.5", "W_AGREE = 3.0",
                 "AGREE_NEUTRAL = 0.7", "K = 3", "FLOOR = -20.0"):
        assert said in module.__doc__


# -- Spearman ---------------------------------------------------------------------------------
def test_ranks_average_ties():
    assert ranks([10, 20, 20, 5, 20]) == [2.0, 4.0, 4.0, 1.0, 4.0]


def test_spearman_hand_computed():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # no ties: 1 - 6 * sum(d^2) / (n (n^2 - 1)); d = (0, -1, 1, 0, 0) -> 1 - 12 / 120
    assert spearman([1, 2, 3, 4, 5], [1, 3, 2, 4, 5]) == pytest.approx(0.9)
    # ties: ranks x (1, 2.5, 2.5, 4), y (1, 3, 2, 4): 4.5 / sqrt(4.5 * 5)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    for xs, ys in (([1, 2], [1]), ([1], [1])):
        with pytest.raises(InputError):
            spearman(xs, ys)


def test_spearman_equals_scipy():
    stats = pytest.importorskip("scipy.stats", reason="scipy is not a dependency; its answer is compared where present")
    rng = random.Random(2)
    for _ in range(20):
        n = rng.randint(3, 50)
        xs = [rng.choice([0.1, 0.2, 0.3, rng.random()]) for _ in range(n)]
        ys = [rng.randint(0, 5) for _ in range(n)]
        want = stats.spearmanr(xs, ys).statistic
        got = spearman(xs, ys)
        assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, abs=1e-12)


def test_sentence_chrf():
    pytest.importorskip("sacrebleu", reason="sacreBLEU is in the eval extra")
    import sacrebleu
    assert sentence_chrf("the cat sat on the mat", "the cat sat on the mat") == pytest.approx(100.0)
    h, r = "the cat sat on a mat", "the cat sat on the mat"
    assert sentence_chrf(h, r) == pytest.approx(sacrebleu.sentence_chrf(h, [r]).score)
    assert sentence_chrf("xyz", r) < sentence_chrf(h, r)
