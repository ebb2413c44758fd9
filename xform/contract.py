"""The graph I/O contract: tensor names, dtypes and named axes of the encoder and decoder graphs.

Written once here as data, derived from a few config numbers; the exporter names the ONNX
tensors from it, the manifest records it, the engine builder derives optimization profiles from
it and the runtime binds by it. Pure Python: no torch, no onnx.

The decoder's self-attention cache is one buffer per layer, key and value, of a fixed capacity
(`cache_len`) that the runtime owns and updates in place. Every row has its own position
(`positions`, (batch,): the number of its tokens already in the cache, so rows that joined a
running batch at different steps decode side by side, docs/design.md "In-flight batching"): a step reads the first
`positions[r]` positions of row r of `cache_*` (the rest is masked, whatever it holds), attends
over them and its own new token at position `positions[r]`, and returns only that token's keys
and values (`new_*`, one position), which the runtime writes at `positions[r]`. No step allocates
or copies the cache (docs/design.md, "The K/V cache"). `min_new_tokens` is per row too:
end-of-sentence is suppressed in row r while positions[r] < min_new_tokens[r].

A third, small graph serves beam search: `reorder` gathers every layer's cache along the batch
axis with `beam_idx` (row b of the result continues row beam_idx[b]), on the device, between two
decoder steps. Greedy decoding never runs it, so its decoder graph carries no gather
(docs/design.md has the measurements behind this choice).

The decoder's `batch` is its rows; its cross K/V and source mask have one row per source
(`src_batch`), which `batch` divides into equal groups: the rows of source i are rows i*g .. i*g+g-1
(g = batch / src_batch: a source's beams or samples, 1 for greedy). The graph reads them as g
extra queries over the source's one copy, as CTranslate2 does, so beams never re-encode or copy
their source (docs/design.md, "Beams share their source"). The reorder graph gathers along its
first axis whatever it is given: the cache by row (beam search, finished rows leaving) and, with
the source length as `cache_len`, the cross K/V by source.

A fourth graph serves beam search: `candidates` reads the decoder's logits where they are (on the
device, on a GPU) and returns each row's `num_candidates` best log-probabilities and their ids,
after the decoder's own suppression (pad and banned ids never, end-of-sentence not before
min_new_tokens): what transformers' beam search ranks, without the (rows, vocab) logits
leaving the device or the host sorting a vocabulary. Greedy decoding never runs it, so its
decoder graph carries no log-softmax or TopK.

An optional fifth graph, `decoder_restricted` (bundles exported --with-vocab-map), is the decoder
with the output projection over given rows of the table only (`out_weight` (vocab_subset,
d_model), `out_bias`): the logits of a per-batch target vocabulary, the rest of the projection
never computed (vocabulary restriction, CTranslate2's vocabulary map). It returns no next_ids:
the host chooses among the subset.

A sixth graph, `decoder_beam` (ONNX Runtime only; exported into every bundle since issue 30, and
optional: a bundle from before runs its beams through the decoder and candidates graphs), is a
beam step in one graph: the
decoder's inputs and `num_candidates`, the decoder's layers and output projection, then the
candidates graph's log-softmax, suppression and TopK. Only `cand_logprobs` / `cand_ids` (rows,
num_candidates), the new K/V (and `attention` with --with-attention) leave it: the (rows, vocab)
logits live inside one session run, in its arena, and are never a graph output. Its weights are the
decoder's bytes (its external data points into the decoder's file; `shared_weights` maps them once
for both sessions). Greedy decoding and TensorRT use the decoder graph.

Axes: a str is a named dynamic axis (`batch`, `src_batch`, `src_len`, `cache_len`, `candidates`,
`vocab_subset`), an int is fixed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xform.errors import BundleError

ENCODER = "encoder"
DECODER = "decoder"
REORDER = "reorder"
CANDIDATES = "candidates"
RESTRICTED = "decoder_restricted"
DECODER_BEAM = "decoder_beam"
GRAPHS = (ENCODER, DECODER, REORDER, CANDIDATES)  # every bundle's
# RESTRICTED: a bundle exported --with-vocab-map; DECODER_BEAM: every bundle from the fused beam
# step on (older bundles run beams through DECODER + CANDIDATES)
OPTIONAL_GRAPHS = (RESTRICTED, DECODER_BEAM)
WEIGHTLESS = (REORDER, CANDIDATES)  # nothing to quantize
# the additive mask of a position attention must not see (src_mask's padding): finite, so that
# 0 x MASK_VALUE stays 0 and a fully masked row gives a uniform softmax, not NaN; exp(MASK_VALUE -
# max) is exactly 0 in fp32, so the result equals masking with -inf
MASK_VALUE = -1e9


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name: int64, float32, float16
    shape: tuple[int | str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TensorSpec":
        return cls(d["name"], d["dtype"], tuple(d["shape"]))

    def dynamic_axes(self) -> dict[int, str]:
        return {i: a for i, a in enumerate(self.shape) if isinstance(a, str)}

    def fixed(self, axis: int) -> int:
        """The size of a fixed axis (a K/V tensor's heads or head size); a named axis has none."""
        size = self.shape[axis]
        if isinstance(size, str):
            raise BundleError(f"tensor {self.name}: axis {axis} is the dynamic axis {size!r}, expected a fixed size")
        return size


@dataclass(frozen=True)
class GraphSpec:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": [t.to_dict() for t in self.inputs], "outputs": [t.to_dict() for t in self.outputs]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GraphSpec":
        return cls(tuple(map(TensorSpec.from_dict, d["inputs"])), tuple(map(TensorSpec.from_dict, d["outputs"])))

    def input(self, name: str) -> TensorSpec:
        return next(t for t in self.inputs if t.name == name)

    def output(self, name: str) -> TensorSpec:
        return next(t for t in self.outputs if t.name == name)

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        return {t.name: t.dynamic_axes() for t in (*self.inputs, *self.outputs) if t.dynamic_axes()}


def cache_dtype(decoder: GraphSpec) -> str:
    """The dtype of a decoder's K/V cache (its first layer's cache key), which the bundle's
    precision sets: float16 in fp16 bundles, float32 otherwise."""
    return decoder.input(kv_names("cache", 1)[0]).dtype


def kv_names(prefix: str, n_layers: int) -> list[str]:
    """`{prefix}_key_{i}`, `{prefix}_value_{i}` for every layer, in layer order."""
    return [f"{prefix}_{kind}_{i}" for i in range(n_layers) for kind in ("key", "value")]


def signature(n_decoder_layers: int, n_heads: int, head_dim: int, tgt_vocab_size: int,
              kv_dtype: str = "float32", attention: bool = False, d_model: int = 0) -> dict[str, GraphSpec]:
    """The graph specs for a model; kv_dtype is the K/V cache precision. With `attention` (a
    bundle exported --with-attention), the decoder also returns `attention` (batch, src_len): one
    decoder layer's cross-attention for the new token, averaged over heads (alignments)."""
    kv = lambda name, length, rows="batch": TensorSpec(name, kv_dtype, (rows, n_heads, length, head_dim))  # noqa: E731
    encoder = GraphSpec(
        inputs=(TensorSpec("src_ids", "int64", ("batch", "src_len")),
                TensorSpec("src_lengths", "int64", ("batch",))),
        outputs=(*(kv(n, "src_len") for n in kv_names("cross", n_decoder_layers)),
                 TensorSpec("src_mask", "float32", ("batch", "src_len"))),
    )
    decoder = GraphSpec(
        inputs=(TensorSpec("input_ids", "int64", ("batch", 1)),
                TensorSpec("min_new_tokens", "int64", ("batch",)),
                TensorSpec("positions", "int64", ("batch",)),
                *(kv(n, "cache_len") for n in kv_names("cache", n_decoder_layers)),
                *(kv(n, "src_len", "src_batch") for n in kv_names("cross", n_decoder_layers)),
                TensorSpec("src_mask", "float32", ("src_batch", "src_len"))),
        outputs=(TensorSpec("logits", "float32", ("batch", tgt_vocab_size)),
                 TensorSpec("next_ids", "int64", ("batch",)),
                 *(kv(n, 1) for n in kv_names("new", n_decoder_layers)),
                 *((TensorSpec("attention", "float32", ("batch", "src_len")),) if attention else ())),
    )
    reorder = GraphSpec(
        inputs=(TensorSpec("beam_idx", "int64", ("batch",)),
                *(kv(n, "cache_len") for n in kv_names("cache", n_decoder_layers))),
        outputs=tuple(kv(n, "cache_len") for n in kv_names("reordered", n_decoder_layers)),
    )
    candidates = GraphSpec(
        inputs=(TensorSpec("logits", "float32", ("batch", tgt_vocab_size)),
                TensorSpec("num_candidates", "int64", (1,)),
                TensorSpec("min_new_tokens", "int64", ("batch",)),
                TensorSpec("positions", "int64", ("batch",))),
        outputs=(TensorSpec("cand_logprobs", "float32", ("batch", "candidates")),
                 TensorSpec("cand_ids", "int64", ("batch", "candidates"))),
    )
    restricted = GraphSpec(  # the decoder with the output projection over given table rows only
        inputs=(*(t for t in decoder.inputs if t.name != "min_new_tokens"),
                TensorSpec("out_weight", "float32", ("vocab_subset", d_model)),
                TensorSpec("out_bias", "float32", ("vocab_subset",))),
        outputs=(TensorSpec("logits", "float32", ("batch", "vocab_subset")),
                 *(kv(n, 1) for n in kv_names("new", n_decoder_layers))),
    )
    beam = GraphSpec(  # the decoder ending in the candidates: no (rows, vocab) output
        inputs=(*decoder.inputs[:3], TensorSpec("num_candidates", "int64", (1,)), *decoder.inputs[3:]),
        outputs=(*candidates.outputs, *(t for t in decoder.outputs if t.name not in ("logits", "next_ids"))),
    )
    return {ENCODER: encoder, DECODER: decoder, REORDER: reorder, CANDIDATES: candidates, RESTRICTED: restricted,
            DECODER_BEAM: beam}


def signature_for(config: dict[str, Any], kv_dtype: str = "float32", attention: bool = False) -> dict[str, GraphSpec]:
    """Signature from a config dict (TransformerConfig.to_dict() or a manifest's `config`)."""
    head_dim = config.get("attention_head_dim") or config["d_model"] // config["n_heads"]
    return signature(config["n_decoder_layers"], config["n_heads"], head_dim,
                     config["tgt_vocab_size"], kv_dtype, attention, config["d_model"])


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do beyond start and step (runtime/backends/backend.py): declared, never probed.
    Here, in the base layer, because the eager backend (models/) declares them too."""

    join: bool = False  # join(): rows of new sources enter a running batch
    candidates: bool = False  # step(..., candidates=K): beam candidates ranked where the logits are
    attention: bool = False  # attention(): the decoder returns a layer's cross-attention
    restriction: bool = False  # restrict(ids): decode over a subset of the target vocabulary
    max_rows: int | None = None  # the most rows one batch may have (a TensorRT profile's batch)
