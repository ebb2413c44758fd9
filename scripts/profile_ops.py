"""Where the decoder step's time goes, operator by operator (ONNX Runtime's profiler), beside
CTranslate2's step at the same rows, on this machine (issue 44, item 1).

    python scripts/profile_ops.py --xform /tmp/xb/xform-fp32 --xform /tmp/xb/xform-int8 --ct2 /tmp/xb/ct2 \\
        [--threads 2] [--new-tokens 64] [--out docs/profile_ops.json]

The bundles and the CTranslate2 model are scripts/bench_peers.py's (Marian-base, random weights:
`python scripts/bench_peers.py --work /tmp/xb` builds them). Two workloads, each decoding exactly
--new-tokens steps from 32-token sources: batch 16 at beam 4 (64 decoder rows, the peer
benchmark's) and a file's 256-row batch (256 sources, greedy). For each bundle and workload:

- the step's time without the profiler (a decode's wall time over its steps, median of 3), and
  CTranslate2's at the same rows and precision (its int8 for an int8 bundle);
- the decoder-step graph's operators by type, their share of the graph's time, from ONNX Runtime's
  profiler over one decode after a warm-up (the profiler's own cost inflates every operator alike);
- the matrix products' throughput (MatMul / Gemm / FusedMatMul and the int8 products:
  2 x output elements x inner dimension, from the shapes the profiler records; for int8, integer
  operations) against the machine's practical FP32 peak, ONNX Runtime's own MatMul on a
  2048-cube product with the same threads, so "compute-bound" is a figure.

Prints Markdown; --out writes the figures as JSON.
"""
from __future__ import annotations

import glob
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import harness
import numpy as np

SRC_LEN = 32
WORKLOADS = {"batch 16, beam 4 (64 rows)": (16, 4), "256 rows, greedy (a file's batch)": (256, 1)}
PRODUCTS = ("MatMul", "Gemm", "FusedMatMul", "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
            "QGemm")


def machine() -> dict:
    """The CPU's model, cores, clock (as /proc/cpuinfo says it now) and widest SIMD."""
    info = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count() or 1, "mhz": None}
    try:
        text = open("/proc/cpuinfo").read()
        info["cpu"] = next(ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name"))
        info["mhz"] = float(next(ln.split(":", 1)[1] for ln in text.splitlines() if ln.startswith("cpu MHz")))
        flags = next(ln for ln in text.splitlines() if ln.startswith("flags")).split()
        info["simd"] = "avx512f" if "avx512f" in flags else "avx2" if "avx2" in flags else "sse"
    except (OSError, StopIteration, ValueError):
        pass
    return info


def gemm_peak(threads: int, n: int = 2048) -> float:
    """The machine's practical FP32 peak: GFLOP/s of ONNX Runtime's own MatMul (MLAS) on an n x n
    x n product with `threads` threads, the best of 5."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "gemm",
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [n, n]) for x in "ab"],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    best = float("inf")
    for _ in range(6):
        t0 = time.perf_counter()
        sess.run(None, {"a": a, "b": a})
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best / 1e9


def sources(vocab: int, batch: int, pad: int, eos: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    src = rng.integers(2, vocab - 10, (batch, SRC_LEN)).astype(np.int64)
    src[src == pad] = 2
    src[:, -1] = eos
    return src, np.full(batch, SRC_LEN, np.int64)


def step_ms(decode, steps: int, runs: int = 3) -> float:
    return statistics.median(harness.timed(decode, runs, warmup=1)) / steps * 1e3


def xform_figures(bundle: str, batch: int, beams: int, steps: int, threads: int) -> dict:
    """The step's time, then one profiled decode's operators (decoder-step graphs only)."""
    import xform
    import xform.runtime.backends.ort_backend as ob

    session = xform.load(bundle, backend="ort", threads=threads)
    src, lens = sources(session.config.src_vocab_size, batch, session.pad_id, session.eos_id)
    gen = session.generation_config(steps, min_new_tokens=steps, num_beams=beams)
    plain = step_ms(lambda: session.run(session.request(src, lens, generation=gen)).ids, steps)
    prefix = tempfile.mkdtemp(prefix="xform-prof-")
    opener = ob.session

    def profiled(ort, path, opts, providers):
        if Path(path).name.startswith("decoder"):
            opts.enable_profiling = True
            opts.profile_file_prefix = os.path.join(prefix, Path(path).stem)
        return opener(ort, path, opts, providers)
    ob.session = profiled
    try:
        session = xform.load(bundle, backend="ort", threads=threads)
        session.run(session.request(src, lens, generation=gen)).ids  # warm-up: its runs are left out below
        session.run(session.request(src, lens, generation=gen)).ids
        for s in session.backend.sessions.values():
            if s.get_session_options().enable_profiling:
                s.end_profiling()
    finally:
        ob.session = opener
    ops = operators(glob.glob(os.path.join(prefix, "*.json")), steps)
    return {"step_ms": plain, **ops}


def operators(files: list[str], steps: int) -> dict:
    """Node time by operator type over the last `steps` runs of each profiled session, and the
    products' FLOPs."""
    by_type: dict[str, float] = defaultdict(float)
    flops, product_us = 0.0, 0.0
    for f in files:
        events = json.load(open(f))
        runs = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
        if not runs:
            continue
        start = runs[-steps] if len(runs) >= steps else runs[0]
        for e in events:
            if e.get("cat") != "Node" or e["ts"] < start or not e["name"].endswith("_kernel_time"):
                continue
            op, dur = e["args"].get("op_name", "?"), float(e["dur"])
            by_type[op] += dur
            if op in PRODUCTS:
                product_us += dur
                flops += product_flops(e["args"])
    total = sum(by_type.values())
    return {"graph_ms_per_step": total / steps / 1e3,
            "by_type": {k: v / total for k, v in sorted(by_type.items(), key=lambda kv: -kv[1])},
            "products_gflops": flops / product_us / 1e3 if product_us else None,
            "products_share": product_us / total if total else None}


def product_flops(args: dict) -> float:
    """2 x output elements x the inner dimension of a matrix product, from the profiler's shapes."""
    try:
        a = list(args["input_type_shape"][0].values())[0]
        out = list(args["output_type_shape"][0].values())[0]
    except (KeyError, IndexError, AttributeError):
        return 0.0
    return 2.0 * float(np.prod(out)) * a[-1]


def ct2_step_ms(model: str, batch: int, beams: int, steps: int, threads: int, compute_type: str) -> float:
    import bench_peers
    import ctranslate2
    translator = ctranslate2.Translator(model, device="cpu", inter_threads=1, intra_threads=threads,
                                        compute_type=compute_type)
    src, lens = sources(32000, batch, bench_peers.PAD, bench_peers.EOS)
    tokens = [[bench_peers.token(int(i)) for i in row[:n]] for row, n in zip(src, lens)]

    def decode():
        translator.translate_batch(tokens, beam_size=beams, max_decoding_length=steps, min_decoding_length=steps,
                                   max_batch_size=batch)
    return step_ms(decode, steps)


def markdown(report: dict) -> str:
    m = report["machine"]
    peak = m["gemm_gflops"]
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores at {m['mhz']:.0f} MHz ({m.get('simd')}); ONNX Runtime's MatMul "
             f"on a 2048-cube product: {peak:.0f} GFLOP/s with these threads (the practical FP32 peak); "
             f"{report['threads']} threads, {report['steps']} steps from {SRC_LEN}-token sources", ""]
    rows = []
    for r in report["rows"]:
        others = ", ".join(f"{k} {v:.0%}" for k, v in list(r["by_type"].items())[:6] if k not in PRODUCTS)
        prod = (f"{r['products_share']:.0%}, {r['products_gflops']:.0f} ({r['products_gflops'] / peak:.0%})"
                if r["products_gflops"] and peak else "-")
        ct2 = r.get("ct2_step_ms")
        rows.append((r["bundle"], r["workload"], f"{r['step_ms']:.2f}", harness.fmt(ct2, "{:.2f}"),
                     harness.fmt(None if ct2 is None else ct2 / r["step_ms"], "{:.2f}x"),
                     f"{r['graph_ms_per_step']:.2f}", prod, others))
    lines += harness.table(("bundle", "workload", "xform step ms", "CTranslate2 step ms", "CT2 / xform",
                            "decoder graph ms", "matrix products: share, GFLOP/s (of peak)",
                            "the other operators (share of the graph)"), "llrrrrll", rows)
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = harness.parser(__doc__, threads=2)
    ap.add_argument("--xform", action="append", required=True, help="a bundle (repeat: fp32 and int8)")
    ap.add_argument("--ct2", default=None, help="the CTranslate2 model of the same weights (bench_peers' ct2)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    import xform
    report = {"machine": {**machine(), "gemm_gflops": gemm_peak(a.threads)}, "threads": a.threads,
              "steps": a.new_tokens, "rows": [], "command": harness.command(__file__)}
    for bundle in a.xform:
        precision = xform.load(bundle).bundle.precision
        for name, (batch, beams) in WORKLOADS.items():
            print(f"  {bundle}: {name}", file=sys.stderr, flush=True)
            row = {"bundle": f"{Path(bundle).name} ({precision})", "workload": name,
                   **xform_figures(bundle, batch, beams, a.new_tokens, a.threads)}
            if a.ct2:
                row["ct2_step_ms"] = ct2_step_ms(a.ct2, batch, beams, a.new_tokens, a.threads,
                                                 "int8" if precision == "int8" else "float32")
            report["rows"].append(row)
    print(markdown(report))
    if a.out is not None:
        harness.write_json(a.out, report)


if __name__ == "__main__":
    main()
