"""`xform export --exporter dynamo`: torch.export + onnxscript instead of the TorchScript tracer.

The dynamo graphs go through the same fp16 conversion, graph checks and verification against eager
PyTorch as TorchScript's (export raises when a graph disagrees); on top, decoding a dynamo bundle
gives the tokens and beam scores of the TorchScript bundle of the same model, at batch and source
shapes other than the trace's, and TensorRT-RTX builds engines from its graphs.
scripts/dynamo_bundles.py runs every family, precision and variant (docs/design.md).
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import xform
from tests.conftest import make_model
from xform.cli import main
from xform.errors import XformError
from xform.exporter.export import export_bundle
from xform.models.checkpoint import save_checkpoint
from xform.runtime.bench import padded_sources

pytest.importorskip("onnxscript", reason="onnxscript is a test dependency (pip install -e '.[dev]')")


@pytest.fixture(scope="module")
def demo_pair(tmp_path_factory):
    """The demo model exported by both exporters, with the restricted decoder and attention (every
    graph a bundle can hold)."""
    root = tmp_path_factory.mktemp("dynamo")
    # a process of its own: what a user sees on stdout and stderr (torch's own log handlers included)
    r = subprocess.run([str(Path(sys.executable).parent / "xform"), "export", "demo", "-o", str(root / "dynamo"),
                        "--exporter", "dynamo", "--with-attention", "--with-vocab-map"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "opset 18, dynamo exporter" in r.stdout
    # torch.onnx's warnings about torchvision (not ours, not the user's) are kept out of the output
    assert "torchvision" not in r.stderr + r.stdout, r.stderr
    ts = export_bundle("demo", root / "torchscript", opset=18, attention_layer=-1, vocab_map=True)
    return root / "dynamo", ts.path, r.stdout


def sources(session, rows, seed):
    """`rows` padded sources of 3 to 11 tokens (end-of-sentence included)."""
    return padded_sources(session.config, np.random.default_rng(seed).integers(3, 12, rows), seed)


def test_the_dynamo_bundle_records_its_exporter_and_verifies(demo_pair):
    dyn, ts, output = demo_pair
    m = json.loads((dyn / "manifest.json").read_text())
    assert m["opset"] == 18 and m["versions"]["exporter"] == "dynamo" and m["versions"]["onnxscript"]
    assert json.loads((ts / "manifest.json").read_text())["versions"]["exporter"] == "torchscript"
    assert set(m["graphs"]) == {"encoder", "decoder", "reorder", "candidates", "decoder_restricted",
                                 "decoder_beam"}
    v = m["verification"]
    assert v["check"]["passed"] and v["greedy_tokens_identical"]
    assert any(k.startswith("restricted_") for k in v)
    r = CliRunner().invoke(main, ["run", str(dyn), "--check"])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("settings", [dict(), dict(num_beams=4), dict(num_beams=3, num_return_sequences=2)],
                         ids=["greedy", "beam4", "beam3x2"])
def test_dynamo_and_torchscript_bundles_decode_alike(demo_pair, settings):
    """Padded batches of 1, 5 and 9 sources of 3 to 11 tokens (the trace: 2 sources of 5): the same
    tokens, and beam scores within fp32 noise."""
    dyn, ts, _ = demo_pair
    a, b = xform.load(dyn), xform.load(ts)
    for rows, seed in ((1, 0), (5, 1), (9, 2)):
        src = sources(a, rows, seed)
        got = a.generate(*src, max_new_tokens=12, return_scores=True, **settings)
        ref = b.generate(*src, max_new_tokens=12, return_scores=True, **settings)
        np.testing.assert_array_equal(got[0], ref[0])
        np.testing.assert_allclose(got[1], ref[1], atol=1e-4, rtol=1e-5)


def test_attention_alike(demo_pair):
    dyn, ts, _ = demo_pair
    a, b = xform.load(dyn), xform.load(ts)
    src = sources(a, 4, 3)
    got = a.generate(*src, max_new_tokens=8, return_attention=True)
    ref = b.generate(*src, max_new_tokens=8, return_attention=True)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_allclose(got[-1], ref[-1], atol=1e-5)


@pytest.mark.parametrize("name, precision", [("seed-004", "fp16"), ("demo", "int8")])
def test_variants_and_precisions_verify(tmp_path, name, precision):
    """Pre-normed residual blocks in fp16 (a float16 cache), the trained demo quantized to int8
    (judged by its translations): each verified against eager PyTorch by the export itself. The
    other variants and families: scripts/dynamo_bundles.py."""
    source = "demo" if name == "demo" else save_checkpoint(make_model(name), tmp_path / "ck")
    result = export_bundle(source, tmp_path / "b", precision=precision, exporter="dynamo")
    assert result.manifest.versions["exporter"] == "dynamo" and result.manifest.verification["check"]["passed"]


def test_tensorrt_rtx_builds_the_dynamo_graphs(demo_pair, tmp_path):
    pytest.importorskip("tensorrt_rtx", reason="tensorrt-rtx is not installed (pip install -e '.[dev]')")
    import shutil

    from xform.exporter.engine import BuildOptions, build_engines
    dyn, _, _ = demo_pair
    shutil.copytree(dyn, tmp_path / "b")
    engines = build_engines(tmp_path / "b", "tensorrt_rtx", options=BuildOptions(builder_optimization_level=0),
                            max_batch=4, max_new_tokens=16)
    assert set(engines) == {"encoder.tensorrt_rtx", "decoder.tensorrt_rtx", "reorder.tensorrt_rtx"}


def test_the_dynamo_exporter_needs_opset_18_and_onnxscript(tmp_path, monkeypatch):
    r = CliRunner().invoke(main, ["export", "demo", "-o", str(tmp_path / "b"), "--exporter", "dynamo",
                                  "--opset", "17"])
    assert r.exit_code == 1 and "--opset 17 is too old; xform needs opset 18 or newer with --exporter dynamo" \
        in r.output, r.output
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if not installed
    with pytest.raises(XformError, match=r"--exporter dynamo needs onnxscript: pip install 'xform\[dynamo\]'"):
        export_bundle("demo", tmp_path / "c", exporter="dynamo")
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()
