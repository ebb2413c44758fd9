"""Greedy (or beam) speed of two xform checkouts, each on its own bundle of the same model, interleaved.

    git worktree add /tmp/xform-old <commit>
    python scripts/bench_greedy_ab.py /tmp/xform-old OLD_BUNDLE . NEW_BUNDLE [--rounds 9] [--beams 4]

Each checkout's runtime runs in a process of its own (its `xform` imported from that checkout),
2 threads, on scripts/bench_peers.py's sources (32 tokens) at batch 1 and 16, exactly 64 new
greedy tokens; the driver alternates them round by round and prints the median tokens/s and
whether their tokens are identical. Made for "greedy must not get slower" (docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

import numpy as np

NEW_TOKENS = 64


def worker(code: str, bundle: str, beams: int, conn) -> None:
    sys.path.insert(0, code)
    import xform
    if not xform.__file__.startswith(code):
        raise RuntimeError(f"imported xform from {xform.__file__}, not from {code}")
    session = xform.load(bundle, threads=2)
    conn.send("ready")
    while (msg := conn.recv()) is not None:
        src, lens = msg
        t0 = time.perf_counter()
        out = session.generate(src, lens, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, num_beams=beams)
        conn.send((time.perf_counter() - t0, out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old_code"), ap.add_argument("old_bundle"), ap.add_argument("new_code"), ap.add_argument("new_bundle")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--beams", type=int, default=1)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_peers import sources

    engines = {"before": (args.old_code, args.old_bundle), "after": (args.new_code, args.new_bundle)}
    ctx, conns = mp.get_context("spawn"), {}
    for name, (code, bundle) in engines.items():
        parent, child = ctx.Pipe()
        ctx.Process(target=worker, args=(str(Path(code).resolve()), bundle, args.beams, child), daemon=True).start()
        if parent.recv() != "ready":
            raise RuntimeError(f"{name} did not start")
        conns[name] = parent
    print("| workload | runtime | tokens/s | tokens identical |\n| --- | --- | ---: | --- |")
    for batch in (1, 16):
        src, lens = sources(batch, 32, False)
        times, outs = {k: [] for k in conns}, {}
        for r in range(args.rounds + 1):  # the first round warms up
            for name, conn in conns.items():
                time.sleep(0.3)
                conn.send((src, lens))
                dt, outs[name] = conn.recv()
                if r:
                    times[name].append(dt)
        same = np.array_equal(outs["before"], outs["after"])
        for name in conns:
            print(f"| batch {batch} | {name} | {batch * NEW_TOKENS / statistics.median(times[name]):,.1f} | {same} |")
    for conn in conns.values():
        conn.send(None)


if __name__ == "__main__":
    main()
