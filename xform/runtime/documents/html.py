"""HTML documents: Python's own parser (html.parser, which browsers' rules inform and which never
refuses a page) says where the tags are; only text is translated, and everything else passes
through as written: tags and their attributes, comments, doctypes, whole elements whose
content is not prose (script, style, pre, code, kbd, samp, var, textarea, template, svg, math),
and whole elements marked `translate="no"` (HTML's own do-not-translate), byte for byte.

Block elements (p, div, li, td, h1-h6, ...) end a run of text; inside one, an inline element
whose start and end tags are both there (b, i, em, strong, a, span, ...) is a mark that goes
back around the words it became (marks.py), a lone or void tag (br, img, ...) an atom that cuts
the run. The model reads a sentence with its entities resolved (`&amp;` as `&`), and its
translation is written back escaped (`&` as `&amp;`, `<` as `&lt;`)."""
from __future__ import annotations

import html
from html.parser import HTMLParser

from xform.runtime.documents.layout import Document, Lines
from xform.runtime.documents.markdown import Inline, inline_segments

RAW = {"script", "style", "pre", "code", "kbd", "samp", "var", "textarea", "template", "svg", "math"}
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
INLINE = {"a", "abbr", "b", "bdi", "bdo", "cite", "del", "dfn", "em", "font", "i", "ins", "label", "mark", "q",
          "s", "small", "span", "strong", "sub", "sup", "u", "time", "data"}


class Events(HTMLParser):
    """Each piece of the page in order: (kind, tag or None, start offset); kinds: start, end,
    startend, data, other (comments, declarations, processing instructions)."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
        self.events: list[tuple[str, str | None, int]] = []
        self.untranslated: set[int] = set()  # where an element with translate="no" starts
        self.feed(text)
        self.close()

    def at(self) -> int:
        line, col = self.getpos()
        return self.starts[line - 1] + col

    def handle_starttag(self, tag, attrs):
        self.events.append(("start", tag, self.at()))
        if tag not in VOID and any(k == "translate" and (v or "").strip().lower() == "no" for k, v in attrs):
            self.untranslated.add(self.at())

    def handle_startendtag(self, tag, attrs):
        self.events.append(("startend", tag, self.at()))

    def handle_endtag(self, tag):
        self.events.append(("end", tag, self.at()))

    def handle_data(self, data):
        self.events.append(("data", None, self.at()))

    def handle_comment(self, data):
        self.events.append(("other", None, self.at()))

    handle_decl = handle_pi = unknown_decl = handle_comment


def blocks(text: str) -> list[tuple[int, int, list[tuple[str, str | None, int, int]]]]:
    """The runs of inline content: (start, end, their events as (kind, tag, start, end)); raw
    elements (script, code, ..., and any with translate="no") are one event each, kind "raw"."""
    parsed = Events(text)
    events = parsed.events
    spans = [(k, t, a, b) for (k, t, a), (_, _, b) in zip(events, [*events[1:], ("", None, len(text))])]
    out: list[list[tuple[str, str | None, int, int]]] = []
    run: list[tuple[str, str | None, int, int]] = []
    raw: tuple[str, int] | None = None
    depth = 0  # the raw element's own tag opened inside it, not yet closed
    for kind, tag, a, b in spans:
        if raw is not None:  # inside a raw element: one atom up to its end tag
            if tag == raw[0] and kind in ("start", "end"):
                depth += 1 if kind == "start" else -1
            if kind == "end" and tag == raw[0] and depth < 0:
                run.append(("raw", raw[0], raw[1], b))
                raw, depth = None, 0
            continue
        if kind == "start" and tag is not None and (tag in RAW or a in parsed.untranslated):
            raw = (tag, a)
        elif kind in ("start", "end", "startend") and tag not in INLINE and tag not in ("br", "img", "wbr", "input"):
            if run:
                out.append(run)
            run = []
        else:
            run.append((kind, tag, a, b))
    if raw is not None:
        run.append(("raw", raw[0], raw[1], len(text)))
    if run:
        out.append(run)
    return [(r[0][2], r[-1][3], r) for r in out]


def html_document(text: str, language: str | None = None, name: str = "<document>") -> Document:
    """An HTML document's sentences (module docstring)."""
    lines = Lines(text)
    segments = []
    for paragraph, (start, end, events) in enumerate(blocks(text)):
        inline = Inline(text[start:end], list(range(start, end + 1)), [], [])
        opened: list[tuple[str, int, int]] = []
        for kind, tag, a, b in events:
            a, b = a - start, b - start
            if kind == "start" and tag in INLINE:
                opened.append((tag, a, b))
            elif kind == "end" and any(t == tag for t, _, _ in opened):
                k = max(i for i, (t, _, _) in enumerate(opened) if t == tag)
                _, oa, ob = opened.pop(k)
                inline.marks.append((oa, ob, a, b))
            elif kind != "data":
                inline.atoms.append((a, b))
        inline.atoms.extend((oa, ob) for _, oa, ob in opened)  # start tags never closed here
        segments.extend(inline_segments(inline, language, lines, paragraph, html.unescape))
    return Document(text, segments, name, escape=lambda t: html.escape(t, quote=False))
