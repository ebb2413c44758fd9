"""fp16 export: fp16 weights / matmuls / K/V, LayerNorm + softmax + logits in fp32, checked on ORT."""
import random

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import xform
from tests.conftest import make_model
from xform.exporter.export import export_bundle
from xform.models.checkpoint import save_checkpoint
from xform.runtime.text.translator import Translator


@pytest.fixture(scope="module")
def fp16_bundles(tmp_path_factory):
    out = {}
    for name in ("seed-001", "marian", "seed-000"):
        ck = tmp_path_factory.mktemp("ck") / name
        save_checkpoint(make_model(name, seed=2), ck)
        out[name] = export_bundle(ck, tmp_path_factory.mktemp("b16") / name, precision="fp16").path
    return out


def typed_graph(path):
    m = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    types = {v.name: v.type.tensor_type.elem_type for v in (*m.graph.value_info, *m.graph.input, *m.graph.output)}
    types.update({i.name: i.data_type for i in m.graph.initializer})
    return m, types


@pytest.mark.parametrize("variant", ["seed-001", "marian", "seed-000"])
def test_fp16_graph_precision_plan(fp16_bundles, variant):
    bundle = fp16_bundles[variant]
    vocab = make_model(variant).cfg.tgt_vocab_size
    for graph in ("encoder", "decoder"):
        m, types = typed_graph(bundle / f"{graph}.onnx")
        for node in m.graph.node:
            if node.op_type in ("LayerNormalization", "Softmax"):
                assert types[node.input[0]] == TensorProto.FLOAT, (graph, node.name)
        big_fp16 = [i for i in m.graph.initializer if i.data_type == TensorProto.FLOAT16 and len(i.dims) == 2]
        assert big_fp16, f"{graph}: no fp16 weight matrices"
        # the one fp32 matrix allowed is the output projection table (vocab x d_model)
        fp32_mats = [list(i.dims) for i in m.graph.initializer if i.data_type == TensorProto.FLOAT and len(i.dims) == 2]
        assert all(sorted(d) == sorted([vocab, 48]) for d in fp32_mats), (graph, fp32_mats)
        assert len(fp32_mats) <= 1
        kv = [o for o in m.graph.output if "key" in o.name or "value" in o.name]
        assert all(o.type.tensor_type.elem_type == TensorProto.FLOAT16 for o in kv)
    _, types = typed_graph(bundle / "decoder.onnx")
    assert types["logits"] == TensorProto.FLOAT and types["src_mask"] == TensorProto.FLOAT


def test_fp16_tied_table_stored_once_in_fp32(fp16_bundles):
    dec = onnx.load(str(fp16_bundles["marian"] / "decoder.onnx"))
    tables = [i for i in dec.graph.initializer if sorted(i.dims) == [37, 48]]
    assert len(tables) == 1 and tables[0].data_type == TensorProto.FLOAT


@pytest.mark.parametrize("variant", ["seed-001", "marian", "seed-000"])
def test_fp16_check_passes_with_fp16_tolerance(fp16_bundles, variant):
    session = xform.load(fp16_bundles[variant], backend="ort")
    report = xform.check(fp16_bundles[variant], session=session, batch=6, src_len=10, max_new_tokens=16)
    assert report.passed and report.precision == "fp16"
    assert report.max_rel_err < 1e-2 and report.token_agreement >= 0.99
    assert report.rtol == 1e-2 and report.atol == 0.0
    # the fp16 tolerance is not vacuous: the same figures fail at fp32's
    strict = xform.check(fp16_bundles[variant], session=session, batch=6, src_len=10, max_new_tokens=16,
                         atol=1e-4, rtol=0.0)
    assert not strict.passed


def test_demo_fp16_keeps_token_agreement(tmp_path):
    sys_path_words()
    from train_demo import to_words
    rng = random.Random(5)
    texts = [str(rng.randrange(10 ** 6)) for _ in range(150)] + ["0", "7", "40512", "999999"]
    (tmp_path / "dev.txt").write_text("\n".join(texts[:40]) + "\n")  # judged on sentences, as int8 is
    exported = export_bundle("demo", tmp_path / "d16", precision="fp16", sample_file=tmp_path / "dev.txt")
    bundle = exported.path
    assert exported.manifest.tolerance["judged_on"] == "--sample-file dev.txt (40 sources)"
    judged = exported.manifest.verification["check"]
    assert judged["sources"] == "sentences" and judged["passed"] and judged["bleu_vs_eager"] > 95
    session = xform.load(bundle, backend="ort")
    report = xform.check(bundle, session=session, texts=texts)
    assert report.passed and report.token_agreement >= 0.99 and report.tokens_compared > 1000
    translations = Translator(session).translate(texts)
    exact = np.mean([t == to_words(int(s)) for s, t in zip(texts, translations)])
    assert exact >= 0.99
    from click.testing import CliRunner

    from xform.cli import main
    r = CliRunner().invoke(main, ["run", str(bundle), "--input-file", str(tmp_path / "dev.txt"), "--check"])
    assert r.exit_code == 0 and "given sentences" in r.output and "BLEU / chrF vs eager" in r.output, r.output


def sys_path_words():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
