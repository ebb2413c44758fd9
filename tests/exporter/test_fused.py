"""The fused decoder graphs (exporter/fused.py): attention as com.microsoft MultiHeadAttention, the
self-attention's projections as one MatMul, residual Add + LayerNormalization as
SkipLayerNormalization. Exported beside the plain graph of the same model and run on ONNX Runtime's
CPU provider with the same inputs, every output agrees (fp32 within 1e-5, fp16 within 1e-2 of the
outputs' scale), at shapes other than the trace's: one row and many, beams and samples (g = 2, 3
rows per source), rows at their own positions in a cache longer than any, padded sources; post- and
pre-norm, T5-like (relative position bias past its max distance, unscaled attention, RMS norm) and
bias-free configs. The graphs hold the fused ops (so the comparison cannot pass on a plain graph)
and the contract's inputs and outputs exactly; a wrong scale, swapped keys and values, or the
present outputs dropped (ORT's CPU kernel then ignores the past) fail the comparison.
The CPU provider has no fp16 MultiHeadAttention kernel: it runs the fp16 graphs' nodes in fp32
through Casts it inserts, so the fp16 kernels' own numbers are for a GPU to check."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from tests.conftest import make_model, padded_batch
from xform.contract import DECODER, DECODER_BEAM, ENCODER, RESTRICTED, signature_for
from xform.errors import XformError
from xform.exporter.fused import FUSIONS, check_fusions, fused_export, node_counts, tensor_types
from xform.exporter.graphs import export_graph
from xform.models.transformer import EncoderOutput, to_fp16

T5_LIKE = dict(norm_kind="rms", norm_position="pre", final_norm=True, norm_bias=False, attn_bias=False,
               ffn_bias=False, scale_attention=False, scale_output=True, positions="relative",
               relative_attention_buckets=8, relative_attention_max_distance=10, ffn_gated=True,
               activation="gelu_tanh", share_embeddings=True, tgt_vocab_size=37, tie_output=True,
               fp32_ffn_output=True, attention_head_dim=12, pad_id=0, bos_id=0, eos_id=1, decoder_start_id=0)
CONFIGS = {  # tests/variants.py's tiny sizes: d_model 48, 3 heads, 2 encoder and 3 decoder layers
    "post-norm": ("seed-002", {}),  # post-LN, attention and FFN biases, scaled embeddings
    "pre-norm": ("seed-001", {}),  # pre-LN, GELU: the residual sum is read past each norm
    "t5-like": ("seed-002", T5_LIKE),  # inner width 36 != d_model
    "bias-free": ("seed-003", {}),  # bias-free attention 3 x 12 wide
}
ALL = ",".join(FUSIONS)
# (sources, rows per source, cache capacity, source lengths): capacities past the T5-like bias's
# max distance (10), a source of its end-of-sentence only
CASES = [(1, 1, 4, [5]), (3, 2, 13, [9, 4, 1]), (2, 3, 17, [12, 6])]
FP32_ATOL = 1e-5
FP16_RTOL = 1e-2  # of the largest output magnitude: the fp16 bundles' tolerance (runtime/compare.py)


def model_for(config: str):
    name, overrides = CONFIGS[config]
    return make_model(name, seed=3, **overrides)


def export_pair(model, graph, tmp, tag, fusions=ALL, attention_layer=None, kv_dtype="float32"):
    """The plain and the fused graph of `model`; returns their paths and the fused graph's counts."""
    spec = signature_for(model.cfg.to_dict(), kv_dtype, attention=attention_layer is not None)[graph]
    plain, fused = tmp / f"{tag}-plain.onnx", tmp / f"{tag}-fused.onnx"
    export_graph(model, graph, spec, plain, 17, attention_layer)
    export_graph(model, graph, spec, fused, 17, attention_layer, fusions=check_fusions(fusions))
    return plain, fused, node_counts(onnx.load(str(fused), load_external_data=False))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Per config: the fp32 model, and the plain / fused decoder graphs at fp32 (all fusions, and
    attention alone) and fp16 (all fusions)."""
    out = {}
    for config in CONFIGS:
        tmp = tmp_path_factory.mktemp(config)
        model = model_for(config)
        plain, fused, counts = export_pair(model, DECODER, tmp, "fp32")
        _, attention_only, attention_counts = export_pair(model, DECODER, tmp, "attention", "attention")
        plain16, fused16, counts16 = export_pair(to_fp16(model), DECODER, tmp, "fp16", kv_dtype="float16")
        out[config] = dict(model=model, plain=plain, fused=fused, counts=counts, attention_counts=attention_counts,
                           attention_only=attention_only, plain16=plain16, fused16=fused16, counts16=counts16)
    return out


def session(path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def feeds(model, sources, group, capacity, lengths, dtype=np.float32, seed=0):
    """Every input a decoder graph may take: R = sources x group rows at their own positions (the
    first at 0, an empty cache; the second at capacity - 1, a full one), noise in the cache
    (masked past each row's position, whatever it holds), the encoder's cross K/V and mask of
    padded sources."""
    cfg = model.cfg
    rng = np.random.default_rng(seed)
    src, lens = padded_batch(cfg, lengths, seed)
    with torch.no_grad():
        enc = model.encode(torch.from_numpy(src), torch.from_numpy(lens))
    rows = sources * group
    positions = rng.integers(0, capacity, rows)
    positions[:2] = [0, capacity - 1][:rows]
    weight, bias = model.output_table()
    subset = np.arange(2, cfg.tgt_vocab_size, 3)
    f = {"input_ids": rng.integers(3, cfg.tgt_vocab_size, (rows, 1)), "min_new_tokens": np.full(rows, 2),
         "positions": positions, "num_candidates": np.array([3]), "src_mask": enc.src_mask.numpy(),
         "out_weight": weight.numpy()[subset], "out_bias": bias.numpy()[subset]}
    for i, (k, v) in enumerate(enc.cross_kv):
        f[f"cross_key_{i}"], f[f"cross_value_{i}"] = k.numpy().astype(dtype), v.numpy().astype(dtype)
        for kind in ("key", "value"):
            f[f"cache_{kind}_{i}"] = rng.standard_normal((rows, cfg.n_heads, capacity, cfg.head_dim)).astype(dtype)
    return {k: v.astype(np.int64) if v.dtype.kind == "i" else v for k, v in f.items()}


def run(path, f) -> dict[str, np.ndarray]:
    s = session(path)
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, {i.name: f[i.name] for i in s.get_inputs()})))


def worst(plain: dict, fused: dict, ids=("next_ids", "cand_ids")) -> float:
    """The largest difference of the float outputs; the id outputs must be equal."""
    assert plain.keys() == fused.keys()
    for name in ids:
        if name in plain:
            np.testing.assert_array_equal(fused[name], plain[name], err_msg=name)
    return max(float(np.abs(fused[k].astype(np.float64) - plain[k]).max()) for k in plain if k not in ids)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_fp32_fused_graph_equals_plain(exported, config):
    e = exported[config]
    for sources, group, capacity, lengths in CASES:
        f = feeds(e["model"], sources, group, capacity, lengths)
        plain = run(e["plain"], f)
        for fused in (e["fused"], e["attention_only"]):
            err = worst(plain, run(fused, f))
            print(f"{config} fp32 {sources}x{group} rows, capacity {capacity}: max abs err {err:.2e}")
            assert err <= FP32_ATOL


@pytest.mark.parametrize("config", list(CONFIGS))
def test_fp16_fused_graph_equals_plain(exported, config):
    """The fp16 graphs: MultiHeadAttention's fp16 node runs on the CPU provider through Casts that
    ONNX Runtime inserts (its CPU kernel is fp32 only), SkipLayerNormalization in fp16 (computed in
    fp32 inside, gamma and beta rounded to fp16). Greedy ids may differ only between near-equal logits."""
    e = exported[config]
    for sources, group, capacity, lengths in CASES:
        f = feeds(e["model"], sources, group, capacity, lengths, np.float16)
        plain, fused = run(e["plain16"], f), run(e["fused16"], f)
        for name in plain:
            if name == "next_ids":
                continue
            scale = float(np.abs(plain[name].astype(np.float32)).max())
            err = float(np.abs(fused[name].astype(np.float32) - plain[name]).max())
            print(f"{config} fp16 {sources}x{group} {name}: max abs err {err:.2e} (scale {scale:.2f})")
            assert err <= FP16_RTOL * scale, name
        logits, ids = plain["logits"], (plain["next_ids"], fused["next_ids"])
        for r in np.flatnonzero(ids[0] != ids[1]):
            assert abs(logits[r, ids[0][r]] - logits[r, ids[1][r]]) <= FP16_RTOL * np.abs(logits).max()


@pytest.mark.parametrize("config", list(CONFIGS))
def test_graphs_hold_the_fused_ops_and_the_contract(exported, config):
    e = exported[config]
    n = e["model"].cfg.n_decoder_layers
    plain, fused = onnx.load(str(e["plain"])), onnx.load(str(e["fused"]))
    counts, attention_only = e["counts"], e["attention_counts"]
    norms = sum(node.op_type == "LayerNormalization" for node in plain.graph.node)
    assert counts["MultiHeadAttention"] == 2 * n == attention_only["MultiHeadAttention"] == e["counts16"][
        "MultiHeadAttention"]
    assert "Softmax" not in counts and "Softmax" in [node.op_type for node in plain.graph.node]
    assert attention_only["MatMul"] - counts["MatMul"] == 2 * n and counts["Split"] == n  # qkv: one MatMul of three
    if config == "t5-like":  # RMS norms are no LayerNormalization: nothing to fuse
        assert norms == 0 and "SkipLayerNormalization" not in counts
    else:
        assert counts["SkipLayerNormalization"] == e["counts16"]["SkipLayerNormalization"] == norms > 0
        assert "LayerNormalization" not in counts and "LayerNormalization" not in e["counts16"]
    computing = lambda c: c["nodes"] - c.get("Constant", 0)  # noqa: E731
    assert computing(counts) <= computing(attention_only) < computing(node_counts(plain))
    pairs = ((plain, fused, "float32"), (onnx.load(str(e["plain16"])), onnx.load(str(e["fused16"])), "float16"))
    for a, b, kv in pairs:
        assert_same_contract(a, b, signature_for(e["model"].cfg.to_dict(), kv)[DECODER])
    for path in (e["fused"], e["fused16"]):  # what export_bundle's check_graph asks of every graph
        onnx.checker.check_model(str(path), full_check=True)
    # fp16: the attention itself is fp16 (its query and its bias), as the CUDA provider runs it
    fused16 = onnx.load(str(e["fused16"]))
    types = tensor_types(fused16)
    for node in fused16.graph.node:
        if node.op_type == "MultiHeadAttention":
            assert types[node.input[0]][0] == types[node.input[5]][0] == onnx.TensorProto.FLOAT16


def declared(value) -> tuple[str, int, list]:
    t = value.type.tensor_type
    return value.name, t.elem_type, [d.dim_param or d.dim_value for d in t.shape.dim]


def assert_same_contract(plain, fused, spec):
    """The fused graph declares its inputs and outputs as the contract has them; the plain graph
    the same names, dtypes and named axes, and the same fixed sizes but where its exporter left a
    size it lost unnamed (a name of its own making: the logits' vocabulary)."""
    for graph, tensors in ((fused, (*spec.inputs, *spec.outputs)), (plain, (*spec.inputs, *spec.outputs))):
        values = [declared(v) for v in (*graph.graph.input, *graph.graph.output)]
        assert [(name, onnx.helper.tensor_dtype_to_np_dtype(t).name) for name, t, _ in values] == [
            (t.name, t.dtype) for t in tensors]
        for (name, _, dims), t in zip(values, tensors):
            if graph is fused:
                assert dims == list(t.shape), name
            else:
                assert len(dims) == len(t.shape) and all(
                    d == s or (isinstance(s, int) and isinstance(d, str) and name in d)
                    for d, s in zip(dims, t.shape)), (name, dims, t.shape)


def test_other_decoder_graphs_and_the_recorded_layer(tmp_path):
    """The fused beam step and the restricted decoder equal theirs; with --with-attention the
    recorded layer's cross-attention stays plain (its probabilities are an output) and equal."""
    model = model_for("post-norm")
    n = model.cfg.n_decoder_layers
    for graph in (DECODER_BEAM, RESTRICTED):
        plain, fused, counts = export_pair(model, graph, tmp_path, graph)
        assert counts["MultiHeadAttention"] == 2 * n
        for case in CASES:
            assert worst(run(plain, feeds(model, *case)), run(fused, feeds(model, *case))) <= FP32_ATOL
    plain, fused, counts = export_pair(model, DECODER, tmp_path, "with-attention", attention_layer=1)
    assert counts["MultiHeadAttention"] == 2 * n - 1
    for case in CASES:
        got, want = run(fused, feeds(model, *case)), run(plain, feeds(model, *case))
        assert "attention" in got and worst(want, got) <= FP32_ATOL


@pytest.mark.parametrize("fusions", ["self_attention", "cross_attention,skip_layer_norm"])
def test_each_attention_fuses_alone(tmp_path, fusions):
    """Self- and cross-attention fuse apart (the self-attention's node copies the cache into its
    presents, the cross-attention's copies nothing: a bundle may want one without the other)."""
    model = model_for("pre-norm")
    plain, fused, counts = export_pair(model, DECODER, tmp_path, "one", fusions)
    n = model.cfg.n_decoder_layers
    assert counts["MultiHeadAttention"] == n and counts["Softmax"] == n
    nodes = onnx.load(str(fused)).graph.node
    past = sum(len(node.input) == 8 for node in nodes if node.op_type == "MultiHeadAttention")
    assert past == (n if fusions == "self_attention" else 0)
    assert ("SkipLayerNormalization" in counts) == ("skip_layer_norm" in fusions)
    for case in CASES:
        assert worst(run(plain, feeds(model, *case)), run(fused, feeds(model, *case))) <= FP32_ATOL


def mutated(path, tmp_path, change) -> str:
    proto = onnx.load(str(path))
    change([node for node in proto.graph.node if node.op_type == "MultiHeadAttention"])
    out = tmp_path / f"mutated-{path.name}"
    onnx.save(proto, str(out))
    return str(out)


def wrong_scale(nodes):
    attr = next(a for a in nodes[0].attribute if a.name == "scale")
    attr.f *= 1.5


def swapped_key_value(nodes):
    cross = next(node for node in nodes if len(node.input) == 6)  # no past: a cross-attention
    cross.input[1], cross.input[2] = cross.input[2], cross.input[1]


def present_dropped(nodes):
    own = next(node for node in nodes if len(node.input) == 8)  # a self-attention over the cache
    del own.output[1:]


@pytest.mark.parametrize("change", [wrong_scale, swapped_key_value, present_dropped])
@pytest.mark.parametrize("config", ["post-norm", "t5-like"])
def test_a_wrong_fused_graph_fails_the_comparison(exported, tmp_path, config, change):
    e = exported[config]
    bad = mutated(e["fused"], tmp_path, change)
    f = feeds(e["model"], *CASES[1])
    plain = run(e["plain"], f)
    assert worst(plain, run(e["fused"], f)) <= FP32_ATOL
    got = run(bad, f)
    assert max(float(np.abs(got[k] - plain[k]).max()) for k in plain if k != "next_ids") > 100 * FP32_ATOL


@pytest.mark.parametrize("config", list(CONFIGS))
def test_fused_step_in_torch_equals_plain(config):
    """The MultiHeadAttention function's own forward (what the trace runs) gives decode_step's numbers
    in torch too, and fused_export leaves the model as it found it."""
    model = model_for(config)
    f = feeds(model, *CASES[2])
    n = model.cfg.n_decoder_layers
    cache = [(torch.from_numpy(f[f"cache_key_{i}"]), torch.from_numpy(f[f"cache_value_{i}"])) for i in range(n)]
    cross = [(torch.from_numpy(f[f"cross_key_{i}"]), torch.from_numpy(f[f"cross_value_{i}"])) for i in range(n)]
    args = (torch.from_numpy(f["input_ids"]), EncoderOutput(cross, torch.from_numpy(f["src_mask"])), cache,
            torch.from_numpy(f["positions"]))
    with torch.no_grad():
        want = model.decode_step(*args)
        with fused_export(model, ["attention", "qkv"]) as chosen:
            assert chosen == ("self_attention", "cross_attention", "qkv")
            got = model.decode_step(*args)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=FP32_ATOL)
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=FP32_ATOL)
    assert not any("step" in vars(layer) for layer in model.decoder_layers)


def test_fused_export_restores_the_model_and_refuses_nesting():
    model = model_for("post-norm")
    with pytest.raises(RuntimeError, match="inside"):
        with fused_export(model, "attention"):
            assert all("step" in vars(layer) for layer in model.decoder_layers)
            with pytest.raises(XformError, match="already fused"):
                with fused_export(model, "attention"):
                    pass
            raise RuntimeError("inside")
    assert not any("step" in vars(layer) for layer in model.decoder_layers)


@pytest.mark.parametrize("given, expected", [
    (None, ()), ("", ()), ("attention", ("self_attention", "cross_attention")),
    (" skip_layer_norm , cross_attention ", ("cross_attention", "skip_layer_norm")),
    (["qkv", "attention"], ("self_attention", "cross_attention", "qkv")),
    ("qkv,self_attention", ("self_attention", "qkv")),
    (ALL, tuple(FUSIONS)),
])
def test_fusion_lists(given, expected):
    assert check_fusions(given) == expected


@pytest.mark.parametrize("given, words", [
    ("flash", ["--fuse 'flash'", "no such fusion", "self_attention, cross_attention, qkv, skip_layer_norm, attention"]),
    ("attention,attention", ["--fuse", "'attention' is given 2 times"]),
    ("qkv", ["--fuse qkv", "'qkv' goes with 'self_attention'", "missing"]),
    ("cross_attention,qkv", ["--fuse cross_attention,qkv", "'qkv' goes with 'self_attention'"]),
    (["attention", 3], ["--fuse", "expected fusion names", "found 3 (int)"]),
    (7, ["--fuse", "expected fusion names", "found 7 (int)"]),
])
def test_fusion_list_errors(given, words):
    with pytest.raises(XformError) as e:
        check_fusions(given)
    for word in words:
        assert word in str(e.value), str(e.value)


def test_only_decoder_graphs_fuse(tmp_path):
    model = model_for("post-norm")
    spec = signature_for(model.cfg.to_dict())[ENCODER]
    with pytest.raises(XformError, match="--fuse applies to the decoder graphs .* not 'encoder' by torchscript"):
        export_graph(model, ENCODER, spec, tmp_path / "encoder.onnx", 17, fusions=("self_attention",))


def test_fp16_norms_fuse_when_the_trace_shares_equal_weights(tmp_path):
    """A fresh model's LayerNorms hold equal gammas (ones) and betas (zeros): the trace keeps one
    initializer and puts Identity nodes in front of the others. The fp16 fusion follows them: every
    norm fuses (on Marian-base fp16 one of 18 did before), and the outputs equal the plain graph's."""
    model = model_for("post-norm")
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            torch.nn.init.ones_(module.weight)
            torch.nn.init.zeros_(module.bias)
    model16 = to_fp16(model)
    plain, fused, counts = export_pair(model16, DECODER, tmp_path, "fresh", "skip_layer_norm", kv_dtype="float16")
    ops = node_counts(onnx.load(str(plain), load_external_data=False))
    assert any(n.op_type == "Identity" for n in onnx.load(str(plain), load_external_data=False).graph.node)
    assert counts.get("SkipLayerNormalization") == ops["LayerNormalization"] and "LayerNormalization" not in counts
    f = feeds(model, 2, 2, 13, [9, 4], np.float16)
    want, got = run(plain, f), run(fused, f)
    scale = float(np.abs(want["logits"].astype(np.float32)).max())
    assert float(np.abs(got["logits"].astype(np.float32) - want["logits"]).max()) <= FP16_RTOL * scale
