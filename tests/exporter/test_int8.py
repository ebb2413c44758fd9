"""int8 export: ONNX Runtime dynamic quantization, checked against eager with its own tolerance."""
import json
import random
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import xform
from xform.errors import ToleranceError
from xform.exporter import export
from xform.exporter.export import export_bundle
from xform.exporter.graphs import save_with_external_data
from xform.runtime.compare import decoded

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
    for graph in ("encoder", "decoder"):  # the data file holds the graph's tensors, no dead bytes
        m = onnx.load(str(demo8 / f"{graph}.onnx"), load_external_data=False)
        ends = [int(e.value) for t in m.graph.initializer for e in t.external_data if e.key in ("offset", "length")]
        used = max(int(o) + int(n) for o, n in zip(ends[0::2], ends[1::2]))
        assert (demo8 / f"{graph}.onnx.data").stat().st_size == used, graph


def test_demo_int8_token_agreement_and_logit_bound(demo8):
    session = xform.load(demo8, backend="ort")
    rng = random.Random(7)
    texts = [str(rng.randrange(10 ** 6)) for _ in range(150)] + ["0", "7", "40512"]
    report = xform.check(demo8, session=session, texts=texts)
    assert report.passed and report.precision == "int8"
    assert report.token_agreement >= 0.90 and report.max_rel_err <= 0.1 and report.tokens_compared > 1000
    exact = np.mean([t == to_words(int(s)) for s, t in zip(texts, session.translate(texts))])
    assert exact >= 0.90
    # judged by its translations: whole decodes against eager's, eager's tokens' log-probs under both
    assert report.judged_by == "decodes" and report.decodes_compared == len(texts)
    assert report.decode_agreement >= 0.90 and abs(report.logprob_drop) < 0.10
    assert report.max_abs_err > 1e-2  # logits differ by far more than fp32's tolerance: reported, not judged


def damage_weight_scales(factor: float, output_only: bool = False):
    """quantize_graph, then int8 weights' scales multiplied by `factor` (weights off by a scale):
    every weight's, or only the output projection's (the decoder's last MatMul)."""
    real = export.quantize_graph

    def damaged(fp32, out):
        real(fp32, out)
        m = onnx.load(str(out))
        matmuls = [n for n in m.graph.node if n.op_type == "MatMulInteger"]
        names = {matmuls[-1].input[1].removesuffix("_quantized") + "_scale"} if "decoder" in out.name else set()
        for init in m.graph.initializer:
            if init.name.endswith("_scale") and init.data_type == onnx.TensorProto.FLOAT and (
                    not output_only or init.name in names):
                arr = onnx.numpy_helper.to_array(init) * np.float32(factor)
                init.CopyFrom(onnx.numpy_helper.from_array(arr.astype(np.float32), init.name))
        save_with_external_data(m, out)
    return damaged


def test_logits_off_by_a_third_with_unchanged_translations_export(tmp_path, monkeypatch):
    """The output projection's scale x 1.35: every logit 35% off (the logit rule at 10% of the scale
    refused this), every argmax and so every greedy translation unchanged: judged by translations,
    it exports, and its logit error is reported."""
    monkeypatch.setattr(export, "quantize_graph", damage_weight_scales(1.35, output_only=True))
    result = export_bundle("demo", tmp_path / "sharper", precision="int8")
    check = result.manifest.verification["check"]
    assert check["max_rel_err"] > 0.15 and check["decode_agreement"] >= 0.95


def test_damaged_quantization_is_refused_with_its_figures(tmp_path, monkeypatch):
    monkeypatch.setattr(export, "quantize_graph", damage_weight_scales(4.0))
    with pytest.raises(ToleranceError) as e:
        export_bundle("demo", tmp_path / "damaged", precision="int8")
    msg = str(e.value)
    assert "translate unlike eager PyTorch" in msg and "over 64 sources" in msg and "needed 90%" in msg
    agreement = float(msg.split("whole decodes ")[1].split("%")[0])
    assert agreement < 90.0
    assert not (tmp_path / "damaged").exists()  # nothing half-written is left


@pytest.mark.parametrize("name", ["swish-scaled", "relu-separate-vocab"])
def test_trained_marians_export_int8_and_translate_like_transformers(marians, tmp_path, name):
    """The trained test Marian models export at int8 and their int8 greedy tokens equal transformers'."""
    import torch

    from tests.marian_fixtures import sources
    directory, model, _ = marians[name]
    pytest.importorskip("transformers")
    result = export_bundle(directory, tmp_path / name, precision="int8")
    check = result.manifest.verification["check"]
    assert check["judged_by"] == "decodes" and check["decode_agreement"] >= 0.90
    assert result.manifest.tolerance["judged_by"] == "decodes"
    src, mask = sources(model.config, [9, 4, 7, 3, 8, 5], seed=3)
    with torch.no_grad():
        want = model.generate(src, attention_mask=mask, num_beams=1, do_sample=False, max_new_tokens=12)[:, 1:]
    got = xform.load(result.path, backend="ort").generate(src.numpy(), max_new_tokens=12)
    eos, pad = model.config.eos_token_id, model.config.pad_token_id
    same = [decoded(g, eos, pad) == decoded(w, eos, pad) for g, w in zip(got, want.numpy())]
    assert sum(same) >= 5, (got, want)  # at most one of six translations differs anywhere


def test_check_on_an_int8_bundle_reports_the_translation_figures(demo8, tmp_path):
    from click.testing import CliRunner

    from xform.cli import main
    js = tmp_path / "check.json"
    r = CliRunner().invoke(main, ["run", str(demo8), "--check", "--num-beams", "3", "--json", str(js)])
    assert r.exit_code == 0, r.output
    for row in ("decodes alike (edits)", "decodes identical", "log-prob drop", "nats/tok", "check passed"):
        assert row in r.output
    check = json.loads(js.read_text())["check"]
    assert check["judged_by"] == "decodes" and check["decodes_compared"] == 64 and check["strategy"] == "beam"
    assert check["decode_agreement"] >= 0.9 and check["passed"]


def test_quantizing_keeps_the_callers_logging_setting(tiny_bundle, tmp_path):
    """The quantizer's advice is silenced during quantization only: a caller's own
    logging.disable level is what it was afterwards (it used to be reset to NOTSET)."""
    import logging
    import shutil
    shutil.copyfile(tiny_bundle / "encoder.onnx", tmp_path / "e32.onnx")
    shutil.copyfile(tiny_bundle / "encoder.onnx.data", tmp_path / "encoder.onnx.data")  # the name it refers to
    before = logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        export.quantize_graph(tmp_path / "e32.onnx", tmp_path / "e8.onnx")
        assert logging.root.manager.disable == logging.ERROR
    finally:
        logging.disable(before)
    assert (tmp_path / "e8.onnx").is_file() and not (tmp_path / "e32.onnx").exists()
