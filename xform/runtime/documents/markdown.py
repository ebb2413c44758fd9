"""Markdown documents: markdown-it-py (CommonMark and tables) says where text is; everything else
is layout and passes through untouched (code blocks and fences, HTML blocks, reference
definitions, list and quote markers, table pipes).

In each inline run of text (a paragraph, a heading, a list item, a table cell), located in the
source line by line:
- inline code, autolinks, images, bare URLs and unpaired HTML tags are atoms: kept as written, the
  text around them translated as separate runs (nothing in code or a URL reaches the model);
- emphasis (`*`, `_`, `**`, `~~`), a link's `[`...`](target)` and paired HTML tags are marks:
  taken out of the text the model sees and put back around the translation of the words they
  surround (marks.py), or, where a sentence's edge cuts them, left where they were as layout;
- `<dnt>...</dnt>` is neither: the tags stay in the sentence the model is given, which keeps the
  span as written and removes them (translate.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from xform.errors import XformError
from xform.runtime.documents.layout import Document, Lines, Mark, Segment, normalised
from xform.runtime.documents.segmenter import sentences

URL = re.compile(r"(?:https?://|www\.)[^\s<>()]+(?:\([^\s<>()]*\)[^\s<>()]*)*")
TRAILING = ".,;:!?'\""
LEADING = ".,;:!?"  # what a run after an atom may begin with that is no word
TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9-]*)")
MARKERS = {"em_open", "em_close", "strong_open", "strong_close", "s_open", "s_close"}
DNT = "dnt"  # <dnt>...</dnt>: neither a mark nor an atom; the sentence keeps it (the conversion strips it)


def parser():
    try:
        from markdown_it import MarkdownIt
    except ImportError as e:
        raise XformError("Markdown is parsed by markdown-it-py: pip install 'xform[documents]'") from e
    return MarkdownIt("commonmark").enable("table")


@dataclass
class Inline:
    """An inline run's raw text (`raw`, its lines joined by newlines) and where each of its
    characters is in the document (`at`); `atoms` and paired `marks` as spans of `raw`."""
    raw: str
    at: list[int]
    atoms: list[tuple[int, int]]
    marks: list[tuple[int, int, int, int]]  # open [a, b), close [c, d)


def markdown(text: str, language: str | None = None, name: str = "<document>") -> Document:
    """A Markdown document's sentences (module docstring)."""
    starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
    source_lines = text.split("\n")
    cursor: dict[int, int] = {}
    lines = Lines(text)
    segments: list[Segment] = []
    for paragraph, token in enumerate(t for t in parser().parse(text) if t.type == "inline" and t.map):
        inline = locate(token, source_lines, starts, cursor)
        if inline is not None:
            scan(inline, token.children or [])
            segments.extend(inline_segments(inline, language, lines, paragraph))
    return Document(text, segments, name)


def locate(token, source_lines: list[str], starts: list[int], cursor: dict[int, int]) -> Inline | None:
    """Where an inline token's content lines are in the source (each searched in its line, after
    what an earlier run on that line took); None where one is not found as written."""
    at: list[int] = []
    first = token.map[0]
    for k, part in enumerate(token.content.split("\n")):
        row = first + k
        if row >= len(source_lines):
            return None
        col = source_lines[row].find(part, cursor.get(row, 0))
        if col < 0:
            return None
        cursor[row] = col + len(part)
        at.extend(range(starts[row] + col, starts[row] + col + len(part)))
        at.append(starts[row] + col + len(part))  # the newline between lines (and one past the end)
    return Inline(token.content, at, [], [])


def scan(inline: Inline, children) -> None:
    """Find the atoms and marks of an inline run, in order (markdown-it's child tokens, each found
    in the raw text after the previous one)."""
    raw, at = inline.raw, 0
    opened: list[tuple[str, int, int]] = []  # markup, start, end of an open mark
    skip = 0
    for child in children:
        if skip:
            skip -= child.type == "link_close"
            continue
        kind = child.type
        if kind == "text":
            found = raw.find(child.content, at)
            if found >= 0:
                text_atoms(inline, found, found + len(child.content))
                at = found + len(child.content)
        elif kind == "code_inline":
            start = raw.find(child.markup, at)
            end = raw.find(child.markup, start + len(child.markup) + len(child.content.strip()) - 1)
            at = (end + len(child.markup)) if start >= 0 and end >= 0 else at
            if start >= 0 and end >= 0:
                inline.atoms.append((start, at))
        elif kind in MARKERS:
            start = raw.find(child.markup, at)
            if start < 0:
                continue
            at = start + len(child.markup)
            pair(inline, opened, child.markup if kind.endswith("open") else "/" + child.markup, start, at)
        elif kind == "link_open" and child.markup == "autolink":
            start, skip = raw.find("<", at), 1
            at = raw.find(">", start) + 1
            inline.atoms.append((start, at))
        elif kind == "link_open":
            start = raw.find("[", at)
            at = start + 1
            opened.append(("[", start, at))
        elif kind == "link_close":
            at = link_end(inline, opened, at)
        elif kind == "image":
            start = raw.find("![", at)
            at = target_end(raw, raw.find("]", start + 2 + len(child.content)))
            inline.atoms.append((start, at))
        elif kind == "html_inline":
            start = raw.find(child.content, at)
            at = start + len(child.content)
            tag = TAG.match(child.content)
            if tag and tag.group(2).lower() == DNT:  # a span kept as written: its tags reach the model
                continue
            pair(inline, opened, ("/" if tag and tag.group(1) else "<") + (tag.group(2).lower() if tag else "?"),
                 start, at, atom_if_alone=True)


def pair(inline: Inline, opened: list, markup: str, start: int, end: int, atom_if_alone: bool = False) -> None:
    """An opening marker waits for its closing one ("/" + its markup); a closing one makes a mark
    of both; an HTML tag left alone is an atom."""
    if markup.startswith("/"):
        for k in range(len(opened) - 1, -1, -1):
            if opened[k][0] in (markup[1:], "<" + markup[1:]):
                _, a, b = opened.pop(k)
                inline.marks.append((a, b, start, end))
                return
        if atom_if_alone:
            inline.atoms.append((start, end))
        return
    if atom_if_alone and markup[1:] in VOID:
        inline.atoms.append((start, end))
    else:
        opened.append((markup, start, end))


VOID = {"br", "img", "hr", "wbr", "input", "meta", "link", "source", "area", "col", "embed", "?"}


def link_end(inline: Inline, opened: list, at: int) -> int:
    """A link's closing `](target)` (or `][ref]`, `]`): a mark with its `[`."""
    raw = inline.raw
    close = raw.find("]", at)
    end = target_end(raw, close)
    for k in range(len(opened) - 1, -1, -1):
        if opened[k][0] == "[":
            _, a, b = opened.pop(k)
            inline.marks.append((a, b, close, end))
            break
    return end


def target_end(raw: str, close: int) -> int:
    """The end of a link's target after its `]` at `close`: `(...)` with nested parentheses, `[ref]`."""
    end = close + 1
    if raw[end:end + 1] == "(":
        depth = 0
        for i in range(end, len(raw)):
            depth += {"(": 1, ")": -1}.get(raw[i], 0)
            if depth == 0:
                return i + 1
    if raw[end:end + 1] == "[":
        return raw.find("]", end) + 1
    return end


def text_atoms(inline: Inline, start: int, end: int) -> None:
    """Bare URLs in a text run are atoms (their trailing punctuation is the sentence's)."""
    for m in URL.finditer(inline.raw, start, end):
        url_end = m.end()
        while url_end > m.start() and inline.raw[url_end - 1] in TRAILING:
            url_end -= 1
        inline.atoms.append((m.start(), url_end))


def inline_segments(inline: Inline, language: str | None, lines: Lines, paragraph: int,
                    clean: Callable[[str], str] = str) -> list[Segment]:
    """The sentences of an inline run: its text between atoms, markers taken out, split by the
    segmenter; each with the marks it holds (a mark cut by the sentence's edge keeps its one side).
    `clean`: a sentence's text as the model is to read it (HTML's entities resolved)."""
    atom = bytearray(len(inline.raw))
    marker = bytearray(len(inline.raw))
    for a, b in inline.atoms:
        atom[a:b] = b"\x01" * (b - a)
    for a, b, c, d in inline.marks:
        marker[a:b] = b"\x01" * (b - a)
        marker[c:d] = b"\x01" * (d - c)
    out = []
    for r0, r1 in runs(atom):
        keep = [i for i in range(r0, r1) if not marker[i]]
        plain = "".join(inline.raw[i] for i in keep)
        for ps, pe in sentences(plain, language) if plain.strip() else []:
            while ps < pe and (plain[ps] in LEADING or plain[ps].isspace()):  # `, then` after an atom
                ps += 1
            if ps == pe:
                continue
            s0, s1 = widened(inline, keep[ps], keep[pe - 1] + 1)
            marks = tuple(sentence_marks(inline, s0, s1, keep[ps:pe]))
            source = normalised(clean(plain[ps:pe]))
            if any(c.isalnum() for c in source):  # punctuation alone (after a URL, say) is layout
                out.append(Segment(inline.at[s0], inline.at[s1 - 1] + 1, source, lines(inline.at[s0]), paragraph,
                                   marks))
    return out


def widened(inline: Inline, s0: int, s1: int) -> tuple[int, int]:
    """A sentence's raw span taken over the markers at its edges whose other side is inside it
    (`*one*` whole, not `*one`)."""
    changed = True
    while changed:
        changed = False
        for a, b, c, d in inline.marks:
            if s0 <= a < s1 and s1 <= c and inline.raw[s1:c].strip() == "" and d > s1:
                s1, changed = d, True
            if s0 < d <= s1 and b <= s0 and inline.raw[b:s0].strip() == "" and a < s0:
                s0, changed = a, True
    return s0, s1


def runs(atom: bytearray) -> list[tuple[int, int]]:
    """The [start, end) ranges between atoms."""
    out, start = [], None
    for i, flag in enumerate([*atom, 1]):
        if not flag and start is None:
            start = i
        elif flag and start is not None:
            out.append((start, i))
            start = None
    return out


def sentence_marks(inline: Inline, s0: int, s1: int, kept: list[int]):
    """The marks inside raw span [s0, s1), over the sentence's words (`kept`: the raw index of each
    of its plain characters): a mark covers the words its characters touch."""
    plain = "".join(inline.raw[k] for k in kept)

    def at(raw_index: int) -> int:  # the plain character a raw index comes before
        return sum(1 for k in kept if k < raw_index)
    for a, b, c, d in inline.marks:
        opens, closes = s0 <= a and b <= s1, s0 <= c and d <= s1
        if opens or closes:
            first, last = words_of(plain, at(b) if opens else 0, at(c) if closes else len(plain))
            yield Mark(first, last, inline.raw[a:b] if opens else "", inline.raw[c:d] if closes else "")


def words_of(text: str, start: int, end: int) -> tuple[int, int]:
    """[first, last) of the whitespace-separated words of `text` that characters [start, end) touch."""
    first = len(text[:start].split()) - (1 if 0 < start < len(text) and not text[start - 1].isspace()
                                         and not text[start].isspace() else 0)
    return first, max(len(text[:end].split()), first + 1)
