"""A document as sentences over its text: everything outside a sentence is layout, kept byte for
byte (whitespace, line and paragraph breaks, list markers; in Markdown, markup and code).

Plain text (`plain`): paragraphs are separated by blank lines; inside one, a line break is a
wrapped line (the sentence goes on), except before a list item (`- `, `* `, `+ `, `• `, `1. `,
`1) `), whose marker is layout and which starts anew. Each paragraph's text is split into
sentences by the segmenter (segmenter.py). A sentence's source is its text with whitespace runs
(a wrapped line's break among them) as one space; its translation replaces the whole span."""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from xform.runtime.documents.segmenter import sentences

LIST_MARKER = re.compile(r"[ \t]*(?:[-*+\u2022\u2023\u25e6]|\d{1,3}[.)])[ \t]+(?=\S)")


@dataclass(frozen=True)
class Mark:
    """Markup around words of a sentence (Markdown's emphasis, a link's brackets and target):
    `open` before the source's words [start, end) (whitespace-separated, 0-based), `close` after
    them; an empty side is one a sentence's edge cut off."""
    start: int
    end: int
    open: str
    close: str


@dataclass(frozen=True)
class Segment:
    """A sentence of a document: the text span [start, end) it replaces, its source (whitespace
    normalised, markup taken out), the 1-based line it starts on, its paragraph (0-based), and the
    markup around its words."""
    start: int
    end: int
    source: str
    line: int
    paragraph: int
    marks: tuple[Mark, ...] = ()


@dataclass
class Document:
    """A text and its sentences, in order, none overlapping; `escape`: how a translation is written
    into it (HTML's `&` and `<` as entities), None: as it is."""
    text: str
    segments: list[Segment] = field(default_factory=list)
    name: str = "<document>"
    escape: Callable[[str], str] | None = None

    def paragraphs(self) -> dict[int, str]:
        """Each paragraph's sentences, joined: what its language is identified from."""
        out: dict[int, list[str]] = {}
        for s in self.segments:
            out.setdefault(s.paragraph, []).append(s.source)
        return {p: " ".join(t) for p, t in out.items()}

    def render(self, translations: Sequence[str | None]) -> str:
        """The text with each segment's span replaced by its translation (None: left as it was)."""
        out, at = [], 0
        for segment, translated in zip(self.segments, translations, strict=True):
            out.append(self.text[at:segment.start])
            out.append(self.text[segment.start:segment.end] if translated is None else translated)
            at = segment.end
        out.append(self.text[at:])
        return "".join(out)


class Lines:
    """Character offset -> 1-based line number of a text."""

    def __init__(self, text: str):
        self.starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]

    def __call__(self, offset: int) -> int:
        return bisect.bisect_right(self.starts, offset)


def normalised(text: str) -> str:
    """A sentence as the model and the memory see it: whitespace runs as one space, trimmed."""
    return " ".join(text.split())


def units(text: str) -> list[tuple[int, int, int]]:
    """(start, end, paragraph) of each run of text a sentence may span: a paragraph's lines joined,
    cut before each list item; blank lines end a paragraph; leading whitespace and list markers
    stay outside."""
    out: list[list[int]] = []
    paragraph, open_unit, at = 0, False, 0
    for line in text.splitlines(keepends=True):
        start, at = at, at + len(line)
        body = line.rstrip("\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
        if not body.strip():
            paragraph += open_unit
            open_unit = False
            continue
        marker = LIST_MARKER.match(body)
        lead = marker.end() if marker else len(body) - len(body.lstrip())
        end = start + len(body.rstrip())
        if open_unit and not marker:
            out[-1][1] = end
        else:
            out.append([start + lead, end, paragraph])
        open_unit = True
    return [(a, b, p) for a, b, p in out]


def plain(text: str, language: str | None = None, name: str = "<document>",
          split: Callable[[str, str | None], list[tuple[int, int]]] = sentences) -> Document:
    """A plain text document: its paragraphs' sentences (module docstring)."""
    lines = Lines(text)
    segments = []
    for start, end, paragraph in units(text):
        for a, b in split(text[start:end], language):
            segments.append(Segment(start + a, start + b, normalised(text[start + a:start + b]),
                                    lines(start + a), paragraph))
    return Document(text, segments, name)


def translations_of(document: Document, translated: Mapping[str, str]) -> list[str | None]:
    """Each segment's translation by its source (absent: None, the span kept as it was)."""
    return [translated.get(s.source) for s in document.segments]
