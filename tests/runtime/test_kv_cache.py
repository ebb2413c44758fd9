"""The K/V cache of the ORT backend: a fixed-capacity buffer updated in place, grown by doubling,
reordered in place for beams; and a table both graphs hold, mapped once.

The capacity is forced small (1 or 3 positions at the first step) so that every decode below
grows it several times, through greedy, beam and sampled decoding; tokens must stay exactly
those of the uncached reference, transformers' beams, or the default capacity.
"""
import json

import numpy as np
import pytest
import torch

import xform
import xform.runtime.backends.ort_backend as ort_backend
from tests.conftest import make_model, padded_batch
from xform.models.checkpoint import save_checkpoint
from xform.models.transformer import greedy_decode


@pytest.mark.parametrize("initial", [1, 3])
def test_greedy_through_growth_equals_the_uncached_reference(tiny_bundle, initial):
    model = make_model("seed-002")
    src, lens = padded_batch(model.cfg, [13, 2, 9, 5], seed=7)
    n = model.cfg.max_len  # to the model's limit: the capacity is capped there
    session = xform.load(tiny_bundle, backend="ort", cache_capacity=initial)
    got = session.generate(src, max_new_tokens=n, min_new_tokens=n)
    ref = greedy_decode(model, torch.from_numpy(src), torch.from_numpy(lens), n, n).numpy()
    np.testing.assert_array_equal(got, ref)
    cache = session.backend.cache
    assert cache.capacity == model.cfg.max_len  # 1 or 3, doubled, then capped at max_len 40
    # logits through growth: within float noise of the eager model's
    _, logits = session.teacher_forced(src, lens, ref)
    torch_logits = xform.load(tiny_bundle, backend="torch").teacher_forced(src, lens, ref)[1]
    np.testing.assert_allclose(logits, torch_logits, rtol=0, atol=1e-4)


def test_the_cache_is_written_in_place_and_unwritten_positions_stay_zero(tiny_bundle):
    session = xform.load(tiny_bundle, backend="ort", cache_capacity=4)
    model = make_model("seed-002")
    src, lens = padded_batch(model.cfg, [6, 3], seed=2)
    backend = session.backend
    backend.start(src, lens)
    arrays = list(backend.cache.arrays)
    tok = np.full(2, session.start_id, np.int64)
    for step in range(3):
        tok, _ = backend.step(tok, 0)
        assert all(a is b for a, b in zip(backend.cache.arrays, arrays))  # no step allocates a cache
        assert all(np.abs(a[:, :, step]).sum() > 0 and not a[:, :, step + 1:].any() for a in arrays)
    tok, _ = backend.step(tok, 0)  # position 3 fills the capacity of 4
    tok, _ = backend.step(tok, 0)  # grows to 8, copying the 4 positions
    grown = backend.cache.arrays
    assert backend.cache.capacity == 8 and grown[0].shape[2] == 8
    for old, new in zip(arrays, grown):
        np.testing.assert_array_equal(new[:, :, :4], old[:, :, :4])
        assert new[:, :, 4].any() and not new[:, :, 5:].any()


def test_the_first_capacity_follows_each_batchs_longest_source(tiny_bundle):
    """By default a host cache of beams starts at the longest source + 8 positions, rounded up to
    16, capped at max_len, and one of greedy rows at 16 (backend.source_capacity); a device starts
    at INITIAL_CAPACITY; a given cache_capacity is kept. Tokens are the fixed capacity's whatever
    the start, through growth too."""
    from xform.runtime.backends.backend import GREEDY_CAPACITY, INITIAL_CAPACITY, source_capacity
    assert [source_capacity(n, 40, 4) for n in (1, 8, 9, 24, 25, 40)] == [16, 16, 32, 32, 40, 40]
    assert [source_capacity(n, 40) for n in (1, 9, 40)] == [GREEDY_CAPACITY] * 3 == [16] * 3
    assert source_capacity(30, 12) == 12
    model = make_model("seed-002")
    session, fixed = xform.load(tiny_bundle, backend="ort"), xform.load(tiny_bundle, backend="ort", cache_capacity=32)
    for lengths, capacity in (([3, 5], 16), ([13, 2, 9], 32), ([30, 4], 40)):
        src, lens = padded_batch(model.cfg, lengths, seed=3)
        got = session.generate(src, max_new_tokens=12, min_new_tokens=12, num_beams=2)
        assert session.backend.cache.capacity == capacity, lengths
        np.testing.assert_array_equal(got, fixed.generate(src, max_new_tokens=12, min_new_tokens=12, num_beams=2))
        assert fixed.backend.cache.capacity == 32
        got = session.generate(src, max_new_tokens=12, min_new_tokens=12)  # greedy: 16 whatever the source
        assert session.backend.cache.capacity == 16, lengths
        np.testing.assert_array_equal(got, fixed.generate(src, max_new_tokens=12, min_new_tokens=12))
        got = session.generate(src, max_new_tokens=20, min_new_tokens=20)  # past 16: grown to 32
        assert session.backend.cache.capacity == 32, lengths
        np.testing.assert_array_equal(got, fixed.generate(src, max_new_tokens=20, min_new_tokens=20))
    session.backend.ops = object()  # the device's branch: as on CUDA
    assert session.backend.start_capacity(3) == session.backend.start_capacity(3, 4) == INITIAL_CAPACITY


def test_beams_through_growth_equal_transformers(marians):
    from tests.marian_fixtures import sources
    from tests.runtime.test_beam_search import MAX_NEW, hf_beams

    capacity = 2  # reordered in place after every step, grown at steps 2, 4, 8
    for name, (_, model, bundle) in sorted(marians.items()):
        src, mask = sources(model.config, [7, 3, 9, 5], seed=4)
        kw = dict(num_beams=4, length_penalty=1.0, early_stopping=False, num_return_sequences=2)
        want, want_scores = hf_beams(model, src, mask, **kw)
        got, scores = xform.load(bundle, backend="ort", cache_capacity=capacity).generate(src.numpy(), max_new_tokens=MAX_NEW,
                                                                   return_scores=True, **kw)
        np.testing.assert_array_equal(got, want, err_msg=name)
        np.testing.assert_allclose(scores, want_scores, rtol=0, atol=1e-4, err_msg=name)


def test_sampling_through_growth_equals_the_default_capacity(tiny_bundle):
    model = make_model("seed-002")
    src, _ = padded_batch(model.cfg, [5, 8, 2], seed=5)
    kw = dict(max_new_tokens=20, do_sample=True, top_k=10, seed=3, num_return_sequences=2)
    want = xform.load(tiny_bundle, backend="ort").generate(src, **kw)
    np.testing.assert_array_equal(xform.load(tiny_bundle, backend="ort", cache_capacity=1).generate(src, **kw), want)


def test_a_table_both_graphs_hold_is_mapped_once(tmp_path):
    """Shared embeddings of at least 1 MiB: the manifest names where the decoder's copy lies, the
    backend maps it once for every session (and pages it out), and decoding is unchanged."""
    from xform.exporter.export import export_bundle

    model = make_model("marian", src_vocab_size=5600, tgt_vocab_size=5600)  # 5600 x 48 x 4 bytes > 1 MiB
    save_checkpoint(model, tmp_path / "ckpt")
    bundle = export_bundle(tmp_path / "ckpt", tmp_path / "b").path
    shared = json.loads((bundle / "manifest.json").read_text())["shared_weights"]
    assert len(shared) == 1
    w = shared[0]
    assert w["file"] == "decoder.onnx.data" and w["dtype"] == "float32" and w["shape"] == [5600, 48]
    assert set(w["graphs"]) == {"encoder", "decoder", "decoder_beam"}  # the fused beam step reads the decoder's data
    table = np.fromfile(bundle / w["file"], np.float32, 5600 * 48, offset=w["offset"]).reshape(5600, 48)
    np.testing.assert_array_equal(table, model.src_embed.weight.detach().numpy())
    session = xform.load(bundle, backend="ort")
    assert [s.array.shape for s in session.backend.shared] == [(5600, 48)]
    src, lens = padded_batch(model.cfg, [9, 4, 6], seed=1)
    ref = greedy_decode(model, torch.from_numpy(src), torch.from_numpy(lens), 12).numpy()
    np.testing.assert_array_equal(session.generate(src, max_new_tokens=12), ref)


def test_a_step_without_a_running_decode_says_so(demo_bundle):
    """Before any start(), and after a start that failed, a step or an attention() is refused with
    what is missing, not an AttributeError from the buffers a start makes."""
    from xform.errors import XformError
    from xform.runtime.bundle import Bundle
    backend = ort_backend.OrtBackend(Bundle.open(demo_bundle), "cpu")
    with pytest.raises(XformError, match=r"step\(\): no decode is running"):
        backend.step(np.array([2]), 0)
    with pytest.raises(XformError, match=r"--with-attention\), or no decode is running"):
        backend.attention()
    src = np.array([[5, 6, 2]], np.int64)
    backend.start(src, np.array([3]))
    backend.step(np.array([2]), 0)  # a decode runs
    with pytest.raises(Exception):  # ONNX Runtime's own error: the encoder's Gather is out of range
        backend.start(np.array([[10 ** 6, 2]], np.int64), np.array([2]))
    # the failed start left no decode behind (the last one's buffers are gone): refused by name
    with pytest.raises(XformError, match=r"step\(\): no decode is running"):
        backend.step(np.array([2]), 0)


def test_every_cpu_session_allocates_from_the_one_arena_and_decodes_the_same(tiny_bundle):
    """Every session the CPU backend opens (the encoder, the reorder graph, each decoder-step graph
    at its first use) takes its tensors from the process's one CPU arena, not an arena of its own
    (docs/design.md, "One CPU arena"); greedy and beam tokens stay the eager model's."""
    model = make_model("seed-002")
    src, lens = padded_batch(model.cfg, [13, 2, 9, 5], seed=3)
    session = xform.load(tiny_bundle, backend="ort")
    ref = greedy_decode(model, torch.from_numpy(src), torch.from_numpy(lens), 16).numpy()
    np.testing.assert_array_equal(session.generate(src, max_new_tokens=16), ref)
    beams = session.generate(src, max_new_tokens=16, num_beams=3)
    torch_beams = xform.load(tiny_bundle, backend="torch").generate(src, max_new_tokens=16, num_beams=3)
    np.testing.assert_array_equal(beams, torch_beams)
    opened = session.backend.sessions
    assert {"encoder", "reorder", "decoder"} <= set(opened), sorted(opened)
    for graph, s in opened.items():
        assert s.get_session_options().get_session_config_entry("session.use_env_allocators") == "1", graph
