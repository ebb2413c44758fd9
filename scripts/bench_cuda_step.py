"""The decoder step on ONNX Runtime's CUDA provider, as exported against CUDA-graph capture and
ONNX Runtime's GPU fusions (issue 41 item 4), on one GPU in one run.

    python scripts/bench_cuda_step.py [--work /tmp/xform-gpu] [--out DIR] [--rows 1 16 64 256]
                                      [--capacity 64] [--src-len 32] [--steps 100]
    python scripts/bench_cuda_step.py --shape tiny --device cpu --variants plain   # its CPU smoke run

The bench_gpu Marian-base (random weights), exported in fp32 and fp16. One decoder step is timed
the way a decode runs it once bound: every input and output an OrtValue on the device at a fixed
address, the step's ids and positions copied in (`update_inplace`), the graph run, the chosen ids
copied out; each row at position capacity / 2 of a capacity-`--capacity` cache over `--src-len`
source tokens. Variants (each its own session over the same bundle, through OrtBackend's own
session opening, so shared weights are given as the runtime gives them):

- `plain`: the session as xform opens it (CUDA with TF32 off, the CPU provider beside it);
- `graph`: the same graph with `enable_cuda_graph` (the CUDA provider alone: a captured graph
  must have every node on it), one `gpu_graph_id` per row count: captured at its first runs,
  replayed after; `graph-cpu` the same with the CPU provider beside it, as xform opens sessions;
- `fused` / `fused-graph` (fp32): the decoder graph through `onnxruntime.transformers.optimizer`
  (model type bart, `use_gpu=True`, its fusions only), verified on the CPU against the traced graph
  as scripts/bench_fusions.py does, without and with capture.

Each variant's logits are compared with `plain`'s on the same inputs after the timing, at a
second position too (a replayed graph must read the inputs' new values). Prints and writes
`bench_cuda_step.json` / `.md` into --out: ms per step (the median of --steps after warm-up),
tokens/s a step implies (rows / step), and the session's node count after ONNX Runtime's
optimizations.
"""
from __future__ import annotations

import json
import shutil
import statistics
import time
import traceback
from pathlib import Path

import harness
import numpy as np


def fused_bundle(src: Path, dst: Path) -> dict:
    """DST: SRC with its decoder graph through ONNX Runtime's GPU fusions, verified (bench_fusions)."""
    import bench_fusions
    from onnxruntime.transformers.optimizer import optimize_model

    from xform.exporter.export import shared_weights
    from xform.manifest import Manifest

    def gpu_optimize(path: Path, cfg):
        return optimize_model(str(path), model_type=bench_fusions.MODEL_TYPE, num_heads=cfg.n_heads,
                              hidden_size=cfg.d_model, opt_level=0, use_gpu=True).model

    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    manifest = Manifest.read(dst / "manifest.json")
    record = bench_fusions.fuse_graph(src / "decoder.onnx", dst / "decoder.onnx", manifest.config, gpu_optimize)
    manifest.shared_weights = shared_weights(dst)
    manifest.write(dst)
    return record


def open_decoder(bundle: Path, device: str, cuda_graph: str, optimized: Path | None):
    """The decoder graph's session opened as OrtBackend opens it; with `cuda_graph` "alone", the
    CUDA provider alone with enable_cuda_graph, with "cpu" the CPU provider beside it (ONNX Runtime
    refuses capture if it places a node there). Returns (backend, session)."""
    from xform.contract import DECODER
    from xform.runtime.backends.ort_backend import OrtBackend
    from xform.runtime.bundle import Bundle

    backend = OrtBackend(Bundle.open(bundle), device=device)
    if cuda_graph:
        backend.providers = [("CUDAExecutionProvider", {"use_tf32": "0", "enable_cuda_graph": "1"})]
        if cuda_graph == "cpu":
            backend.providers.append("CPUExecutionProvider")
    if optimized is not None:  # ONNX Runtime's optimized graph written out: its node count
        open_session = backend.open_session

        def with_dump(graph):
            ort = backend.ort
            real = ort.SessionOptions

            class Dumping(real):  # the options OrtBackend makes, with the optimized graph written
                def __init__(self):
                    super().__init__()
                    self.optimized_model_filepath = str(optimized)
            ort.SessionOptions = Dumping
            try:
                return open_session(graph)
            finally:
                ort.SessionOptions = real
        backend.open_session = with_dump
    backend.sessions.pop(DECODER, None)
    return backend, backend.graph_session(DECODER)


class Step:
    """One decoder step over `rows` rows, every tensor an OrtValue on `device` bound once."""

    def __init__(self, ort, sess, spec, rows: int, capacity: int, src_len: int, device: str, graph_id: int | None):
        rng = np.random.default_rng(rows)
        sizes = {"batch": rows, "src_batch": rows, "src_len": src_len, "cache_len": capacity}
        self.ort, self.sess, self.device = ort, sess, device
        self.binding = sess.io_binding()
        self.values = {}
        for t in spec.inputs:
            shape = [sizes[a] if isinstance(a, str) else a for a in t.shape]
            if t.dtype == "int64":
                a = np.zeros(shape, np.int64)
            elif t.name == "src_mask":
                a = np.zeros(shape, np.float32)
            else:
                a = (rng.standard_normal(shape) * 0.5).astype(t.dtype)
                if t.name.startswith("cache_"):
                    a[:, :, capacity // 2:] = 0  # unwritten positions are zeros, as the runtime keeps them
            self.values[t.name] = v = ort.OrtValue.ortvalue_from_numpy(a, device, 0)
            self.binding.bind_ortvalue_input(t.name, v)
        for t in spec.outputs:
            shape = [sizes[a] if isinstance(a, str) else a for a in t.shape]
            self.values[t.name] = v = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.dtype(t.dtype), device, 0)
            self.binding.bind_ortvalue_output(t.name, v)
        self.ids = rng.integers(2, 100, (rows, 1)).astype(np.int64)
        self.positions = np.full(rows, capacity // 2, np.int64)
        self.options = ort.RunOptions()
        if graph_id is not None:
            self.options.add_run_config_entry("gpu_graph_id", str(graph_id))

    def __call__(self, position: int | None = None) -> np.ndarray:
        if position is not None:
            self.positions[:] = position
        self.values["input_ids"].update_inplace(self.ids)
        self.values["positions"].update_inplace(self.positions)
        self.sess.run_with_iobinding(self.binding, self.options)
        return self.values["next_ids"].numpy()

    def logits(self) -> np.ndarray:
        return self.values["logits"].numpy().astype(np.float32)


def measure(variants: dict, spec, rows_list, capacity, src_len, steps, device) -> list[dict]:
    """ms per step of every variant at every row count; logits against `plain`'s. At the end every
    captured graph is replayed again after the others ran (each row count's graph is its own
    gpu_graph_id in one session: another id's runs must not have disturbed it)."""
    import onnxruntime as ort
    out, kept = [], {}
    for rows in rows_list:
        for name, (sess, graph) in variants.items():
            row = {"variant": name, "rows": rows}
            try:
                step = kept[name, rows] = Step(ort, sess, spec, rows, capacity, src_len, device,
                                               rows if graph else None)
                times = harness.timed(step, steps, warmup=4)  # a captured variant captures in its warm-up
                ms = statistics.median(times) * 1e3
                row.update(ms=round(ms, 4), p10=round(np.percentile(times, 10) * 1e3, 4),
                           tokens_per_s=round(rows / ms * 1e3, 1))
                row.update(compare(kept, name, rows, capacity))
            except Exception as e:  # recorded, the other variants go on
                row["error"] = f"{type(e).__name__}: {e}"[:600]
            print(json.dumps(row), flush=True)
            out.append(row)
    for row in out:  # every graph replayed again, after all the others
        if "error" not in row and row["variant"] != "plain":
            row.update({f"again_{k}": v for k, v in compare(kept, row["variant"], row["rows"], capacity).items()})
    return out


def compare(kept: dict, name: str, rows: int, capacity: int) -> dict:
    """`name`'s logits against `plain`'s at two positions (a replay must read the new values)."""
    diffs = {}
    for p in (capacity // 2 - 5, capacity // 2):
        kept[name, rows](p)
        if name != "plain" and ("plain", rows) in kept:
            kept["plain", rows](p)
            diff = np.abs(kept[name, rows].logits() - kept["plain", rows].logits())
            diffs[f"max_abs_vs_plain@{p}"] = float(diff.max())
    return diffs


def node_count(path: Path) -> int | None:
    import onnx
    return len(onnx.load(str(path), load_external_data=False).graph.node) if path.exists() else None


def main() -> None:
    ap = harness.parser(__doc__, work="/tmp/xform-gpu", out="optional")
    ap.add_argument("--shape", choices=("base", "tiny"), default="base")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--precisions", nargs="+", default=["fp32", "fp16"])
    ap.add_argument("--variants", nargs="+", default=["plain", "graph", "graph-cpu", "fused", "fused-graph"])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--capacity", type=int, default=64)
    ap.add_argument("--src-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    import bench_gpu
    import onnxruntime as ort

    from xform.contract import DECODER
    from xform.runtime.bundle import Bundle

    args.work.mkdir(parents=True, exist_ok=True)
    hf = bench_gpu.build_model(args.shape, args.work)
    results: dict = {"machine": harness.machine(), "onnxruntime": ort.__version__, "device": args.device,
                     "shape": args.shape, "capacity": args.capacity, "src_len": args.src_len, "rows": []}
    if args.device == "cuda":
        import torch
        results["gpu"] = torch.cuda.get_device_name(0)
    for precision in args.precisions:
        t0 = time.perf_counter()
        bundle = bench_gpu.export(hf, args.work, precision)
        results[f"export_{precision}_s"] = round(time.perf_counter() - t0, 1)
        spec = Bundle.open(bundle).graph_spec(DECODER)
        variants, keep = {}, []
        for name in args.variants:
            fused = name.startswith("fused")
            if fused and precision != "fp32":
                continue
            path = bundle
            try:
                if fused:
                    path = args.work / f"fused-{precision}"
                    if "fusion" not in results:
                        results["fusion"] = fused_bundle(bundle, path)
                    if not results["fusion"].get("applied"):
                        continue
                dump = args.work / f"optimized-{precision}-{name}.onnx"
                graph = "cpu" if name.endswith("graph-cpu") else "alone" if name.endswith("graph") else ""
                backend, sess = open_decoder(path, args.device, graph, dump)
                keep.append(backend)  # the shared weights live as long as the session
                variants[name] = (sess, bool(graph))
                results[f"nodes_{precision}_{name}"] = node_count(dump)
            except Exception:
                results[f"open_{precision}_{name}"] = traceback.format_exc()[-1500:]
                print(f"{precision} {name}: could not open\n{results[f'open_{precision}_{name}']}", flush=True)
        for row in measure(variants, spec, args.rows, args.capacity, args.src_len, args.steps, args.device):
            results["rows"].append({"precision": precision, **row})
        del variants, keep
    text = markdown(results)
    print(text)
    if args.out:
        harness.write_report(args.out, "bench_cuda_step", results, text)


def markdown(results: dict) -> str:
    lines = [f"Decoder step, {results['shape']} shape, {results.get('gpu', results['device'])}, onnxruntime "
             f"{results['onnxruntime']}, capacity {results['capacity']}, source {results['src_len']} tokens:", ""]
    rows = []
    for r in results["rows"]:
        if "error" in r:
            rows.append((r["precision"], r["variant"], r["rows"], f"failed: {r['error'][:160]}", "", "", ""))
            continue
        diffs = [v for k, v in r.items() if "max_abs" in k]
        rows.append((r["precision"], r["variant"], r["rows"], f"{r['ms']:.3f}", f"{r['p10']:.3f}",
                     f"{r['tokens_per_s'] / 1e3:.1f}", f"{max(diffs):.2g}" if diffs else "-"))
    lines += harness.table(("precision", "variant", "rows", "ms / step (p50)", "p10", "rows / ms", "max abs vs plain"),
                           "llrrrrr", rows)
    nodes = {k: v for k, v in results.items() if k.startswith("nodes_")}
    lines += ["", f"Nodes after ONNX Runtime's optimizations: {nodes}"]
    if "fusion" in results:
        lines.append(f"Fusion: {results['fusion']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
