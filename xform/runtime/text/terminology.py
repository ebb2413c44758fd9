"""What each sentence's translation must contain (DESIGN.md section 9, issue 56): a glossary of
one language pair (glossary.py), the `keep` regular expressions and the `<dnt>...</dnt>` spans,
as a `Terminology` a door holds; `terminology()` builds it from what a door was given. Kept spans
require the source text as written; a glossary match overlapping a kept span is dropped."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from xform.errors import InputError
from xform.runtime.text.glossary import Entry, Glossary

DNT = re.compile(r"<(/?)dnt>", re.IGNORECASE)


@dataclass(frozen=True)
class Constraint:
    """What a sentence's translation must contain: `target`, as written. `kind` "term" (a glossary
    entry's target) or "keep" (the source span itself); `source` is text[start:end]; `entry` the
    glossary entry, `pattern` the keep pattern ("<dnt>" for a tag) that asked for it."""

    start: int
    end: int
    source: str
    target: str
    kind: str
    entry: Entry | None = None
    pattern: str | None = None


def strip_dnt(text: str, name: str = "<text>") -> tuple[str, list[tuple[int, int]]]:
    """`text` with its `<dnt>...</dnt>` tags removed, and the (start, end) of each tagged span in
    the clean text (empty ones dropped). A tag left open, closed without opening or nested is
    refused, naming `name` and the line."""
    out, spans, at, opened = [], [], 0, None  # opened: (offset in the clean text, line)
    clean_len = 0
    for m in DNT.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        out.append(text[at:m.start()])
        clean_len += m.start() - at
        at = m.end()
        closing = m.group(1) == "/"
        if not closing:
            if opened is not None:
                raise InputError(f"{name}, line {line}: a <dnt> inside another (opened on line {opened[1]})")
            opened = (clean_len, line)
        else:
            if opened is None:
                raise InputError(f"{name}, line {line}: a </dnt> without its <dnt>")
            if clean_len > opened[0]:
                spans.append((opened[0], clean_len))
            opened = None
    if opened is not None:
        raise InputError(f"{name}, line {opened[1]}: a <dnt> never closed")
    out.append(text[at:])
    return "".join(out), spans


def within(spans: Iterable[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """Spans of a whole text as offsets in its part text[start:end] (a sentence), cut to it."""
    return [(max(s, start) - start, min(e, end) - start) for s, e in spans if min(e, end) > max(s, start)]


def compile_keep(patterns: Sequence[str]) -> tuple[re.Pattern, ...]:
    """The `keep` regular expressions, each compile-checked: a bad one is refused by name."""
    compiled = []
    for p in patterns:
        try:
            compiled.append(re.compile(p))
        except (re.error, TypeError) as e:
            raise InputError(f"the {{keep}} pattern {p!r} is not a regular expression: {e}").naming("keep") from None
    return tuple(compiled)


TARGETS_KEPT = 4096  # sentences whose targets a Terminology remembers


@dataclass(frozen=True)
class Terminology:
    """A glossary (for one language pair: `Glossary.pair`) and keep patterns: what each sentence's
    translation must contain. The one object a door holds; `fingerprint` goes into a translation
    memory's key."""

    glossary: Glossary | None = None
    keep: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "keep", tuple(self.keep))
        compile_keep(self.keep)

    @cached_property
    def patterns(self) -> tuple[re.Pattern, ...]:
        return compile_keep(self.keep)

    def __bool__(self) -> bool:
        return bool(self.keep) or bool(self.glossary and self.glossary.entries)

    def constraints(self, text: str, kept: Sequence[tuple[int, int]] = ()) -> list[Constraint]:
        """What the translation of the sentence `text` must contain, in source order: kept spans
        (`kept`: those of `<dnt>` tags, as strip_dnt gives them; keep patterns' matches; glossary
        entries whose target is their source), overlapping ones merged, as written; then the
        glossary's other terms not overlapping a kept span, as their targets. A term twice gives
        its target twice."""
        keeps: list[tuple[int, int, str | None]] = [(s, e, "<dnt>") for s, e in kept if e > s]
        keeps += [(m.start(), m.end(), p.pattern) for p in self.patterns for m in p.finditer(text)
                  if m.end() > m.start()]
        terms = self.glossary.matches(text) if self.glossary is not None else []
        keeps += [(m.start, m.end, None) for m in terms if m.entry.kept]
        merged: list[list] = []  # [start, end, pattern, entry]
        for s, e, p in sorted(keeps, key=lambda k: (k[0], -k[1])):
            if merged and s < merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e, p])
        entry_at = {(m.start, m.end): m.entry for m in terms if m.entry.kept}
        out = [Constraint(s, e, text[s:e], text[s:e], "keep", entry_at.get((s, e)), p) for s, e, p in merged]
        out += [Constraint(m.start, m.end, text[m.start:m.end], m.entry.target, "term", m.entry)
                for m in terms if not m.entry.kept and all(m.end <= s or m.start >= e for s, e, _ in merged)]
        return sorted(out, key=lambda c: c.start)

    def targets(self, text: str, kept: Sequence[tuple[int, int]] = ()) -> list[str]:
        """The strings the translation of `text` must contain (constraints' targets), in order;
        remembered for the last TARGETS_KEPT sentences (a request's conversion and its rendering
        ask for the same ones)."""
        key = (text, tuple(kept))
        found = self.remembered.get(key)
        if found is None:
            if len(self.remembered) >= TARGETS_KEPT:
                self.remembered.clear()
            found = self.remembered[key] = [c.target for c in self.constraints(text, kept)]
        return list(found)

    @cached_property
    def remembered(self) -> dict[tuple, list[str]]:
        return {}

    def prepare(self, text: str, name: str = "<text>") -> tuple[str, list[Constraint]]:
        """A sentence with `<dnt>` tags: the text without them and its constraints."""
        clean, spans = strip_dnt(text, name)
        return clean, self.constraints(clean, spans)

    def fingerprint(self) -> str:
        """A stable hash of the glossary's entries and the keep patterns ("" with neither)."""
        if not self:
            return ""
        blob = json.dumps({"glossary": self.glossary.fingerprint() if self.glossary else None,
                           "keep": list(self.keep)})
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]


def terminology(glossary: "Glossary | str | Path | Mapping[str, str] | Iterable | None" = None,
                keep: "str | Sequence[str]" = (), src_lang: str | None = None,
                tgt_lang: str | None = None) -> Terminology | None:
    """What a door was given, as the Terminology of one language pair: `glossary` a file (TSV or
    TBX), a Glossary, {source: target} or entries; `keep` a regular expression or several. None
    where neither is given."""
    if glossary is None and not keep:
        return None
    if isinstance(glossary, (str, Path)):
        glossary = Glossary.load(glossary)
    chosen = None if glossary is None else Glossary.of(glossary).pair(src_lang, tgt_lang)
    return Terminology(chosen, (keep,) if isinstance(keep, str) else tuple(keep))
