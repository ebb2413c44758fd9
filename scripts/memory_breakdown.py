"""Where a file run's resident memory goes on ONNX Runtime, point by point (issue 44 item 4).

    python scripts/memory_breakdown.py BUNDLE FILE [--lines 1000] [--beams 1] [--threads 2]
                                       [--max-batch-tokens 2048] [--settings default,no-arena,...]

Each setting runs in a process of its own and translates the first --lines lines of FILE with
`Translator.translate_lines` (what `xform run --input-file` and scripts/bench_files.py run, same
token budget). It prints VmRSS (MiB) after each import, after each ONNX Runtime session opens (the
graph named; while its prepacking holds the mapped tables, and once they are paged out again),
after the tokenizer, then per batch: its rows and source length, RSS before it, after its encoder,
at its end, and the process's high-water mark (VmHWM) once it is done, so the batch that set the
peak is visible, with the runtime's own host buffers (the K/V cache at its capacity, the cross
K/V, the logits and candidate buffers: allocated, and resident by /proc/self/pagemap); at the
batch with the highest RSS the owners of it, as far as they can be told apart; glibc's heaps over
all its arenas (malloc_info) at the end and the RSS after `malloc_trim(0)`, which is what the
allocator held free but not returned. The lines each setting translated are compared with the
first setting's. Settings (one process each):

- default: xform's own (every CPU session allocating from one arena for the process);
- own-arenas: each session an arena of its own (ONNX Runtime's default; xform's before issue 44);
- no-arena: `enable_cpu_mem_arena` False (tensors from malloc, returned when freed);
- no-mem-pattern: `enable_mem_pattern` False (no preplanned block per input shape);
- no-prepack: `session.disable_prepacking` 1 (MLAS keeps no packed copy of the weights);
- arena-exact: the one arena growing by what is asked (kSameAsRequested), not in powers of two;
- shrink-encoder, shrink-all: the encoder's runs (or every graph's) end by giving back the arena's
  free regions (the run option `memory.enable_memory_arena_shrinkage`): what the arenas hold
  between runs;
- malloc-mmap-1m: glibc's mmap threshold fixed at 1 MiB (MALLOC_MMAP_THRESHOLD_), not raised to
  the largest block freed so far: every block from 1 MiB on is its own mapping, returned when freed;
- malloc-arenas-1: one glibc arena for every thread (MALLOC_ARENA_MAX=1);
- trim-per-batch: `malloc_trim(0)` before each batch's encoder (glibc gives back the free memory
  it holds);
- capacity-16, capacity-32: the self-attention cache starts at 16 (or 32, xform's default before
  the first capacity came from the source) positions whatever the batch (`xform.load(cache_capacity=N)`);
  by default each batch's starts at its longest source + 8 positions rounded up to 16.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

SETTINGS = {"default": {}, "own-arenas": {"own": True}, "no-arena": {"arena": False},
            "no-mem-pattern": {"pattern": False}, "no-prepack": {"prepack": False}, "arena-exact": {"shared": 1},
            "shrink-encoder": {"shrink": ("encoder",)},
            "shrink-all": {"shrink": ("encoder", "decoder", "decoder_beam")},
            "malloc-mmap-1m": {"env": {"MALLOC_MMAP_THRESHOLD_": "1048576"}},
            "malloc-arenas-1": {"env": {"MALLOC_ARENA_MAX": "1"}}, "trim-per-batch": {"trim": True},
            "capacity-16": {"capacity": 16}, "capacity-32": {"capacity": 32}}


def libc():
    try:
        lib = ctypes.CDLL("libc.so.6")
        return lib if hasattr(lib, "malloc_info") else None
    except OSError:
        return None


def heap() -> dict:
    """glibc's figures over all its arenas (malloc_info; mallinfo2 reports the main one only), MiB:
    heap memory taken from the system, the free part of it (held, not returned), mmapped blocks."""
    lib = libc()
    if lib is None:
        return {}
    lib.fopen.restype, lib.fopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p]
    lib.malloc_info.argtypes, lib.fclose.argtypes = [ctypes.c_int, ctypes.c_void_p], [ctypes.c_void_p]
    fd, path = tempfile.mkstemp()
    os.close(fd)
    fp = lib.fopen(path.encode(), b"w")
    lib.malloc_info(0, fp)
    lib.fclose(fp)
    with open(path) as f:
        text = f.read().rsplit("</heap>", 1)[-1]  # the totals over every arena
    os.unlink(path)

    def total(kind: str) -> float:
        m = re.search(rf'<(?:total|system) type="{kind}" (?:count="\d+" )?size="(\d+)"', text)
        return int(m.group(1)) / 2**20 if m else 0.0

    return {"heap_system": total("current"), "heap_free": total("fast") + total("rest"), "mmapped": total("mmap")}


def resident_mib(arrays) -> float:
    """Resident MiB of the pages under these arrays' memory (each base buffer once), from
    /proc/self/pagemap: present and mapped by this process alone (bits 63 and 56), so a page never
    written, or only read (the kernel's shared zero page), is not counted."""
    spans, page = set(), 4096
    for a in arrays:
        base = a
        while getattr(base, "base", None) is not None and isinstance(base.base, type(a)):
            base = base.base
        if base.nbytes:
            spans.add((base.ctypes.data // page, (base.ctypes.data + base.nbytes - 1) // page + 1))
    present = 0
    with open("/proc/self/pagemap", "rb") as f:
        for lo, hi in spans:
            f.seek(lo * 8)
            entries = np.frombuffer(f.read((hi - lo) * 8), np.uint64)
            own = (entries >> np.uint64(63)) & (entries >> np.uint64(56)) & np.uint64(1)
            present += int(np.count_nonzero(own))
    return present * page / 2**20


def mapped_files_mib() -> float:
    """Resident MiB of the bundle's memory-mapped files (onnx, data, safetensors)."""
    total, counting = 0.0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 5 and "-" in parts[0] and ":" in parts[3]:
                counting = len(parts) > 5 and any(parts[5].endswith(x) for x in (".data", ".onnx", ".safetensors"))
            elif counting and line.startswith("Rss:"):
                total += int(parts[1]) / 1024
    return total


class Shrinking:
    """A session whose every run gives its arena's free regions back (run option)."""

    def __init__(self, ort, session):
        self.session, self.options = session, ort.RunOptions()
        self.options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")

    def run_with_iobinding(self, binding, run_options=None):
        return self.session.run_with_iobinding(binding, self.options)

    def __getattr__(self, name):
        return getattr(self.session, name)


def patch_sessions(points: list, setting: dict, sessions: dict) -> None:
    """Every session the ort backend opens gets `setting`'s options; the RSS each session adds once
    open (its shared tables paged out again) and the RSS a released one gives back."""
    import xform.runtime.backends.ort_backend as ob
    from xform.runtime.bench import rss_mib

    opened, graph_session, settle = ob.session, ob.OrtBackend.graph_session, ob.OrtBackend.settle
    if "shared" in setting:
        ort = ob.import_onnxruntime()
        cpu = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(cpu, ort.OrtArenaCfg({"arena_extend_strategy": setting["shared"]}))
        import xform.runtime.backends.ort_files as files
        files._arena_registered = True  # this one, not xform's

    def session(ort, graph_path, opts, providers):
        if not setting.get("prepack", True):
            opts.add_session_config_entry("session.disable_prepacking", "1")
        if not setting.get("arena", True):
            opts.enable_cpu_mem_arena = False
        if not setting.get("pattern", True):
            opts.enable_mem_pattern = False
        if "shared" in setting:
            opts.add_session_config_entry("session.use_env_allocators", "1")
        if setting.get("own"):
            opts.add_session_config_entry("session.use_env_allocators", "0")
        before = rss_mib()
        s = opened(ort, graph_path, opts, providers)
        points.append((f"{str(graph_path).rsplit('/', 1)[-1]}: session made, its tables' pages still in", rss_mib(),
                       rss_mib() - before))
        name = str(graph_path).rsplit("/", 1)[-1].removesuffix(".onnx")
        return Shrinking(ort, s) if name in setting.get("shrink", ()) else s

    def measured(self, graph):
        if graph in self.sessions:
            return graph_session(self, graph)
        before = rss_mib()
        s = graph_session(self, graph)
        sessions[graph] = rss_mib() - before
        points.append((f"{graph}: session open, tables paged out", rss_mib(), sessions[graph]))
        return s

    def settled(self, graph):
        guess, before = self.guess, rss_mib()
        settle(self, graph)
        if guess is not None and guess != graph:
            sessions.pop(guess, None)
            points.append((f"{guess}: released (the load-time guess; this decode runs {graph})", rss_mib(),
                           rss_mib() - before))

    ob.session, ob.OrtBackend.graph_session, ob.OrtBackend.settle = session, measured, settled


def host_buffers(backend) -> dict:
    """The runtime's own host buffers now: MiB allocated, and MiB resident (unwritten cache pages are not)."""
    def mib(arrays) -> float:
        seen, total = set(), 0
        for a in arrays:
            base = a.base if getattr(a, "base", None) is not None else a
            if id(base) not in seen:
                seen.add(id(base))
                total += base.nbytes
        return total / 2**20

    cache = list(getattr(backend.cache, "arrays", []))
    cross = list(getattr(backend.cross, "arrays", []))
    logits = [backend.logits_buf] if backend.logits_buf is not None else []
    cand = list(backend.cand_bufs or ())
    return {"cache_capacity": cache[0].shape[2] if cache else 0, "cache": mib(cache), "cross": mib(cross),
            "logits": mib(logits), "candidates": mib(cand),
            "resident": {"cache": resident_mib(cache), "cross": resident_mib(cross), "logits": resident_mib(logits),
                         "candidates": resident_mib(cand)}}


def patch_batches(batches: list, trim: bool = False) -> None:
    """Each batch's rows, source length, RSS before it and after its encoder, and (at the next
    batch or the end) the high-water mark it left and its host buffers at their largest."""
    import xform.runtime.backends.ort_backend as ob
    from xform.runtime.bench import peak_rss_mib, rss_mib

    start = ob.OrtBackend.start

    def started(self, src_ids, src_lengths, group=1):
        if batches:
            close_batch(batches[-1], self)
        if trim and libc() is not None:
            libc().malloc_trim(0)
        before = rss_mib()
        start(self, src_ids, src_lengths, group)
        batches.append({"rows": src_ids.shape[0] * group, "src_len": src_ids.shape[1], "before": before,
                        "after_encoder": rss_mib(), "hwm_before": peak_rss_mib()})

    ob.OrtBackend.start = started


def close_batch(batch: dict, backend) -> None:
    from xform.runtime.bench import peak_rss_mib, rss_mib
    batch.update(end=rss_mib(), hwm=peak_rss_mib(), buffers=host_buffers(backend), files=mapped_files_mib(), **heap())


def child(args, setting: dict) -> dict:
    from xform.runtime.bench import peak_rss_mib, rss_mib
    points: list[tuple] = [("python + numpy", rss_mib(), None)]
    import xform
    points.append(("import xform", rss_mib(), None))
    import onnxruntime  # noqa: F401
    points.append(("import onnxruntime", rss_mib(), None))
    from xform.runtime.text.translator import Translator
    sessions: dict[str, float] = {}
    patch_sessions(points, setting, sessions)
    batches: list[dict] = []
    patch_batches(batches, setting.get("trim", False))
    s = xform.load(args.bundle, backend="ort", threads=args.threads, cache_capacity=setting.get("capacity"))
    points.append(("xform.load done", rss_mib(), None))
    before = rss_mib()
    s.tokenizer.encode("warm the tokenizer up")
    points.append(("tokenizer used", rss_mib(), rss_mib() - before))
    with open(args.file, encoding="utf-8") as f:
        text = [next(f) for _ in range(args.lines)]
    from xform.runtime.scheduling.batching import Batching
    gen = s.generation_config(128, num_beams=args.beams)
    t0 = time.perf_counter()
    out = list(Translator(s).translate_lines(text, gen, Batching("tokens", max_batch_tokens=args.max_batch_tokens)))
    seconds = time.perf_counter() - t0
    close_batch(batches[-1], s.backend)
    end = {"rss": rss_mib(), "hwm": peak_rss_mib(), **heap()}
    lib = libc()
    if lib is not None:
        lib.malloc_trim(0)
        end["rss_after_malloc_trim"] = rss_mib()
    return {"points": points, "batches": batches, "sessions": sessions, "end": end, "seconds": round(seconds, 1),
            "lines": sum(1 for line in out if line.error is None),
            "hypotheses": [line.hypotheses[0] if line.hypotheses else "" for line in out]}


def report(name: str, r: dict) -> None:
    print(f"\n### {name}: {r['lines']} lines in {r['seconds']} s (one pass, a hint), peak {r['end']['hwm']:.0f} MiB\n")
    print("| point | VmRSS MiB | change |\n| --- | ---: | ---: |")
    for what, rss, delta in r["points"]:
        print(f"| {what} | {rss:.0f} | {'' if delta is None else f'{delta:+.0f}'} |")
    batches = r["batches"]
    peak = next(i for i, b in enumerate(batches) if b["hwm"] >= r["end"]["hwm"] - 0.5)
    print("\n| batch | rows | source tokens | RSS before | after encoder | end | high-water mark after "
          "| cache capacity | host buffers MiB, allocated (resident): cache / cross / logits / candidates |\n"
          "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for i, b in enumerate(batches):
        f, res = b["buffers"], b["buffers"]["resident"]
        print(f"| {i + 1}{' (peak)' if i == peak else ''} | {b['rows']} | {b['src_len']} | {b['before']:.0f} | "
              f"{b['after_encoder']:.0f} | {b['end']:.0f} | {b['hwm']:.0f} | {f['cache_capacity']} | "
              + " / ".join(f"{f[k]:.0f} ({res[k]:.0f})" for k in ("cache", "cross", "logits", "candidates")) + " |")
    breakdown(r, max(range(len(batches)), key=lambda i: batches[i]["end"]))
    e = r["end"]
    print(f"\nAfter the file: RSS {e['rss']:.0f} MiB; glibc heaps {e.get('heap_system', 0):.0f}, of it free but held "
          f"{e.get('heap_free', 0):.0f}, mmapped blocks {e.get('mmapped', 0):.0f} MiB; RSS after malloc_trim(0) "
          f"{e.get('rss_after_malloc_trim', 0):.0f} MiB")


def breakdown(r: dict, i: int) -> None:
    """The RSS at the end of batch i (the highest at a batch's end), by owner, as far as it is known."""
    b = r["batches"][i]
    imports = next(rss for what, rss, _ in r["points"] if what == "import onnxruntime")
    parts = [("python, numpy, onnxruntime, xform imported", imports)]
    parts += [(f"session {graph}: its weights (prepacked) and first arena", mib)
              for graph, mib in r["sessions"].items()]
    parts += [(f"runtime host buffers: {k} (resident)", b["buffers"]["resident"][k])
              for k in ("cache", "cross", "logits", "candidates")]
    parts += [("the bundle's mapped files (resident pages)", b["files"]),
              ("glibc: freed, held for reuse (every arena's free chunks)", b.get("heap_free", 0.0))]
    known = sum(mib for _, mib in parts)
    parts.append(("the rest: ONNX Runtime's arenas (activations), numpy temporaries, tokenizer", b["end"] - known))
    print(f"\nResident at the end of batch {i + 1} ({b['end']:.0f} MiB; glibc's free memory may be partly "
          "paged out, so the rest is a lower bound):\n\n| owner | MiB |\n| --- | ---: |")
    for what, mib in parts:
        print(f"| {what} | {mib:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("file")
    ap.add_argument("--lines", type=int, default=1000)
    ap.add_argument("--beams", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-batch-tokens", type=int, default=2048)
    ap.add_argument("--settings", default="default")
    ap.add_argument("--json", default=None, help="write every setting's figures and hypotheses here")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args, SETTINGS[args.child])))
        return
    from xform.runtime.bench import machine_name
    print(f"Machine: {machine_name()}; {args.bundle}, {args.lines} lines of {args.file}, beams {args.beams}, "
          f"{args.threads} threads, --max-batch-tokens {args.max_batch_tokens}")
    results = {}
    for name in args.settings.split(","):
        cmd = [sys.executable, __file__, args.bundle, args.file, "--lines", str(args.lines), "--beams", str(args.beams),
               "--threads", str(args.threads), "--max-batch-tokens", str(args.max_batch_tokens), "--child", name]
        env = {**os.environ, **SETTINGS[name].get("env", {})}
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
        results[name] = json.loads(out.splitlines()[-1])
        report(name, results[name])
    first = next(iter(results.values()))["hypotheses"]
    for name, r in results.items():
        print(f"{name}: hypotheses equal to {next(iter(results))}'s: {r['hypotheses'] == first}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
