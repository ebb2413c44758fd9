"""In-flight serving on Triton: each request joins one running batch, and may stream its tokens.

`xform triton --scheduling inflight` (the default) writes two models that share one engine:

- `NAME-stream`, decoupled: the runtime's Scheduler (runtime/scheduling/scheduler.py) in a thread of the
  model. `execute` parses each request (serving/handler.py: the same inputs and checks as the
  dynamic-batching model) and submits it; a request joins the running rows at the next step
  boundary and its response is sent, with Triton's final flag, the step it ends. With the input
  `stream` true, every step first sends the ids it made and the text they add (`output_ids`
  [b, 1], `translation` [b, 1]): gRPC streaming and HTTP `/v2/models/NAME-stream/generate_stream`.
  A client that goes away (Triton's request cancellation, asked every 50 ms by a Watcher) has its
  rows leave at the next step. Responses are sent by a thread of their own, so that the engine's
  steps never wait on Triton.
- `NAME`, the model of plain requests (HTTP `/infer` and gRPC refuse decoupled models): each
  request forwarded to `NAME-stream` through Triton's BLS from a thread and answered through its
  response sender when its result comes, so that `execute` never waits for a decode and every
  request joins the one running batch.

The measurements behind this shape are in docs/design.md, "In-flight batching on Triton".
This module holds the parts without Triton (tested directly); xform/serving/triton_model.py
the Triton side.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Callable

import numpy as np

from xform.errors import InputError
from xform.serving.handler import Job

STREAM_SUFFIX = "-stream"

# Triton 2.51's BLS answers NAME every error of NAME-stream as INTERNAL, whatever its code: a request
# that NAME relays carries this parameter, and the engine writes the kind of its error (`error`'s
# request | server | unavailable) into the message, which NAME reads back and removes.
RELAY = "xform_relay"
KINDS = ("request", "server", "unavailable")


def tagged(message: str, kind: str) -> str:
    """An engine's error message for the front model: its kind first."""
    return f"[xform:{kind}] {message}"


def untagged(message: str) -> tuple[str, str]:
    """(kind, message) of an error the engine model answered a relayed request; an error without
    the engine's tag is Triton's own about the engine (not ready, its stub gone): the server's."""
    for kind in KINDS:
        if message.startswith(tagged("", kind)):
            return kind, message[len(tagged("", kind)):]
    return "server", message


def stream_model(name: str) -> str:
    """The decoupled model that runs NAME's engine."""
    return name + STREAM_SUFFIX


class TextStream:
    """A request's tokens as they come: for each step, the ids its rows made (pad after a row's
    end) and, with a tokenizer, the text each row's ids add to what was sent before."""

    def __init__(self, session, job: Job, send: Callable[[dict[str, np.ndarray]], None]):
        self.session, self.send = session, send
        self.ids: list[list[int]] = [[] for _ in job.rows]
        self.text = ["" for _ in job.rows]
        # an empty source text streams nothing (its final answer is empty: handler.blanked)
        self.ended = np.array([not t.strip() for t in job.texts] if job.texts else [False] * len(job.rows), bool)

    def feed(self, step_ids: np.ndarray) -> None:
        s = self.session
        step_ids = np.asarray(step_ids, np.int64).reshape(-1)
        outputs = {"output_ids": step_ids.reshape(-1, 1).copy()}
        if s.tokenizer is not None:
            deltas = []
            for r, i in enumerate(step_ids.tolist()):
                if self.ended[r] or i in (s.eos_id, s.pad_id):
                    self.ended[r] = True
                    deltas.append(b"")
                    continue
                self.ids[r].append(i)
                text = s.tokenizer.decode(self.ids[r])
                delta = text[len(self.text[r]):] if text.startswith(self.text[r]) else text
                self.text[r] = text
                deltas.append(delta.encode("utf-8"))
            outputs["translation"] = np.array(deltas, dtype=object).reshape(-1, 1)
        self.send(outputs)


def submit(scheduler, session, job: Job, stream: TextStream | None = None) -> Future:
    """The request in the scheduler: a Future of its Result (what it decodes alone)."""
    if stream is not None and job.request.generation.num_return_sequences > 1:
        raise InputError("input 'stream': one sequence a row (num_return_sequences 1)")
    decode = session.decode_item(job.request)
    decode.on_tokens = None if stream is None else stream.feed
    return scheduler.enqueue(decode)


class Watcher:
    """Cancels the requests whose client went away: every `every` seconds, a thread of its own
    asks each running request's `cancelled()` (Triton's request.is_cancelled, a round trip to
    the server) and cancels those that say so; their rows leave the batch at its next step. Off
    the scheduler's thread, so the asking never delays a step."""

    def __init__(self, scheduler, every: float = 0.05):
        self.scheduler, self.every = scheduler, every
        self.live: dict[Future, Callable[[], bool]] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, name="xform-cancel-watch", daemon=True)
        self.thread.start()

    def add(self, future: Future, cancelled: Callable[[], bool]) -> None:
        with self.lock:
            self.live[future] = cancelled

    def forget(self, future: Future) -> None:
        """Never ask about `future`'s request again (call before its final response)."""
        with self.lock:
            self.live.pop(future, None)

    def check(self) -> None:
        """Ask every live request, holding the lock: `forget` (which a request's final response
        waits for) then never returns while its request is being asked, so a request is never
        asked after it was answered (Triton frees it then: asking would read freed memory)."""
        with self.lock:
            gone = []
            for future, cancelled in self.live.items():
                if future.done():
                    continue
                try:
                    if cancelled():
                        gone.append(future)
                except Exception:  # noqa: BLE001 - Triton cannot say: the request is as good as gone
                    gone.append(future)
        for future in gone:
            self.scheduler.cancel(future)

    def loop(self) -> None:
        while not self.stop.wait(self.every):
            self.check()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
