"""One timed run of a file through `Translator.translate_lines`, the cache's first capacity fixed
at 32 positions (`fixed`: xform's default before) or from each batch's longest source (`source`:
the default now, backend.source_capacity). Run it in fresh processes, alternating the settings;
it prints one JSON line: sentences/s, peak RSS, and a hash of the translations (equal across
settings). docs/benchmarks.md, "The first capacity from the source".

    python scripts/ab_cache_capacity.py BUNDLE BEAMS fixed|source [--file corpus-1000.txt]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import time

import xform
from xform.runtime.bench import peak_rss_mib
from xform.runtime.decoding.request import TextOptions
from xform.runtime.scheduling.batching import Batching
from xform.runtime.text.translator import Translator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("beams", type=int)
    ap.add_argument("mode", choices=["fixed", "source"])
    ap.add_argument("--file", default="/tmp/xform-files/corpus-1000.txt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-batch-tokens", type=int, default=2048)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    with open(args.file, encoding="utf-8") as f:
        lines = f.read().splitlines()
    session = xform.load(args.bundle, threads=args.threads, cache_capacity=32 if args.mode == "fixed" else None)
    gen = session.generation_config(args.max_new_tokens, num_beams=args.beams)
    translator, batching = Translator(session), Batching("tokens", max_batch_tokens=args.max_batch_tokens)
    list(translator.translate_lines(lines[:20], gen, batching, TextOptions()))  # warm up
    t0 = time.perf_counter()
    out = list(translator.translate_lines(lines, gen, batching, TextOptions()))
    seconds = time.perf_counter() - t0
    text = "\n".join(line.hypotheses[0] if line.hypotheses else "" for line in out)
    print(json.dumps({"mode": args.mode, "beams": args.beams, "bundle": args.bundle, "seconds": round(seconds, 2),
                      "sentences_per_s": round(len(lines) / seconds, 1), "peak_rss_mib": round(peak_rss_mib()),
                      "hash": hashlib.sha256(text.encode()).hexdigest()[:12]}))


if __name__ == "__main__":
    main()
