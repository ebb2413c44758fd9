"""Compare xform backends on one bundle in one process, interleaved, and print a Markdown table.

    python scripts/bench_backends.py BUNDLE [--backends ort,torch] [--threads 2] [--iters 30]

Each workload (batch, source length, new tokens) runs every backend once per round, in turn, for
`--iters` rounds after `--warmup`; tokens/s is the median over rounds, and the ratio is to the
last backend listed (eager PyTorch by default). End-of-sentence is suppressed so every backend
generates exactly the same number of tokens.
"""
from __future__ import annotations

import os

# torch's OpenMP workers busy-wait after each op and take the cores ONNX Runtime needs when both
# run in one process (measured: ORT at batch 1 fell from ~5,700 to ~2,300 tokens/s); make them sleep.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import platform  # noqa: E402

import harness  # noqa: E402
import numpy as np  # noqa: E402

import xform  # noqa: E402
from xform.runtime.bench import random_sources  # noqa: E402

WORKLOADS = ((1, 7, 16), (8, 7, 16), (32, 7, 16))


def main() -> None:
    ap = harness.parser(__doc__, threads=2, warmup=3, iters=30)
    ap.add_argument("bundle")
    ap.add_argument("--backends", default="ort,torch")
    args = ap.parse_args()
    names = args.backends.split(",")
    sessions = {n: xform.load(args.bundle, backend=n, threads=args.threads) for n in names}
    print(f"bundle {args.bundle}; {platform.machine()} {platform.system()}, {args.threads} threads; "
          f"xform {xform.__version__}; median of {args.iters} interleaved rounds\n")
    titles = ["batch", "src_len", "new tokens", *(f"{n} tokens/s" for n in names),
              *(f"{n} / {names[-1]}" for n in names[:-1])]
    print("\n".join(harness.table(titles, "l" * len(titles))))
    for batch, src_len, new in WORKLOADS:
        src = random_sources(next(iter(sessions.values())).config, batch, src_len)
        runs = {n: (lambda s=s: s.generate(src, max_new_tokens=new, min_new_tokens=new)) for n, s in sessions.items()}
        times, toks = harness.interleave(runs, args.iters, warmup=args.warmup)
        assert all(t.shape == (batch, new) for t in toks.values())
        tps = {n: harness.rate(batch * new, t) for n, t in times.items()}
        same = all(np.array_equal(toks[n], toks[names[-1]]) for n in names)
        ratios = [f"{tps[n] / tps[names[-1]]:.2f}x" for n in names[:-1]]
        if not same and ratios:
            ratios[-1] += " (tokens differ!)"
        print(harness.row(batch, src_len, new, *(f"{tps[n]:,.0f}" for n in names), *ratios))


if __name__ == "__main__":
    main()
