"""Trace the model's `encode` / `decode` seams into the ONNX graphs of the contract: the encoder,
the decoder step (its greedy choice included), the reorder, candidates and restricted-decoder
graphs (the fused beam step is beam_graph.py's).

The wrapper modules flatten the model's structured inputs and outputs into the tensor lists of
xform/contract.py; the computation is the model's own, but for what decoding adds after the
logits (the greedy choice, the candidates' ranking), written here once for every graph. Tracing
uses the TorchScript exporter (`dynamo=False`), which keeps a zero-length past valid
(docs/design.md "The K/V cache").
It does not verify (verify.py) or write manifests (export.py).
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator

import onnx
import torch
from torch import Tensor, nn

from xform.contract import CANDIDATES, DECODER, DECODER_BEAM, ENCODER, GRAPHS, REORDER, RESTRICTED, GraphSpec
from xform.errors import XformError
from xform.exporter.beam_graph import BeamStepGraph
from xform.exporter.external_data import all_tensors, gather_external_data, save_with_external_data
from xform.exporter.steps import cached_step, greedy_choice, rank_candidates
from xform.models.transformer import EncoderOutput, Seq2SeqTransformer, reorder_cache

DEFAULT_OPSET = 17
MIN_OPSET = 17  # LayerNormalization is an ONNX op from opset 17
# the TorchScript tracer (torch.onnx.export(dynamo=False), deprecated by PyTorch, the default) or
# torch.export + onnxscript (dynamo=True; opset 18 or newer): docs/design.md "The exporter's future"
EXPORTERS = ("torchscript", "dynamo")
DYNAMO_MIN_OPSET = 18


class EncoderGraph(nn.Module):
    def __init__(self, model: Seq2SeqTransformer):
        super().__init__()
        self.model = model

    def forward(self, src_ids: Tensor, src_lengths: Tensor):
        enc = self.model.encode(src_ids, src_lengths)
        return (*[t for kv in enc.cross_kv for t in kv], enc.src_mask)


class DecoderGraph(nn.Module):
    def __init__(self, model: Seq2SeqTransformer, attention_layer: int | None = None):
        super().__init__()
        self.model = model
        self.n = model.cfg.n_decoder_layers
        self.attention_layer = attention_layer  # also return this layer's cross-attention

    def forward(self, input_ids: Tensor, min_new_tokens: Tensor, positions: Tensor, *flat: Tensor):
        logits, new, attention = cached_step(self.model, self.n, self.attention_layer, input_ids, positions, flat)
        next_ids = greedy_choice(self.model, logits, positions, min_new_tokens)
        return (logits, next_ids, *[t for kv in new for t in kv], *attention)


class ReorderGraph(nn.Module):
    """Beam search's cache reorder: every layer's cache keys and values gathered by beam_idx."""

    def __init__(self, model: Seq2SeqTransformer):
        super().__init__()
        self.n = model.cfg.n_decoder_layers

    def forward(self, beam_idx: Tensor, *flat: Tensor):
        cache = [(flat[2 * i], flat[2 * i + 1]) for i in range(self.n)]
        return tuple(t for kv in reorder_cache(cache, beam_idx) for t in kv)


class RestrictedGraph(nn.Module):
    """The decoder with the output projection over given table rows (vocabulary restriction)."""

    def __init__(self, model: Seq2SeqTransformer):
        super().__init__()
        self.model = model
        self.n = model.cfg.n_decoder_layers

    def forward(self, input_ids: Tensor, positions: Tensor, *flat: Tensor):
        n = self.n
        cache = [(flat[2 * i], flat[2 * i + 1]) for i in range(n)]
        cross = [(flat[2 * n + 2 * i], flat[2 * n + 2 * i + 1]) for i in range(n)]
        src_mask, out_weight, out_bias = flat[4 * n], flat[4 * n + 1], flat[4 * n + 2]
        logits, new = self.model.decode_step_restricted(input_ids, EncoderOutput(cross, src_mask), cache, positions,
                                                        out_weight, out_bias)
        return (logits, *[t for kv in new for t in kv])


class CandidatesGraph(nn.Module):
    """Beam search's candidates: per row, the num_candidates best log-probs after the decoder's
    suppression (Seq2SeqTransformer.suppress), and their ids, largest first (ties: lower id)."""

    def __init__(self, model: Seq2SeqTransformer):
        super().__init__()
        self.model = model

    def forward(self, logits: Tensor, num_candidates: Tensor, min_new_tokens: Tensor, positions: Tensor):
        return rank_candidates(self.model, logits, num_candidates, min_new_tokens, positions)


MODULES = {ENCODER: EncoderGraph, DECODER: DecoderGraph, REORDER: ReorderGraph, CANDIDATES: CandidatesGraph,
           RESTRICTED: RestrictedGraph}


def graph_module(model: Seq2SeqTransformer, graph: str, attention_layer: int | None = None) -> nn.Module:
    """The module traced into `graph` (the decoder graphs with their attention output, if any)."""
    if graph == DECODER:
        return DecoderGraph(model, attention_layer)
    if graph == DECODER_BEAM:
        return BeamStepGraph(model, attention_layer)
    return MODULES[graph](model)


def example_inputs(model: Seq2SeqTransformer, graph: str, batch: int = 2, src_len: int = 5,
                   past_len: int = 3, cache_len: int = 6, group: int = 2) -> tuple[Tensor, ...]:
    """Trace-time inputs (a cache longer than its valid part, `group` decoder rows per source,
    rows at different positions up to past_len, so that no shape or value is taken for another);
    verification uses other shapes."""
    cfg = model.cfg
    g = torch.Generator().manual_seed(0)
    src = torch.randint(0, cfg.src_vocab_size, (batch, src_len), generator=g)
    lengths = torch.full((batch,), src_len, dtype=torch.long)
    if graph == ENCODER:
        return src, lengths
    if graph == DECODER_BEAM:  # the decoder's inputs, num_candidates after the positions
        dec = example_inputs(model, DECODER, batch, src_len, past_len, cache_len, group)
        return (*dec[:3], torch.tensor([3]), *dec[3:])
    if graph == CANDIDATES:
        rows = batch * group
        logits = torch.randn(rows, cfg.tgt_vocab_size, generator=g)
        return logits, torch.tensor([3]), torch.full((rows,), 2), torch.arange(rows) % (past_len + 1)
    with torch.no_grad():
        enc = model.encode(src, lengths)
    dtype = model.compute_dtype
    rows = batch if graph == REORDER else batch * group
    cache = [torch.randn(rows, cfg.n_heads, cache_len, cfg.head_dim, generator=g).to(dtype)
             for _ in range(2 * cfg.n_decoder_layers)]
    if graph == REORDER:
        beam_idx = torch.arange(batch - 1, -1, -1)  # a real permutation
        return (beam_idx, *cache)
    ids = torch.full((rows, 1), cfg.start_id, dtype=torch.long)
    positions = torch.arange(rows) % (past_len + 1)
    if graph == RESTRICTED:  # a subset of the table's rows, not a prefix of it
        weight, bias = model.output_table()
        subset = torch.arange(1, cfg.tgt_vocab_size, 2)[:7]
        return (ids, positions, *cache, *[t for kv in enc.cross_kv for t in kv], enc.src_mask,
                weight[subset], bias[subset])
    return (ids, torch.zeros(rows, dtype=torch.long), positions, *cache,
            *[t for kv in enc.cross_kv for t in kv], enc.src_mask)


def export_graph(model: Seq2SeqTransformer, graph: str, spec: GraphSpec, path: Path, opset: int,
                 attention_layer: int | None = None, exporter: str = "torchscript",
                 fusions: tuple[str, ...] = ()) -> None:
    """Trace one graph to `path` with the contract's names and dynamic axes, by `exporter`. The
    trace goes to a file in a scratch directory beside `path`, never to memory: a graph over
    protobuf's 2 GB (an NLLB-200-sized embedding table) is written by the exporter as external data
    there, and is moved into the bundle's layout piece by piece rather than loaded whole.
    `fusions` (export --fuse, a decoder graph, TorchScript): traced with ONNX Runtime's fused
    operators (fused.py)."""
    from xform.exporter import fused

    if fusions and (graph not in fused.FUSED_GRAPHS or exporter != "torchscript"):
        raise XformError(f"--fuse applies to the decoder graphs ({', '.join(fused.FUSED_GRAPHS)}) traced by "
                         f"torchscript, not {graph!r} by {exporter}")
    module = graph_module(model, graph, attention_layer)
    module.eval()
    fusing = fused.fused_export(model, fusions) if fusions else contextlib.nullcontext()
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.trace.") as scratch:
        traced = Path(scratch) / path.name
        with torch.no_grad(), warnings.catch_warnings(), fusing:
            warnings.simplefilter("ignore")  # TracerWarnings about shape-derived python ints are expected
            if exporter == "dynamo":
                with quiet("torch.onnx._internal.exporter._registration"):  # "torchvision is not installed"
                    torch.onnx.export(
                        module, example_inputs(model, graph), str(traced), dynamo=True, opset_version=opset,
                        input_names=spec.input_names, output_names=spec.output_names,
                        dynamic_shapes=dynamic_shapes(module, spec), external_data=True, verbose=False,
                    )
            else:
                torch.onnx.export(
                    module, example_inputs(model, graph), str(traced), dynamo=False, opset_version=opset,
                    input_names=spec.input_names, output_names=spec.output_names,
                    dynamic_axes=spec.dynamic_axes(), do_constant_folding=True,
                    custom_opsets=fused.CUSTOM_OPSETS if fusions else None,
                )
        proto = onnx.load(str(traced), load_external_data=False)
        if fusions:
            fused.fused_graph(proto, spec, fusions, Path(scratch))
        if any(t.data_location == onnx.TensorProto.EXTERNAL for t in all_tensors(proto)):
            gather_external_data(proto, Path(scratch), path)
        else:
            save_with_external_data(proto, path)


@contextlib.contextmanager
def quiet(name: str) -> Iterator[None]:
    """Logger `name` at ERROR for the duration (its warnings are not the user's business), then
    back to the level it had: no process-wide logging setting changes."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def dynamic_shapes(module: nn.Module, spec: GraphSpec) -> tuple[Any, ...]:
    """The contract's named axes as torch.export dimensions, one `Dim` per name shared by every
    input that has it, laid out as `forward` takes its arguments (the per-layer K/V, taken as
    `*flat`, as one nested tuple): what the dynamo exporter needs instead of `dynamic_axes`,
    which it cannot convert for varargs."""
    dims: dict[str, Any] = {}
    per_input = tuple({i: dims.setdefault(a, torch.export.Dim(a, min=1)) for i, a in enumerate(t.shape)
                       if isinstance(a, str)} or None for t in spec.inputs)
    params = list(inspect.signature(module.forward).parameters.values())
    fixed = len([p for p in params if p.kind == p.POSITIONAL_OR_KEYWORD])
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return (*per_input[:fixed], tuple(per_input[fixed:]))
    return per_input


__all__ = ["GRAPHS", "export_graph", "example_inputs"]


