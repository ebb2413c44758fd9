"""Export: every variant exports, its graphs equal eager on ORT, the bundle is complete and atomic."""
import json

import numpy as np
import onnx
import pytest
import torch

from tests.conftest import make_model, padded_batch
from tests.variants import VARIANTS
from xform.contract import DECODER, ENCODER
from xform.errors import BundleError, ToleranceError, XformError
from xform.exporter import export as export_mod
from xform.exporter.export import export_bundle
from xform.models.checkpoint import save_checkpoint
from xform.models.transformer import greedy_decode
from xform.runtime.bundle import Bundle


@pytest.fixture(scope="module")
def variant_bundles(tmp_path_factory):
    out = {}
    for name in sorted(VARIANTS):
        ck = tmp_path_factory.mktemp("ck") / name
        save_checkpoint(make_model(name, seed=1), ck)
        out[name] = (ck, export_bundle(ck, tmp_path_factory.mktemp("b") / name).path)
    return out


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_exports_and_decodes_with_parity(variant_bundles, variant):
    import xform
    ck, bundle = variant_bundles[variant]
    model = make_model(variant, seed=1)
    session = xform.load(bundle, backend="ort")
    for lengths in ([11, 3, 7], [5], [2, 9, 9, 1, 4]):
        src, lens = padded_batch(model.cfg, lengths, seed=len(lengths))
        got = session.generate(src, max_new_tokens=14, min_new_tokens=2)
        ref = greedy_decode(model, torch.from_numpy(src), torch.from_numpy(lens), 14, 2).numpy()
        np.testing.assert_array_equal(got, ref)
    report = xform.check(bundle, session=session, batch=3, src_len=9, max_new_tokens=10)
    assert report.passed and report.identical_tokens and report.max_abs_err < 1e-4


def test_manifest_records_the_contract(tiny_bundle):
    manifest = json.loads((tiny_bundle / "manifest.json").read_text())
    assert manifest["version"] == 4 and manifest["precision"] == "fp32" and manifest["opset"] == 17
    # decoder_beam.onnx (the fused beam step) has no data file: its weights are decoder.onnx.data's
    assert set(manifest["files"]) == {"encoder.onnx", "decoder.onnx", "encoder.onnx.data", "decoder.onnx.data", "reorder.onnx", "candidates.onnx",
                                      "decoder_beam.onnx", "reference/config.json", "reference/model.safetensors"}
    assert manifest["model"]["source"]["kind"] == "xform-checkpoint"
    assert len(manifest["model"]["source"]["sha256"]) == 64
    for k in ("torch", "onnx", "xform"):
        assert manifest["versions"][k]
    v = manifest["verification"]
    assert v["greedy_tokens_identical"] and v["decoder_past0_max_abs_err"] < 1e-4 and v["decoder_past2_group2_max_abs_err"] < 1e-4
    assert v["decoder_beam_max_abs_err"] < 1e-4


def test_graphs_have_contract_names_and_dynamic_axes(tiny_bundle):
    bundle = Bundle.open(tiny_bundle)
    for graph in (ENCODER, DECODER):
        spec = bundle.graph_spec(graph)
        m = onnx.load(str(bundle.graph_file(graph)))
        assert [i.name for i in m.graph.input] == spec.input_names
        assert [o.name for o in m.graph.output] == spec.output_names
        for vi, t in zip(m.graph.input, spec.inputs):
            dims = [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
            assert dims == list(t.shape), (t.name, dims)
    dec = onnx.load(str(bundle.graph_file(DECODER)))
    assert not any(n.op_type in ("If", "Loop") for n in dec.graph.node)
    # the greedy choice is in the graph: each row's best 2 + n (TopK, n the never-generated ids),
    # then the first allowed of them: no Where or ArgMax over (rows, vocab) (issue 44)
    made = {o: n for n in dec.graph.node for o in n.output}
    topk = [n for n in dec.graph.node if n.op_type == "TopK"]
    assert len(topk) == 1 and topk[0].input[0] == "logits"  # the projection's output, unsuppressed
    argmax = [n for n in dec.graph.node if n.op_type == "ArgMax"]
    assert len(argmax) == 1 and made[argmax[0].input[0]].op_type == "Where"
    assert topk[0].output[0] in made[argmax[0].input[0]].input  # over TopK's values, not the vocabulary
    assert not any("logits" in n.input for n in dec.graph.node if n.op_type in ("Where", "Add", "ArgMax"))
    # 3 decoder layers: logits, next ids, 3 x (key, value)
    assert len(dec.graph.output) == 2 + 2 * 3


@pytest.mark.parametrize("output_bias", [True, False])
def test_tied_embedding_stored_once_in_decoder(tmp_path, output_bias):
    """With or without an output bias (Marian has one, M2M100 / NLLB none): no transposed copy."""
    ck = tmp_path / "ck"
    save_checkpoint(make_model("marian", output_bias=output_bias), ck)
    bundle = export_bundle(ck, tmp_path / "b").path
    dec = onnx.load(str(bundle / "decoder.onnx"))
    big = [i for i in dec.graph.initializer if list(i.dims) in ([37, 48], [48, 37])]
    assert len(big) == 1, [(i.name, list(i.dims)) for i in big]


def test_refuses_to_overwrite_without_force(tiny_bundle, checkpoint_dir):
    before = (tiny_bundle / "manifest.json").read_text()
    with pytest.raises(BundleError, match="already exists; pass --force"):
        export_bundle(checkpoint_dir, tiny_bundle)
    assert (tiny_bundle / "manifest.json").read_text() == before


def test_force_replaces(tmp_path, checkpoint_dir):
    out = tmp_path / "b"
    export_bundle(checkpoint_dir, out)
    (out / "engines").mkdir()  # what a build-engine killed before its manifest leaves: xform's, replaced
    (out / "engines" / "decoder.tensorrt_rtx.0123456789ab.engine").write_bytes(b"x")
    export_bundle(checkpoint_dir, out, force=True)
    assert not (out / "engines").exists()
    Bundle.open(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_tolerance_failure_fails_and_leaves_nothing(tmp_path, checkpoint_dir, monkeypatch):
    from xform.runtime.compare import Tolerance
    monkeypatch.setattr(export_mod, "tolerance_for", lambda p, **_: Tolerance(0.0, 0.0, 1.0, "impossible"))
    with pytest.raises(ToleranceError, match="exceeds atol 0"):
        export_bundle(checkpoint_dir, tmp_path / "b")
    assert list(tmp_path.iterdir()) == []


def test_nan_weights_are_refused_by_the_tensor_that_holds_them(tmp_path):
    """Weights holding NaN / inf are named, with their counts, before any graph is exported (they
    were reported as "NaN or inf in the ONNX Runtime result" of a graph, issue 55)."""
    from xform.errors import CheckpointError
    model = make_model("seed-002")
    with torch.no_grad():
        model.decoder_layers[0].ffn.fc1.weight[0, :3] = float("nan")
        model.encoder_layers[1].ffn.fc2.bias[0] = float("inf")
    ck = tmp_path / "ck"
    save_checkpoint(model, ck)
    with pytest.raises(CheckpointError) as e:
        export_bundle(ck, tmp_path / "b")
    said = str(e.value)
    assert "weight decoder_layers.0.ffn.fc1.weight (72, 48) holds 3 NaN values" in said, said
    assert "weight encoder_layers.1.ffn.fc2.bias (48,) holds 1 inf value" in said and "ONNX Runtime" not in said
    assert not (tmp_path / "b").exists()


def test_an_empty_directory_is_taken_without_force(tmp_path, checkpoint_dir):
    """-o an existing empty directory: nothing in it to lose, so it is written without --force (it
    was refused as "already exists; pass --force to replace the bundle", issue 55)."""
    out = tmp_path / "b"
    out.mkdir()
    export_bundle(checkpoint_dir, out)
    Bundle.open(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]
    with pytest.raises(BundleError, match="already exists; pass --force"):  # a bundle now: --force replaces it
        export_bundle(checkpoint_dir, out)


def test_unknown_precision_and_old_opset(tmp_path, checkpoint_dir):
    with pytest.raises(XformError, match="--precision 'fp8'"):
        export_bundle(checkpoint_dir, tmp_path / "b", precision="fp8")
    with pytest.raises(XformError, match="--opset 13 is too old"):
        export_bundle(checkpoint_dir, tmp_path / "b", opset=13)
    assert list(tmp_path.iterdir()) == []


def test_a_graph_traced_with_external_data_is_gathered_into_the_bundle_layout(tiny_bundle, tmp_path):
    """A graph over protobuf's 2 GB comes out of the exporter as one file per tensor (external
    data); export_graph moves them, streamed, into one page-aligned <name>.onnx.data that ONNX
    Runtime reads to the same numbers. Stood in for here by the tiny decoder saved the same way."""
    import onnxruntime as ort

    from xform.exporter.external_data import ALIGN, gather_external_data
    source = tmp_path / "trace"
    source.mkdir()
    proto = onnx.load(str(tiny_bundle / "decoder.onnx"))  # with its data
    onnx.save_model(proto, str(source / "decoder.onnx"), save_as_external_data=True, all_tensors_to_one_file=False,
                    size_threshold=0, convert_attribute=True)  # Constant values too, as torch writes them
    split = onnx.load(str(source / "decoder.onnx"), load_external_data=False)
    assert sum(t.data_location == onnx.TensorProto.EXTERNAL for t in split.graph.initializer) > 10
    out = tmp_path / "bundle" / "decoder.onnx"
    out.parent.mkdir()
    gather_external_data(split, source, out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["decoder.onnx", "decoder.onnx.data"]
    gathered = onnx.load(str(out), load_external_data=False)
    offsets = [int(e.value) for t in gathered.graph.initializer for e in t.external_data if e.key == "offset"]
    assert offsets and all(o % ALIGN == 0 for o in offsets)
    feeds, runs = None, []
    for path in (tiny_bundle / "decoder.onnx", out):
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        if feeds is None:
            rng = np.random.default_rng(0)
            feeds = {}
            for i in sess.get_inputs():
                shape = [d if isinstance(d, int) else 2 for d in i.shape]
                feeds[i.name] = (np.zeros(shape, np.int64) + 1 if "int64" in i.type else
                                 rng.normal(0, 1, shape).astype(np.float32))
            feeds["positions"] = np.ones(2, np.int64)
        runs.append(sess.run(None, feeds))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
