"""In-flight batching for a server or a file: a thread that owns one running batch (loop.py,
docs/design.md "In-flight batching").

The `Scheduler` above it owns a running batch for a server or a file: requests are queued from any
thread (`submit` -> a Future; `stream` for tokens as they come), encoded and joined at the next
step boundary while rows and cache memory allow, and their results delivered as soon as they end.
Joining needs a backend that can add rows to a running batch (`capabilities.join`: ONNX Runtime);
the others decode one request at a time through the same loop.
"""
from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np

from xform.errors import InputError, XformError
from xform.runtime.backends.backend import JoinRefused
from xform.runtime.backends.cache import row_bytes
from xform.runtime.decoding.loop import Batch, Decode


class Session(Protocol):
    """What the scheduler needs of the session above it (runtime/session.py): its backend and ids,
    its config and bundle (the cache's size), and the decode a request plans (`plan`)."""

    backend: Any
    config: Any
    bundle: Any
    start_id: int
    pad_id: int

    def plan(self, src_ids, src_lengths=None, **settings: Any) -> Decode: ...

__all__ = ["Batch", "Cancelled", "Decode", "OverloadedError", "RequestFuture", "Scheduler", "Ticket"]


class OverloadedError(XformError):
    """The scheduler's queue is full: the request is refused rather than held without bound."""


class Cancelled(XformError):
    """The request was cancelled (its client went away) before it finished."""


class RequestFuture(Future):
    """The Future of a request `Scheduler.submit` queued: it knows its ticket, for `Scheduler.cancel`."""

    def __init__(self, ticket: Ticket):
        super().__init__()
        self.ticket = ticket


@dataclass(eq=False)
class Ticket:
    """A queued request: the decode to run and its Future (of a named Result, or with `astuple`
    of what Session.generate returns)."""

    decode: Decode
    astuple: bool = False
    future: RequestFuture = field(init=False)

    def __post_init__(self) -> None:
        self.future = RequestFuture(self)

    def tell(self, result=None, error: BaseException | None = None) -> None:
        """Settle the Future once; a second settling (a cancel racing the result) is ignored."""
        try:
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result.astuple() if self.astuple and result is not None else result)
        except InvalidStateError:
            pass


class Scheduler:
    """In-flight batching over a Session: one running Batch, fed from a bounded queue.

    `submit` checks a request at once (a malformed one fails alone, there and then), queues it
    and returns a Future of what `Session.generate` would return for it; `stream` yields its
    tokens step by step, then the result. A thread (`start`, or `run_until_idle` in the caller's
    thread) admits queued requests at each step boundary, in order of arrival, while the running
    rows stay within `max_rows` (which bounds the self-attention cache at max_rows x max_len
    positions: `cache_bytes`), steps the batch, and delivers each request the step it ends. A
    request whose rows a source differ from the running batch's (beams beside greedy rows) waits
    for the batch to drain. More than `max_queue` waiting requests: OverloadedError.
    """

    def __init__(self, session: Session, max_rows: int = 64, max_queue: int = 256, max_cache_mib: float | None = None):
        self.session = session
        backend = session.backend
        per_row = self.row_bytes()
        if max_cache_mib is not None:
            fits = int(max_cache_mib * 2**20 // per_row)
            if fits < 1:
                raise InputError(f"max_cache_mib {max_cache_mib}: one row's cache needs {per_row / 2**20:.2f} MiB")
            max_rows = min(max_rows, fits)
        limit = backend.capabilities.max_rows
        self.max_rows = min(max_rows, limit) if limit else max_rows
        if self.max_rows < 1 or max_queue < 1:
            raise InputError(f"max_rows {max_rows} and max_queue {max_queue} must be at least 1")
        self.max_queue = max_queue
        self.batch = Batch(backend, session.start_id, session.pad_id)
        self.queue: deque[Ticket] = deque()
        self.running: dict[int, Ticket] = {}
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None
        self.closed = False

    def row_bytes(self) -> int:
        """Bytes of one row's self-attention cache at the model's max_len positions."""
        c, bundle = self.session.config, self.session.bundle
        item = 4 if bundle is None else np.dtype(bundle.manifest.kv_dtype).itemsize
        return row_bytes(c.n_decoder_layers, c.n_heads, c.head_dim, c.max_len, item)

    @property
    def cache_bytes(self) -> int:
        """The most the running rows' cache can hold: max_rows rows of max_len positions."""
        return self.max_rows * self.row_bytes()

    # -- requests ------------------------------------------------------------------------------
    def submit(self, src_ids, src_lengths=None, *, on_tokens: Callable[[np.ndarray], None] | None = None,
               **settings: Any) -> RequestFuture:
        """Queue one request (any number of sources; the settings of Session.generate); returns a
        Future of its result, as Session.generate returns it. Raises InputError for a bad request,
        OverloadedError when full. Stop it with `cancel(future)` (Future.cancel() stops nothing
        once it is queued)."""
        decode = self.session.plan(src_ids, src_lengths, **settings)
        decode.on_tokens = on_tokens
        return self.enqueue(decode, astuple=True)

    def enqueue(self, decode: Decode, astuple: bool = False) -> RequestFuture:
        """Queue a planned request (Session.decode_item); a Future of its Result (`astuple`: of
        what Session.generate returns)."""
        if decode.strategy.rows > self.max_rows:
            raise InputError(f"{decode.strategy.rows} rows (sources x beams or samples) exceed the scheduler's "
                             f"max_rows {self.max_rows}")
        ticket = Ticket(decode, astuple)
        with self.cond:
            if self.closed:
                raise XformError("the scheduler is closed")
            if len(self.queue) >= self.max_queue:
                raise OverloadedError(f"overloaded: {len(self.queue)} requests already wait (max_queue "
                                      f"{self.max_queue}); retry later")
            self.queue.append(ticket)
            self.cond.notify_all()
        return ticket.future

    def cancel(self, future: Future) -> None:
        """Stop a request: a queued one never starts, a running one's rows leave at the next step.
        Its Future raises Cancelled."""
        if not isinstance(future, RequestFuture):
            raise TypeError(f"cancel() takes a Future that submit() returned, not a {type(future).__name__}")
        ticket = future.ticket
        with self.cond:
            ticket.decode.cancelled = True
            if ticket in self.queue:
                self.queue.remove(ticket)
        ticket.tell(error=Cancelled("the request was cancelled"))

    def stream(self, src_ids, src_lengths=None, **settings: Any):
        """Yield each step's ids (one per output row: greedy and sampling; beam search's rows
        change until the end, so beams yield nothing before it), then the result (what the
        Future holds), for one request. Needs the scheduler running (`start`)."""
        import queue as q
        got: q.Queue = q.Queue()
        future = self.submit(src_ids, src_lengths, on_tokens=got.put, **settings)
        future.add_done_callback(lambda f: got.put(future))
        try:
            while True:
                item = got.get()
                if item is future:
                    yield future.result()
                    return
                yield item
        finally:
            if not future.done():
                self.cancel(future)

    # -- the loop ------------------------------------------------------------------------------
    def admit(self) -> None:
        """Join queued requests at this step boundary, first come first served, while rows allow:
        all of them through one encoder run."""
        batch = self.batch
        taken: list[Ticket] = []
        rows = batch.rows
        with self.cond:
            while self.queue:
                ticket = self.queue[0]
                if ticket.decode.cancelled:
                    self.queue.popleft()
                    continue
                first = taken[0].decode if taken else None
                fits = rows + ticket.decode.strategy.rows <= self.max_rows
                if (batch.items or taken) and not (fits and batch.can_join(ticket.decode, first)):
                    break  # waits for rows to free (or, another kind of request, for the batch to drain)
                self.queue.popleft()
                taken.append(ticket)
                rows += ticket.decode.strategy.rows
        if not taken:
            return
        joining = bool(batch.items)
        try:
            batch.admit(*(t.decode for t in taken))
        except Exception as e:  # noqa: BLE001 - these requests fail; the batch too if the join changed it
            for t in taken:
                t.tell(error=e)
            if joining and not isinstance(e, JoinRefused):
                self.fail_running(XformError(f"the running batch failed when requests joined it: {e}"))
            return
        for t in taken:
            self.running[id(t.decode)] = t

    def run_once(self) -> bool:
        """Admit, step once, deliver; False when there is nothing to do."""
        self.admit()
        batch = self.batch
        if not batch.items:
            return False
        try:
            finished = batch.step()
        except Exception as e:  # noqa: BLE001 - a backend failure fails the running requests, not the thread
            self.fail_running(e)
            return True
        for d in batch.items:
            self.report(d)
        for d in finished:
            self.report(d)
            ticket = self.running.pop(id(d))
            ticket.tell(d.output) if not d.cancelled else ticket.tell(error=Cancelled("the request was cancelled"))
        return True

    def fail_running(self, error: BaseException) -> None:
        """Every running request fails with `error`; the batch is empty (the next admit starts one)."""
        for d in self.batch.items:
            ticket = self.running.pop(id(d), None)
            if ticket is not None:
                ticket.tell(error=error)
        self.batch.items = []

    def report(self, d: Decode) -> None:
        """Streaming: the ids each of the request's output rows took at the steps not yet sent."""
        out = d.strategy.out
        if d.on_tokens is None or d.cancelled or out is None:
            return
        ticket = self.running.get(id(d))
        while d.sent < d.step:
            try:
                d.on_tokens(out[:, d.sent].copy())
            except Exception as e:  # noqa: BLE001 - a listener that fails (a client gone) ends its request only
                d.cancelled = True
                if ticket is not None:
                    ticket.tell(error=Cancelled(f"the request's token listener failed: {e}"))
                return
            d.sent += 1

    def run_until_idle(self) -> None:
        """Run in this thread until the queue and the batch are empty."""
        while self.run_once():
            pass

    def start(self) -> "Scheduler":
        """Run the loop in a daemon thread until close()."""
        if self.thread is None:
            self.thread = threading.Thread(target=self.loop, name="xform-scheduler", daemon=True)
            self.thread.start()
        return self

    def loop(self) -> None:
        while True:
            with self.cond:
                while not self.closed and not self.queue and not self.batch.items:
                    self.cond.wait()
                if self.closed:
                    break
            try:
                self.run_once()
            except Exception as e:  # noqa: BLE001 - the thread must live: what was running fails, the rest goes on
                self.fail_running(XformError(f"the scheduler failed: {type(e).__name__}: {e}"))
        error = Cancelled("the scheduler was closed")
        for ticket in [*self.queue, *self.running.values()]:
            ticket.tell(error=error)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def __enter__(self) -> "Scheduler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
