"""The fused beam step (contract.py `decoder_beam`, exporter/beam_graph.py): beam search through one
graph that ends in the candidates equals transformers' `generate` and the decoder + candidates
path, token for token; only (rows, 2k) candidates come back to the host; the graph's weights are
the decoder's bytes; a bundle without it still searches beams; its export verification fails a
graph that ranks wrongly.

Every test checks which graphs ran (`runs`), so none passes by falling back to the other path."""
import json
import shutil

import numpy as np
import pytest
import torch

import xform
import xform.runtime.backends.ort_backend as ob
from tests.marian_fixtures import sources
from tests.runtime.test_beam_search import MAX_NEW, SCORE_ATOL, hf_beams
from xform.contract import DECODER, DECODER_BEAM, ENCODER
from xform.errors import ToleranceError
from xform.manifest import MANIFEST, hash_files
from xform.runtime.scheduling.scheduler import Scheduler

pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e '.[dev]')")


def runs(session) -> dict[str, int]:
    """Count the runs of each graph's session from now on (sessions opened later too)."""
    backend, counts = session.backend, {}

    def counted(graph, s):
        if getattr(s, "_counted", False):
            return s
        run = s.run_with_iobinding

        def wrapped(binding, *a, **k):
            counts[graph] = counts.get(graph, 0) + 1
            return run(binding, *a, **k)
        s.run_with_iobinding, s._counted = wrapped, True
        return s

    for graph, s in backend.sessions.items():
        counted(graph, s)
    opened = backend.graph_session
    backend.graph_session = lambda graph: counted(graph, opened(graph))
    return counts


def both_paths(bundle, src, **kw):
    """generate() through the fused graph and through decoder + candidates: (ids, scores, runs) each."""
    out = []
    for fused in (True, False):
        session = xform.load(bundle, backend="ort")
        session.backend.fused_beams = fused
        counts = runs(session)
        ids, scores = session.generate(src, max_new_tokens=kw.pop("max_new_tokens", MAX_NEW), return_scores=True,
                                       **kw)
        out.append((ids, scores, counts))
    (fused_ids, fused_scores, fused_runs), (plain_ids, plain_scores, plain_runs) = out
    assert fused_runs.get(DECODER_BEAM, 0) > 0 and DECODER not in fused_runs and "candidates" not in fused_runs
    assert plain_runs.get(DECODER, 0) > 0 and plain_runs.get("candidates", 0) == plain_runs[DECODER]
    assert DECODER_BEAM not in plain_runs
    np.testing.assert_array_equal(fused_ids, plain_ids)
    np.testing.assert_allclose(fused_scores, plain_scores, rtol=0, atol=1e-5)
    return fused_ids, fused_scores


CASES = [  # (num_beams, length_penalty, early_stopping, num_return_sequences)
    (2, 1.0, False, 2),
    (4, 0.6, True, 1),
    (4, 1.0, "never", 4),
    (5, 2.0, False, 3),
    (5, -0.5, True, 5),
    (2, 0.0, "never", 1),
]


@pytest.mark.parametrize("name", ["swish-scaled", "relu-separate-vocab"])
@pytest.mark.parametrize("beams,penalty,early,n_ret", CASES)
def test_fused_beams_equal_transformers_and_the_two_graph_path(marians, name, beams, penalty, early, n_ret):
    _, model, bundle = marians[name]
    src, mask = sources(model.config, [7, 3, 9, 5], seed=beams + 1)
    kw = dict(num_beams=beams, length_penalty=penalty, early_stopping=early, num_return_sequences=n_ret)
    want, want_scores = hf_beams(model, src, mask, **kw)
    got, scores = both_paths(bundle, src.numpy(), **kw)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(scores, want_scores, rtol=0, atol=SCORE_ATOL)


def test_padded_rows_that_finish_at_different_steps_leave_and_equal_transformers(marians):
    """Six padded sources, early stopping: sources leave the batch at different steps (the fused
    graph runs on fewer rows after each), and every hypothesis is transformers'."""
    _, model, bundle = marians["swish-scaled"]
    src, mask = sources(model.config, [7, 3, 9, 5, 2, 8], seed=3)
    kw = dict(num_beams=4, length_penalty=1.0, early_stopping=True, num_return_sequences=1)
    want, want_scores = hf_beams(model, src, mask, **kw)
    session = xform.load(bundle, backend="ort")
    rows, step = [], session.backend.beam_step
    session.backend.beam_step = lambda k: (rows.append(session.backend.rows), step(k))[1]
    got, scores = session.generate(src.numpy(), max_new_tokens=MAX_NEW, return_scores=True, **kw)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(scores, want_scores, rtol=0, atol=SCORE_ATOL)
    assert len(set(rows)) >= 3 and rows == sorted(rows, reverse=True), rows  # fell at least twice


def test_forced_first_token_and_prefixes_on_the_fused_path(marians):
    """A forced first token (a target language, transformers' forced_bos_token_id) and target
    prefixes of different lengths are forced on the host over the fused graph's candidates."""
    _, model, bundle = marians["swish-scaled"]
    src, mask = sources(model.config, [7, 3, 9, 5], seed=2)
    kw = dict(num_beams=4, length_penalty=1.0, early_stopping=False, num_return_sequences=2)
    want, want_scores = hf_beams(model, src, mask, forced_bos_token_id=11, **kw)
    got, scores = both_paths(bundle, src.numpy(), forced_bos_token_id=11, **kw)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(scores, want_scores, rtol=0, atol=SCORE_ATOL)
    prefix = [[5, 9], [], [12, 7, 30], [4]]
    got, _ = both_paths(bundle, src.numpy(), target_prefix=prefix, **kw)
    for i, p in enumerate(prefix):  # a batch of prefixes equals each source searched alone with its own
        dec_in = torch.tensor([[model.config.decoder_start_token_id, *p]])
        n = len(p) + MAX_NEW
        with torch.no_grad():
            out = model.generate(src[i:i + 1], attention_mask=mask[i:i + 1], decoder_input_ids=dec_in,
                                 max_new_tokens=MAX_NEW, do_sample=False, **kw).numpy()[:, 1:]
        mine = got[2 * i:2 * i + 2]
        width = min(out.shape[1], mine.shape[1], n)
        np.testing.assert_array_equal(mine[:, :width], out[:, :width])


def test_beam_requests_joining_a_running_batch_on_the_fused_path(marians):
    """Requests joining a running beam batch at other steps (rows at their own positions in one
    fused step) each equal their search alone."""
    from tests.runtime.test_scheduler import drive
    _, model, bundle = marians["relu-separate-vocab"]
    s = xform.load(bundle, backend="ort")
    counts = runs(s)
    src, _ = sources(model.config, [7, 3, 9, 5], seed=6)
    src = src.numpy()
    rows = [src[r:r + 1, :int((src[r] != s.pad_id).sum())] for r in range(len(src))]
    settings = dict(max_new_tokens=MAX_NEW, num_beams=4, early_stopping=False, return_scores=True)
    futures = drive(Scheduler(s, max_rows=64), {0: [(rows[0], settings)], 2: [(rows[1], settings)],
                                                 3: [(rows[2], settings)], 6: [(rows[3], settings)]})
    assert counts.get(DECODER_BEAM, 0) > 0 and DECODER not in counts
    for r, f in zip(rows, futures):
        ids, scores = f.result()
        want, want_scores = s.generate(r, **settings)
        np.testing.assert_array_equal(ids, want)
        np.testing.assert_allclose(scores, want_scores, rtol=0, atol=1e-5)


def bound_outputs(monkeypatch) -> list[tuple[str, tuple, str]]:
    """Every output the backend binds from now on: (name, shape, dtype), host and device."""
    seen: list[tuple[str, tuple, str]] = []
    original = ob.bind_host

    def spy(binding, kind, name, array):
        if kind == "output":
            seen.append((name, tuple(array.shape), array.dtype.name))
        return original(binding, kind, name, array)
    import xform.runtime.backends.ort_beams as beams
    for module in (ob, beams):  # the backend's modules that bind outputs (the step; the beam operations)
        monkeypatch.setattr(module, "bind_host", spy)
    return seen


def test_no_rows_by_vocabulary_buffer_comes_back_from_a_beam_step(marians, monkeypatch):
    """From the outputs the backend binds: the fused path returns (rows, 2k) candidates and the new
    K/V, never a (rows, vocab) float buffer; the same spy sees the logits on the two-graph path
    (so it would see them on the fused one)."""
    _, model, bundle = marians["swish-scaled"]
    vocab = model.config.decoder_vocab_size or model.config.vocab_size
    src, _ = sources(model.config, [7, 3, 9, 5], seed=1)
    for fused in (True, False):
        seen = bound_outputs(monkeypatch)
        session = xform.load(bundle, backend="ort")
        session.backend.fused_beams = fused
        session.generate(src.numpy(), max_new_tokens=MAX_NEW, num_beams=4)
        wide = [o for o in seen if o[1][-1:] == (vocab,) and o[2].startswith("float")]
        cands = [o for o in seen if o[0] == "cand_logprobs"]
        assert cands and all(o[1][1] == 8 for o in cands)  # 2 x 4 beams
        if fused:
            assert not wide, wide
            # src_mask: the encoder's output, (sources, src_len), once a batch
            assert {o[0] for o in seen} <= {"src_mask", "cand_logprobs", "cand_ids",
                                            *[f"new_{kv}_{i}" for i in range(8) for kv in ("key", "value")]}
        else:
            assert wide and {o[0] for o in wide} == {"logits"}


def test_the_fused_graph_stores_and_maps_no_weights_of_its_own(marians):
    """Its initializers are the decoder's bytes in decoder.onnx.data (no data file of its own), and
    a beam search opens neither the plain decoder nor the candidates session (each would prepack
    or hold a copy of its own)."""
    import onnx

    from xform.exporter.export import shared_weights
    _, model, bundle = marians["swish-scaled"]
    assert not (bundle / "decoder_beam.onnx.data").exists()
    proto = onnx.load(str(bundle / "decoder_beam.onnx"), load_external_data=False)
    external = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert external and all({e.key: e.value for e in t.external_data}["location"] == "decoder.onnx.data"
                            for t in external)
    # with a threshold the tiny model's tensors reach, every one of them is mapped once for both
    pairs = {w.graphs.get(DECODER_BEAM) for w in shared_weights(bundle, min_bytes=1024)}
    big = {t.name for t in external if int({e.key: e.value for e in t.external_data}["length"]) >= 1024}
    assert big and big <= pairs
    from xform.runtime.bundle import Bundle
    from xform.runtime.session import Session
    backend = ob.OrtBackend(Bundle.open(bundle))
    session = Session(backend, backend.bundle.config)
    src, _ = sources(model.config, [7, 3], seed=1)
    session.generate(src.numpy(), max_new_tokens=4, num_beams=4)
    # whatever the bundle's defaults opened at load, only the graph the decode ran stays open
    assert set(backend.sessions) == {ENCODER, "reorder", DECODER_BEAM}


@pytest.mark.parametrize("first_beams", [1, 4])
def test_the_session_opened_at_load_is_released_when_the_first_decode_runs_another(marians, first_beams):
    """A bundle's defaults pick the decoder-step session opened at load; a first decode of the other
    strategy releases it (one decoder-step session's prepacked weights held, not two), and a later
    decode of the first kind opens it again with the same tokens."""
    _, model, bundle = marians["swish-scaled"]
    src, _ = sources(model.config, [7, 3], seed=2)
    want = {k: xform.load(bundle, backend="ort").generate(src.numpy(), max_new_tokens=6, num_beams=k)
            for k in (1, 4)}
    session = xform.load(bundle, backend="ort")
    backend = session.backend
    other = 4 if first_beams == 1 else 1
    backend.guess = DECODER_BEAM if first_beams == 1 else DECODER  # as the other default would open
    backend.graph_session(backend.guess)
    np.testing.assert_array_equal(session.generate(src.numpy(), max_new_tokens=6, num_beams=first_beams),
                                  want[first_beams])
    ran = DECODER if first_beams == 1 else DECODER_BEAM
    assert ran in backend.sessions and ({DECODER, DECODER_BEAM} - {ran}).isdisjoint(backend.sessions)
    np.testing.assert_array_equal(session.generate(src.numpy(), max_new_tokens=6, num_beams=other), want[other])
    assert {DECODER, DECODER_BEAM} <= set(backend.sessions)  # both asked for: both held


def without_fused_graph(bundle, out):
    """A copy of `bundle` as a bundle exported before the fused graph: no decoder_beam."""
    shutil.copytree(bundle, out)
    m = json.loads((out / MANIFEST).read_text())
    del m["graphs"][DECODER_BEAM]
    m["shared_weights"] = [w for w in m["shared_weights"] if set(w["graphs"]) != {DECODER, DECODER_BEAM}]
    for w in m["shared_weights"]:
        w["graphs"].pop(DECODER_BEAM, None)
    (out / "decoder_beam.onnx").unlink()
    m["files"] = hash_files(out, set())
    (out / MANIFEST).write_text(json.dumps(m))
    return out


def test_a_bundle_without_the_fused_graph_searches_beams_as_before(marians, tmp_path):
    _, model, bundle = marians["swish-scaled"]
    old = without_fused_graph(bundle, tmp_path / "old")
    src, mask = sources(model.config, [7, 3, 9, 5], seed=4)
    kw = dict(num_beams=4, length_penalty=1.0, early_stopping=False, num_return_sequences=2)
    want, want_scores = hf_beams(model, src, mask, **kw)
    session = xform.load(old, backend="ort")
    counts = runs(session)
    assert not session.backend.fused_beams
    got, scores = session.generate(src.numpy(), max_new_tokens=MAX_NEW, return_scores=True, **kw)
    assert counts.get("candidates", 0) > 0 and DECODER_BEAM not in counts
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(scores, want_scores, rtol=0, atol=SCORE_ATOL)


# -- export verification ------------------------------------------------------------------------------
def verify_fused(model, tmp_path):
    """Trace the fused graph of `model` alone and run export's verification of it."""
    import onnxruntime as ort

    from xform.contract import signature_for
    from xform.exporter.graphs import EncoderGraph, export_graph
    from xform.exporter.verify import VERIFY_BATCH, VERIFY_SRC_LEN, sample_sources, verify_beam_step
    from xform.runtime.compare import tolerance_for
    specs = signature_for(model.cfg.to_dict())
    tmp_path.mkdir()
    path = tmp_path / "decoder_beam.onnx"
    export_graph(model, DECODER_BEAM, specs[DECODER_BEAM], path, 17)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    src, lengths = sample_sources(model.cfg, VERIFY_BATCH, VERIFY_SRC_LEN)
    enc_in = (torch.from_numpy(src), torch.from_numpy(lengths))
    with torch.no_grad():
        enc = EncoderGraph(model)(*enc_in)
    return verify_beam_step(model, session, specs[DECODER_BEAM], tolerance_for("fp32"), enc_in, list(enc[:-1]),
                            enc[-1], None)


def no_early_eos(model, logits, k, min_new, positions):
    from xform.exporter.steps import rank_candidates
    return rank_candidates(model, logits, k, torch.zeros_like(min_new), positions)


def raw_logits(model, logits, k, min_new, positions):
    from unittest import mock

    from xform.exporter.steps import rank_candidates
    with mock.patch.object(torch, "log_softmax", lambda x, dim: x):  # while tracing only
        return rank_candidates(model, logits, k, min_new, positions)


def test_export_verification_passes_the_fused_graph_and_fails_mutations(monkeypatch, tmp_path):
    """The unmutated graph passes; end-of-sentence no longer suppressed before min_new_tokens, or
    the log-softmax left out (the raw logits ranked), fail export's verification of the fused graph."""
    import xform.exporter.beam_graph as bg
    from tests.conftest import make_model
    model = make_model("seed-002")
    assert verify_fused(model, tmp_path / "ok") >= 0
    for mutation, message in ((no_early_eos, "decoder_beam"), (raw_logits, "decoder_beam")):
        monkeypatch.setattr(bg, "rank_candidates", lambda *a, m=mutation: m(*a))
        with pytest.raises(ToleranceError, match=message):
            verify_fused(model, tmp_path / mutation.__name__)
        monkeypatch.undo()


def test_export_records_and_verifies_the_fused_graph(marians):
    _, _, bundle = marians["swish-scaled"]
    m = xform.load(bundle, backend="ort").backend.bundle.manifest
    assert m.graphs[DECODER_BEAM].file == "decoder_beam.onnx" and ENCODER in m.graphs
    assert "decoder_beam_max_abs_err" in m.verification
    assert m.graphs[DECODER_BEAM].signature.output_names[:2] == ["cand_logprobs", "cand_ids"]
    assert "logits" not in m.graphs[DECODER_BEAM].signature.output_names


def test_log_probs_are_judged_at_twice_the_logits_tolerance_at_the_logits_scale():
    """A log-prob is a logit less the log-sum-exp, each off by at most the logits' error: fp32
    log-probs of a wide model (MADLAD's 2,048 widths, 256,000 ids moved them by 1.8e-4) pass within
    twice the logits' tolerance at the logits' scale, and fail past it; other outputs keep theirs."""
    from xform.exporter.verify import compare_outputs
    from xform.runtime.compare import TOLERANCES
    tol = TOLERANCES["fp32"]
    ref = np.array([[-2.0, -9.0], [-1.0, -14.0]], np.float32)
    logit_scale = np.array([[40.0], [10.0]])
    allowed = 2 * (tol.atol + tol.rtol * logit_scale)  # (2, 1): 1.8e-4, 2.2e-4
    for factor, passes in ((0.9, True), (1.2, False)):
        got = ref + (factor * allowed).astype(np.float32)
        run = lambda lp: compare_outputs("decoder_beam", ["cand_logprobs"], [got], [torch.from_numpy(ref)],
                                         tol, "test", lp)
        if passes:
            assert run({"cand_logprobs": logit_scale}) > 1e-4
        else:
            with pytest.raises(ToleranceError, match="cand_logprobs .*atol 0.0002 "):
                run({"cand_logprobs": logit_scale})
        with pytest.raises(ToleranceError, match="atol 0.0001 "):  # not named log-probs: the logits' own
            run(None)
