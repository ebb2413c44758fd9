"""Which lines of a stream are decoded together: read-ahead windows, sorted by source length and
cut into batches of examples (lines) or of tokens.

Pure planning over token counts, as production engines do (Marian's maxi-batch, CTranslate2's
read_batch_size): sorting a window by length puts sources of like length in a batch, so little
padding is decoded. Decoding the batches and putting results back in input order is the
session's business (session.py).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, TypeVar

from xform.errors import Message, SettingError

T = TypeVar("T")
BATCH_TYPES = ("examples", "tokens")
DEFAULT_BATCH_SIZE = 32  # lines per batch with batch_type "examples" when none is given
# decoder rows (lines x beams, or x samples) a batch holds at most unless told otherwise: the
# (rows, vocab) logits and the rows' K/V cache are what a batch's memory grows with, so a token
# budget alone let a window of short lines at beam 4 decode 1,024 rows at once (docs/benchmarks.md)
DEFAULT_MAX_ROWS = 256
# the settings a batching names in its messages, by their markers (errors.py)
SETTINGS = ("batch_type", "batch_size", "max_batch_tokens", "read_ahead", "max_rows")


@dataclass(frozen=True)
class Batching:
    """How a stream of lines is batched.

    examples: at most batch_size lines per batch (default 32).
    tokens: a batch's padded size, lines x its longest source (in source tokens), is at most
    max_batch_tokens; a single source longer than that runs alone. batch_size, when given, also
    limits the lines (a TensorRT engine's profile batch, say).
    read_ahead: batches' worth of lines read, sorted and decoded together (a window): read_ahead
    x batch_size lines, or with tokens read_ahead x max_batch_tokens source tokens.
    max_rows: decoder rows per batch, lines x the rows each decodes (beams, or samples), whatever
    the batch type (default DEFAULT_MAX_ROWS); a single line always runs. With it a batch's
    memory is bounded whatever the sentence lengths.
    """
    batch_type: str = "examples"
    batch_size: int | None = None
    max_batch_tokens: int | None = None
    read_ahead: int = 8
    max_rows: int | None = None

    def __post_init__(self):
        problems = [(name, f"{{{name}}} must be an integer >= 1, got {getattr(self, name)!r}")
                    for name in ("batch_size", "max_batch_tokens", "read_ahead", "max_rows")
                    if getattr(self, name) is not None and not whole(getattr(self, name))]
        if self.batch_type not in BATCH_TYPES:
            problems.append(("batch_type", f"{{batch_type}} must be examples or tokens, got {self.batch_type!r}"))
        elif self.batch_type == "tokens" and self.max_batch_tokens is None:
            problems.append(("batch_type", "{batch_type} tokens needs {max_batch_tokens}"))
        elif self.batch_type == "examples" and self.max_batch_tokens is not None:
            problems.append(("max_batch_tokens", "{max_batch_tokens} goes with {batch_type} tokens, not examples"))
        if problems:
            at_fault = list(dict.fromkeys(name for name, _ in problems))
            raise SettingError("invalid batching:\n  - " + "\n  - ".join(m for _, m in problems),
                               *at_fault, *(s for s in SETTINGS if s not in at_fault))

    @property
    def lines_per_batch(self) -> int | None:
        """The limit on lines per batch; None: only max_batch_tokens limits a batch."""
        if self.batch_size is None and self.batch_type == "examples":
            return DEFAULT_BATCH_SIZE
        return self.batch_size

    @property
    def rows_limit(self) -> int:
        return self.max_rows if self.max_rows is not None else DEFAULT_MAX_ROWS

    def describe(self, per_line: int, self_bytes: int, cross_bytes: int, logit_bytes: int) -> list[Message]:
        """The plan's limits in words (Messages naming the settings by their markers), with the
        memory they bound: `per_line` rows a line (beams or samples); a row's self-attention K/V at
        the most positions it may reach, a line's cross-attention K/V at the longest source, a
        row's float logits."""
        rows, lines = self.rows_limit, self.lines_per_batch
        why = "{max_rows}" if self.max_rows is not None else (
            "the default: the knee of the speed curve of rows, docs/benchmarks.md")
        limits = [f"at most {rows} decoder rows ({why}), so {max(1, rows // per_line)} lines at {per_line} rows a line"]
        if lines is not None:
            limits.append(f"at most {lines} lines ({{batch_size}}{'' if self.batch_size else ', default'})")
        if self.max_batch_tokens is not None:
            limits.append(f"at most {self.max_batch_tokens} padded source tokens ({{max_batch_tokens}})")
        n = min(max(1, rows // per_line), lines or rows)
        return [Message(f"batches: {'; '.join(limits)}; windows of {self.read_ahead} batches sorted by length "
                        "({read_ahead})", *SETTINGS),
                Message(f"a batch holds at most, whatever the sentence lengths: {size(rows * self_bytes)} of "
                        f"self-attention cache, {size(n * cross_bytes)} of cross-attention keys and values, "
                        f"{size(rows * logit_bytes)} of step logits")]

    def fits(self, rows: int, longest: int, per_line: int = 1) -> bool:
        """Whether `rows` sources, the longest of `longest` tokens, each decoding `per_line` rows
        (beams or samples), are within a batch's limits."""
        lines = self.lines_per_batch
        if lines is not None and rows > lines:
            return False
        if rows * per_line > self.rows_limit:
            return False
        if self.batch_type == "examples":
            return True
        assert self.max_batch_tokens is not None  # __post_init__: batch_type tokens needs max_batch_tokens
        return rows * longest <= self.max_batch_tokens

    def window_full(self, lines: int, tokens: int) -> bool:
        """Whether a window of `lines` lines holding `tokens` source tokens is read_ahead batches' worth."""
        per_batch = self.lines_per_batch
        if per_batch is not None and lines >= self.read_ahead * per_batch:
            return True
        if self.batch_type != "tokens":
            return False
        assert self.max_batch_tokens is not None  # __post_init__: batch_type tokens needs max_batch_tokens
        return tokens >= self.read_ahead * self.max_batch_tokens


def size(nbytes: int) -> str:
    """Bytes in MiB, or KiB under one MiB."""
    return f"{nbytes / (1 << 20):,.0f} MiB" if nbytes >= 1 << 20 else f"{nbytes / 1024:,.0f} KiB"


def whole(v: object) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool) and int(v) >= 1


def windows(items: Iterable[T], size: Callable[[T], int], batching: Batching) -> Iterator[list[T]]:
    """Consecutive windows of `items`, read lazily: each ends once it holds read_ahead batches'
    worth (`size` gives an item's source tokens; count an item without tokens as 1, so blank
    lines cannot make a window unbounded)."""
    window: list[T] = []
    tokens = 0
    for item in items:
        window.append(item)
        tokens += size(item)
        if batching.window_full(len(window), tokens):
            yield window
            window, tokens = [], 0
    if window:
        yield window


def plan(lengths: list[int], batching: Batching, per_line: int = 1) -> list[list[int]]:
    """Indices into `lengths` (source token counts) grouped into batches: longest first (ties in
    input order), each batch within the limits (`per_line`: the decoder rows a source decodes), a
    single source past max_batch_tokens or the row limit alone."""
    batches: list[list[int]] = []
    batch: list[int] = []
    longest = 0
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if batch and not batching.fits(len(batch) + 1, max(longest, lengths[i]), per_line):
            batches.append(batch)
            batch, longest = [], 0
        batch.append(i)
        longest = max(longest, lengths[i])
    if batch:
        batches.append(batch)
    return batches
