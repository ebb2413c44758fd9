"""ONNX Runtime's transformer optimizer on the CPU graphs, verified (issue 44, item 2).

`onnxruntime.transformers.optimizer` rewrites subgraphs into ONNX Runtime's fused contrib
operators. On xform's traced graphs only one of its fusions applies: residual Add + LayerNorm
(and the Add of the projection's bias before it) into `SkipLayerNormalization`, two a layer in the
encoder, three in the decoder step. Its attention fusions (`Attention` / `MultiHeadAttention`)
match Hugging Face's exported patterns, which xform's are not (docs/design.md, "ONNX Runtime's
fusions"), and ONNX Runtime's own session optimizer neither fuses the LayerNorm nor does what the
optimizer does.

`fuse_graph` writes the optimized graph only where the optimizer fused something and the result
computes what the traced graph computes: both are run on ONNX Runtime (CPU) on the same inputs at
shapes unlike the trace's (several rows, padded sources, an empty and a filled cache, rows at
different positions), token ids exactly, floats within FUSED_ATOL; otherwise the traced graph is
kept, and the record says why. The manifest keeps the record on the graph's entry (`optimized`).
"""
from __future__ import annotations

import logging
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

from xform.contract import DECODER, DECODER_BEAM, ENCODER, MASK_VALUE
from xform.exporter.external_data import gather_external_data

log = logging.getLogger(__name__)
FUSABLE = (ENCODER, DECODER, DECODER_BEAM)  # the graphs a CPU decode runs (not the restricted decoder)
FUSED_PRECISIONS = ("fp32", "int8")  # the CPU graphs; int8's are optimized in fp32, then quantized
FUSED_ATOL = 1e-4  # fp32 graphs, optimized against traced, on the same runtime: measured ~3e-6
MODEL_TYPE = "bart"  # the optimizer's pass list for encoder-decoder graphs; "bert" / "t5" fuse no more
CONTRIB = "com.microsoft"
# (source rows, decoder rows a source, source length, cache positions): shapes unlike the trace's
SHAPES = ((3, 1, 7, 0), (2, 2, 5, 6))


def optimizer_run(path: Path, cfg) -> onnx.ModelProto:
    """The optimizer's graph (its fusions only: ONNX Runtime's own level applies when a session opens)."""
    from onnxruntime.transformers.optimizer import optimize_model

    before = logging.root.manager.disable
    logging.disable(max(before, logging.WARNING))  # the optimizer logs each pass's findings
    try:
        return optimize_model(str(path), model_type=MODEL_TYPE, num_heads=cfg.n_heads, hidden_size=cfg.d_model,
                              opt_level=0).model
    finally:
        logging.disable(before)


def fused_ops(model: onnx.ModelProto) -> dict[str, int]:
    """ONNX Runtime's contrib operators in the graph, by type."""
    return dict(sorted(Counter(n.op_type for n in model.graph.node if n.domain == CONTRIB).items()))


def fuse_graph(traced: Path, out: Path, cfg, optimize=None) -> dict:
    """Write `out` (with its `<name>.data`): the optimizer's graph of `traced` where it fused
    something and verifies, else `traced` itself; returns the record for the manifest."""
    import onnxruntime

    record: dict = {"by": f"onnxruntime.transformers.optimizer {onnxruntime.__version__}",
                    "model_type": MODEL_TYPE, "applied": False}
    model = (optimize or optimizer_run)(traced, cfg)
    record["fused"] = fused_ops(model)
    if record["fused"] and all(o.domain != CONTRIB for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(CONTRIB, 1))  # onnx.checker asks for its domain
    if not record["fused"]:
        record["reason"] = "no fusion applies"
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        candidate = Path(tmp) / "fused.onnx"
        onnx.save_model(model, str(candidate), save_as_external_data=True, location="fused.data", size_threshold=1024)
        if record["fused"]:
            ok, figure = compare_graphs(traced, candidate, cfg)
            record["max_abs_diff"] = figure
            record["applied"] = ok
            if not ok:
                record["reason"] = (f"differs from the traced graph: {figure} (allowed {FUSED_ATOL:g})"
                                    if isinstance(figure, float) else str(figure))
                log.warning("%s: ONNX Runtime's optimizer refused, the traced graph kept: %s", out.name,
                            record["reason"])
        source = candidate if record["applied"] else traced
        gather_external_data(onnx.load(str(source), load_external_data=False), source.parent, out)
    return record


def compare_graphs(traced: Path, fused: Path, cfg) -> tuple[bool, float | str]:
    """Both graphs on ONNX Runtime (CPU) on the same inputs: ids equal, floats within FUSED_ATOL.
    Returns (verified, the largest float difference or what failed)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        a = ort.InferenceSession(str(traced), opts, providers=["CPUExecutionProvider"])
        b = ort.InferenceSession(str(fused), opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - any failure to load refuses the graph
        return False, f"does not load on ONNX Runtime: {type(e).__name__}: {str(e)[:200]}"
    worst = 0.0
    for k, shape in enumerate(SHAPES):
        feeds = graph_feeds(a.get_inputs(), cfg, *shape, seed=k)
        try:
            got = b.run(None, feeds)
        except Exception as e:  # noqa: BLE001
            return False, f"fails to run at {shape}: {type(e).__name__}: {str(e)[:200]}"
        for meta, x, y in zip(a.get_outputs(), a.run(None, feeds), got):
            if x.shape != y.shape or (x.dtype.kind in "iu" and not np.array_equal(x, y)):
                return False, f"output {meta.name} differs at {shape}"
            if x.dtype.kind == "f":
                diff = float(np.abs(x.astype(np.float64) - y).max(initial=0.0))
                if not np.isfinite(diff) or diff > FUSED_ATOL:
                    return False, diff if np.isfinite(diff) else f"output {meta.name}: NaN or inf at {shape}"
                worst = max(worst, diff)
    return True, worst


def graph_feeds(inputs, cfg, sources: int, rows: int, src_len: int, cache: int, seed: int = 0) -> dict:
    """Random inputs for a graph of the contract by its input names: padded sources, a cache of
    `cache` positions with rows at different positions, `rows` decoder rows a source."""
    rng = np.random.default_rng(seed)
    R = sources * rows
    dims = {"batch": R, "src_batch": sources, "src_len": src_len, "cache_len": cache}
    lengths = np.array([src_len] + list(rng.integers(1, src_len + 1, sources - 1)), np.int64)
    feeds: dict[str, np.ndarray] = {}
    for meta in inputs:
        shape = [d if isinstance(d, int) else dims.get(d, 1) for d in meta.shape]
        name = meta.name
        if name == "src_ids":
            feeds[name] = rng.integers(0, cfg.src_vocab_size, (sources, src_len)).astype(np.int64)
        elif name == "src_lengths":
            feeds[name] = lengths
        elif name == "input_ids":
            feeds[name] = rng.integers(0, cfg.tgt_vocab_size, shape).astype(np.int64)
        elif name == "positions":
            feeds[name] = rng.integers(max(cache - 3, 0), cache + 1, shape).astype(np.int64)
        elif name == "min_new_tokens":
            feeds[name] = rng.integers(0, 3, shape).astype(np.int64)
        elif name == "num_candidates":
            feeds[name] = np.array([min(4, cfg.tgt_vocab_size)], np.int64)
        elif name == "src_mask":
            valid = np.arange(src_len)[None] < lengths[:, None]
            mask = np.where(valid, 0.0, MASK_VALUE).astype(np.float32)
            feeds[name] = mask if shape[0] == sources else np.repeat(mask, rows, 0)
        elif "int" in meta.type:
            feeds[name] = np.zeros(shape, np.int64)
        else:
            feeds[name] = rng.standard_normal(shape).astype(np.float16 if "float16" in meta.type else np.float32)
    return feeds
