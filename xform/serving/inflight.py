"""In-flight serving on Triton: each request joins one running batch, and may stream its tokens.

`xform triton --scheduling inflight` (the default) writes two models that share one engine:

- `NAME-stream`, decoupled: the runtime's Scheduler (runtime/scheduler.py) in a thread of the
  model. `execute` parses each request (serving/handler.py: the same inputs and checks as the
  dynamic-batching model) and submits it; a request joins the running rows at the next step
  boundary and its response is sent, with Triton's final flag, the step it ends. With the input
  `stream` true, every step first sends the ids it made and the text they add (`output_ids`
  [b, 1], `translation` [b, 1]): gRPC streaming and HTTP `/v2/models/NAME-stream/generate_stream`.
  A client that goes away (Triton's request cancellation) has its rows leave at the next step.
- `NAME`, the model of plain requests (HTTP `/infer` and gRPC refuse decoupled models): each
  request forwarded to `NAME-stream` through Triton's BLS from a thread and answered through its
  response sender when its result comes, so that `execute` never waits for a decode and every
  request joins the one running batch.

The measurements behind this shape are in docs/design.md, "In-flight batching on Triton".
This module holds the parts without Triton (tested directly); xform/serving/triton_model.py
the Triton side.
"""
from __future__ import annotations

from concurrent.futures import Future
from typing import Callable

import numpy as np

from xform.errors import InputError
from xform.serving.handler import Job, decode_settings

STREAM_SUFFIX = "-stream"
CHECK_EVERY = 4  # steps between two questions to Triton whether a request was cancelled


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
        self.ended = np.zeros(len(job.rows), bool)

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


def submit(scheduler, session, job: Job, stream: TextStream | None = None,
           cancelled: Callable[[], bool] | None = None) -> Future:
    """The request in the scheduler: a Future of Session.generate's result for its rows alone.
    `cancelled` is asked at every step (Triton's request cancellation): true, its rows leave."""
    if stream is not None and job.settings.get("num_return_sequences", 1) > 1:
        raise InputError("input 'stream': one sequence a row (num_return_sequences 1)")
    holder: list[Future] = []

    def on_step(step: int) -> None:  # asking Triton costs a round trip: every CHECK_EVERY steps
        if step % CHECK_EVERY == 0 and holder:
            try:
                gone = cancelled()
            except Exception:  # noqa: BLE001 - Triton cannot say: the request is as good as gone
                gone = True
            if gone:
                scheduler.cancel(holder[0])
    src, lengths = session.pad(job.rows)
    future = scheduler.submit(src, lengths, on_tokens=None if stream is None else stream.feed,
                              on_step=on_step if cancelled is not None else None, **decode_settings(job))
    holder.append(future)
    return future
