"""What the decoding controls cost, and what vocabulary restriction gains, on Marian Transformer-base.

    python scripts/bench_controls.py [--work /tmp/xform-bench] [--rounds 3] [--out docs]

The model is scripts/bench_peers.py's (d_model 512, 6+6 layers, vocabulary 32,000, random
weights), exported fp32 with --with-vocab-map. One process, 2 threads; every configuration decodes
exactly 32 new tokens (min_new_tokens = max_new_tokens) from 24-token sources, so all do the same
work; configurations are interleaved round by round and the median taken.

1. Vocabulary restriction: greedy and beam 4, batch 1 and 16, the full vocabulary (the default
   decoder: ArgMax in the graph, beam candidates in the graph) against the restricted decoder
   over 2,000 and 4,000 ids (the host choosing among them).
2. The design of the repetition controls: beam 4 with candidates ranked in the graph (no control
   set) against the same decode on host logits (what any control that needs the history
   switches to: repetition_penalty 1.2), and greedy's graph ArgMax against host logits likewise.

Writes bench_controls.json and prints Markdown tables with ratios.
"""
from __future__ import annotations

import platform
import statistics
from pathlib import Path

import bench_peers
import harness
import numpy as np

NEW, SRC_LEN = 32, 24


def bundle(work: Path) -> Path:
    from xform.exporter.export import export_bundle
    out = work / "xform-fp32-vmap"
    if not (out / "manifest.json").exists():
        export_bundle(bench_peers.build_model(work), out, vocab_map=True, force=True)
    return out


def main() -> None:
    args = harness.parser(__doc__, work="/tmp/xform-bench", rounds=3, out="optional").parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    import onnxruntime

    import xform
    session = xform.load(bundle(args.work), backend="ort", threads=2)
    rng = np.random.default_rng(0)
    vocab = session.config.tgt_vocab_size
    subsets = {n: np.sort(rng.choice(np.arange(3, vocab - 1), n, replace=False)) for n in (2000, 4000)}
    configs = {}
    for batch in (1, 16):
        src = rng.integers(3, vocab - 1, (batch, SRC_LEN))
        src[:, -1] = session.eos_id
        for beams in (1, 4):
            base = dict(max_new_tokens=NEW, min_new_tokens=NEW, num_beams=beams)
            configs[(batch, beams, "full vocabulary")] = (src, base)
            for n, ids in subsets.items():
                configs[(batch, beams, f"{n:,} ids")] = (src, {**base, "vocabulary": ids})
            configs[(batch, beams, "host logits (repetition_penalty 1.2)")] = (src, {**base, "repetition_penalty": 1.2})
    runs = {k: (lambda src=src, kw=kw: session.generate(src, **kw)) for k, (src, kw) in configs.items()}
    times, _ = harness.interleave(runs, args.rounds, warmup=1, progress="configurations")
    rows = []
    for (batch, beams, what), ts in times.items():
        med = statistics.median(ts)
        full = statistics.median(times[(batch, beams, "full vocabulary")])
        rows.append({"batch": batch, "beams": beams, "config": what, "seconds": med,
                     "tokens_per_s": batch * beams * NEW / med if beams == 1 else batch * NEW / med,
                     "vs_full": full / med})
    for title, keep in (("Vocabulary restriction", lambda r: "repetition" not in r["config"]),
                        ("Host logits (repetition controls) against the graph's choice",
                         lambda r: "ids" not in r["config"])):
        print(f"\n{title} (Marian-base fp32, ort, 2 threads, {NEW} new tokens, {SRC_LEN}-token sources)\n")
        print("\n".join(harness.table(
            ("batch", "decoding", "configuration", "ms a decode", "target tokens/s", "vs full vocabulary"), "rllrrr",
            [(r["batch"], "greedy" if r["beams"] == 1 else f"beam {r['beams']}", r["config"],
              f"{r['seconds'] * 1e3:,.0f}", f"{r['tokens_per_s']:,.1f}", f"{r['vs_full']:.2f}x")
             for r in filter(keep, rows)])))
    if args.out is not None:
        harness.write_json(args.out / "bench_controls.json", {
            "rows": rows, "rounds": args.rounds, "new_tokens": NEW, "src_len": SRC_LEN,
            "machine": harness.machine(), "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__, "xform": xform.__version__,
            "command": harness.command(__file__)})


if __name__ == "__main__":
    main()
