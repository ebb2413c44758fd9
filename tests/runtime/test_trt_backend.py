"""The TensorRT backend on a GPU: engines built here, run, checked against eager PyTorch and ORT.

Skipped without an NVIDIA GPU (the one gate in conftest.py). Needs a TensorRT flavour for the GPU
(`tensorrt` for data-centre GPUs such as the H100; `tensorrt-rtx` for RTX cards) and cuda-bindings.
"""
import numpy as np
import pytest

import xform
from tests.conftest import make_model, padded_batch, require_gpu_stack, requires_gpu
from xform.errors import InputError
from xform.exporter.engine import build_engines
from xform.exporter.export import export_bundle
from xform.runtime.text.translator import Translator

pytestmark = requires_gpu


@pytest.fixture(scope="module")
def gpu_bundles(tmp_path_factory, checkpoint_dir):
    require_gpu_stack()
    root = tmp_path_factory.mktemp("gpu")
    out = {}
    for name, src, precision in (("tiny32", checkpoint_dir, "fp32"), ("tiny16", checkpoint_dir, "fp16"),
                                 ("demo32", "demo", "fp32"), ("demo16", "demo", "fp16")):
        path = export_bundle(src, root / name, precision=precision).path
        build_engines(path, "auto", max_batch=8, max_new_tokens=24, opt_batch=4, opt_src_len=12)
        out[name] = path
    return out


@pytest.mark.parametrize("lengths", [[1], [9], [11, 3, 7], [13, 2, 9, 5, 1, 7, 11, 4]])
def test_trt_tokens_equal_ort_fp32(gpu_bundles, lengths):
    trt_s = xform.load(gpu_bundles["tiny32"], backend="trt")
    ort_s = xform.load(gpu_bundles["tiny32"], backend="ort")
    src, _ = padded_batch(make_model("seed-002").cfg, lengths, seed=len(lengths))
    for min_new in (0, 4):
        np.testing.assert_array_equal(trt_s.generate(src, max_new_tokens=20, min_new_tokens=min_new),
                                      ort_s.generate(src, max_new_tokens=20, min_new_tokens=min_new))


@pytest.mark.parametrize("name", ["tiny32", "demo32", "tiny16", "demo16"])
def test_trt_check_against_eager(gpu_bundles, name):
    report = xform.check(gpu_bundles[name], backend="trt", batch=6, src_len=10, max_new_tokens=20)
    assert report.passed, report.to_dict()
    if name.endswith("32"):
        assert report.identical_tokens and report.max_abs_err <= 1e-4
    else:
        assert report.token_agreement >= 0.99 and report.max_rel_err < 1e-2


def test_trt_translates_demo(gpu_bundles):
    s = xform.load(gpu_bundles["demo32"], backend="trt")
    assert Translator(s).translate(["40512", "7", "999999"], max_new_tokens=24) == [
        "forty thousand five hundred twelve", "seven", "nine hundred ninety nine thousand nine hundred ninety nine"]


def test_trt_benchmark_and_cli(gpu_bundles, tmp_path):
    from click.testing import CliRunner

    from xform.cli import main
    r = CliRunner().invoke(main, ["run", str(gpu_bundles["demo32"]), "--backend", "trt", "--check", "--benchmark",
                                  "--batch", "8", "--src-len", "7", "--new-tokens", "16", "--iters", "5"])
    assert r.exit_code == 0, r.output
    assert "check passed" in r.output and "tokens/s" in r.output


def test_trt_profile_limits(gpu_bundles):
    s = xform.load(gpu_bundles["tiny32"], backend="trt")
    cfg = make_model("seed-002").cfg
    src, _ = padded_batch(cfg, [4] * 9)
    with pytest.raises(InputError, match="exceeds the engines' --max-batch 8"):
        s.generate(src, max_new_tokens=4)
    src, _ = padded_batch(cfg, [4, 3])
    with pytest.raises(InputError, match="exceeds the engines' longest decode, 24 steps"):
        s.generate(src, max_new_tokens=30, min_new_tokens=30)


@pytest.mark.parametrize("beams,n_ret", [(2, 1), (4, 3)])
def test_trt_beams_equal_ort(gpu_bundles, beams, n_ret):
    """Beam search on the engines (cache reordered on the device by the reorder engine) gives
    ONNX Runtime's hypotheses and scores; the profile batch is 8, so 2 sources x 4 beams fit."""
    trt_s = xform.load(gpu_bundles["tiny32"], backend="trt")
    ort_s = xform.load(gpu_bundles["tiny32"], backend="ort")
    src, _ = padded_batch(make_model("seed-002").cfg, [9, 4], seed=beams)
    kw = dict(max_new_tokens=16, num_beams=beams, num_return_sequences=n_ret, return_scores=True)
    (t_ids, t_scores), (o_ids, o_scores) = trt_s.generate(src, **kw), ort_s.generate(src, **kw)
    np.testing.assert_array_equal(t_ids, o_ids)
    np.testing.assert_allclose(t_scores, o_scores, rtol=0, atol=1e-3)


def test_trt_refuses_beams_beyond_the_profile(gpu_bundles):
    s = xform.load(gpu_bundles["tiny32"], backend="trt")
    src, _ = padded_batch(make_model("seed-002").cfg, [5, 4, 3], seed=1)
    with pytest.raises(InputError, match="exceeds the engines' profile batch 8; rebuild them with a larger one "
                                         r"\(xform build-engine BUNDLE --force --max-batch N --max-beams N\)"):
        s.generate(src, max_new_tokens=8, num_beams=3)
