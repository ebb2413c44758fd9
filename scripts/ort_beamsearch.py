"""ONNX Runtime's own beam search (the `com.microsoft.BeamSearch` contrib operator, encoder-decoder
mode: model_type 1, the T5 layout `onnxruntime.transformers.convert_generation` builds for T5 / BART)
over the model xform decodes: a peer engine for scripts/bench_gpu.py ("ort-beamsearch fp32 / fp16").

    python scripts/ort_beamsearch.py MODEL OUT [--precision fp32|fp16]

MODEL is a Hugging Face Marian directory (or anything `xform.models.importers.resolve_model`
reads); OUT receives `beamsearch.onnx` (its tensors in `beamsearch.onnx.data` when it is large).

The two subgraphs are traced (torch.onnx.export, dynamo=False) from xform's own model code, so the
math is xform's (Seq2SeqTransformer.encode and .decode, DecoderLayer's growing past):

- `encoder` attribute, the "encoder_decoder_init" subgraph. Inputs encoder_input_ids int32 (B, S),
  encoder_attention_mask int32 (B, S), decoder_input_ids int32 (B, 1) (the start id, filled in by
  the operator). Outputs logits (B, 1, V), encoder_hidden_states (B, S, D), present_key_self_i /
  present_value_self_i (B, H, 1, Dh) for every layer, then present_key_cross_i / present_value_cross_i
  (B, H, S, Dh). B is the batch: the operator runs it once a source and repeats its outputs num_beams
  times (ExpandBuffer) for the decoder's first feeds; the first step's logits (B, 1, V) are read once
  a source for all its beams (ProcessLogits).
- `decoder` attribute. Inputs input_ids int32 (B x beams, 1) (the static 1 makes the operator feed the
  last token, not the whole sequence), encoder_attention_mask int32, past_key_self_i /
  past_value_self_i (B x beams, H, P, Dh), past_key_cross_i / past_value_cross_i; no
  encoder_hidden_states input (it is optional: xform's decoder reads only the cross K/V). Outputs
  logits (B x beams, 1, V) and present_key_self_i / present_value_self_i (B x beams, H, P + 1, Dh),
  which the operator reorders by beam (PickT5PastState) into the next step's past.

Every float input and output of a subgraph has one dtype (the operator checks it): in fp16 the
logits, which xform computes in fp32, are cast to fp16 on the way out. The int32 attention mask
becomes xform's source lengths inside both subgraphs (its sum: sources are right-padded, as xform's
are). The shared weights of the two subgraphs are stored once, in the main graph (as
convert_generation's get_shared_initializers does).

Node inputs (BeamSearch's order): input_ids, max_length, min_length, num_beams, num_return_sequences,
length_penalty, repetition_penalty, vocab_mask (V,) int32 (1 allowed, 0 banned), prefix_vocab_mask
(unused), attention_mask (B, S) int32 (given: without it the operator masks left padding only).
The output `sequences` (B, num_return_sequences, max_length) int32 starts with the start id, and the
operator's lengths count it: max_length = new + 1 gives `new` tokens, and min_length = min_new + 1
bans end-of-sentence while fewer than min_new tokens were generated (it bans it while the sequence,
start id included, is shorter than min_length). The fixed-length workload (exactly `new` tokens) is
max_length = min_length = new + 1: end-of-sentence is banned at every step, as xform bans it with
min_new_tokens = max_new_tokens. (BeamSearchParameters::Validate in ONNX Runtime's source refuses
min_length >= max_length; 1.32 does not apply it: it runs and bans end-of-sentence to the last step.)
The pad id (and the config's banned ids: xform's `never_generated`) is banned through vocab_mask,
as xform never generates it. Scores are log-softmax, then the processors, then the beam's sum; the
top 2 x beams of beams x V per source, as transformers' and xform's beam search. fp16 needs the
CUDA provider: ONNX Runtime's CPU kernel refuses an fp16 model ("BeamSearch does not support float16
model on CPU execution provider").
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

MODEL_FILE = "beamsearch.onnx"
DATA_FILE = "beamsearch.onnx.data"
PROTOBUF_LIMIT = 2**31 - 2**26  # above this the tensors go to DATA_FILE (protobuf's 2 GB, with room)
SHARED_MIN_ELEMENTS = 1024  # initializers shared by both subgraphs from this size are stored once


# -- the subgraphs, traced from xform's model ----------------------------------------------------------
def _modules():
    """The two torch modules (defined here so that importing this file needs no torch: the engine
    runs in a process of ONNX Runtime alone)."""
    import torch
    from torch import nn

    from xform.contract import MASK_VALUE
    from xform.models.transformer import EncoderOutput

    def lengths(mask):
        return mask.sum(1).long()  # right-padded sources: the count of ones is the length

    def source_mask(mask):
        """encode()'s additive source mask from the int32 attention mask (the same formula)."""
        S = mask.shape[1]
        valid = torch.arange(S, device=mask.device).unsqueeze(0) < lengths(mask).unsqueeze(1)
        return torch.where(valid, 0.0, MASK_VALUE).to(torch.float32)

    class InitGraph(nn.Module):
        """encoder_decoder_init: encode, then the decoder over the start id with no past."""

        def __init__(self, model):
            super().__init__()
            self.model = model
            self.dtype = model.compute_dtype

        def forward(self, encoder_input_ids, encoder_attention_mask, decoder_input_ids):
            m = self.model
            hidden: list = []
            last = m.encoder_norm if m.encoder_norm is not None else m.encoder_layers[-1]
            hook = last.register_forward_hook(lambda _m, _i, out: hidden.append(out))
            try:
                enc = m.encode(encoder_input_ids.long(), lengths(encoder_attention_mask))
            finally:
                hook.remove()
            logits, present = m.decode(decoder_input_ids.long(), enc)
            dt = self.dtype
            return (logits.to(dt), hidden[0].to(dt), *[t.to(dt) for kv in present for t in kv],
                    *[t.to(dt) for kv in enc.cross_kv for t in kv])

    class StepGraph(nn.Module):
        """decoder: one token a row against its growing self-attention past and the cross K/V."""

        def __init__(self, model):
            super().__init__()
            self.model = model
            self.n = model.cfg.n_decoder_layers
            self.dtype = model.compute_dtype

        def forward(self, input_ids, encoder_attention_mask, *flat):
            n = self.n
            past = [(flat[2 * i], flat[2 * i + 1]) for i in range(n)]
            cross = [(flat[2 * n + 2 * i], flat[2 * n + 2 * i + 1]) for i in range(n)]
            enc = EncoderOutput(cross, source_mask(encoder_attention_mask))
            logits, present = self.model.decode(input_ids.long(), enc, past)
            return (logits.to(self.dtype), *[t.to(self.dtype) for kv in present for t in kv])

    return InitGraph, StepGraph


def io_names(n: int) -> dict[str, list[str]]:
    kv = lambda kind, scope: [f"{kind}_{k}_{scope}_{i}" for i in range(n) for k in ("key", "value")]  # noqa: E731
    return {"init_in": ["encoder_input_ids", "encoder_attention_mask", "decoder_input_ids"],
            "init_out": ["logits", "encoder_hidden_states", *kv("present", "self"), *kv("present", "cross")],
            "step_in": ["input_ids", "encoder_attention_mask", *kv("past", "self"), *kv("past", "cross")],
            "step_out": ["logits", *kv("present", "self")]}


def trace(model, opset: int, scratch: Path):
    """(init subgraph, decoder subgraph) as ModelProtos, traced from `model` with shapes set."""
    import warnings

    import onnx
    import torch

    InitGraph, StepGraph = _modules()
    cfg = model.cfg
    n, H, Dh, D, V = cfg.n_decoder_layers, cfg.n_heads, cfg.head_dim, cfg.d_model, cfg.tgt_vocab_size
    names = io_names(n)
    dt = model.compute_dtype
    B, S, P = 2, 5, 3
    ids = torch.randint(4, min(V, cfg.src_vocab_size) - 1, (B, S), dtype=torch.int32)
    mask = torch.ones(B, S, dtype=torch.int32)
    mask[1, 3:] = 0
    start = torch.full((B, 1), cfg.start_id, dtype=torch.int32)
    past = [torch.randn(B, H, P, Dh).to(dt) for _ in range(2 * n)]
    cross = [torch.randn(B, H, S, Dh).to(dt) for _ in range(2 * n)]
    kv_axes = lambda names_, seq: {k: {0: "batch", 2: seq} for k in names_}  # noqa: E731
    init_axes = {"encoder_input_ids": {0: "batch", 1: "enc_len"}, "encoder_attention_mask": {0: "batch", 1: "enc_len"},
                 "decoder_input_ids": {0: "batch"}, "logits": {0: "batch"},
                 "encoder_hidden_states": {0: "batch", 1: "enc_len"},
                 **{k: {0: "batch"} for k in names["init_out"] if "_self_" in k},
                 **kv_axes([k for k in names["init_out"] if "_cross_" in k], "enc_len")}
    step_axes = {"input_ids": {0: "batch"}, "encoder_attention_mask": {0: "batch", 1: "enc_len"},
                 "logits": {0: "batch"},
                 **kv_axes([k for k in names["step_in"] if "_self_" in k], "past_len"),
                 **kv_axes([k for k in names["step_in"] if "_cross_" in k], "enc_len"),
                 **kv_axes(names["step_out"][1:], "present_len")}
    jobs = [("init", InitGraph(model).eval(), (ids, mask, start), init_axes),
            ("step", StepGraph(model).eval(), (start, mask, *past, *cross), step_axes)]
    out = []
    for tag, module, args, axes in jobs:
        path = scratch / f"{tag}.onnx"
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TracerWarnings about shape-derived python ints are expected
            torch.onnx.export(module, args, str(path), dynamo=False, opset_version=opset,
                              input_names=names[f"{tag}_in"], output_names=names[f"{tag}_out"],
                              dynamic_axes=axes, do_constant_folding=True)
        proto = onnx.load(str(path), load_external_data=True)
        shapes = subgraph_shapes(names, tag, H, Dh, D, V)
        for vi in (*proto.graph.input, *proto.graph.output):
            set_shape(vi, shapes[vi.name])
        out.append(proto)
    return out[0], out[1]


def subgraph_shapes(names: dict, tag: str, H: int, Dh: int, D: int, V: int) -> dict[str, list]:
    """Every input's and output's dims as the operator reads them: heads, head size and vocabulary as
    numbers (Subgraph::GetParameters), input_ids' second dim 1 (the last token fed, not the sequence)."""
    s: dict[str, list] = {"logits": ["batch", 1, V], "input_ids": ["batch", 1], "decoder_input_ids": ["batch", 1],
                          "encoder_input_ids": ["batch", "enc_len"], "encoder_attention_mask": ["batch", "enc_len"],
                          "encoder_hidden_states": ["batch", "enc_len", D]}
    for k in names[f"{tag}_in"] + names[f"{tag}_out"]:
        if "_cross_" in k:
            s[k] = ["batch", H, "enc_len", Dh]
        elif k.startswith("past_"):
            s[k] = ["batch", H, "past_len", Dh]
        elif k.startswith("present_"):
            s[k] = ["batch", H, 1 if tag == "init" else "present_len", Dh]
    return s


def set_shape(vi, dims: list) -> None:
    shape = vi.type.tensor_type.shape
    shape.ClearField("dim")
    for d in dims:
        dim = shape.dim.add()
        if isinstance(d, int):
            dim.dim_value = d
        else:
            dim.dim_param = d


# -- the operator's graph --------------------------------------------------------------------------
def share_initializers(g1, g2) -> list:
    """Initializers of SHARED_MIN_ELEMENTS or more with the same dtype, dims and bytes in both
    subgraphs: removed from both, returned renamed `shared_<i>` for the main graph, each subgraph
    given a value_info for the name (ONNX Runtime needs the type of an outer-scope value)."""
    import onnx

    def key(t):
        return t.data_type, tuple(t.dims), hashlib.sha256(t.raw_data or t.SerializeToString()).hexdigest()

    def big(t):
        return int(np.prod(t.dims)) >= SHARED_MIN_ELEMENTS

    by_key = {key(t): t for t in g2.initializer if big(t)}
    shared, rename1, rename2 = [], {}, {}
    for t in list(g1.initializer):
        other = by_key.get(key(t)) if big(t) else None
        if other is None:
            continue
        if other.name in rename2:  # a duplicate within g1 of one already shared
            rename1[t.name] = rename2[other.name]
            continue
        name = f"shared_{len(shared)}"
        rename1[t.name], rename2[other.name] = name, name
        moved = onnx.TensorProto()
        moved.CopyFrom(t)
        moved.name = name
        shared.append(moved)
    for graph, rename in ((g1, rename1), (g2, rename2)):
        keep = [t for t in graph.initializer if t.name not in rename]
        graph.ClearField("initializer")
        graph.initializer.extend(keep)
        for node in graph.node:
            for i, name in enumerate(node.input):
                if name in rename:
                    node.input[i] = rename[name]
        infos = [v for v in graph.value_info if v.name not in rename]
        graph.ClearField("value_info")
        graph.value_info.extend(infos)
        for t in shared:
            graph.value_info.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return shared


def beam_search_model(init, step, cfg, opset: int):
    """The model: one BeamSearch node over the two subgraphs, its inputs the graph's."""
    import onnx
    from onnx import TensorProto, helper

    init.graph.name, step.graph.name = "xform encoder and decoder init", "xform decoder"
    shared = share_initializers(step.graph, init.graph)
    V = cfg.tgt_vocab_size
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", "src_len"]),
              *[helper.make_tensor_value_info(k, TensorProto.INT32, [1])
                for k in ("max_length", "min_length", "num_beams", "num_return_sequences")],
              helper.make_tensor_value_info("length_penalty", TensorProto.FLOAT, [1]),
              helper.make_tensor_value_info("repetition_penalty", TensorProto.FLOAT, [1]),
              helper.make_tensor_value_info("vocab_mask", TensorProto.INT32, [V]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT32, ["batch", "src_len"])]
    node_inputs = [i.name for i in inputs[:8]] + ["", "attention_mask"]  # prefix_vocab_mask unused
    node = helper.make_node(
        "BeamSearch", node_inputs, ["sequences"], name="BeamSearch_xform", domain="com.microsoft",
        eos_token_id=cfg.eos_id, pad_token_id=cfg.pad_id, decoder_start_token_id=cfg.start_id,
        no_repeat_ngram_size=0, early_stopping=0, model_type=1, vocab_size=V,
        encoder=init.graph, decoder=step.graph)
    out = helper.make_tensor_value_info("sequences", TensorProto.INT32, ["batch", "num_return_sequences", "max_length"])
    graph = helper.make_graph([node], "xform beam search", inputs, [out], shared)
    model = helper.make_model(graph, producer_name="xform scripts/ort_beamsearch.py",
                              opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = init.ir_version
    meta = {"vocab_size": V, "eos_id": cfg.eos_id, "pad_id": cfg.pad_id, "start_id": cfg.start_id,
            "never_generated": list(cfg.never_generated)}
    onnx.helper.set_model_props(model, {k: json.dumps(v) for k, v in meta.items()})
    return model


def load_model(model_or_dir: Any):
    """An xform Seq2SeqTransformer as is, or one resolved from a path (a Hugging Face Marian directory ...)."""
    from xform.models.transformer import Seq2SeqTransformer
    if isinstance(model_or_dir, Seq2SeqTransformer):
        return model_or_dir.eval()
    from xform.models.importers import resolve_model
    return resolve_model(model_or_dir).model.eval()


def build(model_or_dir: Any, out_dir: str | Path, precision: str = "fp32", opset: int = 17) -> Path:
    """Write OUT/beamsearch.onnx (and .data when large) for `model_or_dir` in `precision` ("fp32" or
    "fp16": the subgraphs traced from xform's `to_fp16` copy); returns its path."""
    import onnx

    from xform.models.transformer import to_fp16
    if precision not in ("fp32", "fp16"):
        raise ValueError(f"precision {precision!r}: fp32 or fp16")
    model = load_model(model_or_dir)
    if precision == "fp16":
        model = to_fp16(model)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".trace.") as scratch:
        init, step = trace(model, opset, Path(scratch))
        proto = beam_search_model(init, step, model.cfg, opset)
    path = out / MODEL_FILE
    (out / DATA_FILE).unlink(missing_ok=True)
    if proto.ByteSize() > PROTOBUF_LIMIT:
        onnx.save_model(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=DATA_FILE, size_threshold=1024)
    else:
        onnx.save_model(proto, str(path))
    return path


def cached_build(model_dir: Path, out_dir: Path, precision: str) -> Path:
    """OUT/beamsearch.onnx, built by a child process when absent (torch and the trace stay out of
    the caller's memory: bench_gpu records the engine process's peak RSS)."""
    path = Path(out_dir) / MODEL_FILE
    if not path.exists():
        subprocess.run([sys.executable, __file__, str(model_dir), str(out_dir), "--precision", precision], check=True)
    return path


def subgraph(path: str | Path, which: str):
    """The `encoder` or `decoder` subgraph of a built model as a model of its own (the shared
    initializers it reads put back): for checking what the operator runs, step by step."""
    import onnx
    full = onnx.load(str(path))
    node = full.graph.node[0]
    g = next(a.g for a in node.attribute if a.name == which)
    used = {i for n in g.node for i in n.input}
    g.initializer.extend(t for t in full.graph.initializer if t.name in used)
    keep = [v for v in g.value_info if v.name not in {t.name for t in g.initializer}]
    g.ClearField("value_info")
    g.value_info.extend(keep)
    model = onnx.helper.make_model(g, opset_imports=[o for o in full.opset_import if o.domain == ""])
    model.ir_version = full.ir_version
    return model


# -- running it ------------------------------------------------------------------------------------
def session(path: str | Path, device: str = "cpu"):
    import onnxruntime as ort
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
    return ort.InferenceSession(str(path), providers=providers)


def feeds(meta: dict, src: np.ndarray, lens: np.ndarray, beams: int, new: int, min_new: int) -> dict:
    """The operator's inputs: `new` tokens at most, end-of-sentence banned before `min_new`."""
    V, never = int(meta["vocab_size"]), json.loads(meta["never_generated"])
    S = src.shape[1]
    mask = (np.arange(S)[None, :] < np.asarray(lens)[:, None]).astype(np.int32)
    vocab_mask = np.ones(V, np.int32)
    vocab_mask[never] = 0  # the pad id (and banned ids): never generated, as by xform
    one = lambda v, dt=np.int32: np.array([v], dt)  # noqa: E731
    return {"input_ids": np.ascontiguousarray(src, np.int32), "max_length": one(new + 1),
            "min_length": one(min_new + 1), "num_beams": one(beams), "num_return_sequences": one(1),
            "length_penalty": one(1.0, np.float32), "repetition_penalty": one(1.0, np.float32),
            "vocab_mask": vocab_mask, "attention_mask": mask}


def engine(path: str | Path, device: str = "cpu"):
    """bench_gpu's engine callable: run(src (B, S), lens (B,), beams, new, on_step) -> ids (B, new),
    exactly `new` tokens a hypothesis (end-of-sentence banned, length penalty 1, one hypothesis
    returned, the start id dropped). num_beams 1 runs the same operator with one beam (greedy).
    `device` "cuda": the CUDA provider (the only one that runs an fp16 model). `new` 1 is refused: with
    max_length 2 ONNX Runtime 1.32's T5 beam search skips the branch that prepares the decoder's
    first feeds and runs the decoder subgraph on unset ones (garbage input_ids, an out-of-range
    Gather).

    The whole search is one operator call, so `on_step` cannot be called per step, and it is not
    called at all: a single call at the end would make bench_gpu record the whole run as one
    "step". This engine has no step latency (bench_gpu shows "-", as for CTranslate2)."""
    sess = session(path, device)
    meta = sess.get_modelmeta().custom_metadata_map

    def run(src, lens, beams, new, on_step=None):
        if new < 2:  # max_length 2: the operator skips its first-token branch and runs the decoder on unset feeds
            raise ValueError(f"ort-beamsearch decodes 2 new tokens or more (ONNX Runtime's BeamSearch with "
                             f"max_length 2 runs its decoder subgraph unfed), got {new}")
        seqs = sess.run(["sequences"], feeds(meta, src, lens, beams, new, new))[0]
        return seqs[:, 0, 1:].astype(np.int64)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a Hugging Face Marian directory (or any MODEL xform reads)")
    ap.add_argument("out", type=Path, help="the directory to write beamsearch.onnx in")
    ap.add_argument("--precision", choices=["fp32", "fp16"], default="fp32")
    a = ap.parse_args()
    print(build(a.model, a.out, a.precision))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # xform from this checkout when not installed
    main()
