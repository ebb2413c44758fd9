"""export --fuse: a bundle whose decoder graphs hold ONNX Runtime's fused operators decodes as the plain
bundle does (tests/exporter/test_fused.py compares the graphs themselves), records its fusions, and is
refused where it cannot run."""
import json
import random
import shutil

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import xform
from tests.conftest import requires_gpu
from xform import manifest
from xform.cli import main
from xform.errors import BundleError, XformError
from xform.exporter import fused
from xform.exporter.export import export_bundle
from xform.runtime.bundle import Bundle
from xform.runtime.decoding.generation import GenerationConfig
from xform.runtime.text.text_policy import TextPolicy

ALL = "attention,qkv,skip_layer_norm"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("fused")
    return export_bundle("demo", root / "plain").path, export_bundle("demo", root / "fused", fuse=ALL).path


def ops(path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def test_the_fused_bundle_records_its_fusions_and_holds_the_operators(pair):
    plain, bundle = pair
    layers = Bundle.open(bundle).config.n_decoder_layers
    record = json.loads((bundle / "manifest.json").read_text())
    assert record["fusions"] == list(manifest.FUSIONS) == list(fused.FUSIONS)
    assert Bundle.open(bundle).fusions == manifest.FUSIONS and Bundle.open(plain).fusions == ()
    for graph in ("decoder", "decoder_beam"):
        got, before = ops(bundle / f"{graph}.onnx"), ops(plain / f"{graph}.onnx")
        assert got["MultiHeadAttention"] == 2 * layers and "Softmax" not in got, graph
        assert got["SkipLayerNormalization"] == before["LayerNormalization"] and "LayerNormalization" not in got
        assert got["MatMul"] < before["MatMul"]  # qkv: one projection where there were three
    assert "MultiHeadAttention" not in ops(bundle / "encoder.onnx")  # the encoder stays plain
    assert not (bundle / "decoder_beam.onnx.data").exists()  # the fused beam step shares the decoder's bytes
    assert record["verification"]["check"]["passed"] and record["verification"]["check"]["max_abs_err"] < 1e-4


@pytest.mark.parametrize("beams", [1, 4])
def test_the_fused_bundle_decodes_the_plain_bundles_tokens(pair, beams):
    """Greedy and beam 4 over sources of different lengths (padding), the fused decoder_beam graph too."""
    rng = random.Random(4)
    texts = [str(rng.randrange(10 ** rng.randrange(1, 7))) for _ in range(9)]
    gen = GenerationConfig(num_beams=beams, num_return_sequences=min(beams, 2), max_new_tokens=20)
    results = []
    for bundle in pair:
        session = xform.load(bundle, backend="ort")
        src, lengths = session.prepare(TextPolicy(session).encode_texts(texts), None)
        assert len(set(lengths.tolist())) > 1  # padded sources
        results.append(session.run(session.request(src, lengths, generation=gen, return_scores=beams > 1)))
    np.testing.assert_array_equal(results[0].ids, results[1].ids)
    if beams > 1:
        np.testing.assert_allclose(results[0].scores, results[1].scores, atol=1e-4)


def test_fusions_are_refused_where_they_cannot_run(pair, tmp_path):
    with pytest.raises(XformError, match="--fuse goes with --exporter torchscript"):
        export_bundle("demo", tmp_path / "d", fuse="attention", exporter="dynamo")
    with pytest.raises(XformError, match="--fuse 'flash': no such fusion"):
        export_bundle("demo", tmp_path / "e", fuse="attention,flash")
    assert not (tmp_path / "d").exists() and not (tmp_path / "e").exists()
    copy = tmp_path / "copy"
    shutil.copytree(pair[1], copy)
    record = json.loads((copy / "manifest.json").read_text())
    record["fusions"] = ["self_attention", "flash"]
    (copy / "manifest.json").write_text(json.dumps(record))
    with pytest.raises(BundleError, match=r"manifest.fusions must be a list of distinct fusions"):
        Bundle.open(copy)
    refused = CliRunner().invoke(main, ["build-engine", str(pair[1])])
    assert refused.exit_code != 0 and "ONNX Runtime's fused operators (export --fuse" in refused.output


def test_fused_graphs_with_weight_only_quantization(tmp_path):
    """--fuse and --weights together: the fused attention over MatMulNBits projections, verified and
    translating; --precision int8 with --fuse is refused (the CPU's precision, the GPU's graphs)."""
    bundle = export_bundle("demo", tmp_path / "fw", fuse=ALL, weights="int8").path
    got = ops(bundle / "decoder.onnx")
    assert got["MultiHeadAttention"] > 0 and got["MatMulNBits"] > 0 and got["SkipLayerNormalization"] > 0
    assert json.loads((bundle / "manifest.json").read_text())["verification"]["check"]["passed"]
    with pytest.raises(XformError, match="--fuse goes with --precision fp32 or fp16"):
        export_bundle("demo", tmp_path / "f8", precision="int8", fuse="attention")


def test_cli_export_fuse(tmp_path):
    result = CliRunner().invoke(main, ["export", "demo", "-o", str(tmp_path / "f"), "--fuse", "cross_attention"])
    assert result.exit_code == 0, result.output
    assert "(fp32, fused: cross_attention, opset" in result.output
    assert json.loads((tmp_path / "f" / "manifest.json").read_text())["fusions"] == ["cross_attention"]
    bad = CliRunner().invoke(main, ["export", "demo", "-o", str(tmp_path / "g"), "--fuse", "qkv"])
    assert bad.exit_code != 0 and "'qkv' goes with 'self_attention'" in bad.output


@requires_gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_fused_bundles_on_cuda(tmp_path, precision):
    """On a lent GPU: the fused operators' CUDA kernels pass the bundle's check (the step captured),
    greedy and beam 4."""
    bundle = export_bundle("demo", tmp_path / precision, precision=precision, fuse=ALL).path
    session = xform.load(bundle, backend="ort", device="cuda")
    texts = ["01234567", "7654", "40512", "9"]
    for beams in (1, 4):
        report = xform.check(bundle, session=session, texts=texts, generation=GenerationConfig(num_beams=beams))
        assert report.passed, report.to_dict()
