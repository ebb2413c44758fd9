"""Where the rest of a beam-4 file run's memory goes, and what ONNX Runtime's options give back
(issue 30 item 5): MLAS's prepacked weights, the CPU arena, initializers in the arena.

    python scripts/memory_options.py BUNDLE FILE [--lines 500] [--beams 4] [--threads 2]

Each setting translates the first --lines lines of FILE with `Translator.translate_lines` (what
`xform run --input-file` runs) in a process of its own, and reports that process's peak RSS, its
RSS after loading, and the seconds it took (one pass; a hint, not a timing, on a shared machine).
The settings are applied to every ONNX Runtime session the backend opens:

- default: xform's own session options;
- no-prepack: `session.disable_prepacking` 1 (MLAS keeps no packed copy of the MatMul weights);
- no-arena: `enable_cpu_mem_arena` False (tensors from malloc, returned when freed);
- no-prepack+no-arena: both;
- shared-arena: one arena for every session of the process (an environment allocator,
  `session.use_env_allocators` 1) instead of one a session, growing as ONNX Runtime's default does
  (to the next power of two);
- shared-arena-exact: the same arena growing by what is asked (`arena_extend_strategy` 1,
  kSameAsRequested).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from xform.runtime.text.translator import Translator

SETTINGS = {"default": {}, "no-prepack": {"prepack": False}, "no-arena": {"arena": False},
            "no-prepack+no-arena": {"prepack": False, "arena": False}, "shared-arena": {"shared": 0},
            "shared-arena-exact": {"shared": 1}}


def child(bundle: str, path: str, lines: int, beams: int, threads: int, setting: dict) -> dict:
    import xform
    import xform.runtime.backends.ort_backend as ob
    from xform.runtime.bench import peak_rss_mib, rss_mib

    opened = ob.session
    if "shared" in setting:
        ort = ob.import_onnxruntime()
        cpu = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(cpu, ort.OrtArenaCfg({"arena_extend_strategy": setting["shared"]}))

    def session(ort, graph_path, opts, providers):
        if not setting.get("prepack", True):
            opts.add_session_config_entry("session.disable_prepacking", "1")
        if not setting.get("arena", True):
            opts.enable_cpu_mem_arena = False
        if "shared" in setting:
            opts.add_session_config_entry("session.use_env_allocators", "1")
        return opened(ort, graph_path, opts, providers)

    ob.session = session
    s = xform.load(bundle, backend="ort", threads=threads)
    loaded = rss_mib()
    with open(path, encoding="utf-8") as f:
        text = [next(f) for _ in range(lines)]
    gen = s.generation_config(128, num_beams=beams)
    t0 = time.perf_counter()
    done = sum(1 for line in Translator(s).translate_lines(text, gen) if line.error is None)
    return {"lines": done, "seconds": round(time.perf_counter() - t0, 1), "loaded_mib": round(loaded),
            "peak_mib": round(peak_rss_mib()), "after_mib": round(rss_mib())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("file")
    ap.add_argument("--lines", type=int, default=500)
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.bundle, args.file, args.lines, args.beams, args.threads, SETTINGS[args.child])))
        return
    print("| setting | lines | loaded MiB | peak MiB | after MiB | seconds (hint) |\n| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in args.settings.split(","):
        out = subprocess.run([sys.executable, __file__, args.bundle, args.file, "--lines", str(args.lines), "--beams",
                              str(args.beams), "--threads", str(args.threads), "--child", name],
                             capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(f"| {name} | {r['lines']} | {r['loaded_mib']:,} | {r['peak_mib']:,} | {r['after_mib']:,} | "
              f"{r['seconds']} |", flush=True)


if __name__ == "__main__":
    main()
