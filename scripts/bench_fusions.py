"""ONNX Runtime's transformer optimizer and session options, each against xform's defaults, on the
CPU (issue 44, item 2).

    python scripts/bench_fusions.py --variant plain=/tmp/xb/xform-fp32 \\
        --variant fused=/tmp/xb/xform-fp32-fused [--variant "extended=/tmp/xb/xform-fp32,level=extended"] \\
        [--rounds 4] [--threads 2] [--workloads "b1 greedy,b16 greedy,b1 beam4,b16 beam4,encoder b16"] \\
        [--out figures.json]

A variant is LABEL=BUNDLE[,option=value...]: a bundle (the optimizer's variant is a bundle whose
graphs were optimized, `--fuse-bundle`) opened with xform's session
options and the given changes on every graph's session:

    level=basic|extended|all      graph_optimization_level (xform: all)
    spin=0|1                      session.intra_op.allow_spinning on every graph (xform: on for the
                                  decoder-step graphs, off for the others)
    affinity=1;2                  session.intra_op_thread_affinities (the pool's threads but the
                                  caller's, pinned, ";"-separated logical processors, 1-based)
    arena=0|1                     enable_cpu_mem_arena (xform: on)
    mode=sequential|parallel      execution_mode (xform: sequential)

`--graphs A B [...]`: the graphs alone instead, each bundle's encoder and decoder-step graphs on
the same random inputs (graph_feeds: 32-token sources, a 48-position cache) in one
process, in alternating blocks of 20 runs: a step without the decode loop around it, A and B
seconds apart, so a busy machine's drift falls on both alike.

`--fuse-bundle SRC DST` writes DST: SRC (fp32) with its encoder and decoder-step graphs through
`onnxruntime.transformers.optimizer` (model type bart, opt_level 0: its fusions only), each kept
where it verifies against the traced graph on ONNX Runtime (ids equal, floats within 1e-4, at
shapes unlike the trace's), the decoder_beam graph's weights shared with the decoder again and
the manifest's shared weights and hashes rewritten. It prints what fused. (This was `xform
export --optimize`, measured and reverted: docs/design.md, "ONNX Runtime's fusions".)

Each variant runs in a worker process of its own; the driver runs the variants round-robin (A B A
B ...), `--rounds` times, each round timing every workload once after a warm-up; the table gives
each variant's median and range over the rounds and whether its tokens equal the first variant's.
Workloads: exactly 64 new tokens from 32-token sources (min_new_tokens = 64), greedy or beam 4, at
batch 1 or 16; `encoder b16`: the encoder graph alone on 16 sources of 32 tokens, in ms a call.
"""
from __future__ import annotations

import logging
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import harness
import numpy as np
import onnx
from profile_ops import SRC_LEN, sources  # a script beside this one: the same sources

NEW_TOKENS = 64
WORKLOADS = {"b1 greedy": (1, 1), "b16 greedy": (16, 1), "b1 beam4": (1, 4), "b16 beam4": (16, 4),
             "encoder b16": (16, 0)}
OPTIONS = ("level", "spin", "affinity", "arena", "mode")


def parse_variant(text: str) -> tuple[str, str, dict[str, str]]:
    label, _, rest = text.partition("=")
    bundle, *pairs = rest.split(",")
    options = dict(p.split("=", 1) for p in pairs)
    unknown = set(options) - set(OPTIONS)
    if not label or not bundle or unknown:
        raise SystemExit(f"--variant {text!r}: LABEL=BUNDLE[,option=value...] with options {OPTIONS}")
    return label, bundle, options


def apply_options(ort, opts, options: dict[str, str]) -> None:
    """The variant's changes to the SessionOptions xform built."""
    levels = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
              "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    if "level" in options:
        opts.graph_optimization_level = levels[options["level"]]
    if "spin" in options:
        opts.add_session_config_entry("session.intra_op.allow_spinning", options["spin"])
    if "affinity" in options:
        opts.add_session_config_entry("session.intra_op_thread_affinities", options["affinity"])
    if "arena" in options:
        opts.enable_cpu_mem_arena = options["arena"] == "1"
    if "mode" in options:
        opts.execution_mode = (ort.ExecutionMode.ORT_PARALLEL if options["mode"] == "parallel"
                               else ort.ExecutionMode.ORT_SEQUENTIAL)


def worker(bundle: str, options: dict[str, str], threads: int, workloads: list[str], conn) -> None:
    """Open the bundle with the variant's options, send the tokens of every workload (the warm-up);
    then on each message time every workload once."""
    import onnxruntime

    import xform
    import xform.runtime.backends.ort_backend as ob

    onnxruntime.set_default_logger_severity(3)  # a changed config entry warns that it replaced xform's
    opener = ob.session

    def with_options(ort, path, opts, providers):
        apply_options(ort, opts, options)
        return opener(ort, path, opts, providers)
    ob.session = with_options
    session = xform.load(bundle, backend="ort", threads=threads)
    cfg = session.config
    runs = {}
    for w in workloads:
        batch, beams = WORKLOADS[w]
        src, lens = sources(cfg.src_vocab_size, batch, session.pad_id, session.eos_id)
        if beams == 0:
            runs[w] = (lambda s=src, n=lens: encoder_call(session.backend, s, n))
            continue
        gen = session.generation_config(NEW_TOKENS, min_new_tokens=NEW_TOKENS, num_beams=beams)
        runs[w] = (lambda s=src, n=lens, g=gen: session.run(session.request(s, n, generation=g)).ids)
    outputs = {w: run() for w, run in runs.items()}  # the warm-up, and the tokens compared

    def time_each(_message) -> dict[str, float]:
        times, _ = harness.interleave(runs, 1)
        return {w: t[0] for w, t in times.items()}
    harness.serve(conn, {w: (np.asarray(o).tolist() if o is not None else None) for w, o in outputs.items()},
                  time_each)


def encoder_call(backend, src: np.ndarray, lens: np.ndarray) -> None:
    backend.encoder.run(None, {"src_ids": src, "src_lengths": lens})
    return None


def time_variants(variants: list[tuple[str, str, dict]], threads: int, workloads: list[str],
                  rounds: int) -> tuple[dict, dict]:
    """Each variant a worker process (harness.Workers), A B A B round by round: drift hits every
    variant alike. The seconds of each variant's workloads, and their tokens."""
    workers = harness.Workers({label: (worker, (bundle, options, threads, workloads))
                               for label, bundle, options in variants})
    times: dict[str, dict[str, list[float]]] = {label: {w: [] for w in workloads} for label in workers.hello}
    for _ in range(rounds):
        for label in workers.hello:
            for w, t in workers.ask(label, "time").items():
                times[label][w].append(t)
    workers.close()
    return times, workers.hello


def summarize(times: dict, tokens: dict, workloads: list[str]) -> list[dict]:
    """Per variant and workload: the median and range over rounds, and the speed-up against the
    first variant as the median and range of the rounds' paired ratios (first's time / this one's,
    the two timed back to back in the same round)."""
    first = next(iter(times))
    rows = []
    for w in workloads:
        batch, beams = WORKLOADS[w]
        for label, by_w in times.items():
            ts = by_w[w]
            if beams:
                rate = [batch * NEW_TOKENS / t for t in ts]
                fig = {"unit": "tokens/s", "median": statistics.median(rate), "low": min(rate), "high": max(rate)}
            else:
                fig = {"unit": "ms", "median": statistics.median(ts) * 1e3, "low": min(ts) * 1e3,
                       "high": max(ts) * 1e3}
            ratios = [b / t for b, t in zip(times[first][w], ts)]
            rows.append({"workload": w, "variant": label, **fig, "speedup": statistics.median(ratios),
                         "speedup_low": min(ratios), "speedup_high": max(ratios),
                         "tokens_equal": tokens[label][w] == tokens[first][w] if beams else None})
    return rows


def markdown(rows: list[dict], command: str, threads: int, rounds: int) -> str:
    import onnxruntime
    lines = harness.preamble(command, harness.machine(), f"{threads} threads", f"onnxruntime {onnxruntime.__version__}",
                             f"{rounds} rounds, median (low-high)", "speed-up: the first variant's time over this "
                             "one's, round by round, median (low-high)")
    lines += harness.table(
        ("workload", "variant", "median", "range", "speed-up", "speed-up range", "tokens = first"), "llrrrrr",
        [(r["workload"], r["variant"], f"{r['median']:,.1f} {r['unit']}", f"{r['low']:,.1f}-{r['high']:,.1f}",
          f"{r['speedup']:.3f}x", f"{r['speedup_low']:.3f}-{r['speedup_high']:.3f}",
          "-" if r["tokens_equal"] is None else "yes" if r["tokens_equal"] else "NO") for r in rows])
    return "\n".join(lines) + "\n"


GRAPH_CASES = (("encoder", 16, 0), ("decoder", 1, 48), ("decoder", 16, 48), ("decoder", 256, 48),
               ("decoder_beam", 4, 48), ("decoder_beam", 64, 48))  # (graph, decoder rows, cache positions)


def graph_table(bundles: list[Path], threads: int, out: Path | None) -> None:
    rows = [graph_ab(g, bundles, threads, r, c) for g, r, c in GRAPH_CASES]
    names = [b.name for b in bundles]
    titles = ["graph", "rows", *(f"{n} ms" for n in names), *(f"{n} speed-up" for n in names[1:])]
    command = f"python scripts/bench_fusions.py --graphs {' '.join(map(str, bundles))}"
    lines = harness.preamble(command, harness.machine(),
                             f"{threads} threads", "12 alternating blocks of 20 runs, medians (low-high)")
    lines += harness.table(titles, "lr" + "r" * (len(titles) - 2), [
        (r["graph"], r["rows"], *(f"{m:.3f} ({lo:.3f}-{hi:.3f})" for m, (lo, hi) in zip(r["ms"], r["ms_range"])),
         *(f"{m:.3f}x ({lo:.3f}-{hi:.3f})" for m, (lo, hi) in zip(r["speedup"][1:], r["speedup_range"][1:])))
        for r in rows])
    print("\n".join(lines))
    if out:
        harness.write_json(out, {"machine": harness.machine(), "bundles": list(map(str, bundles)), "rows": rows})


FUSED_ATOL = 1e-4  # fp32 graphs, optimized against traced, on the same runtime: measured ~3e-6
MODEL_TYPE = "bart"  # the optimizer's pass list for encoder-decoder graphs; "bert" / "t5" fuse no more
CONTRIB = "com.microsoft"
FUSABLE = ("encoder", "decoder", "decoder_beam")
# (source rows, decoder rows a source, source length, cache positions): shapes unlike the trace's
SHAPES = ((3, 1, 7, 0), (2, 2, 5, 6))
MASK_VALUE = -1e9  # xform.contract's


# -- the optimizer's graphs, verified against the traced ones (what `export --optimize` did, reverted:
# docs/design.md "ONNX Runtime's fusions") -------------------------------------------------------------
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
    something and verifies, else `traced` itself; returns what it did."""
    import onnxruntime

    from xform.exporter.external_data import gather_external_data

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
                print(f"{out.name}: ONNX Runtime's optimizer refused, the traced graph kept: {record['reason']}")
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


def fuse_bundle(src: Path, dst: Path) -> None:
    """DST: a copy of SRC (an fp32 bundle) with its encoder and decoder-step graphs through
    fuse_graph, and its manifest rewritten."""
    import shutil

    from xform.exporter.beam_graph import share_decoder_data
    from xform.exporter.export import shared_weights
    from xform.manifest import Manifest

    shutil.copytree(src, dst)
    manifest = Manifest.read(dst / "manifest.json")
    for graph in FUSABLE:
        if graph in manifest.graphs:
            record = fuse_graph(src / f"{graph}.onnx", dst / f"{graph}.onnx", manifest.config)
            print(graph, record)
    if "decoder_beam" in manifest.graphs:  # its weights are the decoder's bytes again
        share_decoder_data(dst / "decoder_beam.onnx", dst / "decoder.onnx")
    manifest.shared_weights = shared_weights(dst)
    manifest.write(dst)


def graph_ab(graph: str, bundles: list[Path], threads: int, rows: int, cache: int, blocks: int = 12,
             calls: int = 20) -> dict:
    """One graph of each bundle on the same inputs in one process, in alternating blocks of
    `calls` runs (A B A B ..., the first run of a block left out: the other pool's spinning):
    ms a run per bundle, and the paired blocks' ratios (first bundle's time over each one's)."""
    import onnxruntime as ort

    from xform.runtime.bundle import Bundle

    cfg = Bundle.open(bundles[0]).config
    sessions = []
    for b in bundles:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        sessions.append(ort.InferenceSession(str(b / f"{graph}.onnx"), opts, providers=["CPUExecutionProvider"]))
    sources = rows // 4 if graph == "decoder_beam" else rows
    feeds = graph_feeds(sessions[0].get_inputs(), cfg, max(sources, 1), rows // max(sources, 1), SRC_LEN, cache)
    per: list[list[float]] = [[] for _ in bundles]
    for _ in range(blocks):
        for k, sess in enumerate(sessions):
            sess.run(None, feeds)
            t0 = time.perf_counter()
            for _ in range(calls):
                sess.run(None, feeds)
            per[k].append((time.perf_counter() - t0) / calls * 1e3)
    ratios = [[a / b for a, b in zip(per[0], p)] for p in per]
    return {"graph": graph, "rows": rows, "cache": cache, "ms": [statistics.median(p) for p in per],
            "ms_range": [(min(p), max(p)) for p in per], "speedup": [statistics.median(r) for r in ratios],
            "speedup_range": [(min(r), max(r)) for r in ratios]}


def main() -> None:
    ap = harness.parser(__doc__, threads=2, rounds=4)
    ap.add_argument("--variant", action="append", default=[])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--fuse-bundle", nargs=2, type=Path, metavar=("SRC", "DST"))
    ap.add_argument("--graphs", nargs="+", type=Path, metavar="BUNDLE",
                    help="graph A/B instead: each bundle's encoder and decoder-step graphs on the same inputs")
    args = ap.parse_args()
    if args.fuse_bundle:
        fuse_bundle(*args.fuse_bundle)
        return
    if args.graphs:
        graph_table(args.graphs, args.threads, args.out)
        return
    variants = [parse_variant(v) for v in args.variant]
    workloads = [w.strip() for w in args.workloads.split(",")]
    if len(variants) < 2 or set(workloads) - set(WORKLOADS):
        raise SystemExit(f"two --variant at least; workloads from {list(WORKLOADS)}")
    times, tokens = time_variants(variants, args.threads, workloads, args.rounds)
    rows = summarize(times, tokens, workloads)
    command = harness.command(__file__, quote=True)
    print(markdown(rows, command, args.threads, args.rounds))
    if args.out:
        harness.write_json(args.out, {"command": command, "machine": harness.machine(), "rows": rows, "times_s": times})


if __name__ == "__main__":
    main()
