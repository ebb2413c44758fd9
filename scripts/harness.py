"""What the benchmarks in scripts/ share: their common flags, the machine, versions and command line
a report states (docs/benchmarks.md: a ratio depends on the CPU, so a table says which one), timing
interleaved round by round in this process or one process per engine, Markdown tables, and the
JSON and Markdown a run writes.

    import harness
    ap = harness.parser(__doc__, work="/tmp/xform-files", out="docs", rounds=1)

A script beside this one imports it as `harness` (a script's own folder is on sys.path when it
runs, and its spawned workers inherit that path).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

SCRIPTS = Path(__file__).resolve().parent
DOCS = SCRIPTS.parent / "docs"
SETTLE_S = 0.3  # pause before a worker's run: OpenMP / ORT threads of the previous one spin for up to ~200 ms


# -- arguments ----------------------------------------------------------------------------------------
def parser(doc: str, *, work: str | None = None, out: str | None = None, threads: int | None = None,
           warmup: int | None = None, iters: int | None = None, rounds: int | None = None) -> argparse.ArgumentParser:
    """An ArgumentParser described by the docstring's first paragraph, with the common flags given:
    --work DIR (models, bundles, files; reused across runs), --out DIR (`out="docs"`: the docs
    folder by default; `"optional"`: nothing written without it), --threads N, --warmup N (untimed
    rounds), --iters N or --rounds N (timed rounds: the median is reported). tests/test_docs.py
    reads the flags a script takes from the keywords of its call."""
    ap = argparse.ArgumentParser(description=" ".join(doc.strip().split("\n\n")[0].split()))
    if work is not None:
        ap.add_argument("--work", type=Path, default=Path(work), help=f"models, bundles and files (default {work})")
    if out is not None:
        ap.add_argument("--out", type=Path, default=DOCS if out == "docs" else None,
                        help="where the report is written" + (" (default: docs/)" if out == "docs" else
                                                               " (default: nowhere)"))
    if threads is not None:
        ap.add_argument("--threads", type=int, default=threads)
    if warmup is not None:
        ap.add_argument("--warmup", type=int, default=warmup, help="untimed rounds first")
    if iters is not None:
        ap.add_argument("--iters", type=int, default=iters, help="timed rounds (median)")
    if rounds is not None:
        ap.add_argument("--rounds", type=int, default=rounds, help="timed rounds, interleaved (median)")
    return ap


# -- what a report states ------------------------------------------------------------------------------
def command(script: str, quote: bool = False) -> str:
    """The command line as run, as the docs write it: `python scripts/NAME ARGS` (`quote`: shell-quoted)."""
    args = shlex.join(sys.argv[1:]) if quote else " ".join(sys.argv[1:])
    return f"python scripts/{Path(script).name} {args}"


def machine(device: str = "cpu") -> str:
    """The machine as every table states it (xform.runtime.bench.machine_name: CPU model, cores,
    SIMD, OS, Python); on CUDA the GPU and its compute capability first."""
    from xform.runtime.bench import machine_name
    gpu = ""
    if device == "cuda":
        from xform.runtime.backends.gpu import gpu_info
        info = gpu_info() or {}
        gpu = f"{info.get('name', 'GPU ?')} (compute {info.get('compute_capability', '?')}), "
    return f"{gpu}{machine_name()}"


def versions(packages: Iterable[str], missing: str | None = None) -> dict[str, str]:
    """Each package's installed version; one not installed is named `missing`, or left out (None)."""
    from importlib.metadata import PackageNotFoundError, version
    found = {}
    for p in packages:
        try:
            found[p] = version(p)
        except PackageNotFoundError:
            if missing is not None:
                found[p] = missing
    return found


def listed(found: dict[str, str]) -> str:
    """Versions as a report's header lists them: `xform 0.1, onnxruntime 1.20`."""
    return ", ".join(f"{k} {v}" for k, v in found.items())


def preamble(command_line: str, machine_line: str, *facts: str) -> list[str]:
    """A report's first lines: the command, then the machine and the run's facts, `; `-separated."""
    return [f"Command: `{command_line}`", "", "Machine: " + "; ".join((machine_line, *facts)), ""]


# -- Markdown ------------------------------------------------------------------------------------------
def row(*cells: object) -> str:
    """A Markdown table's row: `| a | b |` (an empty cell `| |`)."""
    return "|" + "|".join(f" {c} " if str(c) else " " for c in cells) + "|"


def table(titles: Sequence[str], align: str, rows: Iterable[Sequence[object]] = ()) -> list[str]:
    """A Markdown table's lines: the titles, the alignment row (`align` a letter a column: l, or r
    for figures), then each row's cells."""
    assert len(align) == len(titles), (titles, align)
    return [row(*titles), row(*("---:" if a == "r" else "---" for a in align)), *(row(*r) for r in rows)]


def fmt(value: Any, template: str = "{}") -> str:
    """`template` filled with the value ("{:.2f}x", "{:.1%}"); "-" for None."""
    return "-" if value is None else template.format(value)


# -- writing -------------------------------------------------------------------------------------------
def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def write_report(out: Path, stem: str, report: dict, markdown: str | None = None) -> None:
    """`out`/STEM.json (the figures) and, given, `out`/STEM.md."""
    write_json(out / f"{stem}.json", report)
    if markdown is not None:
        (out / f"{stem}.md").write_text(markdown)


# -- timing --------------------------------------------------------------------------------------------
def rate(count: float, seconds: Sequence[float]) -> float:
    """`count` (tokens, sentences) over the median of the timed seconds."""
    return count / statistics.median(seconds)


def interleave(runs: dict[str, Callable[[], Any]], rounds: int, warmup: int = 0,
               before: Callable[[str], None] | None = None, progress: str | None = None
               ) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Every run once a round, in turn, for `warmup` untimed rounds and `rounds` timed ones, so
    that a busy machine's drift falls on each alike. `before(name)` prepares a run, untimed.
    Returns each run's seconds in the timed rounds and what it returned last."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    last: dict[str, Any] = {}
    for r in range(warmup + rounds):
        for name, run in runs.items():
            if before is not None:
                before(name)
            t0 = time.perf_counter()
            last[name] = run()
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)
        if progress is not None:
            print(f"  {progress}: round {r + 1}/{warmup + rounds}", file=sys.stderr, flush=True)
    return times, last


def timed(run: Callable[[], Any], rounds: int, warmup: int = 0,
          before: Callable[[str], None] | None = None) -> list[float]:
    """The seconds of `rounds` calls of run() after `warmup` untimed ones."""
    return interleave({"run": run}, rounds, warmup, before)[0]["run"]


# -- an engine a process -------------------------------------------------------------------------------
def spawn(target: Callable, args: tuple):
    """target(*args, conn) in a spawned process of its own (no engine's thread pools, wait policy or
    allocator imposed on another; its peak RSS its own): (process, the driver's end of the pipe)."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(*args, child), daemon=True)
    proc.start()
    return proc, parent


def in_process(target: Callable, args: tuple, what: str, timeout: float | None = None) -> Any:
    """What target(*args, conn) sends back from a process of its own. A process that ends without
    answering (an engine that crashes) raises RuntimeError, one that takes over `timeout` seconds
    is killed and raises TimeoutError: never a hang."""
    proc, conn = spawn(target, args)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while not conn.poll(1.0):  # a process gone closes the pipe: poll() sees it, recv() raises EOFError
            if deadline is not None and time.monotonic() > deadline:
                proc.kill()
                raise TimeoutError(f"{what}: timed out")
        return conn.recv()
    except EOFError:
        proc.join(10)
        raise RuntimeError(f"{what}: its process ended with exit code {proc.exitcode} before answering") from None
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def serve(conn, hello: Any, handle: Callable[[Any], Any], final: Callable[[], Any] = lambda: None) -> None:
    """A Workers process's loop: send `hello` once loaded, answer each message with handle(message)
    until told to stop (None), then send final()."""
    conn.send(hello)
    while (message := conn.recv()) is not None:
        conn.send(handle(message))
    conn.send(final())


class Workers:
    """An engine a spawned process, each loaded before the next starts (loading is not what is
    measured), then asked in turn: the driver runs one engine at a time, round by round, pausing
    SETTLE_S before each so the previous one's spinning threads settle. Each target runs serve()."""

    def __init__(self, targets: dict[str, tuple[Callable, tuple]]):
        self.procs = {}
        self.hello = {}  # what each sent once loaded
        for name, (target, args) in targets.items():
            proc, conn = spawn(target, args)
            self.hello[name] = conn.recv()
            self.procs[name] = (proc, conn)

    def ask(self, name: str, message: Any) -> Any:
        time.sleep(SETTLE_S)
        conn = self.procs[name][1]
        conn.send(message)
        return conn.recv()

    def close(self) -> dict[str, Any]:
        """Stop every worker; what each sent last (serve's final())."""
        finals = {}
        for name, (proc, conn) in self.procs.items():
            conn.send(None)
            finals[name] = conn.recv()
            proc.join(30)
        return finals
