"""Sampling: reproducible by seed, top_k=1 is greedy, and the empirical distribution of a first
token matches the softmax of the (suppressed, tempered, truncated) logits."""
import numpy as np
import pytest

import xform
from tests.conftest import make_model, padded_batch

N = 6000  # samples of the first token; the bound below is 4.5 standard errors per token, + 2e-3


@pytest.fixture(scope="module")
def session(tiny_bundle):
    return xform.load(tiny_bundle, backend="ort")


@pytest.fixture(scope="module")
def src():
    return padded_batch(make_model("seed-002").cfg, [7, 4, 6], seed=4)


def first_step_probs(session, src_row, temperature=1.0):
    session.backend.start(src_row[None], np.array([len(src_row)], np.int64))
    _, logits = session.backend.step(np.array([session.start_id]), 0, want_logits=True)
    z = logits[0].astype(np.float64) / temperature
    z[list(session.special.blocked)] = -np.inf
    p = np.exp(z - z.max())
    return p / p.sum()


def empirical(session, src_row, **kw):
    out = session.generate(src_row[None], max_new_tokens=1, do_sample=True, num_return_sequences=N, **kw)
    return np.bincount(out[:, 0], minlength=session.config.tgt_vocab_size) / N


def within_bound(freq, p):
    bound = 4.5 * np.sqrt(p * (1 - p) / N) + 2e-3
    return np.abs(freq - p) <= bound


@pytest.mark.parametrize("temperature", [1.0, 0.6, 2.5])
def test_first_token_distribution_matches_softmax(session, src, temperature):
    ids, _ = src
    p = first_step_probs(session, ids[1][:4], temperature)
    assert p.max() < 0.9, "a near-deterministic distribution would test nothing"
    freq = empirical(session, ids[1][:4], temperature=temperature, seed=11)
    assert within_bound(freq, p).all(), np.abs(freq - p).max()
    # and the test can fail: the untempered distribution is outside the bound at other temperatures
    if temperature != 1.0:
        assert not within_bound(freq, first_step_probs(session, ids[1][:4], 1.0)).all()


def test_top_k_and_top_p_truncate_then_renormalize(session, src):
    ids, _ = src
    row = ids[0]
    p = first_step_probs(session, row)
    order = np.argsort(-p, kind="stable")
    freq = empirical(session, row, top_k=3, seed=5)
    top3 = np.zeros_like(p)
    top3[order[:3]] = p[order[:3]] / p[order[:3]].sum()
    assert within_bound(freq, top3).all() and set(np.flatnonzero(freq)) <= set(order[:3])
    mass = np.cumsum(p[order])
    nucleus = order[: int(np.searchsorted(mass, 0.7)) + 1]  # the smallest set with mass >= 0.7
    freq = empirical(session, row, top_p=0.7, seed=6)
    q = np.zeros_like(p)
    q[nucleus] = p[nucleus] / p[nucleus].sum()
    assert set(np.flatnonzero(freq)) == set(nucleus.tolist()) and within_bound(freq, q).all()


def test_same_seed_same_tokens_other_seed_other_tokens(session, src):
    ids, lengths = src
    kw = dict(max_new_tokens=12, do_sample=True, temperature=1.5)
    a = session.generate(ids, lengths, seed=3, **kw)
    np.testing.assert_array_equal(a, session.generate(ids, lengths, seed=3, **kw))
    assert not np.array_equal(a, session.generate(ids, lengths, seed=4, **kw))


@pytest.mark.parametrize("backend", ["ort", "torch"])
def test_top_k_one_is_greedy(tiny_bundle, src, backend):
    ids, lengths = src
    s = xform.load(tiny_bundle, backend=backend)
    np.testing.assert_array_equal(s.generate(ids, lengths, max_new_tokens=12, do_sample=True, top_k=1, seed=9),
                                  s.generate(ids, lengths, max_new_tokens=12))


def test_sampling_never_generates_pad_or_early_eos(session, src):
    ids, lengths = src
    out = session.generate(ids, lengths, max_new_tokens=8, min_new_tokens=5, do_sample=True, temperature=3.0,
                           num_return_sequences=50, seed=1)
    assert out.shape[0] == 3 * 50
    assert (out[:, :5] != session.pad_id).all() and (out[:, :5] != session.eos_id).all()


@pytest.mark.parametrize("settings,fragment", [
    (dict(num_beams=2, num_return_sequences=3), "num_return_sequences 3 exceeds"),
    (dict(do_sample=True, top_p=0.0), "top_p must be in (0, 1]"),
    (dict(do_sample=True, top_p=1.5), "top_p must be in (0, 1]"),
    (dict(do_sample=True, temperature=0.0), "temperature must be > 0"),
    (dict(do_sample=True, num_beams=3), "beam sampling is not supported"),
    (dict(num_return_sequences=2), "greedy decoding has one answer"),
    (dict(early_stopping="sometimes", num_beams=2), "early_stopping must be"),
    (dict(num_beams=0), "num_beams must be an integer >= 1"),
])
def test_invalid_settings_are_refused_by_name(session, src, settings, fragment):
    from xform.errors import InputError
    with pytest.raises(InputError) as e:
        session.generate(src[0], src[1], max_new_tokens=4, **settings)
    assert fragment in str(e.value)
