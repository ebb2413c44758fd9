"""What `xform serve` owns from launch to exit: signals, the watch over tritonserver and its
backend stubs, and the log that outlives the run when something went wrong.

- A stop (SIGINT, SIGTERM, SIGHUP: Ctrl-C, `kill`, systemd or Kubernetes stopping it, the shell
  going away) is a flag from the moment serve begins, before tritonserver exists: starting is
  abandoned, or the running server gets SIGINT, refuses new requests (Triton answers them
  "unavailable"), lets those in flight finish for the grace period, and is SIGKILLed with its
  stubs after it. A second signal kills at once. Exit code 0.
- tritonserver crashing (a fault signal: SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL; Triton 2.51's gRPC
  cancellation race is one, docs/serving.md) is restarted on the same ports and repository, at most
  `--restarts` times in any RESTART_WINDOW seconds (Restarts): each restart said on stderr, its log
  kept, and counted in /metrics (`xform_serve_restarts`, from the XFORM_SERVE_RESTARTS the new
  server is started with). Past the bound, a crash is a death like any other.
- tritonserver dying on its own otherwise, or one of its Python-backend stubs dying (Triton 2.51 does not
  restart a dead stub and keeps reporting the model ready, answering every request to it with an
  error): the server is stopped and serve exits 1, naming what died and where Triton's log is
  kept, so that a supervisor restarts it. Under explicit model control (many bundles, one
  server) a stub that exits because its model was unloaded is no death: its model is not READY
  in Triton's repository index, or it was loaded again in a new stub. A stub gone while its
  model is still READY is.
- Serving many bundles, SIGUSR1 asks the router to read its bundles again (serving/rescan.py);
  serve goes on.
- tritonserver is started with PR_SET_PDEATHSIG (server.die_with_parent): if serve itself is
  SIGKILLed, the kernel kills tritonserver too, and its stubs exit when they find it gone.
"""
from __future__ import annotations

import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from xform.serving import residency
from xform.serving.server import TritonServer

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOPPED, DIED, STUB_DIED = "stop", "died", "stub"
# a crash, not a stop: SIGKILL (an operator, the OOM killer) and SIGTERM are not restarted
FAULTS = (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL)
RESTART_WINDOW = 600.0  # seconds: --restarts bounds the restarts within any window this long
# a stub seen gone waits this long for tritonserver's own exit: a tritonserver aborting (Triton
# 2.51's gRPC 'ASSERTION FAILED: prior > 0', SIGABRT) takes its stubs with it a moment before it
# is reaped, and that is its crash, not a stub's death
STUB_GRACE = 2.0
BENIGN = ("CudaDriverHelper has not been initialized",)  # said at every start on a machine without a GPU


class Restarts:
    """How many crashes of tritonserver serve restarts: at most `limit` within any `window` seconds
    (`clock` for tests). `allow(code)` says whether the exit code `code` is a crash to restart now,
    and counts it; `count` is the restarts so far."""

    def __init__(self, limit: int, window: float = RESTART_WINDOW, clock: Callable[[], float] = time.monotonic):
        if limit < 0:
            raise ValueError(f"restarts: at least 0, got {limit}")
        self.limit, self.window, self.clock = limit, window, clock
        self.times: list[float] = []

    @property
    def count(self) -> int:
        return len(self.times)

    def allow(self, code: int | None) -> bool:
        if not crashed(code):
            return False
        now = self.clock()
        if sum(1 for t in self.times if now - t < self.window) >= self.limit:
            return False
        self.times.append(now)
        return True

    def said(self, what: str, kept: Path | None, error: str = "") -> str:
        """The line serve prints for the restart it is about to make (`error`: the log's last)."""
        log = f"; the crashed server's log kept at {kept}" if kept else ""
        last = f"; its log's last error: {error}" if error else ""
        return (f"{what} (a crash: {cause(what)}{last}); restarting it, restart {self.count} (at most "
                f"{self.limit} in {self.window:.0f} s){log}")


def crashed(code: int | None) -> bool:
    """Whether tritonserver's exit code `code` is a crash: killed by a fault signal."""
    return code is not None and code < 0 and -code in {int(s) for s in FAULTS}


def signal_name(code: int) -> str:
    return signal.Signals(-code).name if code < 0 else f"code {code}"


def cause(what: str) -> str:
    """A crash's likely cause, in words."""
    if "SIGSEGV" in what:
        return "Triton 2.51 can crash so when a gRPC client cancels a request as it completes, docs/serving.md"
    if "SIGABRT" in what:
        return ("aborted: by a bundle's engine whose response Triton never took (Triton 2.51's gRPC cancellation "
                "race, docs/serving.md), or by Triton itself: the kept log says which")
    return "see the kept log"


class Stopper:
    """The stop signals as a flag, installed for a `with` block: the first asks for a stop, a second
    one SIGKILLs the server (`server`, once there is one) without waiting for its grace."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.server: TritonServer | None = None
        self.restarts: Restarts | None = None  # the crashes serve restarts (none unless set)
        self.previous: dict[int, object] = {}

    def __enter__(self) -> "Stopper":
        # SIGINT too: a shell starting `xform serve ... &` leaves SIGINT ignored
        self.previous = {sig: signal.signal(sig, self.handle) for sig in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def handle(self, signum: int, frame) -> None:
        if self.signum is not None and self.server is not None:  # a second signal: no more grace
            self.server.kill_group()
        self.signum = self.signum or signum

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""


class Asked:
    """A signal (`signum`, SIGUSR1 by default) as a flag, installed for a `with` block: `take()`
    says whether it came since the last take (the many-bundle server's rescan)."""

    def __init__(self, signum: int = signal.SIGUSR1) -> None:
        self.signum, self.flag = signum, threading.Event()
        self.previous: object = None

    def __enter__(self) -> "Asked":
        self.previous = signal.signal(self.signum, lambda signum, frame: self.flag.set())
        return self

    def __exit__(self, *exc) -> None:
        signal.signal(self.signum, self.previous)  # type: ignore[arg-type]

    def take(self) -> bool:
        came = self.flag.is_set()
        self.flag.clear()
        return came


def watch(server: TritonServer, stopper: Stopper, poll: float = 0.25,
          tick: Callable[[], None] = lambda: None) -> tuple[str, str]:
    """Wait until a stop is asked for, tritonserver exits, or one of its stubs dies (calling
    `tick()` at each poll: it must not block); returns
    (STOPPED | DIED | STUB_DIED, what happened, in words). A stub that left because its model
    was unloaded (explicit model control: the index says the model is not READY, or it was
    loaded again and runs in a new stub) is no death."""
    process = server.process
    assert process is not None  # started
    stubs = running(server)
    unknown: set[int] = set()  # stubs gone before their command line said their model
    while True:
        if stopper.requested:
            return STOPPED, f"stopped on {stopper.name}"
        if process.poll() is not None:
            return DIED, exit_said(process.returncode)
        # a stub being killed can still be listed after its memory (and so its command line) is
        # gone: it keeps the model it was seen running
        now = {pid: model or stubs.get(pid, "") for pid, model in running(server).items()}
        gone = {pid: model for pid, model in stubs.items() if pid not in now}
        unknown |= {pid for pid, model in gone.items() if not model}
        judged = server.explicit and (gone or all(now.values()))
        ready = index(server) if judged else None  # asked once a poll, for both rules below
        dead = died(server, gone, stubs, now, ready) if gone else []
        if dead:
            if exited(process, STUB_GRACE):  # the stubs went with a tritonserver that is dying: its death
                return DIED, exit_said(process.returncode)
            return STUB_DIED, (f"a Triton Python-backend stub (pid {', '.join(map(str, dead))}) died: Triton does "
                               "not restart it and would answer every request to its model with an error")
        if server.explicit and all(now.values()):  # judged once every live stub says its model
            lost = orphaned(ready, now)
            if lost or (lost is None and unknown):
                pids = f" (pid {', '.join(map(str, sorted(unknown)))})" if unknown else ""
                return STUB_DIED, (f"a Triton Python-backend stub{pids} died, leaving {', '.join(lost or ['?'])} "
                                   "READY with no stub: Triton does not restart it and would answer every "
                                   "request to its model with an error")
            unknown = set()
        stubs = now
        tick()
        time.sleep(poll)


def exit_said(code: int) -> str:
    named = f" ({signal_name(code)})" if code < 0 else ""
    return f"tritonserver exited on its own with code {code}{named}"


def exited(process, seconds: float) -> bool:
    """Whether `process` exits within `seconds` (polled: Popen.poll is all the watch asks of it)."""
    deadline = time.monotonic() + seconds
    while process.poll() is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def running(server: TritonServer) -> dict[int, str]:
    """pid -> model of tritonserver's stubs ('' where the command line does not say)."""
    return {pid: residency.stub_model(pid) or "" for pid in server.stubs()}


def index(server: TritonServer) -> set[str] | None:
    """The models Triton's index says READY; None when it does not answer."""
    try:
        return server.ready_models()
    except (OSError, ValueError):
        return None


def died(server: TritonServer, gone: dict[int, str], before: dict[int, str], now: dict[int, str],
         ready: set[str] | None) -> list[int]:
    """The pids of `gone` that died: their model still READY (`ready`, the index's answer) and
    run by no new stub (an unloaded model is not READY; one loaded again since has a stub that was
    not there `before`). An index that did not answer (None) counts them all as dead: seen here,
    Triton 2.51's index can stop answering once a loaded model's stub was killed, and a false stop
    is safer than a model that answers every request with an error."""
    if not server.explicit or ready is None:
        return sorted(gone)
    reloaded = {m for p, m in now.items() if p not in before}
    return sorted(p for p, m in gone.items() if m in ready and m not in reloaded)


def orphaned(ready: set[str] | None, now: dict[int, str]) -> list[str] | None:
    """The models READY that no live stub runs (each READY model of a many-bundle server is a
    Python-backend model with a stub of its own, from before it is READY until after it is not):
    their stub died, even one the watch never saw (a load's instance stub started and was killed
    between two looks) or saw only before it named its model. None when the index did not answer
    (`ready` None): a death only if a stub of unknown model is gone (died's rule), else no judgement."""
    return None if ready is None else sorted(ready - set(now.values()))


def keep_log(server: TritonServer) -> Path | None:
    """A copy of Triton's log where it outlives serve's temporary directory."""
    if server.log_path is None or not server.log_path.is_file():
        return None
    kept = Path(tempfile.gettempdir()) / f"xform-serve-{server.http_port}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    shutil.copyfile(server.log_path, kept)
    return kept


def first_error(server: TritonServer, last: bool = False) -> str:
    """Triton's first error line (why a model did not load, a port it could not bind), or with
    `last` its last (why a running server died), without its timestamp prefix, or ''; the lines
    every start says on a machine without a GPU (BENIGN) are no reason."""
    said = [line.split("] ", 1)[-1].strip().strip('"') for line in server.log_tail(400).splitlines()
            if line.startswith("E") and line[1:5].isdigit()]
    said = [line for line in said if not any(b in line for b in BENIGN)]
    return (said[-1] if last else said[0]) if said else ""
