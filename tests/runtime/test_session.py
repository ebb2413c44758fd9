"""Session.generate on ORT: exact parity with the uncached oracle, and clear errors for bad input."""
import numpy as np
import pytest
import torch

import xform
from tests.conftest import make_model, padded_batch
from xform.errors import InputError, XformError
from xform.models.transformer import greedy_decode
from xform.runtime.text.translator import Translator


@pytest.fixture(scope="module")
def session(tiny_bundle):
    return xform.load(tiny_bundle, backend="ort")


@pytest.mark.parametrize("lengths", [[1], [6], [8, 8, 8], [13, 2, 9, 5, 1, 7, 11]])
@pytest.mark.parametrize("min_new", [0, 3])
def test_ort_tokens_equal_uncached_reference(session, lengths, min_new):
    model = make_model("seed-002")
    src, lens = padded_batch(model.cfg, lengths, seed=sum(lengths))
    got = session.generate(src, max_new_tokens=16, min_new_tokens=min_new)
    ref = greedy_decode(model, torch.from_numpy(src), torch.from_numpy(lens), 16, min_new).numpy()
    np.testing.assert_array_equal(got, ref)
    assert got.dtype == np.int64


def test_explicit_lengths_equal_derived(session):
    model = make_model("seed-002")
    src, lens = padded_batch(model.cfg, [9, 3, 6])
    np.testing.assert_array_equal(session.generate(src, lens, max_new_tokens=10),
                                  session.generate(src, max_new_tokens=10))


def test_rows_end_independently_and_pad_follows(session):
    model = make_model("seed-002")
    src, _ = padded_batch(model.cfg, [9, 3, 6, 4, 8], seed=7)
    out = session.generate(src, max_new_tokens=30)
    cfg = session.config
    assert not (out == cfg.pad_id).all()
    for row in out:
        ends = np.flatnonzero(row == cfg.eos_id)
        if len(ends):
            assert (row[ends[0] + 1:] == cfg.pad_id).all()
            assert (row[:ends[0]] != cfg.pad_id).all()
        else:
            assert (row != cfg.pad_id).all()


def test_forced_length(session):
    src, _ = padded_batch(make_model("seed-002").cfg, [5, 2])
    out = session.generate(src, max_new_tokens=12, min_new_tokens=12)
    assert out.shape == (2, 12) and (out != session.config.pad_id).all()


def test_torch_backend_equals_ort(tiny_bundle, session):
    ref = xform.load(tiny_bundle, backend="torch")
    src, _ = padded_batch(make_model("seed-002").cfg, [7, 3, 5])
    np.testing.assert_array_equal(ref.generate(src, max_new_tokens=10), session.generate(src, max_new_tokens=10))


@pytest.mark.parametrize("src, fragment", [
    (np.zeros((0, 4), np.int64), "empty batch"),
    (np.array([[5, 6, 99]], np.int64), r"src_ids\[0, 2\] = 99 is outside the source vocabulary \[0, 37\)"),
    (np.array([[5, -1]], np.int64), "outside the source vocabulary"),
    (np.full((1, 41), 5, np.int64), "src_len 41, longer than the model's max_len 40"),
    (np.array([[5, 6]], np.int32), "dtype int64, got int32"),
    ([[5, 6]], "numpy int64 array"),
    (np.array([5, 6], np.int64), "2-D"),
    (np.array([[5, 0, 6]], np.int64), "row 0 is not right-padded"),
    (np.array([[0, 0]], np.int64), "source row 0 is empty"),
])
def test_bad_sources(session, src, fragment):
    with pytest.raises(InputError, match=fragment):
        session.generate(src, max_new_tokens=4)


def test_bad_lengths_and_limits(session):
    src = np.array([[5, 6, 7]], np.int64)
    with pytest.raises(InputError, match="src_lengths"):
        session.generate(src, np.array([2], np.int32))
    with pytest.raises(InputError, match="exceeds src_len 3"):
        session.generate(src, np.array([4], np.int64))
    with pytest.raises(InputError, match="min_new_tokens"):
        session.generate(src, max_new_tokens=3, min_new_tokens=4)
    with pytest.raises(InputError, match="max_new_tokens 41 exceeds the model's max_len 40"):
        session.generate(src, max_new_tokens=41)


def test_translate_needs_a_tokenizer(session):
    with pytest.raises(XformError, match="no tokenizer"):
        Translator(session).translate(["12"])


def test_unknown_backend_and_device(tiny_bundle):
    with pytest.raises(XformError, match="unknown backend 'tvm'"):
        xform.load(tiny_bundle, backend="tvm")
    with pytest.raises(XformError, match="unknown device 'tpu'"):
        xform.load(tiny_bundle, device="tpu")


def test_fp32_tolerance_scales_with_a_steps_largest_logit():
    """A logit bias of -1e4 (a user banning a token) rounds every logit of its step by ~1e-3 in
    float32: within fp32's 1e-6 of the scale; an error of 2e-2 at that scale, or 2e-4 at scale
    10, still fails."""
    from xform.runtime.compare import compare_steps, tolerance_for
    tol = tolerance_for("fp32")
    rng = np.random.default_rng(0)
    ref = rng.normal(0, 3, (2, 3, 11)).astype(np.float32)
    ref[..., 5] = -1e4
    choice, active = ref.argmax(-1), np.ones((2, 3), bool)

    def passes(got):
        return compare_steps("ort", "fp32", got, ref, choice, choice, active, tol.atol, tol.rtol, 1.0).passed

    assert passes(ref + np.float32(9.8e-4))
    assert not passes(ref + np.float32(2e-2))
    small = ref.copy()
    small[..., 5] = 10.0
    assert not compare_steps("ort", "fp32", small + np.float32(2e-4), small, small.argmax(-1), small.argmax(-1),
                             active, tol.atol, tol.rtol, 1.0).passed


def test_compare_steps_over_row_chunks_merges_to_the_whole():
    """merge_steps of compare_steps on row chunks is compare_steps on all rows (the check holds one
    chunk's logits at a time), and logprob_drops is the log-softmax difference at eager's tokens."""
    from xform.runtime.compare import compare_steps, logprob_drops, merge_steps
    rng = np.random.default_rng(4)
    B, n, V = 11, 6, 23
    ref = rng.normal(0, 3, (B, n, V)).astype(np.float32)
    got = (ref + rng.normal(0, 0.01, ref.shape)).astype(np.float32)  # the same choices everywhere but:
    active = np.arange(n)[None, :] < np.array([6, 5, 4, 6, 6, 2, 6, 6, 3, 6, 6])[:, None]
    for row, step in ((1, 4), (7, 1), (9, 1), (10, 3)):  # the earliest step is 1, first in row 7 (chunk 1)
        got[row, step, ref[row, step].argmax()] -= 100
    got[8, 4, ref[8, 4].argmax()] -= 100  # row 8's step 4 is past its end: not compared
    whole = compare_steps("ort", "fp16", got, ref, got.argmax(-1), ref.argmax(-1), active, 0.0, 1e-2, 0.99)
    parts = [(a, compare_steps("ort", "fp16", got[a:a + 4], ref[a:a + 4], got[a:a + 4].argmax(-1),
                               ref[a:a + 4].argmax(-1), active[a:a + 4], 0.0, 1e-2, 0.99)) for a in range(0, B, 4)]
    assert whole.first_divergence == (7, 1) and whole.tokens_compared == int(active.sum())
    assert whole.token_agreement == pytest.approx(1 - 4 / int(active.sum()))
    assert merge_steps(parts).to_dict() == whole.to_dict()
    eos, pad = 0, 1
    tokens = rng.integers(2, V, (B, n))
    tokens[3, 2], tokens[5, 4:] = eos, pad
    drops = logprob_drops(tokens, got, ref, eos, pad)
    lsm = lambda x: x - x.max(-1, keepdims=True) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))  # noqa: E731
    want = [lsm(ref[r].astype(np.float64))[t, tokens[r, t]] - lsm(got[r].astype(np.float64))[t, tokens[r, t]]
            for r in range(B) for t in range(3 if r == 3 else 4 if r == 5 else n)]
    np.testing.assert_allclose(drops, want, rtol=1e-12, atol=1e-12)
