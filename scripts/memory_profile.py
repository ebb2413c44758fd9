"""Where a bundle's resident memory goes on ONNX Runtime: after loading, after the encoder, and
along one greedy decode, optionally with ORT's weight prepacking or CPU arena turned off.

    python scripts/memory_profile.py BUNDLE [--batch 16] [--src-len 32] [--new-tokens 64]
                                            [--threads 2] [--no-prepack] [--no-arena]

Prints VmRSS (MiB) at each point, the process's peak RSS, and tokens/s of the same decode.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--src-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-prepack", action="store_true")
    ap.add_argument("--no-arena", action="store_true")
    args = ap.parse_args()
    import xform.runtime.backends.ort_backend as ob

    original = ob.session

    configured = set()

    def session(ort, path, opts, providers):
        if args.no_prepack and id(opts) not in configured:  # one options object serves every graph
            configured.add(id(opts))
            opts.add_session_config_entry("session.disable_prepacking", "1")
        if args.no_arena:
            opts.enable_cpu_mem_arena = False
        return original(ort, path, opts, providers)

    ob.session = session
    import xform
    from xform.runtime.bench import peak_rss_mib, random_sources, rss_mib

    s = xform.load(args.bundle, backend="ort", threads=args.threads)
    print(f"loaded            {rss_mib():7.0f} MiB")
    src = random_sources(s.config, args.batch, args.src_len, 0)
    t0 = time.perf_counter()
    s.backend.start(src, np.full(args.batch, args.src_len, np.int64))
    print(f"after encoder     {rss_mib():7.0f} MiB")
    tok = np.full(args.batch, s.start_id, np.int64)
    for step in range(args.new_tokens):
        tok, _ = s.backend.step(tok, args.new_tokens)
        if step + 1 in (1, 8, 16, 32, 64, 128, 256) or step + 1 == args.new_tokens:
            print(f"after step {step + 1:<6} {rss_mib():7.0f} MiB")
    dt = time.perf_counter() - t0
    print(f"peak              {peak_rss_mib():7.0f} MiB; {args.batch * args.new_tokens / dt:.0f} tokens/s (one pass, cold)")


if __name__ == "__main__":
    main()
