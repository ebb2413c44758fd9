"""int8 export: ONNX Runtime dynamic quantization, checked against eager with its own tolerance."""
import random
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import xform
from xform.errors import XformError
from xform.exporter.engine import build_engines
from xform.exporter.export import export_bundle

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from train_demo import to_words  # noqa: E402


@pytest.fixture(scope="module")
def demo8(tmp_path_factory):
    return export_bundle("demo", tmp_path_factory.mktemp("int8") / "demo8", precision="int8").path


def test_int8_graphs_hold_int8_weights(demo8):
    for graph in ("encoder", "decoder"):
        m = onnx.load(str(demo8 / f"{graph}.onnx"))
        ops = {n.op_type for n in m.graph.node}
        assert "DynamicQuantizeLinear" in ops and ops & {"MatMulInteger", "DynamicQuantizeMatMul"}
        assert any(i.data_type == onnx.TensorProto.INT8 and len(i.dims) == 2 for i in m.graph.initializer)
    assert sorted(p.name for p in demo8.iterdir() if p.suffix in (".onnx", ".data")) == [
        "candidates.onnx", "decoder.onnx", "decoder.onnx.data", "encoder.onnx", "encoder.onnx.data", "reorder.onnx"]


def test_demo_int8_token_agreement_and_logit_bound(demo8):
    session = xform.load(demo8, backend="ort")
    rng = random.Random(7)
    texts = [str(rng.randrange(10 ** 6)) for _ in range(150)] + ["0", "7", "40512"]
    report = xform.check(demo8, session=session, texts=texts)
    assert report.passed and report.precision == "int8"
    assert report.token_agreement >= 0.90 and report.max_rel_err <= 0.1 and report.tokens_compared > 1000
    exact = np.mean([t == to_words(int(s)) for s, t in zip(texts, session.translate(texts))])
    assert exact >= 0.90
    # the int8 tolerance is not vacuous: the same figures fail fp32's
    strict = xform.check(demo8, session=session, texts=texts, atol=1e-4, rtol=0.0)
    assert not strict.passed


def test_tensorrt_refuses_int8_bundles(demo8):
    with pytest.raises(XformError, match="int8 bundle holds ONNX Runtime's dynamic quantization"):
        build_engines(demo8, "tensorrt_rtx")
