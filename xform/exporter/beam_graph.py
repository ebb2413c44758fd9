"""The fused beam step (contract.py `decoder_beam`): the decoder graph ending in the candidates.

A beam step through the decoder and candidates graphs holds each row's (vocabulary,) logits twice:
the decoder's output buffer, then the candidates session's input and its log-softmax. In one graph
the logits are an intermediate of one session run, in its arena, and only (rows, num_candidates)
log-probs and ids leave (docs/design.md "Logits never leave a beam step").

Its weights are the decoder's: `share_decoder_data` points every initializer whose bytes the
decoder's data file already holds at those bytes, so the bundle stores them once, and export's
`shared_weights` then maps the large ones once for both sessions.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import onnx
from torch import Tensor, nn

from xform.exporter.external_data import ALIGN
from xform.exporter.steps import cached_step, rank_candidates
from xform.models.transformer import Seq2SeqTransformer


class BeamStepGraph(nn.Module):
    """The decoder step (DecoderGraph's computation) then rank_candidates (the candidates graph's),
    traced as one graph: the logits never become an output."""

    def __init__(self, model: Seq2SeqTransformer, attention_layer: int | None = None):
        super().__init__()
        self.model = model
        self.n = model.cfg.n_decoder_layers
        self.attention_layer = attention_layer

    def forward(self, input_ids: Tensor, min_new_tokens: Tensor, positions: Tensor, num_candidates: Tensor,
                *flat: Tensor):
        logits, new, attention = cached_step(self.model, self.n, self.attention_layer, input_ids, positions, flat)
        top, ids = rank_candidates(self.model, logits, num_candidates, min_new_tokens, positions)
        return (top, ids, *[t for kv in new for t in kv], *attention)


def _external(tensor: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def share_decoder_data(graph: Path, decoder: Path) -> dict[str, int]:
    """Point each external initializer of `graph` whose bytes (dtype, shape and content) the
    decoder graph `decoder` holds at the decoder's copy, in the decoder's data file; the others
    stay in `graph`'s own data file, rewritten with only them (removed when none is left).
    Returns the bytes shared and the bytes kept apart."""
    directory = graph.parent
    proto = onnx.load(str(graph), load_external_data=False)
    dec = onnx.load(str(decoder), load_external_data=False)

    def read(info: dict[str, str]) -> bytes:
        with open(directory / info["location"], "rb") as f:
            f.seek(int(info.get("offset", 0)))
            return f.read(int(info["length"])) if "length" in info else f.read()

    by_shape: dict[tuple, list[dict[str, str]]] = {}
    for t in dec.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            by_shape.setdefault((t.data_type, tuple(t.dims)), []).append(_external(t))
    digests: dict[tuple[str, str], str] = {}

    def digest(info: dict[str, str]) -> str:
        key = (info["location"], info.get("offset", "0"))
        if key not in digests:
            digests[key] = hashlib.sha256(read(info)).hexdigest()
        return digests[key]

    own = graph.with_name(f"{graph.name}.data")
    shared, apart = 0, 0
    kept: list[tuple[onnx.TensorProto, bytes]] = []
    for t in proto.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = _external(t)
        data = read(info)
        mine = hashlib.sha256(data).hexdigest()
        match = next((d for d in by_shape.get((t.data_type, tuple(t.dims)), []) if digest(d) == mine), None)
        if match is None:
            kept.append((t, data))
            apart += len(data)
            continue
        del t.external_data[:]
        for key in ("location", "offset", "length"):
            if key in match:
                entry = t.external_data.add()
                entry.key, entry.value = key, match[key]
        shared += len(data)
    own.unlink(missing_ok=True)
    if kept:  # what the decoder does not hold, in a file of the graph's own, each page-aligned
        with open(own, "wb") as out:
            for t, data in kept:
                offset = -(-out.tell() // ALIGN) * ALIGN
                out.seek(offset)
                out.write(data)
                del t.external_data[:]
                for key, value in (("location", own.name), ("offset", str(offset)), ("length", str(len(data)))):
                    entry = t.external_data.add()
                    entry.key, entry.value = key, value
    onnx.save_model(proto, str(graph))
    return {"shared_bytes": shared, "own_bytes": apart}
