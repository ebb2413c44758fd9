"""xform on a GPU against eager transformers on the same GPU, in one run (issue 41 item 5).

    python scripts/bench_gpu.py [--work /tmp/xform-gpu] [--out docs] [--iters 5]
    python scripts/bench_gpu.py --device cpu --shape tiny --batches 1 --beams 1 --new-tokens 8 --iters 1

A Marian Transformer-base (d_model 512, 6+6 layers, 8 heads, FFN 2048, vocabulary 32,000, random
weights: scripts/bench_peers.py's) is exported by xform in fp32 and fp16; every engine decodes
the same 32-token random sources, exactly --new-tokens (64) new tokens a hypothesis, at batch 1,
16, 64 and 256, greedy and beam 4 (length penalty 1, one hypothesis returned):

- xform fp32 / fp16: `xform.load(bundle, device=cuda)` on ONNX Runtime's CUDA provider (fp32
  with TF32 off, as xform runs it by default); `xform-graph` (named in --engines): the same with
  the decoder step captured as a CUDA graph (xform/runtime/backends/cuda_graphs.py), and
  `xform-graph-cand` with beams through the captured decoder + the candidates graph;
  `xform-graph-reorder` with the beam reorder graph captured too (cuda_graphs.CAPTURE_REORDER);
- xform fp16-int4 / fp16-int8 / fp16-fused / fp16-int4-fused ... (named in --engines; any engine
  kind of xform's): the bundle exported with `--weights int4 / int8` (MatMul weights as ONNX
  Runtime's MatMulNBits, activations in the named precision; exporter/weights.py) and / or `--fuse`
  (`fused`: attention,qkv,skip_layer_norm; `fusedx`: cross_attention,skip_layer_norm;
  exporter/fused.py), bench_peers.VARIANTS;
- transformers fp32 / fp16: eager `generate` with the KV cache (TF32 off for fp32, as for xform);
- ort-beamsearch fp32 / fp16 (named in --engines): ONNX Runtime's BeamSearch operator, scripts/ort_beamsearch.py;
- CTranslate2 fp32 / fp16 where its wheel imports and sees the device (`--shape base` only: it
  converts the model with its synthetic vocabulary).

Each engine runs in a process of its own, one after the other (the GPU is never shared). Per
workload: tokens/s (the median of --iters runs after --warmup), the decoder step's latency p50
(the time between steps as the host sees them; CTranslate2 exposes no step), and the engine's
memory: on CUDA the device memory its process holds after the runs (allocators keep their peak;
cudaMemGetInfo before loading and after), on the CPU its peak RSS. Token agreement with
transformers at the same precision is recorded (random weights: near-ties may flip in fp16).
Writes JSON and Markdown (`bench_gpu[_cpu].json / .md` in --out) with ratios to transformers
fp16 on CUDA (fp32 on the CPU), the issue's yardstick.

`--device cpu` runs the same code on the CPU (fp32 engines only; fp16 needs a GPU), so CI runs its
smallest case (`--shape tiny`: d_model 64, 2+2 layers, vocabulary 1,000).
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import harness
import numpy as np

SHAPES = {"base": dict(d_model=512, layers=6, heads=8, ffn=2048, vocab=32000),
          "tiny": dict(d_model=64, layers=2, heads=4, ffn=128, vocab=1000)}
SRC_LEN = 32


def build_model(shape: str, work: Path, tokenizer: bool = False) -> Path:
    """The Hugging Face Marian directory: bench_peers' Marian-base (with its synthetic tokenizer,
    which CTranslate2's converter reads), or the tiny one (no tokenizer: xform and transformers
    read ids)."""
    if shape == "base" and tokenizer:  # CTranslate2's converter reads bench_peers' synthetic tokenizer
        import bench_peers
        return bench_peers.build_model(work)
    import torch
    from transformers import MarianConfig, MarianMTModel
    s, hf = SHAPES[shape], work / f"marian-{shape}"
    if not (hf / "config.json").exists():
        torch.manual_seed(0)
        pad = s["vocab"] - 1
        cfg = MarianConfig(vocab_size=s["vocab"], decoder_vocab_size=s["vocab"], d_model=s["d_model"],
                           encoder_layers=s["layers"], decoder_layers=s["layers"], encoder_attention_heads=s["heads"],
                           decoder_attention_heads=s["heads"], encoder_ffn_dim=s["ffn"], decoder_ffn_dim=s["ffn"],
                           max_position_embeddings=512, activation_function="swish", scale_embedding=True,
                           pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad, forced_eos_token_id=None,
                           bad_words_ids=[[pad]])
        MarianMTModel(cfg).eval().save_pretrained(hf)
    return hf


def export(hf: Path, work: Path, precision: str) -> Path:
    import bench_peers
    out = work / f"bundles-{hf.name}"
    out.mkdir(exist_ok=True)
    return bench_peers.export_xform(hf, out, precision)


def sources(vocab: int, batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(batch, SRC_LEN) ids 2 .. vocab-2 ending with end-of-sentence (0); no padding."""
    rng = np.random.default_rng(seed)
    src = rng.integers(2, vocab - 1, (batch, SRC_LEN)).astype(np.int64)
    src[:, -1] = 0
    return src, np.full(batch, SRC_LEN, np.int64)


# -- the engines: each (src, lens, beams, new_tokens, on_step) -> ids (B, new_tokens) ---------------------
def xform_engine(bundle: Path, device: str, capture: bool = False, fused_beams: bool = True,
                 capture_reorder: bool = False):
    """xform on ONNX Runtime; `capture`: the decoder step captured as a CUDA graph (engines
    "xform-graph" and "xform-graph-cand", the backend's cuda_graphs.py whatever its default; this
    process's alone); without `fused_beams`, beams through decoder + candidates graphs."""
    import xform
    from xform.runtime.backends import ort_backend
    from xform.runtime.decoding.generation import GenerationConfig
    ort_backend.CAPTURE = capture
    ort_backend.CAPTURE_REORDER = capture_reorder
    session = xform.load(bundle, backend="ort", device=device)
    session.backend.fused_beams = session.backend.fused_beams and fused_beams

    def run(src, lens, beams, new, on_step):
        gen = GenerationConfig(max_new_tokens=new, min_new_tokens=new, num_beams=beams)
        return session.run(session.request(src, lens, generation=gen), on_step).ids
    return run


def transformers_engine(hf: Path, device: str, precision: str):
    import torch
    from transformers import MarianMTModel, StoppingCriteria, StoppingCriteriaList
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 is fp32, as for xform
    model = MarianMTModel.from_pretrained(hf).eval().to(device)
    if precision == "fp16":
        model = model.half()

    class Steps(StoppingCriteria):  # called once a generated step: the step clock
        def __init__(self, on_step):
            self.on_step = on_step

        def __call__(self, input_ids, scores, **kw):
            if device == "cuda":
                torch.cuda.synchronize()
            self.on_step(input_ids.shape[1])
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def run(src, lens, beams, new, on_step):
        ids = torch.from_numpy(src).to(device)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), num_beams=beams,
                                 do_sample=False, max_new_tokens=new, min_new_tokens=new, early_stopping=False,
                                 length_penalty=1.0, stopping_criteria=StoppingCriteriaList([Steps(on_step)]))
        return out[:, 1:].cpu().numpy()
    return run


def ct2_engine(model: Path, device: str, precision: str):
    import bench_peers
    import ctranslate2
    translator = ctranslate2.Translator(str(model), device=device,
                                        compute_type="float16" if precision == "fp16" else "float32")
    ids = bench_peers.ct2_vocabulary(model)

    def run(src, lens, beams, new, on_step):
        bench_peers.NEW_TOKENS = new
        return bench_peers.ct2_generate(translator, src, lens, beams, ids)
    return run


def make_engine(name: str, paths: dict, device: str):
    kind, precision = name.rsplit(" ", 1)
    if kind in ("xform", "xform-graph", "xform-graph-cand", "xform-graph-reorder"):
        return xform_engine(paths[f"xform-{precision}"], device, capture=kind != "xform",
                            fused_beams=kind != "xform-graph-cand", capture_reorder=kind == "xform-graph-reorder")
    if kind == "transformers":
        return transformers_engine(paths["hf"], device, precision)
    if kind == "ort-beamsearch":  # built once per model and precision (scripts/ort_beamsearch.py)
        import ort_beamsearch
        out = paths["work"] / f"ort-beamsearch-{precision}" / paths["hf"].name
        return ort_beamsearch.engine(ort_beamsearch.cached_build(paths["hf"], out, precision), device)
    if kind == "ctranslate2":
        if "ct2" not in paths:
            import bench_peers
            paths["ct2"] = bench_peers.convert_ct2(paths["hf"], paths["work"])
        return ct2_engine(paths["ct2"], device, precision)
    raise ValueError(name)


# -- measuring: one engine a process --------------------------------------------------------------------
def device_used_mib() -> float | None:
    """The GPU's memory in use, MiB (cudaMemGetInfo through cuda-bindings); None without it."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return None
    err, free, total = cudart.cudaMemGetInfo()
    return None if err != cudart.cudaError_t.cudaSuccess else (total - free) / (1 << 20)


def worker(name: str, paths: dict, args: dict, conn) -> None:
    """Load one engine, time every workload, send the figures back (or the error)."""
    try:
        before = device_used_mib() if args["device"] == "cuda" else None
        run = make_engine(name, paths, args["device"])
        rows, outputs = [], {}
        for beams in args["beams"]:
            for batch in args["batches"]:
                rows.append(time_workload(run, batch, beams, args, outputs))
        from xform.runtime.bench import peak_rss_mib
        after = device_used_mib() if args["device"] == "cuda" else None
        memory = after - before if after is not None and before is not None else None
        conn.send({"rows": rows, "outputs": outputs, "device_mib": memory, "peak_rss_mib": peak_rss_mib()})
    except Exception as e:  # noqa: BLE001 - reported by the driver beside the other engines' figures
        conn.send({"error": f"{type(e).__name__}: {e}"})


def time_workload(run, batch: int, beams: int, args: dict, outputs: dict) -> dict:
    src, lens = sources(args["vocab"], batch)
    new = args["new_tokens"]
    times, steps = [], []
    for i in range(args["warmup"] + args["iters"]):
        clock: list[float] = []
        t0 = time.perf_counter()
        out = run(src, lens, beams, new, lambda _s: clock.append(time.perf_counter()))
        dt = time.perf_counter() - t0
        if out.shape != (batch, new):
            raise RuntimeError(f"batch {batch} beam {beams}: {out.shape} ids, expected {(batch, new)}")
        if i >= args["warmup"]:
            times.append(dt)
            steps.extend(np.diff([t0, *clock]).tolist())
        outputs[f"{batch}/{beams}"] = out
    return {"batch": batch, "beams": beams, "tokens_per_s": harness.rate(batch * new, times),
            "median_s": statistics.median(times),
            "step_ms_p50": float(np.percentile(steps, 50) * 1e3) if steps else None}


def measure(names: list[str], paths: dict, args: dict) -> dict:
    results = {}
    for name in names:
        print(f"  {name} ...", file=sys.stderr, flush=True)
        try:
            results[name] = harness.in_process(worker, (name, paths, args), name, args["timeout"])
        except TimeoutError:
            results[name] = {"error": "timed out"}
        except RuntimeError as e:  # its process died: reported beside the other engines' figures
            results[name] = {"error": str(e)}
    return results


# -- the report --------------------------------------------------------------------------------------
def summarize(results: dict, baseline: str) -> list[dict]:
    base = {(r["batch"], r["beams"]): r["tokens_per_s"] for r in results.get(baseline, {}).get("rows", [])}
    rows = []
    for name, res in results.items():
        if "error" in res:
            rows.append({"engine": name, "error": res["error"]})
            continue
        ref = results.get(f"transformers {name.rsplit(' ', 1)[1]}", {}).get("outputs", {})
        for r in res["rows"]:
            key = f"{r['batch']}/{r['beams']}"
            out, want = res["outputs"][key], ref.get(key)
            agree = None if want is None or name.startswith("transformers") else float((out == want).mean())
            ratio = r["tokens_per_s"] / base[(r["batch"], r["beams"])] if (r["batch"], r["beams"]) in base else None
            rows.append({"engine": name, **r, "vs_baseline": ratio, "tokens_equal_transformers": agree,
                         "device_mib": res["device_mib"], "peak_rss_mib": res["peak_rss_mib"]})
    return rows


def markdown(report: dict) -> str:
    memory = "GPU MiB" if report["device"] == "cuda" else "peak RSS MiB"
    lines = harness.preamble(report["command"], report["machine"], f"{report['shape']} Marian, {SRC_LEN}-token "
                             f"sources, exactly {report['new_tokens']} new tokens",
                             f"versions: {harness.listed(report['versions'])}")
    rows = []
    for r in report["rows"]:
        if "error" in r:
            rows.append((r["engine"], "-", "-", f"not run: {r['error'][:120]}", "", "", "", ""))
            continue
        mem = r["device_mib"] if report["device"] == "cuda" else r["peak_rss_mib"]
        rows.append((r["engine"], r["batch"], "greedy" if r["beams"] == 1 else f"beam {r['beams']}",
                     f"{r['tokens_per_s']:,.0f}", harness.fmt(r["vs_baseline"], "{:.2f}x"),
                     harness.fmt(r["step_ms_p50"], "{:.2f}"), harness.fmt(r["tokens_equal_transformers"], "{:.2%}"),
                     harness.fmt(mem, "{:,.0f}")))
    lines += harness.table(("engine", "batch", "strategy", "tokens/s", f"vs {report['baseline']}", "step p50 ms",
                            "tokens = transformers", memory), "lrlrrrrr", rows)
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = harness.parser(__doc__, work="/tmp/xform-gpu", out="docs", warmup=1, iters=5)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--shape", choices=list(SHAPES), default="base")
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--beams", default="1,4", help="beam widths, comma-separated (1: greedy)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--engines", default=None, help="default: every engine the device runs")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds an engine may take for every workload")
    a = ap.parse_args()
    precisions = ("fp32", "fp16") if a.device == "cuda" else ("fp32",)
    kinds = ("xform", "transformers", "ctranslate2") if a.shape == "base" else ("xform", "transformers")
    names = a.engines.split(",") if a.engines else [f"{k} {p}" for k in kinds for p in precisions]
    a.work.mkdir(parents=True, exist_ok=True)
    hf = build_model(a.shape, a.work, any(n.startswith("ctranslate2") for n in names))
    paths: dict = {"hf": hf, "work": a.work}
    for p in {n.rsplit(" ", 1)[1] for n in names if n.startswith("xform")}:
        paths[f"xform-{p}"] = export(hf, a.work, p)
    args = {"device": a.device, "batches": [int(b) for b in a.batches.split(",")],
            "beams": [int(b) for b in a.beams.split(",")], "new_tokens": a.new_tokens, "warmup": a.warmup,
            "iters": a.iters, "vocab": SHAPES[a.shape]["vocab"], "timeout": a.timeout}
    results = measure(names, paths, args)
    baseline = "transformers fp16" if a.device == "cuda" else "transformers fp32"
    report = {"command": harness.command(__file__, quote=True), "device": a.device, "shape": a.shape,
              "new_tokens": a.new_tokens, "baseline": baseline, "machine": harness.machine(a.device),
              "versions": harness.versions(("xform", "onnxruntime", "onnxruntime-gpu", "torch", "transformers",
                                            "ctranslate2")), "rows": summarize(results, baseline)}
    harness.write_report(a.out, "bench_gpu" + ("" if a.device == "cuda" else "_cpu"), report, markdown(report))
    print(markdown(report))
    if any("error" in r for r in report["rows"] if not r["engine"].startswith("ctranslate2")):
        sys.exit(1)  # an engine of ours or the yardstick failed: say so by the exit status


if __name__ == "__main__":
    main()
