"""CTranslate2's `asynchronous=True`: a translate_batch or score_batch call run on the translator's
one worker thread, each example's result a future (AsyncTranslationResult / AsyncScoringResult:
`result()` waits for it and raises what the call raised, `done()` says whether it is ready).

One Session decodes one batch at a time: the worker runs the calls in the order they came, and a
synchronous call waits for the call under way (`Worker.lock`). The counts are CTranslate2's
`num_queued_batches` (calls submitted, not started) and `num_active_batches` (started, not done)."""
from __future__ import annotations

import functools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class AsyncResult:
    """One example's result of an asynchronous call."""

    def __init__(self, future: Future, index: int) -> None:
        self.future, self.index = future, index

    def result(self) -> Any:
        return self.future.result()[self.index]

    def done(self) -> bool:
        return self.future.done()


class Worker:
    """A translator's worker thread (made at its first asynchronous call) and its counts."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # held while a call decodes, synchronous or not
        self.executor: ThreadPoolExecutor | None = None
        self.counts = threading.Lock()
        self.queued = self.active = 0

    def submit(self, call: Callable[[], list], n: int) -> list[AsyncResult]:
        if self.executor is None:
            self.executor = ThreadPoolExecutor(1, thread_name_prefix="xform-translator")
        with self.counts:
            self.queued += 1
        future = self.executor.submit(self.run, call)
        return [AsyncResult(future, i) for i in range(n)]

    def run(self, call: Callable[[], list]) -> list:
        with self.counts:
            self.queued -= 1
            self.active += 1
        try:
            with self.lock:
                return call()
        finally:
            with self.counts:
                self.active -= 1


def counts(translator) -> tuple[int, int]:
    """(calls queued, calls decoding) of the translator's asynchronous calls; (0, 0) before any."""
    made = vars(translator).get("_worker")
    return (made.queued, made.active) if made is not None else (0, 0)


def worker(translator) -> Worker:
    if "_worker" not in vars(translator):
        vars(translator)["_worker"] = Worker()
    return vars(translator)["_worker"]


def may_run_asynchronously(method: F) -> F:
    """A batch call that takes CTranslate2's `asynchronous`: True returns one AsyncResult an
    example at once and decodes on the worker thread; False decodes now, after the call under way."""
    @functools.wraps(method)
    def call(self, *args, asynchronous: bool = False, **kwargs):
        if not asynchronous:
            made = vars(self).get("_worker")  # none before a first asynchronous call: nothing to wait for
            if made is None:
                return method(self, *args, **kwargs)
            with made.lock:
                return method(self, *args, **kwargs)
        source = args[0] if args else kwargs.get("source")
        try:
            n = len(source)  # type: ignore[arg-type]
        except TypeError:
            n = 0  # the call refuses it, when its result is asked
        return worker(self).submit(lambda: method(self, *args, **kwargs), n)
    return call  # type: ignore[return-value]
