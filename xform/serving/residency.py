"""Which Triton model each Python-backend stub process runs, what memory it holds, and when it is
gone: read from /proc (Linux), so a model's cost is measured, not guessed from its files.

A stub's command line is `triton_python_backend_stub <repo>/<model>/<version>/model.py <shm> ...`
and its parent is tritonserver. Triton 2.51 unloads asynchronously: `unload_model` returns at
once, the index says UNLOADING, and the stub exits about a second later (measured 1.1-1.3 s);
only then is its memory free. Used by the router model (its loader: serving/triton_router.py)
and by `xform serve`'s watch (lifecycle.py: a stub that left because its model was unloaded is no death).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable

PROC = Path("/proc")
STUB = "triton_python_backend_stub"


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is not)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] not in ("Z", "X")


def parent_of(pid: int) -> int | None:
    try:
        return int((PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def children(parent: int) -> list[int]:
    """The live processes whose parent is `parent` (tritonserver's: its stubs)."""
    return [int(p.name) for p in PROC.glob("[0-9]*") if parent_of(int(p.name)) == parent and alive(int(p.name))]


def stub_model(pid: int) -> str | None:
    """The model a stub process runs (from its command line), or None for another process."""
    try:
        args = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if not args or not args[0].decode(errors="replace").endswith(STUB):
        return None
    for arg in args[1:]:
        path = Path(arg.decode(errors="replace"))
        if path.name == "model.py" and len(path.parts) >= 3:
            return path.parent.parent.name
    return None


def stub_models(pids: Iterable[int]) -> dict[int, str]:
    """pid -> model, for the stubs among `pids`."""
    out = {}
    for pid in pids:
        model = stub_model(pid)
        if model is not None:
            out[pid] = model
    return out


def stubs_of(model: str, pids: Iterable[int]) -> list[int]:
    """The stubs among `pids` that run `model`."""
    return sorted(p for p, m in stub_models(pids).items() if m == model)


def memory_bytes(pid: int) -> int:
    """A process's proportional set size (Pss, /proc/PID/smaps_rollup: shared pages split among
    their users), else its resident set (VmRSS); 0 when it is gone."""
    for name, key in (("smaps_rollup", "Pss:"), ("status", "VmRSS:")):
        try:
            with open(PROC / str(pid) / name) as f:
                for line in f:
                    if line.startswith(key):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            continue
    return 0


def wait_gone(pids: Iterable[int], timeout: float, poll: float = 0.05) -> list[int]:
    """Wait until every pid has exited, at most `timeout` seconds; the pids still alive."""
    left = [p for p in pids if alive(p)]
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        time.sleep(poll)
        left = [p for p in left if alive(p)]
    return left
