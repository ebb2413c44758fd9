"""The ort backend's device branch (ONNX Runtime on CUDA), end to end: on the CPU through
tests/runtime/cuda_double.py (IOBinding as a CUDA session's: a host input is copied when bound,
device memory is read at each run; DeviceCache on a stream of queued copies; logits left on the
device; the reorder graph as the gather), and, where a GPU is lent, the same tests on ONNX
Runtime's real CUDA provider (`device` "gpu": onnxruntime-gpu and cuda-bindings required there).
Tokens and scores must equal the host path's for greedy, beams 2 to 5 (the fused graph and the
candidates graph), rows joining a running batch, finished rows leaving (compaction), cache growth
and the restricted decoder; `--check` must pass in fp32 and fp16.

On the H100's first run (issue 41) the step's inputs were host arrays bound once per set of rows,
so every step after the first decoded step 0's ids: `test_host_inputs_bound_once_repeat_step_zero`
puts that binding back and must see the double reproduce the failure."""
import numpy as np
import pytest

import xform
from tests.conftest import requires_gpu
from tests.marian_fixtures import sources
from tests.runtime.cuda_double import CudaBinding, CudaOrt, emulate_cuda
from xform.contract import DECODER, DECODER_BEAM
from xform.errors import BackendUnavailableError, XformError
from xform.runtime.backends import ort_backend, ort_files
from xform.runtime.backends.step_inputs import StepInputs
from xform.runtime.decoding.generation import GenerationConfig
from xform.runtime.scheduling.scheduler import Scheduler
from xform.runtime.text.translator import Translator

TEXTS = ["7", "999999", "40", "123456", "5", "88 12"]
SCORE_ATOL = 1e-5
LOGIT_ATOL = 1e-5  # fp32 on the CPU and on CUDA without TF32: kernel order only (the H100: 1e-6)


def real_cuda() -> None:
    """On a GPU machine the real provider must be there: a skip there would prove nothing."""
    import onnxruntime
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.fail("this machine has a GPU but onnxruntime offers no CUDA provider: pip uninstall -y onnxruntime "
                    "&& pip install onnxruntime-gpu cuda-bindings (or ../shared/gpu/pack.sh's parts)")


@pytest.fixture(params=["double", "double-captured", pytest.param("gpu", marks=requires_gpu),
                        pytest.param("gpu-captured", marks=requires_gpu)])
def device(request, monkeypatch):
    """The CudaOrt double ("double"), or None on the real CUDA provider ("gpu"); "-captured": the
    decoder-step graphs captured as CUDA graphs (cuda_graphs.py), whatever the default."""
    monkeypatch.setattr(ort_backend, "CAPTURE", request.param.endswith("-captured"))
    if request.param.startswith("gpu"):
        real_cuda()
        return None
    return emulate_cuda(monkeypatch)


@pytest.fixture
def cuda(monkeypatch):
    """The double alone: tests of what only the double can show (its own semantics, counts)."""
    return emulate_cuda(monkeypatch)


def pair(bundle, double, capacity=3):
    """(host session, CUDA session) over the same bundle; a small first cache capacity so that
    decodes grow it."""
    host = xform.load(bundle, backend="ort", cache_capacity=capacity)
    dev = xform.load(bundle, backend="ort", device="cuda", cache_capacity=capacity)
    assert dev.backend.ops is not None and host.backend.ops is None
    assert double is None or dev.backend.ops is double.ops
    return host, dev


def test_the_double_copies_host_inputs_when_bound_and_reads_device_memory_at_each_run(demo_bundle, cuda):
    """The double itself: the reorder graph run twice on one binding, its beam_idx changed in
    between. Bound from host memory the second run still sees the first value (copied when bound);
    bound in device memory it sees the new one."""
    session = cuda.InferenceSession(str(demo_bundle / "reorder.onnx"), None, ["CUDAExecutionProvider"])
    shape = [3, *[d if isinstance(d, int) else 1 for d in session.get_inputs()[1].shape[1:]]]
    cache = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    names = [i.name for i in session.get_inputs()][1:]
    outs = [o.name for o in session.get_outputs()]

    def run(device: bool):
        binding = session.io_binding()
        assert isinstance(binding, CudaBinding)
        idx = np.array([0, 1], np.int64)
        buf = np.empty_like(idx)
        if device:
            binding.bind_input("beam_idx", "cuda", 0, np.int64, [2], buf.ctypes.data)
            buf[:] = idx
        else:
            binding.bind_input("beam_idx", "cpu", 0, np.int64, [2], idx.ctypes.data)
        for n in names:
            binding.bind_input(n, "cpu", 0, np.float32, shape, cache.ctypes.data)
        got = [np.empty((2, *shape[1:]), np.float32) for _ in outs]
        for n, g in zip(outs, got):
            binding.bind_output(n, "cpu", 0, np.float32, list(g.shape), g.ctypes.data)
        session.run_with_iobinding(binding)
        (buf if device else idx)[:] = [2, 2]
        session.run_with_iobinding(binding)
        return got[0]
    np.testing.assert_array_equal(run(device=False), cache[[0, 1]])
    np.testing.assert_array_equal(run(device=True), cache[[2, 2]])


def test_host_inputs_bound_once_repeat_step_zero(demo_bundle, cuda, monkeypatch):
    """Today's fix undone (every step input bound from host memory, as before issue 41): on the
    double, greedy decodes repeat their first token, as the H100 did ("hundred hundred ..."; no
    growth within 12 steps, which would bind them anew)."""
    from xform.runtime.backends.ort_files import bind_host
    monkeypatch.setattr(ort_backend, "CAPTURE", False)  # captured, the double refuses host memory outright
    host, dev = pair(demo_bundle, cuda, capacity=32)
    monkeypatch.setattr(StepInputs, "bind", lambda self, binding, name, array, each_step=False:
                        bind_host(binding, "input", name, array))
    src = Translator(host).policy.encode_texts(TEXTS[:2])
    want, got = host.generate(src, max_new_tokens=12), dev.generate(src, max_new_tokens=12)
    assert want.shape != got.shape or (want != got).any()
    for row in got:  # each row's first token again and again, to the limit
        assert len(row) == 12 and len(set(row.tolist())) == 1, got


def test_greedy_with_growth_compaction_and_logits_equals_the_host(demo_bundle, device):
    """Rows end at different steps and leave; the cache grows 3 -> 6 -> 12 -> 24; the logits
    left on the device equal the host's; every step's inputs reached the device each step."""
    host, dev = pair(demo_bundle, device)
    src = Translator(host).policy.encode_texts(TEXTS)
    before = device.ops.uploads if device else 0
    want, got = host.generate(src, max_new_tokens=20), dev.generate(src, max_new_tokens=20)
    np.testing.assert_array_equal(got, want)
    if device:
        assert device.ops.uploads - before >= 3 * got.shape[1]  # ids, positions, min_new_tokens each step
    assert dev.backend.cache.capacity > 3  # grew
    hw, hl = host.teacher_forced(src, None, want)
    dw, dl = dev.teacher_forced(src, None, want)
    np.testing.assert_array_equal(dw, hw)
    np.testing.assert_allclose(dl, hl, rtol=0, atol=LOGIT_ATOL)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("beams", [2, 3, 4, 5])
def test_beams_equal_the_host_path(marians, device, beams, fused):
    """Beam search through the fused graph and through decoder + candidates (the reorder graph as
    the device gather each step, sources leaving as their hypotheses end): hypotheses and scores
    equal the host path's."""
    _, model, bundle = marians["swish-scaled"]
    src, _ = sources(model.config, [7, 3, 9, 5], seed=beams)
    host, dev = pair(bundle, device)
    for s in (host, dev):
        s.backend.fused_beams = fused
    kw = dict(max_new_tokens=14, num_beams=beams, num_return_sequences=min(beams, 2), return_scores=True)
    want, got = host.generate(src.numpy(), **kw), dev.generate(src.numpy(), **kw)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=0, atol=SCORE_ATOL)
    assert (DECODER_BEAM if fused else DECODER) in dev.backend.sessions


@pytest.mark.parametrize("fused", [True, False])
def test_a_beam_reorder_binds_each_buffer_set_once(demo_bundle, device, fused, monkeypatch):
    """A device's beam reorder moves the cache into the other of its two buffer sets, rows
    unchanged: the step's binding of each set is made once and reused (issue 41: made anew after
    every gather it was 1.24 ms of a 4 ms beam step on the H100), and so is the reorder graph's,
    its beam_idx written into device memory before each run. No growth, no row leaving (every
    hypothesis runs to its min_new_tokens): two bindings of the step graph and two of the reorder
    graph over 10 steps, and the hypotheses and scores still the host's."""
    from tests.runtime.cuda_double import CudaSession
    host, dev = pair(demo_bundle, device, capacity=32)
    for s in (host, dev):
        s.backend.fused_beams = fused
    made: list[int] = []
    if device is not None:
        real = CudaSession.io_binding
        monkeypatch.setattr(CudaSession, "io_binding", lambda self: made.append(id(self)) or real(self))
    src = Translator(host).policy.encode_texts(TEXTS[:3])
    kw = dict(max_new_tokens=10, min_new_tokens=10, num_beams=3, return_scores=True)
    want, got = host.generate(src, **kw), dev.generate(src, **kw)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=0, atol=SCORE_ATOL)
    if device is not None:
        step = dev.backend.sessions[DECODER_BEAM if fused else DECODER]
        assert made.count(id(step)) == 2, made.count(id(step))
        assert made.count(id(dev.backend.reorder)) == 2, made.count(id(dev.backend.reorder))  # one a direction


def test_rows_joining_a_running_batch_equal_the_host(demo_bundle, device):
    """In-flight batching on the device: requests join at steps 0, 2, 3 and 6 (a longer source
    widening the cross K/V), rows leave as they end; each result equals the host path's alone."""
    from tests.runtime.test_scheduler import drive
    host, dev = pair(demo_bundle, device)
    reqs = [Translator(host).policy.encode_texts([t]) for t in TEXTS[:4]] + [Translator(host).policy.encode_texts(TEXTS[4:])]
    plan = {0: [(reqs[0], {"max_new_tokens": 16})], 2: [(reqs[1], {"max_new_tokens": 16})],
            3: [(reqs[2], {"max_new_tokens": 4}), (reqs[3], {"max_new_tokens": 16})],
            6: [(reqs[4], {"max_new_tokens": 16})]}
    futures = drive(Scheduler(dev, max_rows=16), plan)
    for src, f, n in zip(reqs, futures, (16, 16, 4, 16, 16)):
        np.testing.assert_array_equal(f.result(), host.generate(src, max_new_tokens=n))


def test_restricted_decoder_equals_the_host(marians, device, tmp_path):
    """A vocabulary restriction: the restricted decoder's table rows are device inputs bound
    once a decode, its ids, positions and min_new_tokens each step."""
    from xform.exporter.export import export_bundle
    d, model, _ = marians["swish-scaled"]
    bundle = export_bundle(d, tmp_path / "b", vocab_map=True).path
    host, dev = pair(bundle, device)
    src, _ = sources(model.config, [7, 3, 9], seed=2)
    allowed = list(range(4, 40))
    for kw in (dict(), dict(num_beams=3, min_new_tokens=4, return_scores=True)):
        want = host.generate(src.numpy(), max_new_tokens=12, vocabulary=allowed, **kw)
        got = dev.generate(src.numpy(), max_new_tokens=12, vocabulary=allowed, **kw)
        if kw:
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_allclose(got[1], want[1], rtol=0, atol=SCORE_ATOL)
        else:
            np.testing.assert_array_equal(got, want)


@pytest.fixture(scope="module")
def demo16(tmp_path_factory):
    from xform.exporter.export import export_bundle
    return export_bundle("demo", tmp_path_factory.mktemp("d16") / "demo16", precision="fp16").path


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_check_passes_on_the_device_path(demo_bundle, demo16, device, precision):
    """`xform run --device cuda --check`'s comparison with eager PyTorch: fp32 agrees on every
    token within fp32's tolerance (the H100 gave 3.12% before the fix), fp16 within fp16's;
    greedy and beam 4."""
    bundle = demo_bundle if precision == "fp32" else demo16
    dev = xform.load(bundle, backend="ort", device="cuda")
    for gen in (None, GenerationConfig(max_new_tokens=16, num_beams=4)):
        report = xform.check(bundle, session=dev, texts=["01234567", "7654", "40512"], generation=gen)
        assert report.passed and not report.tf32, report
        if precision == "fp32":
            assert report.token_agreement == 1.0 and report.atol == 1e-4 and report.beam_hypotheses_identical in (
                None, 1.0)


def test_tf32_is_off_unless_asked_and_its_check_says_what_it_costs(demo_bundle, cuda):
    """fp32 on CUDA is fp32: the CUDA provider is opened with use_tf32 0; --allow-tf32 opens it
    with 1, and the check then judges by the TF32 tolerance and says so. TF32 on the CPU, the
    eager reference or TensorRT (an engine-build setting) is refused by name."""
    xform.load(demo_bundle, backend="ort", device="cuda")
    assert cuda.providers and all(p[0][1]["use_tf32"] == "0" for p in cuda.providers)
    cuda.providers.clear()
    dev = xform.load(demo_bundle, backend="ort", device="cuda", allow_tf32=True)
    assert cuda.providers and all(p[0][1]["use_tf32"] == "1" for p in cuda.providers)
    report = xform.check(demo_bundle, session=dev, texts=["01234567"])
    assert report.tf32 and report.rtol == 1e-2 and report.atol == 0.0
    for backend, device, words in (("ort", "cpu", "CUDA math mode"), ("torch", "cpu", "fp32 reference"),
                                   ("trt", "cuda", "build-engine BUNDLE --tf32")):
        with pytest.raises(XformError, match=words):
            xform.load(demo_bundle, backend=backend, device=device, allow_tf32=True)


def test_providers_of_a_cpu_onnxruntime_refuse_cuda():
    from types import SimpleNamespace
    cpu_only = SimpleNamespace(get_available_providers=lambda: ["CPUExecutionProvider"])
    with pytest.raises(BackendUnavailableError, match="onnxruntime-gpu"):
        ort_files.providers_for(cpu_only, "cuda")
    assert ort_files.providers_for(CudaOrt(), "cpu") == ["CPUExecutionProvider"]


def test_run_cli_on_the_device_with_and_without_tf32(demo_bundle, cuda, tmp_path):
    """`xform run --device cuda --check` passes (on the double) and records tf32 false; with
    --allow-tf32 the check table says what TF32 cost; on the CPU the flag is refused by name."""
    from click.testing import CliRunner

    from xform.cli import main
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--device", "cuda", "--check", "--text", "01234567",
                                  "--text", "7654", "--json", str(tmp_path / "r.json")])
    assert r.exit_code == 0 and "check passed" in r.output and "TF32" not in r.output, r.output
    assert '"tf32": false' in (tmp_path / "r.json").read_text()
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--device", "cuda", "--allow-tf32", "--check",
                                  "--text", "01234567"])
    assert r.exit_code == 0 and "TF32 matmuls" in r.output and "fp16's tolerance" in r.output, r.output
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--allow-tf32", "--text", "7"])
    assert r.exit_code != 0 and "--allow-tf32" in r.output and "CUDA" in r.output, r.output
