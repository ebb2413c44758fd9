"""Soak a bundle for a long time and report resident memory: flat, or how fast it grows.

    python scripts/soak.py BUNDLE [--hours 2] [--backend ort] [--threads N] [--sample-every 5000]

Runs xform.runtime.soak (varied batch shapes, greedy / beam / sampling, text through translate
when the bundle has a tokenizer) until the time is up, printing (steps, RSS MiB) as it goes, then
the growth after the warm-up and a least-squares slope in MiB per 100,000 steps. Exit 1 when the
growth exceeds --bound (default 5 MiB).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import xform
from xform.runtime.soak import soak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--backend", default="ort")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--sample-every", type=int, default=5000)
    ap.add_argument("--bound", type=float, default=5.0, help="MiB of growth after the warm-up that fails")
    args = ap.parse_args()
    session = xform.load(args.bundle, backend=args.backend, threads=args.threads)
    texts = [str(n) for n in range(100_000, 101_000)]
    deadline = time.monotonic() + args.hours * 3600
    total, reports = 0, []

    def show(r):
        steps, rss = r.samples[-1]
        print(f"{total + steps:>12} steps  {rss:8.1f} MiB", flush=True)

    chunk = max(args.sample_every, 50_000)
    while time.monotonic() < deadline:  # chunks of steps; the first chunk's warm-up is the baseline
        r = soak(session, chunk, texts=texts, seed=len(reports), on_sample=show, sample_every=args.sample_every)
        reports.append(r)
        total += r.steps
    warm = reports[0].warm_rss_mib
    points = [(s + sum(r.steps for r in reports[:i]), rss) for i, r in enumerate(reports) for s, rss in r.samples]
    growth = max(rss for _, rss in points) - warm
    slope = np.polyfit([s for s, _ in points], [rss for _, rss in points], 1)[0] * 100_000 if len(points) > 1 else 0.0
    print(f"{total} steps in {args.hours} h: RSS {warm:.1f} MiB after warm-up, growth {growth:.2f} MiB, "
          f"slope {slope:.3f} MiB per 100,000 steps")
    return 1 if growth > args.bound else 0


if __name__ == "__main__":
    sys.exit(main())
