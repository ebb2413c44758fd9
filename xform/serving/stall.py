"""A response that Triton never takes: under `xform serve`, the in-flight engine aborts its
tritonserver so that serve restarts it (serving/lifecycle.py's Restarts), instead of a server that
answers nothing again.

Seen here (issue 55): under 32 streaming clients cancelling a tenth of their requests, Triton
2.51's Python backend blocked the engine's `send` of a final response forever (the stub's
responder idle in `ResponseSender.send`, tritonserver alive and ready, every later request to the
bundle timing out): the same gRPC cancellation race that can also crash it with SIGSEGV
(docs/serving.md). The engine sends every response from one thread, so one send that never
returns wedges the bundle. `Stall` times each send; a send older than XFORM_SERVE_STALL seconds
(set by serve only where it restarts crashes: a tritonserver run by hand is never aborted) logs
an error and sends SIGABRT to tritonserver, the stub's parent."""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Callable, Iterator

STALL_ENV = "XFORM_SERVE_STALL"  # seconds a response may wait for Triton to take it; unset: never abort
STALL_S = 20.0  # what serve sets: far above any send Triton takes (milliseconds), below a client's patience


def stall_seconds() -> float | None:
    """The stall bound serve set for this server, or None (no bound: not run by serve, or garbage)."""
    try:
        value = float(os.environ.get(STALL_ENV, ""))
    except ValueError:
        return None
    return value if value > 0 else None


class Stall:
    """Times the sends of one thread; `check()` (from a watch thread, every `poll` seconds) calls
    `abort(seconds)` once when a send has been under way longer than `limit` seconds."""

    def __init__(self, limit: float, abort: Callable[[float], None], clock: Callable[[], float] = time.monotonic):
        self.limit, self.abort, self.clock = limit, abort, clock
        self.since: float | None = None
        self.aborted = False

    @contextlib.contextmanager
    def sending(self) -> Iterator[None]:
        self.since = self.clock()
        try:
            yield
        finally:
            self.since = None

    def check(self) -> bool:
        """Whether the send under way is stalled (then, the first time, abort is called)."""
        since = self.since
        waited = 0.0 if since is None else self.clock() - since
        if waited <= self.limit:
            return False
        if not self.aborted:
            self.aborted = True
            self.abort(waited)
        return True

    def watch(self, stop: threading.Event, poll: float = 1.0) -> threading.Thread:
        """A daemon thread checking every `poll` seconds until `stop` is set."""
        def loop() -> None:
            while not stop.wait(poll):
                self.check()
        thread = threading.Thread(target=loop, name="xform-stall-watch", daemon=True)
        thread.start()
        return thread


def abort_server(log: Callable[[str], None]) -> Callable[[float], None]:
    """The abort of a stalled engine: say why in Triton's log (`log`, an error), then SIGABRT to
    tritonserver (this stub's parent), which serve sees as a crash and restarts."""
    def abort(waited: float) -> None:
        log(f"xform: a response has waited {waited:.0f} s for Triton to take it (Triton 2.51's gRPC cancellation "
            "race wedges a stream so; docs/serving.md): aborting tritonserver so that xform serve restarts it")
        os.kill(os.getppid(), signal.SIGABRT)
    return abort
