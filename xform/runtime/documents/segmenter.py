"""Sentences by sentencex (a segmenter with rules for some 300 languages, falling back along its
language families), and the finer boundaries a sentence longer than the model's max_len is cut at.

A boundary is a character span of the text given; the whitespace around a sentence is layout,
never sent to the model. No boundary falls inside a `<dnt>...</dnt>` span (kept as written: it
reaches the model whole, in one sentence)."""
from __future__ import annotations

import re
from typing import Callable

from xform.errors import XformError
from xform.runtime.text.codes import base_language

# inside a sentence, where a clause ends: a comma, semicolon or colon before a space, or a dash
# between spaces; the boundary is after the mark
CLAUSE = re.compile(r"[,;:\u060c\u3001\uff0c\uff1b](?=\s)|(?<=\s)[\u2013\u2014-](?=\s)")
DNT_SPAN = re.compile(r"<dnt>.*?</dnt>", re.IGNORECASE | re.DOTALL)


def inside_dnt(text: str, offset: int) -> bool:
    """Whether a cut at `offset` would fall inside a `<dnt>...</dnt>` span of `text`."""
    return any(m.start() < offset < m.end() for m in DNT_SPAN.finditer(text))


def sentencex_boundaries() -> Callable[[str, str], list[dict]]:
    try:
        from sentencex import get_sentence_boundaries
    except ImportError as e:
        raise XformError("documents are split into sentences by sentencex: pip install 'xform[documents]'") from e
    return get_sentence_boundaries


def sentences(text: str, language: str | None) -> list[tuple[int, int]]:
    """[start, end) of each sentence of `text` (character offsets), whitespace trimmed; `language`:
    a model's language code (fra_Latn, fr_XX, fr, fra) or None (sentencex's generic rules)."""
    spans = []
    for b in sentencex_boundaries()(base_language(language) if language else "en", text):
        start, end = b["start_index"], b["end_index"]
        piece = text[start:end]
        if piece.strip():
            lead = len(piece) - len(piece.lstrip())
            spans.append((start + lead, start + len(piece.rstrip())))
    joined: list[tuple[int, int]] = []
    for start, end in spans:  # a boundary inside a <dnt> span: the sentences on both sides are one
        if joined and "<" in text and inside_dnt(text, joined[-1][1]):
            joined[-1] = (joined[-1][0], end)
        else:
            joined.append((start, end))
    return joined


def clauses(sentence: str, fits: Callable[[str], bool]) -> list[str] | None:
    """A sentence cut at its clause boundaries into as few pieces as each `fits`, in order (joined
    by a space, they spell the sentence with its whitespace normalised); None where one clause
    alone does not fit."""
    cuts = [m.end() for m in CLAUSE.finditer(sentence) if not inside_dnt(sentence, m.end())]
    parts = [sentence[a:b].strip() for a, b in zip([0, *cuts], [*cuts, len(sentence)])]
    parts = [p for p in parts if p]
    out: list[str] = []
    for part in parts:
        if not fits(part):
            return None
        if out and fits(f"{out[-1]} {part}"):
            out[-1] = f"{out[-1]} {part}"
        else:
            out.append(part)
    return out
