"""One decoder self-attention step, today's cache against an in-place one (issue 30 item 2).

    python scripts/bench_inplace_cache.py [--rows 1 16 256 400] [--capacity 128] [--fill P] [--core]
                                          [--op gqa|dmmha] [--steps 8] [--repeat 5]

Marian-base shaped (d_model 512, 8 heads, head_dim 64), one layer's self-attention sublayer (the
q/k/v projections, the attention, the output projection), 2 threads, rows at mixed positions
(uniform in [0, capacity - steps), a fixed seed) or all at one position (--fill), each step one
position further; the cache as the runtime holds it (zeros, each row's filled positions written):

- `standard`: the decoder graph's attention as exported today (Attention.attend_cache traced: the
  whole capacity scored, unfilled positions masked), its new keys / values returned into bound
  buffers and written into the cache by the runtime (HostCache.write, the strided numpy write);
- `inplace`: com.microsoft GroupQueryAttention over the same cache bound as past and present
  (one buffer: the kernel writes row r's new keys / values at positions[r] and attends over
  positions[0..positions[r]] only; seqlens_k = positions, total_sequence_length = capacity).

Both produce the same output and leave the same cache (the largest difference of either is
printed: rounding, under 2e-6). `--core`: the attention alone (no projections, which are the same
work in both). `--op dmmha`: com.microsoft DecoderMaskedMultiHeadAttention instead, whose one
past_sequence_length for every row needs --fill. Prints ms per step, the best of --repeat timings
of --steps steps each, the variants interleaved.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import harness
import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper

from xform.config import TransformerConfig
from xform.models.layers import MASK_VALUE, Attention
from xform.runtime.backends.cache import HostCache

D, H, DH = 512, 8, 64


class Identity(torch.nn.Module):
    """Stands for a projection in the attention-only graphs (--core): no weights, no work."""

    def __init__(self):
        super().__init__()
        self.weight = torch.zeros(())

    def forward(self, x):
        return x


class Standard(torch.nn.Module):
    def __init__(self, attn: Attention):
        super().__init__()
        self.attn = attn

    def forward(self, x, positions, cache_k, cache_v):
        at = torch.arange(cache_k.shape[2])
        mask = torch.where(at[None] < positions[:, None], 0.0, MASK_VALUE).to(torch.float32)[:, None, None, :]
        new = self.attn.project_kv(x)
        return self.attn.attend_cache(x, (cache_k, cache_v), new, mask), new[0], new[1]


def core(attn: Attention) -> Attention:
    """`attn` without its projections (and with its scaling): the attention between them only."""
    import copy
    bare = copy.deepcopy(attn)
    bare.q_proj, bare.k_proj, bare.v_proj, bare.out_proj = Identity(), Identity(), Identity(), Identity()
    return bare


def standard_graph(attn: Attention, path: Path) -> None:
    x, pos = torch.randn(2, 1, D), torch.tensor([0, 3])
    k = torch.randn(2, H, 6, DH)
    torch.onnx.export(Standard(attn), (x, pos, k, k.clone()), str(path), dynamo=False, opset_version=17,
                      input_names=["x", "positions", "cache_key", "cache_value"],
                      output_names=["out", "new_key", "new_value"],
                      dynamic_axes={"x": {0: "b"}, "positions": {0: "b"}, "cache_key": {0: "b", 2: "c"},
                                    "cache_value": {0: "b", 2: "c"}, "out": {0: "b"}, "new_key": {0: "b"},
                                    "new_value": {0: "b"}})


def fused_graph(attn: Attention, path: Path, projections: bool, op: str = "gqa") -> None:
    """The same with GroupQueryAttention (or DecoderMaskedMultiHeadAttention: `op` dmmha), its
    cache past = present, with the model's own scaling of the queries and the operator's scale 1.0.
    DMMHA takes one past_sequence_length for every row: positions[0]."""
    inits = [helper.make_tensor("scale", TensorProto.FLOAT, [], [attn.scale or 1.0]),
             helper.make_tensor("two", TensorProto.INT64, [], [2]),
             helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
             helper.make_tensor("one", TensorProto.INT64, [1], [1])]
    nodes = []
    for n, src, out in (("q_proj", "x", "q0"), ("k_proj", "x", "k"), ("v_proj", "x", "v"), ("out_proj", "attn", "out")):
        if not projections:
            nodes.append(helper.make_node("Identity", [src], [out]))
            continue
        lin = getattr(attn, n)
        inits += [onnx.numpy_helper.from_array(lin.weight.detach().numpy().T.copy(), f"{n}.w"),
                  onnx.numpy_helper.from_array(lin.bias.detach().numpy(), f"{n}.b")]
        nodes += [helper.make_node("MatMul", [src, f"{n}.w"], [f"{out}_mm"]),
                  helper.make_node("Add", [f"{out}_mm", f"{n}.b"], [out])]
    nodes.append(helper.make_node("Mul", ["q0", "scale"], ["q"]))
    if op == "dmmha":
        nodes += [
            helper.make_node("Slice", ["positions", "zero", "one"], ["first"]),
            helper.make_node("Cast", ["first"], ["past_len"], to=TensorProto.INT32),
            helper.make_node("DecoderMaskedMultiHeadAttention",
                             ["q", "k", "v", "", "", "cache_key", "cache_value", "past_len"],
                             ["attn", "present_key", "present_value"], domain="com.microsoft",
                             num_heads=H, past_present_share_buffer=1, scale=1.0)]
    else:
        nodes += [
            helper.make_node("Cast", ["positions"], ["seqlens_k"], to=TensorProto.INT32),
            helper.make_node("Shape", ["cache_key"], ["cshape"]),
            helper.make_node("Gather", ["cshape", "two"], ["cap64"], axis=0),
            helper.make_node("Cast", ["cap64"], ["total"], to=TensorProto.INT32),
            helper.make_node("GroupQueryAttention", ["q", "k", "v", "cache_key", "cache_value", "seqlens_k", "total"],
                             ["attn", "present_key", "present_value"], domain="com.microsoft",
                             num_heads=H, kv_num_heads=H, scale=1.0)]
    cache = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", H, "c", DH])  # noqa: E731
    graph = helper.make_graph(
        nodes, "gqa", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 1, D]),
                       helper.make_tensor_value_info("positions", TensorProto.INT64, ["b"]),
                       cache("cache_key"), cache("cache_value")],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["b", 1, D]), cache("present_key"),
         cache("present_value")], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    onnx.save(model, str(path))


def session(path: Path):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 2, 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def bind(b, kind, name, a):
    (b.bind_input if kind == "input" else b.bind_output)(name, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)


def measure(rows: int, cap: int, fill: int | None, steps: int, repeat: int, std, gqa
            ) -> tuple[float, float, float, float, float]:
    """ms per step of (standard + write, in place, -, standard graph, write) and the largest
    difference between the two variants' outputs and caches."""
    rng = np.random.default_rng(rows)
    positions = (np.full(rows, fill) if fill is not None else rng.integers(0, cap - steps, rows)).astype(np.int64)
    x = rng.standard_normal((rows, 1, D)).astype(np.float32)
    # as the runtime holds it: zeros (pages never written stay the shared zero page), each row's
    # first positions[r] positions written
    init = [np.zeros((rows, H, cap, DH), np.float32) for _ in range(2)]
    for a in init:
        for r, p in enumerate(positions):
            a[r, :, :p] = rng.standard_normal((H, p, DH))
    # standard: the cache as HostCache holds it, the new K/V bound out, written in by the runtime
    hc = HostCache(2, (rows, H, cap, DH), np.float32)
    hc.arrays = [a.copy() for a in init]
    out_s = np.empty((rows, 1, D), np.float32)
    # in place: the two buffers bound as past and present
    kv = [a.copy() for a in init]
    out_g = np.empty((rows, 1, D), np.float32)

    def run_graph(p):  # the standard graph alone, its new keys / values into hc.new
        b = std.io_binding()
        bind(b, "input", "x", x), bind(b, "input", "positions", p)
        for n, a in zip(("cache_key", "cache_value"), hc.arrays):
            bind(b, "input", n, a)
        bind(b, "output", "out", out_s)
        for n, a in zip(("new_key", "new_value"), hc.new):
            bind(b, "output", n, a)
        std.run_with_iobinding(b)

    def run_standard(p):  # what the runtime does today: the graph, then the host write
        run_graph(p)
        hc.write(p)

    def run_gqa(p):
        b = gqa.io_binding()
        bind(b, "input", "x", x), bind(b, "input", "positions", p)
        for n, a in zip(("cache_key", "cache_value"), kv):
            bind(b, "input", n, a)
        bind(b, "output", "out", out_g)
        for n, a in zip(("present_key", "present_value"), kv):
            bind(b, "output", n, a)
        gqa.run_with_iobinding(b)

    def fresh(name: str) -> None:
        """A fresh copy of the starting cache (all of it resident: the page faults of first writes
        would be the same in both variants, and are not what is measured)."""
        for i, b in enumerate(init):
            (hc.arrays if name != "inplace" else kv)[i] = np.zeros_like(b)
            (hc.arrays if name != "inplace" else kv)[i][:] = b

    def steps_of(run):
        return lambda: [run(positions + s) for s in range(steps)]
    runs = {"graph": run_graph, "write": hc.write, "standard": run_standard, "inplace": run_gqa}
    # interleaved, so that the machine's other load falls on both
    times, _ = harness.interleave({name: steps_of(run) for name, run in runs.items()}, repeat, before=fresh)
    best = {name: min(t) / steps * 1e3 for name, t in times.items()}
    diff = float(np.abs(out_s - out_g).max())  # the last step of the last repeat, both from the same start
    # the caches: equal up to the projections' rounding (the two graphs' MatMuls), untouched elsewhere
    diff = max(diff, *(float(np.abs(a - b).max()) for a, b in zip(hc.arrays, kv)))
    return best["standard"], best["inplace"], diff, best["graph"], best["write"]


def main() -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 256, 400])
    ap.add_argument("--capacity", type=int, default=128)
    ap.add_argument("--fill", type=int, default=None, help="every row at this position (default: mixed)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--op", choices=("gqa", "dmmha"), default="gqa",
                    help="the in-place operator: GroupQueryAttention, or DecoderMaskedMultiHeadAttention (with --fill)")
    ap.add_argument("--core", action="store_true", help="the attention alone, without the four projections")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = TransformerConfig(d_model=D, n_heads=H, d_ff=2048, n_encoder_layers=1, n_decoder_layers=1,
                            src_vocab_size=8, tgt_vocab_size=8)
    attn = Attention(cfg).eval()
    with tempfile.TemporaryDirectory() as tmp:
        standard_graph(core(attn) if args.core else attn, Path(tmp) / "std.onnx")
        if args.op == "dmmha" and args.fill is None:
            ap.error("--op dmmha takes one past length for every row: give --fill")
        fused_graph(attn, Path(tmp) / "gqa.onnx", not args.core, args.op)
        std, gqa = session(Path(tmp) / "std.onnx"), session(Path(tmp) / "gqa.onnx")
        where = f"all at {args.fill}" if args.fill is not None else "mixed positions"
        what = "attention alone" if args.core else "self-attention sublayer"
        print(f"{what}, capacity {args.capacity}, {where}, ms per step (best of {args.repeat} x {args.steps} steps), "
              "2 threads, machine shared")
        print("\n".join(harness.table(("rows", "standard graph", "host write", "standard + write",
                                       f"in place ({args.op})", "ratio", "max abs diff"), "rrrrrrr")))
        for rows in args.rows:
            s, g, diff, graph, write = measure(rows, args.capacity, args.fill, args.steps, args.repeat, std, gqa)
            print(harness.row(rows, f"{graph:.3f}", f"{write:.3f}", f"{s:.3f}", f"{g:.3f}", f"{s / g:.2f}x",
                              f"{diff:.1e}"))


if __name__ == "__main__":
    main()
