"""A corpus cut into shards: runs of a few thousand consecutive lines of one input, the unit of
work, of retry and of the record.

A shard's id is its input's rank among the command's inputs and its own rank in that input
(`0-3`: the fourth shard of the first input); the same inputs cut at the same size give the same
shards, so a re-run finds what an earlier one finished. A shard is done exactly when its result
file exists in the record (record.py); a lost worker costs the shard it held, nothing more.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice
from typing import Iterable, Iterator

from xform.errors import InputError

DEFAULT_SHARD_LINES = 2000


@dataclass(frozen=True)
class Shard:
    """Lines [start, start + lines) of input `file`, the `index`-th shard of that input."""
    file: int
    index: int
    start: int
    lines: int

    @property
    def id(self) -> str:
        return f"{self.file}-{self.index}"


def plan(counts: list[int], shard_lines: int = DEFAULT_SHARD_LINES) -> list[Shard]:
    """The shards of inputs of `counts` lines, in input order (an empty input has none)."""
    if shard_lines < 1:
        raise ValueError(f"shard_lines must be at least 1, got {shard_lines}")
    return [Shard(f, i, start, min(shard_lines, n - start))
            for f, n in enumerate(counts) for i, start in enumerate(range(0, n, shard_lines))]


@dataclass(frozen=True)
class ShardTask:
    """What a worker translates: a shard's lines (text or bytes), and the lines the reader could
    not use (index in the shard -> message), sent as blank lines and failed as they are; `name`
    is its input's path, for messages."""
    shard: Shard
    lines: list[str | bytes]
    failed: dict[int, str] = field(default_factory=dict)
    name: str = ""

    @property
    def label(self) -> str:
        """The shard as a message names it: FILE lines FIRST-LAST (shard ID)."""
        s = self.shard
        return f"{self.name or 'input ' + str(s.file)} lines {s.start + 1}-{s.start + s.lines} (shard {s.id})"


def cut(shards: list[Shard], items: Iterable, name: str) -> Iterator[tuple[Shard, list]]:
    """One input's items (`name`, for the message) grouped into its shards, in order."""
    it = iter(items)
    for shard in shards:
        chunk = list(islice(it, shard.lines))
        if len(chunk) < shard.lines:
            raise InputError(f"{name}: {shard.start + len(chunk)} lines now, fewer than when it was measured: it "
                             "changed while the corpus was read")
        yield shard, chunk
