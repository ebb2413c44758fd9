"""The decoder step captured as a CUDA graph (xform/runtime/backends/cuda_graphs.py), on the CPU
through tests/runtime/cuda_double.py, whose captured session replays a graph id at the addresses
it was captured with, as ONNX Runtime does, and refuses host memory in a captured run. The parity
of the captured path with the host path (greedy with growth and compaction, beams 2 to 5, joins,
the restricted decoder, --check) runs in test_ort_device.py's "-captured" cases, on the double and,
where a GPU is lent, on the real provider."""
import numpy as np
import pytest

import xform
from tests.conftest import requires_gpu
from tests.runtime.cuda_double import emulate_cuda
from tests.runtime.test_ort_device import TEXTS, real_cuda
from xform.contract import DECODER, DECODER_BEAM, REORDER
from xform.errors import XformError
from xform.runtime.backends import cuda_graphs, ort_backend
from xform.runtime.backends.ort_backend import OrtBackend
from xform.runtime.text.translator import Translator


@pytest.fixture
def cuda_default(monkeypatch):
    """The double with the backend's own default (whatever a test module set before)."""
    monkeypatch.setattr(ort_backend, "CAPTURE", cuda_graphs.CAPTURE)
    return emulate_cuda(monkeypatch)


@pytest.fixture
def captured(monkeypatch):
    monkeypatch.setattr(ort_backend, "CAPTURE", True)
    return emulate_cuda(monkeypatch)


def decode(bundle, texts=TEXTS, **kw):
    """(host tokens, device tokens, the device session) of a greedy decode from a first capacity
    of 3, so that the cache grows 3 -> 6 -> 12 -> 24 and rows leave as they end."""
    host = xform.load(bundle, backend="ort", cache_capacity=3)
    dev = xform.load(bundle, backend="ort", device="cuda", cache_capacity=3)
    src = Translator(host).policy.encode_texts(texts)
    return host.generate(src, max_new_tokens=20, **kw), dev.generate(src, max_new_tokens=20, **kw), dev


def test_the_step_is_replayed_one_graph_a_layout(demo_bundle, captured):
    """A layout (a capacity, a row count after compaction, a buffer set) is one graph id, captured
    after its regular runs (ONNX Runtime's two, then the capture). The cache's buffers are kept
    between decodes, so from the second decode of a batch on the layouts recur: once each has run
    three times, a decode captures nothing new and every one of its steps is a replay."""
    want, got, dev = decode(demo_bundle)
    np.testing.assert_array_equal(got, want)
    graphs = dev.backend.graphs[DECODER]
    assert 2 <= len(graphs.ids) < got.shape[1], len(graphs.ids)
    src = Translator(dev).policy.encode_texts(TEXTS)
    for _ in range(3):  # from the second decode on the layouts recur; by the fourth each ran 3 times
        np.testing.assert_array_equal(dev.generate(src, max_new_tokens=20), want)
    session, layouts, replays = dev.backend.sessions[DECODER], len(graphs.ids), captured.replays
    regular = dict(session.counts)  # the runs of each id that were not replays
    np.testing.assert_array_equal(dev.generate(src, max_new_tokens=20), want)
    assert len(graphs.ids) == layouts and session.counts == regular, (layouts, regular, session.counts)
    assert captured.replays - replays >= got.shape[1] and session.capture and 2 <= len(session.captured) <= layouts
    assert [("CUDAExecutionProvider", {"use_tf32": "0", "enable_cuda_graph": "1"})] in captured.providers


def test_one_graph_id_for_every_layout_decodes_stale_memory(demo_bundle, captured, monkeypatch):
    """The mutation the layout key prevents: every binding run as graph id 1 replays the layout of
    its capture (the first capacity's buffers), and the tokens go wrong."""
    monkeypatch.setattr(cuda_graphs.CapturedGraphs, "options", lambda self, binding: self.run_options("1"))
    want, got, _ = decode(demo_bundle)
    assert got.shape != want.shape or (got != want).any()


def test_past_the_limit_layouts_run_uncaptured(demo_bundle, captured, monkeypatch):
    """A session keeps LIMIT graphs; further layouts run as before (gpu_graph_id -1), still right."""
    monkeypatch.setattr(cuda_graphs, "LIMIT", 1)
    monkeypatch.setattr(cuda_graphs.CapturedGraphs.__init__, "__defaults__", (1,))
    want, got, dev = decode(demo_bundle)
    src = Translator(dev).policy.encode_texts(TEXTS)
    for _ in range(3):
        np.testing.assert_array_equal(got, want)
        got = dev.generate(src, max_new_tokens=20)
    assert len(dev.backend.graphs[DECODER].ids) == 1
    assert list(dev.backend.sessions[DECODER].counts) == ["1"]  # every other layout ran as gpu_graph_id -1


@pytest.mark.parametrize("fused", [False, True])
def test_beams_replay_both_buffer_sets(marians, captured, fused):
    """Beam search reorders the cache into the other buffer set each step: through decoder +
    candidates the two sets are two layouts of the captured decoder, both replayed; the fused beam
    graph is not captured (ONNX Runtime refuses it). Hypotheses and scores equal the host path's."""
    from tests.marian_fixtures import sources
    _, model, bundle = marians["swish-scaled"]
    src, _ = sources(model.config, [7, 3, 9, 5], seed=4)
    host = xform.load(bundle, backend="ort", cache_capacity=32)
    dev = xform.load(bundle, backend="ort", device="cuda", cache_capacity=32)
    dev.backend.fused_beams = fused
    kw = dict(max_new_tokens=14, num_beams=4, min_new_tokens=14, return_scores=True)
    want, got = host.generate(src.numpy(), **kw), dev.generate(src.numpy(), **kw)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=0, atol=1e-5)
    if fused:
        assert DECODER not in dev.backend.graphs and not dev.backend.sessions[DECODER_BEAM].capture
    else:
        assert len(dev.backend.graphs[DECODER].ids) == 2 and captured.replays >= 14 - 2 * 3


def test_a_captured_run_refuses_host_memory(demo_bundle, captured, monkeypatch):
    """The double holds the backend to device memory: an output bound in host memory, as the
    uncaptured path binds them, fails a captured run."""
    from xform.runtime.backends.ort_files import bind_host
    monkeypatch.setattr(OrtBackend, "bind_output", lambda self, dec, name, array: bind_host(dec, "output", name,
                                                                                              array))
    with pytest.raises(AssertionError, match="device memory.*next_ids"):
        decode(demo_bundle)


def test_capture_is_cuda_only(demo_bundle):
    with pytest.raises(XformError, match="captures the decoder step on CUDA") as e:
        OrtBackend(xform.load(demo_bundle, backend="ort").backend.bundle, device="cpu", cuda_graph=True)
    assert e.value.settings == ("cuda_graph",)


def test_captured_by_default_on_cuda_and_off_when_asked(demo_bundle, cuda_default, tmp_path):
    """On CUDA the decoder session is opened with enable_cuda_graph and beams go through the
    captured decoder + candidates; cuda_graph=False (`xform run --no-cuda-graph`) opens every
    session without it and keeps the fused beam graph; other backends refuse cuda_graph=True."""
    from click.testing import CliRunner

    from xform.cli import main
    dev = xform.load(demo_bundle, backend="ort", device="cuda")
    assert dev.backend.capture and not dev.backend.fused_beams
    assert [("CUDAExecutionProvider", {"use_tf32": "0", "enable_cuda_graph": "1"})] in cuda_default.providers
    cuda_default.providers.clear()
    dev = xform.load(demo_bundle, backend="ort", device="cuda", cuda_graph=False)
    assert not dev.backend.capture and dev.backend.fused_beams == dev.backend.bundle.has_graph(DECODER_BEAM)
    assert all("enable_cuda_graph" not in p[0][1] for p in cuda_default.providers)
    cuda_default.providers.clear()
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--device", "cuda", "--no-cuda-graph", "--check",
                                  "--text", "01234567"])
    assert r.exit_code == 0 and "check passed" in r.output, r.output
    assert cuda_default.providers and all("enable_cuda_graph" not in p[0][1] for p in cuda_default.providers)
    with pytest.raises(XformError, match="ONNX Runtime's on CUDA"):
        xform.load(demo_bundle, backend="torch", cuda_graph=True)


@pytest.fixture(params=["double", pytest.param("gpu", marks=requires_gpu)])
def reorder_captured(request, monkeypatch):
    """The decoder step and the beam reorder captured (cuda_graphs.CAPTURE_REORDER), on the double or,
    where a GPU is lent, on the real provider (None)."""
    monkeypatch.setattr(ort_backend, "CAPTURE", True)
    monkeypatch.setattr(ort_backend, "CAPTURE_REORDER", True)
    if request.param == "gpu":
        real_cuda()
        return None
    return emulate_cuda(monkeypatch)


@pytest.mark.parametrize("beams", [2, 5])
def test_a_captured_reorder_equals_the_host_path(marians, reorder_captured, beams):
    """With the reorder graph captured too, each direction between the cache's two buffer sets (at a
    capacity, a row count) is one graph id, replayed with beam_idx written into its device buffer
    before the run: hypotheses and scores equal the host path's over beams 2 and 5, rows leaving as
    sources end (new row counts: new layouts) and a second decode replaying the first's layouts."""
    from tests.marian_fixtures import sources
    _, model, bundle = marians["swish-scaled"]
    src, _ = sources(model.config, [7, 3, 9, 5], seed=beams)
    host = xform.load(bundle, backend="ort", cache_capacity=32)
    dev = xform.load(bundle, backend="ort", device="cuda", cache_capacity=32)
    kw = dict(max_new_tokens=14, num_beams=beams, num_return_sequences=min(beams, 2), return_scores=True)
    want = host.generate(src.numpy(), **kw)
    for _ in range(2):
        got = dev.generate(src.numpy(), **kw)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_allclose(got[1], want[1], rtol=0, atol=1e-5)
    # more layouts than the two directions: rows left the batch as their sources ended (new row counts)
    assert dev.backend.capture_reorder and len(dev.backend.graphs[REORDER].ids) > 2
    if reorder_captured is not None:
        assert dev.backend.sessions[REORDER].capture and dev.backend.sessions[REORDER].captured


def test_one_graph_id_for_every_reorder_layout_decodes_stale_memory(marians, reorder_captured, monkeypatch):
    """The mutation: the reorder's layouts (directions, row counts) all run as one graph id, so a
    replay gathers from and into the buffers of its capture whatever the step's: the hypotheses go
    wrong."""
    if reorder_captured is None:
        pytest.skip("a mutation of the double's replay: shown on the double")
    from tests.marian_fixtures import sources
    real = cuda_graphs.CapturedGraphs.options
    monkeypatch.setattr(cuda_graphs.CapturedGraphs, "options",
                        lambda self, binding: self.run_options("1") if binding.layout[0][1] == "beam_idx"
                        else real(self, binding))
    _, model, bundle = marians["swish-scaled"]
    src, _ = sources(model.config, [7, 3, 9, 5], seed=4)
    host = xform.load(bundle, backend="ort", cache_capacity=32)
    dev = xform.load(bundle, backend="ort", device="cuda", cache_capacity=32)
    kw = dict(max_new_tokens=14, num_beams=4, min_new_tokens=14)
    want, got = host.generate(src.numpy(), **kw), dev.generate(src.numpy(), **kw)
    assert got.shape != want.shape or (got != want).any()


def test_the_reorder_is_captured_only_when_asked(demo_bundle, captured):
    """CAPTURE_REORDER off (the default until a GPU measures it): the reorder session opens without
    enable_cuda_graph, the decoder's with it."""
    dev = xform.load(demo_bundle, backend="ort", device="cuda")
    assert not cuda_graphs.CAPTURE_REORDER and not dev.backend.capture_reorder
    assert not dev.backend.sessions[REORDER].capture
