"""export --weights int8 / int4: MatMul weights as ONNX Runtime's MatMulNBits over fp32 or fp16
activations, judged by translations (compare.py's weight-only tolerances)."""
import json
import random
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import xform
from tests.conftest import requires_gpu
from xform.cli import main
from xform.errors import BundleError, ToleranceError, XformError
from xform.exporter import export, weights
from xform.exporter.export import export_bundle
from xform.exporter.external_data import save_with_external_data
from xform.exporter.weights import gemms_as_matmuls
from xform.runtime.bundle import Bundle
from xform.runtime.text.translator import Translator

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from train_demo import to_words  # noqa: E402

FLOAT_WEIGHT = (TensorProto.FLOAT, TensorProto.FLOAT16)


def sample(path: Path, n: int = 48) -> Path:
    rng = random.Random(3)
    path.write_text("".join(f"{rng.randrange(10 ** rng.randrange(1, 7))}\n" for _ in range(n)))
    return path


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("weights")
    sentences = sample(root / "sample.txt")
    return {(p, w): export_bundle("demo", root / f"{p}_{w}", precision=p, weights=w, sample_file=sentences).path
            for p, w in (("fp16", "int4"), ("fp32", "int8"))} | {
        ("fp32", None): export_bundle("demo", root / "fp32").path}


def weight_matmuls(path: Path) -> tuple[int, int]:
    """(MatMul / Gemm nodes over a float 2-D initializer, MatMulNBits nodes) of a graph."""
    m = onnx.load(str(path), load_external_data=False)
    inits = {i.name: i for i in m.graph.initializer}
    full = sum(n.op_type in ("MatMul", "Gemm") and n.input[1] in inits and inits[n.input[1]].data_type in FLOAT_WEIGHT
               and len(inits[n.input[1]].dims) == 2 for n in m.graph.node)
    return full, sum(n.op_type == "MatMulNBits" for n in m.graph.node)


@pytest.mark.parametrize("precision,weights,bits", [("fp16", "int4", 4), ("fp32", "int8", 8)])
def test_every_weight_matmul_becomes_matmulnbits(bundles, precision, weights, bits):
    plain, quantized = bundles[("fp32", None)], bundles[(precision, weights)]
    for graph in ("encoder", "decoder", "decoder_beam"):
        before, _ = weight_matmuls(plain / f"{graph}.onnx")
        full, nbits = weight_matmuls(quantized / f"{graph}.onnx")
        assert full == 0 and nbits == before > 0, graph  # the output projection (a Gemm) included
        m = onnx.load(str(quantized / f"{graph}.onnx"), load_external_data=False)
        assert {a.i for n in m.graph.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "bits"} \
            == {bits}
    manifest = json.loads((quantized / "manifest.json").read_text())
    assert manifest["weights"] == {"name": weights, "bits": bits, "block_size": 32, "symmetric": True,
                                   "accuracy_level": 4, "operator": "com.microsoft.MatMulNBits"}
    assert {a.i for n in m.graph.node if n.op_type == "MatMulNBits" for a in n.attribute
            if a.name == "accuracy_level"} == {4}
    assert f"MatMul weights {weights}" in manifest["precision_plan"] and manifest["precision"] == precision
    bundle = Bundle.open(quantized)
    assert bundle.weights == weights and bundle.precision_label == f"{precision} + {weights} weights"
    # the fused beam step's quantized weights are the decoder's bytes: no data file of its own
    assert not (quantized / "decoder_beam.onnx.data").exists()
    # smaller: the decoder's weights an eighth (int4) or a quarter (int8) of fp32's, plus scales and the
    # embedding table, which stays in the activations' precision
    ratio = (quantized / "decoder.onnx.data").stat().st_size / (plain / "decoder.onnx.data").stat().st_size
    assert ratio < (0.2 if bits == 4 else 0.35), ratio


@pytest.mark.parametrize("key", [("fp16", "int4"), ("fp32", "int8")])
def test_weight_only_bundles_translate_and_pass_the_check_by_translations(bundles, key):
    bundle = bundles[key]
    manifest = json.loads((bundle / "manifest.json").read_text())
    check = manifest["verification"]["check"]
    assert check["judged_by"] == "decodes" and check["passed"] and check["sources"] == "sentences"
    assert manifest["tolerance"]["min_decode_agreement"] == (0.80 if key[1] == "int4" else 0.90)
    session = xform.load(bundle, backend="ort")
    rng = random.Random(11)
    texts = [str(rng.randrange(10 ** 6)) for _ in range(60)]
    exact = np.mean([t == to_words(int(s)) for s, t in zip(texts, Translator(session).translate(texts))])
    assert exact >= 0.9, exact
    report = xform.check(bundle, session=session, texts=texts)
    assert report.passed and report.precision == f"{key[0]} + {key[1]} weights" and not report.gross_only
    assert report.max_abs_err > 1e-3  # not the full-precision graphs: logits move, translations do not


def test_damaged_scales_fail_the_export(tmp_path, monkeypatch):
    """Scales 4x too large (weights off by a factor) translate unlike eager: the export is refused."""
    real = export.quantize_weights

    def damaged(source, out, plan):
        n = real(source, out, plan)
        m = onnx.load(str(out))
        for node in m.graph.node:
            if node.op_type == "MatMulNBits":
                for init in m.graph.initializer:
                    if init.name == node.input[2]:
                        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 4, init.name))
        save_with_external_data(m, out)
        return n

    monkeypatch.setattr(export, "quantize_weights", damaged)
    with pytest.raises(ToleranceError, match=r"fp32 \+ int4 weights graphs translate unlike eager"):
        export_bundle("demo", tmp_path / "bad", weights="int4", sample_file=sample(tmp_path / "s.txt"))
    assert not (tmp_path / "bad").exists()


def test_gemm_becomes_matmul_plus_add_and_a_tied_weight_stays():
    rng = np.random.default_rng(0)
    table = rng.standard_normal((11, 6)).astype(np.float32)  # (V, D): the Gather's table and the Gemm's B^T
    bias = rng.standard_normal(11).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["emb"]),
         helper.make_node("Gemm", ["x", "table", "bias"], ["logits"], transB=1, name="out")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["R", 6]),
              helper.make_tensor_value_info("ids", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["R", 11]),
         helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["N", 6])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(bias, "bias")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert gemms_as_matmuls(model) == 1
    assert [n.op_type for n in model.graph.node] == ["Gather", "MatMul", "Add"]
    x, ids = rng.standard_normal((3, 6)).astype(np.float32), np.array([1, 10])
    logits, emb = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x, "ids": ids})
    np.testing.assert_allclose(logits, x @ table.T + bias, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(emb, table[ids])


def test_weights_refusals(tmp_path):
    with pytest.raises(XformError, match="--weights goes with --precision fp32 or fp16"):
        export_bundle("demo", tmp_path / "a", precision="int8", weights="int8")
    with pytest.raises(XformError, match=r"--weights 'int2': choose from int8, int4"):
        export_bundle("demo", tmp_path / "b", weights="int2")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_manifest_weights_are_validated(bundles, tmp_path):
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(bundles[("fp16", "int4")], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["weights"]["bits"] = 8
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"manifest.weights must be name and bits one of"):
        Bundle.open(copy)


def test_cli_export_weights_and_tensorrt_refusal(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["export", "demo", "-o", str(tmp_path / "w8"), "--weights", "int8",
                                  "--sample-file", str(sample(tmp_path / "s.txt", 24))])
    assert result.exit_code == 0, result.output
    assert "(fp32 + int8 weights, opset" in result.output and "translations 100.00% alike" in result.output
    refused = runner.invoke(main, ["build-engine", str(tmp_path / "w8")])
    assert refused.exit_code != 0 and "its MatMul weights are int8" in refused.output
    bad = runner.invoke(main, ["export", "demo", "-o", str(tmp_path / "x"), "--weights", "int3"])
    assert bad.exit_code == 2 and "int3" in bad.output


@requires_gpu
@pytest.mark.parametrize("key", [("fp16", "int4"), ("fp32", "int8")])
def test_weight_only_bundles_on_cuda(bundles, key):
    """On a lent GPU: ONNX Runtime's CUDA MatMulNBits kernels (which ignore accuracy_level) pass the same
    check by translations, with the step captured as a CUDA graph."""
    session = xform.load(bundles[key], backend="ort", device="cuda")
    rng = random.Random(5)
    texts = [str(rng.randrange(10 ** 6)) for _ in range(64)]
    report = xform.check(bundles[key], session=session, texts=texts)
    assert report.passed, report.to_dict()
    exact = np.mean([t == to_words(int(s)) for s, t in zip(texts, Translator(session).translate(texts))])
    assert exact >= 0.9, exact


def test_the_translator_names_weight_only_bundles_in_ctranslate2s_words(bundles):
    """fp16 activations over int8 weights are CTranslate2's int8_float16: the name asks for the bundle, and
    the bundle's compute_type says it; a precision's plain name does not."""
    t = xform.Translator(bundles[("fp32", "int8")], compute_type="int8_float32")
    assert t.compute_type == "int8_float32"
    assert xform.Translator(bundles[("fp16", "int4")]).compute_type == "int4_float16"
    with pytest.raises(XformError, match=r"compute_type float32: .* is a fp32 \+ int8 weights bundle \(compute_type "
                                         r"default or int8_float32\)"):
        xform.Translator(bundles[("fp32", "int8")], compute_type="float32")


def test_a_weight_left_unquantized_is_refused(tmp_path, monkeypatch):
    """The manifest says every MatMul weight is quantized: an output projection left a Gemm (the
    mutation: no Gemm rewritten) fails the export naming the graph, leaving nothing."""
    monkeypatch.setattr(weights, "gemms_as_matmuls", lambda model: 0)
    with pytest.raises(XformError, match=r"encoder: --weights int4 left 1 product\(s\) over full-precision|"
                                         r"decoder: --weights int4 left 1 product\(s\) over full-precision"):
        export_bundle("demo", tmp_path / "w", weights="int4")
    assert not (tmp_path / "w").exists()


def test_an_older_onnxruntime_is_refused_before_any_work(tmp_path, monkeypatch):
    import onnxruntime
    monkeypatch.setattr(onnxruntime, "__version__", "1.21.1")
    with pytest.raises(XformError, match=r"--weights needs onnxruntime 1.22 or newer .* found 1.21.1"):
        export_bundle("demo", tmp_path / "w", weights="int8")
    with pytest.raises(XformError, match=r"--fuse needs onnxruntime 1.20 or newer"):
        monkeypatch.setattr(onnxruntime, "__version__", "1.19.2")
        export_bundle("demo", tmp_path / "f", fuse="attention")
    assert not (tmp_path / "w").exists() and not (tmp_path / "f").exists()
