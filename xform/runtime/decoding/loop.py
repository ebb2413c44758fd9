"""The one decoding loop: a `Batch` of running rows that requests (`Decode`) join and leave.

A `Batch` runs the decoder over every row of its requests at once, each row at its own position
(the decoder graph's per-row `positions`, contract.py). A request's rows join at a step boundary
at position 0 while the others go on at theirs; a request's rows leave when its strategy is done
with them, and its result is ready that very step. Each request keeps its own strategy
(decoding.py), so what it decodes is what it decodes alone: greedy, beams (a request's beams stay
together, the rows of one source next to each other) and sampling.

    batch = Batch(backend, start_id)
    item = batch.admit(Decode(strategy, src_ids, src_lengths, ...))   # start, or join the running rows
    finished = batch.step()          # one decoder step over every row; the requests done at it

`Session.run` runs one request through a Batch to its end; the threaded `Scheduler`
(scheduler.py) owns a running batch for a server or a file. Joining needs a backend that can add
rows to a running batch (`capabilities.join`: ONNX Runtime); requests that start together need none.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from xform.errors import InputError
from xform.runtime.backends.backend import Backend
from xform.runtime.decoding.request import Result
from xform.runtime.decoding.strategies import Strategy


@dataclass(eq=False)
class Decode:
    """One request in a batch: its sources, its strategy, what it returns and whom it tells."""

    strategy: Strategy  # decoding.Greedy / Sample / Alternatives / BeamSearch / ConstrainedBeamSearch
    src_ids: np.ndarray
    src_lengths: np.ndarray
    return_scores: bool = False
    return_token_scores: bool = False
    return_attention: bool = False
    on_step: Callable[[int], None] | None = None  # progress: called with each finished step
    on_tokens: Callable[[np.ndarray], None] | None = None  # streaming: each step's ids, one per output row
    step: int = 0
    tokens: np.ndarray | None = None  # the ids the rows feed at the next step
    output: Result | None = None
    done: bool = False
    cancelled: bool = False
    sent: int = 0  # streaming: steps already reported
    promoted_beams: int | None = None  # Request.promoted_beams, said in the result

    @property
    def rows(self) -> int:
        return 0 if self.tokens is None else len(self.tokens)

    @property
    def min_new(self) -> int:
        return self.strategy.graph_min_new_tokens or 0  # None: the strategy applies it on the host

    def result(self) -> Result:
        """The ids, and the scores, token scores and attention asked for; with constraints, the
        phrases each hypothesis misses and the beam a greedy request was promoted to."""
        s = self.strategy
        ids, scores = s.result()
        unmet = getattr(s, "unmet", None)  # a constrained search's (constrained.py)
        return Result(ids.astype(np.int64, copy=False), scores if self.return_scores or self.return_token_scores
                      else None, s.per_token() if self.return_token_scores else None,
                      s.attentions() if self.return_attention else None, None if unmet is None else unmet(),
                      self.promoted_beams)


class Batch:
    """The running rows of the requests admitted over one backend, stepped together."""

    def __init__(self, backend: Backend, start_id: int, pad_id: int = 0):
        self.backend, self.start_id, self.pad_id = backend, start_id, pad_id
        self.items: list[Decode] = []
        self.pending: np.ndarray | None = None  # the backend's rows to continue, applied at the next step

    @property
    def rows(self) -> int:
        return sum(d.rows for d in self.items)

    @property
    def group(self) -> int | None:
        """Rows a source of the running requests (one batch reads its sources in equal groups)."""
        return self.items[0].strategy.group if self.items else None

    @property
    def key(self) -> tuple | None:
        return self.key_of(self.items[0]) if self.items else None

    @staticmethod
    def key_of(item: Decode) -> tuple:
        """Requests that may share a batch: the same rows a source, the same ranked candidates."""
        return item.strategy.group, item.strategy.candidates_wanted

    def can_join(self, item: Decode, first: Decode | None = None) -> bool:
        """Whether `item` may join the running batch (a backend with capabilities.join), or, the
        batch empty, start with the requests `first` opens (one encoder run: any backend)."""
        if self.items:
            return self.backend.capabilities.join and self.key_of(item) == self.key
        return first is None or self.key_of(item) == self.key_of(first)

    def admit(self, *items: Decode) -> None:
        """The requests' sources encoded together (one encoder run, padded to the longest) and
        their rows added at position 0, in order: a new batch, or at the end of the running one
        (the pending reorder applied first, so row numbers are current). They share one key."""
        group = items[0].strategy.group
        for item in items:
            if (self.items or item is not items[0]) and not self.can_join(item, items[0]):
                raise InputError(f"this request ({item.strategy.group} rows a source) cannot join the running "
                                 f"batch ({self.group or group} rows a source)")
        if len(items) == 1:
            src, lengths = items[0].src_ids, items[0].src_lengths
        else:
            width = max(i.src_ids.shape[1] for i in items)
            src = np.concatenate([np.pad(i.src_ids, ((0, 0), (0, width - i.src_ids.shape[1])),
                                         constant_values=self.pad_id) for i in items])
            lengths = np.concatenate([i.src_lengths for i in items])
        if not self.items:
            self.pending = None
            self.backend.start(src, lengths, group)
        else:
            if self.pending is not None:
                self.backend.gather(self.pending)
                self.pending = None
            self.backend.join(src, lengths, group)
        for item in items:
            item.tokens = np.full(item.strategy.rows, self.start_id, np.int64)
            self.items.append(item)

    def step(self) -> list[Decode]:
        """One decoder step over every running row; returns the requests that ended at it (their
        rows leave the backend with the next step's gather, or before the next join)."""
        items = self.items
        tokens = np.concatenate([d.tokens for d in items])
        min_new = items[0].min_new if len(items) == 1 else np.repeat([d.min_new for d in items],
                                                                      [d.rows for d in items])
        ranked = {}
        wanted = items[0].strategy.candidates_wanted  # one value in a batch (Batch.key_of)
        if wanted and self.backend.capabilities.candidates:
            ranked = {"candidates": wanted}
        needs_logits = any(d.strategy.needs_logits for d in items)
        nxt, out = self.backend.step(tokens, min_new, needs_logits, self.pending, **ranked)
        attention = self.backend.attention() if any(d.return_attention for d in items) else None
        finished, keep_rows, offset = [], [], 0
        for d in items:
            rows = slice(offset, offset + d.rows)
            offset += d.rows
            part = None if out is None else (tuple(o[rows] for o in out) if isinstance(out, tuple) else out[rows])
            args: tuple[np.ndarray, ...] = ()
            if d.return_attention:
                assert attention is not None  # fetched above: this request returns it
                # each source's columns start at 0; the batch's may be wider (a longer source joined)
                args = (attention[rows, :d.src_ids.shape[1]],)
            fed, keep = d.strategy.advance(d.step, nxt[rows], part, *args)
            if d.on_step is not None:
                d.on_step(d.step)
            d.step += 1
            if fed is None or d.step >= d.strategy.steps_needed or d.cancelled:
                d.done, d.tokens = True, None
                if not d.cancelled:
                    d.output = d.result()
                finished.append(d)
                continue
            keep_rows.append(rows.start + (np.arange(rows.stop - rows.start) if keep is None else keep))
            d.tokens = np.asarray(fed, np.int64)
        self.items = [d for d in items if not d.done]
        idx = np.concatenate(keep_rows).astype(np.int64) if keep_rows else np.zeros(0, np.int64)
        self.pending = None if len(idx) == offset and (idx == np.arange(offset)).all() else idx
        return finished
