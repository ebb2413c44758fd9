"""`xform export --optimize`: ONNX Runtime's transformer optimizer on the CPU graphs, verified
against the traced graphs, recorded per graph in the manifest (exporter/fusions.py)."""
import json

import numpy as np
import onnx
import pytest

import xform
from tests.conftest import make_model, padded_batch
from xform.errors import BundleError, XformError
from xform.exporter import fusions
from xform.exporter.export import export_bundle
from xform.exporter.fusions import FUSABLE, fuse_graph
from xform.models.importers import LoadedModel
from xform.runtime.bundle import Bundle

# distinct dims (d_model 48, 6 heads of 8, FFN 80, vocabularies 37 / 41, 2 + 3 layers): a fused
# operator that took one for another would not verify
DIMS = dict(d_model=48, n_heads=6, d_ff=80, src_vocab_size=37, tgt_vocab_size=41, n_encoder_layers=2,
            n_decoder_layers=3)


def loaded(name: str) -> LoadedModel:
    return LoadedModel(make_model(name, **DIMS), source={"kind": "test"})


def ops(path, domain: str | None = None) -> dict[str, int]:
    found: dict[str, int] = {}
    for n in onnx.load(str(path), load_external_data=False).graph.node:
        if domain is None or n.domain == domain:
            found[n.op_type] = found.get(n.op_type, 0) + 1
    return found


@pytest.fixture(scope="module", params=["seed-002", "learned-pre"])  # post-LN and pre-LN
def pair(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("fusions")
    traced = export_bundle("unused", d / "traced", loaded=loaded(request.param)).path
    fused = export_bundle("unused", d / "fused", loaded=loaded(request.param), optimize=True).path
    return traced, fused


def test_optimized_graphs_fuse_verify_and_are_recorded(pair):
    traced, fused = pair
    bundle = Bundle.open(fused)
    for graph, entry in bundle.manifest.graphs.items():
        if graph not in FUSABLE:
            assert entry.optimized is None
            continue
        record = entry.optimized
        assert record["applied"] is True and record["model_type"] == "bart", graph
        assert record["by"].startswith("onnxruntime.transformers.optimizer")
        assert 0 <= record["max_abs_diff"] <= fusions.FUSED_ATOL
        # every layer's residual + LayerNorm; the pre-LN variant's gelu_tanh also becomes FastGelu
        assert record["fused"] == ops(fused / f"{graph}.onnx", "com.microsoft"), graph
        assert record["fused"]["SkipLayerNormalization"] >= 2, graph
        assert "SkipLayerNormalization" not in ops(traced / f"{graph}.onnx")
    assert all(e.optimized is None for e in Bundle.open(traced).manifest.graphs.values())
    raw = json.loads((traced / "manifest.json").read_text())
    assert all("optimized" not in g for g in raw["graphs"].values())  # untouched bundles read as before


def test_optimized_bundle_decodes_the_traced_tokens(pair):
    traced, fused = pair
    a, b = xform.load(traced), xform.load(fused)
    src, lengths = padded_batch(a.config, [9, 3, 6])
    for beams in (1, 4):
        ids = [s.generate(src, lengths, max_new_tokens=12, num_beams=beams) for s in (a, b)]
        assert np.array_equal(np.asarray(ids[0]), np.asarray(ids[1])), beams
    report = xform.check(fused, batch=5, max_new_tokens=10)
    assert report.passed and report.max_abs_err <= 1e-4 and report.token_agreement == 1.0


def test_int8_is_optimized_in_fp32_then_quantized(tmp_path):
    out = export_bundle("unused", tmp_path / "b8", loaded=loaded("seed-002"), precision="int8", optimize=True).path
    entry = Bundle.open(out).manifest.graphs["decoder"]
    assert entry.optimized["applied"]
    found = ops(out / "decoder.onnx")
    assert found["SkipLayerNormalization"] == entry.optimized["fused"]["SkipLayerNormalization"]
    assert "DynamicQuantizeLinear" in found or "DynamicQuantizeMatMul" in found


def test_a_broken_optimized_graph_is_refused_and_the_traced_graph_kept(tmp_path, monkeypatch):
    """The mutation: an optimizer whose graph computes something else (a SkipLayerNorm's gamma
    scaled) must not reach the bundle."""
    real = fusions.optimizer_run

    def broken(path, cfg):
        model = real(path, cfg)
        node = next(n for n in model.graph.node if n.op_type == "SkipLayerNormalization")
        gamma = next(t for t in model.graph.initializer if t.name == node.input[2])
        values = onnx.numpy_helper.to_array(gamma) * 1.5
        gamma.CopyFrom(onnx.numpy_helper.from_array(values.astype(np.float32), gamma.name))
        return model
    monkeypatch.setattr(fusions, "optimizer_run", broken)
    out = export_bundle("unused", tmp_path / "b", loaded=loaded("seed-002"), optimize=True).path
    for graph in FUSABLE:
        record = Bundle.open(out).manifest.graphs[graph].optimized
        assert record["applied"] is False and "differs from the traced graph" in record["reason"], graph
        assert "SkipLayerNormalization" not in ops(out / f"{graph}.onnx")
    report = xform.check(out, batch=3, max_new_tokens=8)
    assert report.passed and report.max_abs_err <= 1e-4


def test_a_graph_nothing_fuses_is_written_as_traced(tmp_path):
    traced = export_bundle("unused", tmp_path / "t", loaded=loaded("seed-002")).path
    out = tmp_path / "enc.onnx"
    record = fuse_graph(traced / "encoder.onnx", out, Bundle.open(traced).config,
                        optimize=lambda path, cfg: onnx.load(str(path)))
    assert record["applied"] is False and record["reason"] == "no fusion applies" and record["fused"] == {}
    assert ops(out) == ops(traced / "encoder.onnx")


def test_optimize_is_for_the_cpu_graphs(tmp_path):
    with pytest.raises(XformError, match="--optimize is for the CPU graphs"):
        export_bundle("unused", tmp_path / "h", loaded=loaded("seed-002"), precision="fp16", optimize=True)


def test_a_malformed_optimized_record_is_refused(pair):
    _, fused = pair
    manifest = json.loads((fused / "manifest.json").read_text())
    manifest["graphs"]["decoder"]["optimized"] = {"fused": {}}
    bad = fused.parent / "bad"
    if not bad.exists():
        import shutil
        shutil.copytree(fused, bad)
    (bad / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="optimized"):
        Bundle.open(bad)
