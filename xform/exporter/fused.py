"""The fused decoder graphs: attention as ONNX Runtime's `com.microsoft` contrib operators, meant
for its CUDA execution provider ("fewer, larger kernels"), verified on its CPU provider.

The graphs' inputs and outputs (the contract, xform/contract.py) are the plain graphs': the same
names, dtypes and named axes (`declare_contract`), only their insides change, so a runtime binds a
fused graph as it binds a plain one. Each fusion is named (FUSIONS) and chosen by `--fuse`
(`attention` is short for both attentions):

- `cross_attention`: each decoder layer's cross-attention as one `MultiHeadAttention` node
  (softmax(scale x Q K^T + attention_bias) V): the g rows of one source are g queries (Bs, g,
  inner) of one attention over its keys / values (Bs, H, S, Dh), passed as they are (BNSH), the
  source mask expanded to (Bs, 1, g, S) as its `attention_bias`; Attention.attend_shared's
  numbers. The layer whose cross-attention is recorded (`--with-attention`, Attention.record)
  keeps the plain computation: the node does not return its probabilities.
- `self_attention`: each self-attention as one MultiHeadAttention node: the new token's query,
  key and value (R, 1, inner), the cache as `past_key` / `past_value` (R, H, C, Dh), the cache
  mask and the new token's own score bias (0, or T5's relative position bias) as
  `attention_bias` (R, 1 or H, 1, C + 1); Attention.attend_cache's numbers. The new keys and
  values leave the graph from the projections, as in the plain graph. The node's `present_key` /
  `present_value` are named and left unread: ONNX Runtime's CPU kernel (1.32) reads `past_key`
  only when they are there (without them it attends over the new token alone), its CUDA kernel
  refuses a past without them. So each step writes the cache and the new token into the
  presents: a copy of the cache per layer and step that the plain graph's two score blocks avoid
  (docs/design.md "The K/V cache: a fixed buffer updated in place"); on the CPU provider this
  node costs more than the plain self-attention it replaces at many rows.
- `qkv` (with `self_attention`): the self-attention's q, k and v projections as one MatMul over
  their concatenated weights (and one bias Add), split after.
- `skip_layer_norm`: after the export, each residual Add feeding a LayerNormalization becomes one
  `SkipLayerNormalization` (fuse_skip_layer_norm); RMS norms (T5) are not LayerNormalization and
  stay as they are.

In fp16 graphs the attention runs in fp16 inside the node; its `attention_bias` is fp16, the
masks' MASK_VALUE clamped to fp16's lowest finite value (exp of it is 0 as exp(MASK_VALUE) is).
ONNX Runtime's CPU provider has an fp32 MultiHeadAttention kernel only: it runs an fp16 node
through Casts it inserts itself. The fp16 SkipLayerNormalization takes gamma and beta in fp16
(the plain graph's LayerNormalization keeps them fp32 behind Casts); its kernels compute in fp32.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx
import torch
from torch import Tensor

from xform import manifest
from xform.contract import DECODER, DECODER_BEAM, RESTRICTED, GraphSpec
from xform.errors import XformError
from xform.models.layers import Attention, DecoderLayer, LayerKV
from xform.models.transformer import Seq2SeqTransformer

FUSIONS = dict(zip(manifest.FUSIONS, (  # the names the manifest records, in its order
    "each self-attention as one com.microsoft MultiHeadAttention over the cache as its past",
    "each cross-attention as one com.microsoft MultiHeadAttention, a source's rows its queries",
    "the self-attention's q, k and v projections as one MatMul (with self_attention)",
    "each residual Add + LayerNormalization as one com.microsoft SkipLayerNormalization",
)))
SHORTHANDS = {"attention": ("self_attention", "cross_attention")}
NEEDS = {"qkv": "self_attention"}
FUSED_GRAPHS = (DECODER, DECODER_BEAM, RESTRICTED)  # the graphs with decoder layers; the encoder stays plain
CUSTOM_OPSETS = {"com.microsoft": 1}  # torch.onnx.export's custom_opsets for a fused trace
MS_DOMAIN = "com.microsoft"


def check_fusions(fusions: str | Iterable[str] | None) -> tuple[str, ...]:
    """The fusions asked for (a comma-separated str, or names; `attention` is both attentions),
    validated, in FUSIONS' order; () for none."""
    known = ", ".join([*FUSIONS, *SHORTHANDS])
    if fusions is None:
        return ()
    if isinstance(fusions, str):
        given: list = [f.strip() for f in fusions.split(",") if f.strip()]
    elif isinstance(fusions, Iterable):
        given = list(fusions)
    else:
        raise XformError(f"--fuse: expected fusion names ({known}), found {fusions!r} ({type(fusions).__name__})")
    chosen: set[str] = set()
    for name in given:
        if not isinstance(name, str):
            raise XformError(f"--fuse: expected fusion names ({known}), found {name!r} ({type(name).__name__})")
        if name not in FUSIONS and name not in SHORTHANDS:
            raise XformError(f"--fuse {name!r}: no such fusion; expected some of {known}, comma-separated")
        if given.count(name) > 1:
            raise XformError(f"--fuse: {name!r} is given {given.count(name)} times; give each fusion once")
        chosen.update(SHORTHANDS.get(name, (name,)))
    for name, needed in NEEDS.items():
        if name in chosen and needed not in chosen:
            raise XformError(f"--fuse {','.join(given)}: {name!r} goes with {needed!r} (its projections feed "
                             f"that MultiHeadAttention); found {needed!r} missing")
    return tuple(f for f in FUSIONS if f in chosen)


class MultiHeadAttention(torch.autograd.Function):
    """ONNX Runtime's com.microsoft MultiHeadAttention: softmax(scale x Q K^T + attention_bias) V
    over the heads, traced as one node. query (B, S, H x Dh); key / value (B, L, H x Dh), or
    (B, H, L, Dh) as they are (no past then); past_key / past_value (B, H, P, Dh) or None, the
    keys / values before `key` / `value`; attention_bias (B or 1, H or 1, S, P + L) in the
    query's dtype. Returns (B, S, H x Dh). `forward` is the same computation in torch (softmax in
    fp32), so that the trace has the shapes and eager runs give the numbers."""

    @staticmethod
    def forward(ctx: Any, query: Tensor, key: Tensor, value: Tensor, attention_bias: Tensor,
                past_key: Tensor | None, past_value: Tensor | None, num_heads: int, scale: float,
                length: int, hidden: int) -> Tensor:
        B, S, _ = query.shape
        heads = lambda t: t.reshape(B, t.shape[1], num_heads, -1).transpose(1, 2)  # noqa: E731
        q = heads(query)
        k, v = (key, value) if key.dim() == 4 else (heads(key), heads(value))
        if past_key is not None and past_value is not None:
            k, v = torch.cat([past_key, k], dim=2), torch.cat([past_value, v], dim=2)
        probs = ((q @ k.transpose(-2, -1)).float() * scale + attention_bias.float()).softmax(dim=-1)
        out = probs.to(v.dtype) @ v  # (B, H, S, Dh)
        return out.transpose(1, 2).reshape(B, S, -1)

    @staticmethod
    def symbolic(g: Any, query: Any, key: Any, value: Any, attention_bias: Any, past_key: Any, past_value: Any,
                 num_heads: int, scale: float, length: int, hidden: int) -> Any:
        from torch.onnx.symbolic_helper import _optional_input_placeholder_tensor as absent
        inputs = [query, key, value, absent(g), absent(g), attention_bias]
        if past_key is not None:
            inputs += [past_key, past_value]
        # with a past, present_key / present_value named (and left unread): ORT's CPU kernel ignores
        # past_key without them, its CUDA kernel refuses it
        outputs = 3 if past_key is not None else 1
        out = g.op(f"{MS_DOMAIN}::MultiHeadAttention", *inputs, num_heads_i=num_heads, scale_f=scale,
                   outputs=outputs)
        out = out[0] if outputs > 1 else out
        # the output's dtype and shape, the query's (B, S, hidden) (v_hidden_size = hidden_size here): ONNX's
        # shape inference knows no contrib op, and without them the sizes after it (the new K/V's) go unknown
        out.setType(query.type().with_sizes([None, length or None, hidden]))
        return out


def mha(query: Tensor, key: Tensor, value: Tensor, attention_bias: Tensor, past: LayerKV | None,
        num_heads: int, scale: float, length: int = 0) -> Tensor:
    """MultiHeadAttention.apply, typed; `length`: the query's length where fixed (1: one new token
    a row), for the graph's shapes, 0 where not."""
    past_key, past_value = past if past is not None else (None, None)
    return cast(Tensor, MultiHeadAttention.apply(query, key, value, attention_bias, past_key, past_value,
                                                 num_heads, scale, length, int(query.shape[-1])))


def as_bias(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """An additive fp32 mask in `dtype` (MultiHeadAttention's attention_bias has the query's):
    clamped to the dtype's lowest finite value first, where that is above MASK_VALUE (fp16)."""
    if mask.dtype == dtype:
        return mask
    return mask.clamp(min=torch.finfo(dtype).min).to(dtype)


@dataclass
class FusedStep:
    """DecoderLayer.step with the fusions asked for; the layers' modules and weights are the
    model's own. `memo` holds the attention biases built from one step's masks, so that every
    layer of a trace reads one copy (the masks are the same tensors for all layers)."""

    fusions: tuple[str, ...]
    memo: dict[str, tuple[Tensor, Tensor]] = field(default_factory=dict)

    def derived(self, kind: str, source: Tensor, make: Callable[[], Tensor]) -> Tensor:
        """make(), once for each `source` tensor (a step's mask) and `kind`."""
        held = self.memo.get(kind)
        if held is None or held[0] is not source:
            self.memo[kind] = held = (source, make())
        return held[1]

    def __call__(self, layer: DecoderLayer, x: Tensor, cache: LayerKV, cache_mask: Tensor, cross: LayerKV,
                 cross_mask: Tensor, new_bias: Tensor | None = None) -> tuple[Tensor, LayerKV]:
        new: list[LayerKV] = []

        def self_attn(h: Tensor) -> Tensor:
            attn = layer.self_attn
            if "self_attention" not in self.fusions:
                new.append(attn.project_kv(h))
                return attn.attend_cache(h, cache, new[0], cache_mask, new_bias)
            q, k, v = self.projections(attn, h)
            new.append((attn.split_heads(k), attn.split_heads(v)))  # (R, H, 1, Dh): the contract's new K/V
            bias = self.derived("self", cache_mask, lambda: as_bias(
                torch.nn.functional.pad(cache_mask, (0, 1)) if new_bias is None
                else torch.cat([cache_mask, new_bias], dim=-1), q.dtype))
            return attn.out_proj(mha(q, k, v, bias, cache, attn.n_heads, scale_of(attn), 1))

        def cross_attn(h: Tensor) -> Tensor:
            attn = layer.cross_attn
            # the recorded layer's probabilities are an output: it stays plain
            if attn.record is not None or "cross_attention" not in self.fusions:
                return attn.attend_shared(h, cross[0], cross[1], cross_mask)
            inner = attn.n_heads * attn.head_dim
            q = attn.q_proj(h.to(attn.q_proj.weight.dtype)).reshape(cross[0].shape[0], -1, inner)  # (Bs, g, inner)
            bias = self.derived("cross", cross_mask, lambda: as_bias(
                cross_mask.expand(-1, -1, q.shape[1], -1), q.dtype))  # (Bs, 1, g, S)
            out = mha(q, cross[0], cross[1], bias, None, attn.n_heads, scale_of(attn))
            return attn.out_proj(out.reshape(-1, 1, inner))

        return layer.blocks(x, self_attn, cross_attn), new[0]

    def projections(self, attn: Attention, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The self-attention's unscaled query, key and value (R, 1, inner): three Linears, or
        with `qkv` one over the concatenated weights (constant-folded into one initializer)."""
        h = h.to(attn.q_proj.weight.dtype)
        if "qkv" not in self.fusions:
            return attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
        linears = (attn.q_proj, attn.k_proj, attn.v_proj)
        weight = torch.cat([p.weight for p in linears])
        bias = None if attn.q_proj.bias is None else torch.cat([cast(Tensor, p.bias) for p in linears])
        q, k, v = torch.nn.functional.linear(h, weight, bias).split(attn.q_proj.out_features, dim=-1)
        return q, k, v


def scale_of(attn: Attention) -> float:
    """The attention's score scale: head_dim ** -0.5, or 1.0 where queries are unscaled (T5)."""
    return 1.0 if attn.scale is None else float(attn.scale)


@contextlib.contextmanager
def fused_export(model: Seq2SeqTransformer, fusions: str | Iterable[str] | None) -> Iterator[tuple[str, ...]]:
    """Within it, the model's decoder layers trace with the attention fusions of `fusions`
    (validated; yielded): each layer's `step` is a FusedStep, restored on exit. `skip_layer_norm`
    changes nothing here (it is a pass over the exported graph: fuse_skip_layer_norm)."""
    chosen = check_fusions(fusions)
    layers = [cast(DecoderLayer, layer) for layer in model.decoder_layers]
    if any("step" in vars(layer) for layer in layers):
        raise XformError("fused_export: the model's decoder layers are already fused (nested fused_export)")
    if "self_attention" not in chosen and "cross_attention" not in chosen:
        yield chosen
        return
    fused = FusedStep(chosen)
    try:
        for layer in layers:
            layer.step = partial(fused, layer)  # type: ignore[method-assign]  # an instance's own step
        yield chosen
    finally:
        for layer in layers:
            vars(layer).pop("step", None)


def tensor_types(proto: onnx.ModelProto) -> dict[str, tuple[int, tuple[int | str, ...]]]:
    """Every tensor's element type and shape (a dim's value, or its symbolic name), by ONNX
    Runtime's symbolic shape inference, which knows the contrib operators (onnx's does not: it
    stops at the first MultiHeadAttention)."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    inferred = SymbolicShapeInference.infer_shapes(proto, auto_merge=True)
    if inferred is None:
        raise XformError("--fuse skip_layer_norm: ONNX Runtime's symbolic shape inference failed on the graph")
    types: dict[str, tuple[int, tuple[int | str, ...]]] = {}
    graph = inferred.graph
    for v in (*graph.input, *graph.value_info, *graph.output):
        t = v.type.tensor_type
        types[v.name] = (t.elem_type, tuple(d.dim_param or d.dim_value for d in t.shape.dim))
    for init in graph.initializer:
        types[init.name] = (init.data_type, tuple(init.dims))
    return types


def cast_to(node: onnx.NodeProto) -> int:
    """A Cast node's target element type."""
    return next(int(onnx.helper.get_attribute_value(a)) for a in node.attribute if a.name == "to")


FLOAT, FLOAT16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16


class SkipLayerNormFusion:
    """fuse_skip_layer_norm's rewrite of one graph: the graph's producers and readers, and the
    rewrite decided for each residual Add (`fused`: the SkipLayerNormalization that takes its
    place; `dropped`: the nodes it replaces)."""

    def __init__(self, proto: onnx.ModelProto, base_dir: Path | None):
        self.proto, self.base_dir = proto, base_dir
        self.types = tensor_types(proto)
        self.nodes = list(proto.graph.node)
        self.producer = {o: n for n in self.nodes for o in n.output}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for n in self.nodes:
            for i in n.input:
                self.readers.setdefault(i, []).append(n)
        self.outputs = {o.name for o in proto.graph.output}
        self.initializers = {t.name: t for t in proto.graph.initializer}
        self.fused: dict[int, onnx.NodeProto] = {}
        self.dropped: set[int] = set()
        self.rounded: set[str] = set()  # fp32 gamma / beta with an fp16 copy: removed when nothing else reads them

    def only_reader(self, name: str, node: onnx.NodeProto) -> bool:
        return name not in self.outputs and [id(r) for r in self.readers.get(name, [])] == [id(node)]

    def computed(self, name: str) -> bool:
        return name in self.producer and self.producer[name].op_type != "Constant"

    def fuse(self, norm: onnx.NodeProto) -> None:
        """The Add (+ Cast) + LayerNormalization (+ Cast) ending in `norm`, if it is a residual:
        fp32 (a no-op Cast between, which the trace leaves), or fp16 widened to the fp32 norm and
        its result narrowed back (fp16 graphs: then the fused node is fp16, gamma and beta
        rounded to fp16, and the kernel computes in fp32 inside)."""
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in norm.attribute}
        if len(norm.input) < 2 or attrs.get("axis", -1) not in (-1, 2):
            return
        widen = self.producer.get(norm.input[0])
        narrow = None
        if widen is not None and widen.op_type == "Cast":
            source = self.types.get(widen.input[0], (0, ()))[0]
            if source == FLOAT16 and cast_to(widen) == FLOAT:
                narrow = next(iter(self.readers.get(norm.output[0], [])), None)
                if (narrow is None or narrow.op_type != "Cast" or cast_to(narrow) != FLOAT16
                        or not self.only_reader(norm.output[0], narrow)):
                    return
            elif source != cast_to(widen):
                return
        else:
            widen = None
        add = self.producer.get(widen.input[0] if widen is not None else norm.input[0])
        if add is None or add.op_type != "Add" or id(add) in self.fused or not all(map(self.computed, add.input)):
            return
        a, b, total = (self.types.get(n) for n in (add.input[0], add.input[1], add.output[0]))
        if a is None or a != b or a != total or len(a[1]) != 3:
            return
        weights = list(norm.input[1:3])
        if narrow is not None:
            stored = [self.initializer_of(w) for w in weights]
            if None in stored:
                return
            self.rounded.update(cast(list[str], stored))
            weights = [self.half(cast(str, w)) for w in stored]
        widen_kept = widen is not None and not self.only_reader(widen.output[0], norm)
        inner = [n for n in (widen, norm) if n is not None]
        sum_read = widen_kept or add.output[0] in self.outputs or any(
            all(r is not n for n in inner) for r in self.readers.get(add.output[0], []))
        out = narrow.output[0] if narrow is not None else norm.output[0]
        self.fused[id(add)] = onnx.helper.make_node(
            "SkipLayerNormalization", [add.input[0], add.input[1], *weights],
            [out, *(["", "", add.output[0]] if sum_read else [])],
            name=f"{norm.name}/SkipLayerNormalization", domain=MS_DOMAIN, epsilon=attrs.get("epsilon", 1e-5))
        self.dropped.update(id(n) for n in (norm, narrow, None if widen_kept else widen) if n is not None)

    def initializer_of(self, name: str) -> str | None:
        """The initializer `name` is, through the Identity nodes the trace puts in front of equal
        tensors (every LayerNorm's gamma of a fresh model, say); None if it is computed."""
        while name not in self.initializers:
            producer = self.producer.get(name)
            if producer is None or producer.op_type != "Identity":
                return None
            name = producer.input[0]
        return name

    def half(self, name: str) -> str:
        """An fp16 copy of the fp32 initializer `name` (gamma or beta), added once."""
        fp16 = f"{name}.fp16"
        if fp16 not in self.initializers:
            from onnx import numpy_helper
            value = numpy_helper.to_array(self.initializers[name], base_dir=str(self.base_dir or ""))
            tensor = numpy_helper.from_array(value.astype("float16"), fp16)
            self.proto.graph.initializer.append(tensor)
            self.initializers[fp16] = tensor
        return fp16

    def apply(self) -> int:
        for node in self.nodes:
            if node.op_type == "LayerNormalization":
                self.fuse(node)
        if self.fused:
            del self.proto.graph.node[:]
            self.proto.graph.node.extend(self.fused.get(id(n), n) for n in self.nodes if id(n) not in self.dropped)
            read = {i for n in self.proto.graph.node for i in n.input}
            unread = [t for t in self.proto.graph.initializer if t.name in self.rounded and t.name not in read]
            for t in unread:
                self.proto.graph.initializer.remove(t)
            if not any(o.domain == MS_DOMAIN for o in self.proto.opset_import):
                self.proto.opset_import.append(onnx.helper.make_opsetid(MS_DOMAIN, 1))
        return len(self.fused)


def fuse_skip_layer_norm(proto: onnx.ModelProto, base_dir: Path | None = None) -> int:
    """Each residual Add feeding a LayerNormalization of `proto` (two computed inputs of one
    shape (R, 1, D), by symbolic shape inference) as one com.microsoft SkipLayerNormalization, in
    place; returns how many. Where the sum is read elsewhere too (pre-norm layers: the residual
    stream), the node's fourth output (input_skip_bias_sum) gives it; the node takes the Add's
    place in the node order. `base_dir`: where external initializers are (fp16 graphs' gamma
    and beta are read to round them). RMS norms (T5) are not LayerNormalization: none fuse."""
    return SkipLayerNormFusion(proto, base_dir).apply()


def declare_contract(proto: onnx.ModelProto, spec: GraphSpec) -> None:
    """The graph's inputs and outputs declared as the contract has them: names, dtypes, named axes
    and fixed sizes. The exporter's shape inference knows no contrib operator, so it would name the
    sizes after the first MultiHeadAttention anew (`Transposenew_key_1_dim_1` where the plain
    graph has the contract's heads, 1, head_dim). (The plain graph's declarations are the
    contract's too, but for a fixed size its exporter lost: its logits' vocabulary,
    `Gatherlogits_dim_1`.)"""
    for values, tensors in ((proto.graph.input, spec.inputs), (proto.graph.output, spec.outputs)):
        for value, tensor in zip(values, tensors):
            if value.name != tensor.name:
                raise XformError(f"{value.name}: the fused graph's tensors are not the contract's (expected "
                                 f"{tensor.name} here)")
            value.type.CopyFrom(onnx.helper.make_tensor_type_proto(
                onnx.helper.np_dtype_to_tensor_dtype(np.dtype(tensor.dtype)), list(tensor.shape)))


def node_counts(proto: onnx.ModelProto) -> dict[str, int]:
    """Nodes by op type, and `nodes` in all: what the fusions change, for reports and tests."""
    counts: dict[str, int] = {"nodes": len(proto.graph.node)}
    for node in proto.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def fused_graph(proto: onnx.ModelProto, spec: GraphSpec, fusions: tuple[str, ...], base_dir: Path) -> None:
    """After a trace within `fused_export` (graphs.export_graph): the contract's declared sizes put
    back, then the `skip_layer_norm` pass when asked."""
    declare_contract(proto, spec)
    if "skip_layer_norm" in fusions:
        fuse_skip_layer_norm(proto, base_dir)
