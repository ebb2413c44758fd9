"""Terminology on the text side: a glossary read from TSV or TBX, its terms found in a source
sentence, the spans kept as written (do not translate), and what each sentence's translation must
contain (`Terminology.constraints`): the strings the text layer tokenizes into the target id
phrases the constrained beam search enforces (DESIGN.md section 9, issue 56). Pure Python; the
search, the tokenizer and the doors are elsewhere. docs/terminology.md says the rules for users.

**Files.** TSV: `source TAB target [TAB source-language TAB target-language]`, UTF-8 (a BOM is
skipped), blank lines and lines starting with `#` skipped, an optional header line (`source`,
`target`[, `source_lang`, `target_lang`]); 2 or 4 columns, no quoting. TBX (ISO 30042, TBX-Basic
and TBX v3; namespace `urn:iso:std:iso:30042:ed-2` or none): each `<termEntry>` /
`<conceptEntry>` is a concept, its `<langSet>` / `<langSec>` (`xml:lang`) hold terms (`<tig>`,
`<ntig>`, `<termSec>`, each with a `<term>`); a concept gives, for each ordered pair of its
languages, every term of the first language to the preferred term of the second (the first whose
administrativeStatus is preferredTerm, else the first not deprecated or superseded). XML is read
by expat with what defusedxml forbids by default refused: entity declarations, external entities;
a DOCTYPE is allowed but nothing in it is loaded. A malformed file is refused (InputError) naming
the file and line; two entries giving the same source term different targets for language pairs
that can meet are refused naming both lines.

**Matching** (`Glossary.matches`): whole words (a term that starts / ends with a letter or digit
needs a word boundary there; letters, digits, `_` and combining marks are word characters, and
scripts written without spaces (Han, kana, Thai, Lao, Khmer, Myanmar) have a boundary between any
two characters); spaces inside a term match any run of whitespace; case-insensitive unless
`case_sensitive` (Python's re.IGNORECASE: simple case folding); a term's NFC and NFD forms both
match. Of overlapping occurrences the longest wins, then the leftmost. Offsets are str indices.

**Kept spans** (terminology.py): glossary entries whose target is their source, `keep` regular
expressions, and `<dnt>...</dnt>` tags (`strip_dnt`). TBX is read by tbx.py.
"""
from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from xform.errors import InputError
from xform.runtime.text.tbx import (
    CONCEPTS,
    LANGUAGES,
    XML_LANG,
    lang_set_terms,
    local,
    parse_xml,
    preferred,
    refused,
)

TSV_SUFFIXES = (".tsv", ".tab", ".txt")
TBX_SUFFIXES = (".tbx", ".xml")
HEADER = ({"source", "src", "source_term"}, {"target", "tgt", "target_term"},
          {"source_lang", "src_lang", "source_language", "source language"},
          {"target_lang", "tgt_lang", "target_language", "target language"})
# scripts written without spaces between words: a word boundary between any two of their characters
CONTINUOUS = ((0x0E00, 0x0EFF), (0x1000, 0x109F), (0x1780, 0x17FF), (0x3040, 0x30FF), (0x31F0, 0x31FF),
              (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0xFF66, 0xFF9F), (0x20000, 0x3134F))


@dataclass(frozen=True)
class Entry:
    """A source term and the target it must be translated as; languages None apply to any pair.
    `origin` (where it was read, "FILE, line N") is not part of its identity."""

    source: str
    target: str
    source_lang: str | None = None
    target_lang: str | None = None
    origin: str = field(default="", compare=False)

    @property
    def kept(self) -> bool:
        """A do-not-translate entry: its target is its source."""
        return self.source == self.target


@dataclass(frozen=True)
class Match:
    """A glossary term found in a text: text[start:end] is an occurrence of entry.source."""

    start: int
    end: int
    entry: Entry


def language(code: str | None) -> str | None:
    """A language code compared as written apart from case and `_` / `-`."""
    return None if code is None else code.strip().replace("_", "-").casefold()


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def continuous(ch: str) -> bool:
    o = ord(ch)
    return any(a <= o <= b for a, b in CONTINUOUS)


def word_char(ch: str) -> bool:
    return ch == "_" or ch.isalnum() or unicodedata.category(ch)[0] == "M"


def joined(a: str, b: str) -> bool:
    """Whether a and b are inside one word (no boundary between them)."""
    return word_char(a) and word_char(b) and not continuous(a) and not continuous(b)


def first_run(text: str, start: int = 0) -> str:
    """The word (or the one other character) text[start] begins."""
    end = start + 1
    while end < len(text) and joined(text[end - 1], text[end]):
        end += 1
    return text[start:end]


def term_pattern(term: str, case_sensitive: bool) -> re.Pattern:
    forms = dict.fromkeys(unicodedata.normalize(f, term) for f in ("NFC", "NFD"))
    alternatives = [r"\s+".join(re.escape(w) for w in form.split()) for form in forms]
    return re.compile("|".join(alternatives), 0 if case_sensitive else re.IGNORECASE)


def both(a: str, b: str) -> str:
    """Two origins said once: "FILE, lines 3 and 7" where they share the file."""
    (file_a, sep_a, line_a), (file_b, sep_b, line_b) = a.rpartition(", line "), b.rpartition(", line ")
    if sep_a and sep_b and file_a == file_b:
        return f"{file_a}, lines {line_a} and {line_b}"
    return f"{a} and {b}"


def compatible(a: str | None, b: str | None) -> bool:
    return a is None or b is None or language(a) == language(b)


def conflicts(entries: Sequence[Entry], case_sensitive: bool) -> list[tuple[Entry, Entry]]:
    """Pairs of entries giving one source term two targets for language pairs that can meet."""
    groups: dict[str, list[Entry]] = {}
    for e in entries:
        groups.setdefault(Glossary.key(e.source, case_sensitive), []).append(e)
    found = []
    for group in groups.values():
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                if (a.target != b.target and compatible(a.source_lang, b.source_lang)
                        and compatible(a.target_lang, b.target_lang)):
                    found.append((a, b))
    return found


@dataclass(frozen=True)
class Glossary:
    """Terms and their required translations. `name`: the file it was read from (for messages);
    `languages`: the file's languages in order; `default_pair`: the (source, target) a bilingual
    TBX implies (its root's xml:lang first), used when `pair` is asked no language."""

    entries: tuple[Entry, ...]
    name: str = field(default="<glossary>", compare=False)
    case_sensitive: bool = False
    languages: tuple[str, ...] = ()
    default_pair: tuple[str, str] | None = None

    def __post_init__(self):
        unique: dict[tuple, Entry] = {}
        for e in self.entries:
            if not isinstance(e, Entry):
                raise InputError(f"a glossary entry must be an Entry, not {type(e).__name__}")
            where = e.origin or self.name
            if not e.source.strip() or not e.target.strip():
                raise refused(where, f"an empty {'source' if not e.source.strip() else 'target'} term")
            unique.setdefault((self.key(e.source, self.case_sensitive), e.target, language(e.source_lang),
                               language(e.target_lang)), e)
        object.__setattr__(self, "entries", tuple(unique.values()))
        clash = conflicts(self.entries, self.case_sensitive)
        if clash:
            a, b = clash[0]
            langs = "" if a.source_lang is None and b.source_lang is None else \
                f" ({a.source_lang or b.source_lang or '*'} -> {a.target_lang or b.target_lang or '*'})"
            more = f" (and {len(clash) - 1} more such pairs)" if len(clash) > 1 else ""
            raise refused(both(a.origin or self.name, b.origin or self.name),
                          f"the source term {a.source!r} has two targets{langs}, {a.target!r} and {b.target!r}; "
                          f"keep one{more}")

    # -- reading ---------------------------------------------------------------------------
    @staticmethod
    def key(term: str, case_sensitive: bool = False) -> str:
        """What makes two source terms the same: NFC, whitespace runs as one space, case unless
        case_sensitive."""
        k = " ".join(nfc(term).split())
        return k if case_sensitive else k.lower()

    @classmethod
    def load(cls, path: str | Path, case_sensitive: bool = False) -> "Glossary":
        """A glossary file: TBX by its suffix (.tbx, .xml) or, with another suffix than .tsv,
        .tab or .txt, by content starting with `<`; TSV otherwise."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise refused(str(path), "no such file") from None
        except IsADirectoryError:
            raise refused(str(path), "a directory, not a glossary file") from None
        except OSError as e:
            raise refused(str(path), f"cannot be read ({e.strerror})") from None
        suffix = path.suffix.lower()
        tbx = suffix in TBX_SUFFIXES or (suffix not in TSV_SUFFIXES
                                         and data.removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"<"))
        return (cls.from_tbx if tbx else cls.from_tsv)(data, name=str(path), case_sensitive=case_sensitive)

    @classmethod
    def from_tsv(cls, data: bytes | str, name: str = "<glossary>", case_sensitive: bool = False) -> "Glossary":
        """A TSV glossary's bytes or text (see the module's docstring)."""
        if isinstance(data, bytes):
            try:
                text = data.decode("utf-8-sig")
            except UnicodeDecodeError as e:
                bad = data[:e.start].count(b"\n") + 1
                raise refused(f"{name}, line {bad}", "not UTF-8 text") from None
        else:
            text = data.removeprefix("\ufeff")
        entries: list[Entry] = []
        languages: dict[str | None, str] = {}
        header_seen = False
        for n, raw in enumerate(text.split("\n"), 1):
            line = raw.rstrip("\r")
            if not line.strip() or line.startswith("#"):
                continue
            fields = [f.strip() for f in line.split("\t")]
            if not header_seen:
                header_seen = True
                if len(fields) in (2, 4) and all(f.casefold() in words for f, words in zip(fields, HEADER)):
                    continue
            where = f"{name}, line {n}"
            if len(fields) not in (2, 4):
                raise refused(where, f"{len(fields)} tab-separated column{'s' * (len(fields) != 1)}; expected 2 "
                                     f"(source, target) or 4 "
                                     f"(source, target, source language, target language)")
            for f, what in zip(fields, ("source term", "target term")):
                if not f:
                    raise refused(where, f"an empty {what}")
            src_lang, tgt_lang = (fields[2] or None, fields[3] or None) if len(fields) == 4 else (None, None)
            for code in (src_lang, tgt_lang):
                if code is not None:
                    languages.setdefault(language(code), code)
            entries.append(Entry(nfc(fields[0]), nfc(fields[1]), src_lang, tgt_lang, origin=where))
        if not entries:
            raise refused(name, "no entries (a TSV glossary has lines of source TAB target)")
        return cls(tuple(entries), name=name, case_sensitive=case_sensitive, languages=tuple(languages.values()))

    @classmethod
    def from_tbx(cls, data: bytes | str, name: str = "<glossary>", case_sensitive: bool = False) -> "Glossary":
        """A TBX glossary's bytes or text (see the module's docstring)."""
        root = parse_xml(data, name)
        if local(root.tag) not in ("martif", "tbx"):
            raise refused(f"{name}, line {root.line}",
                          f"not a TBX file (its root element is <{local(root.tag)}>, not <tbx> or <martif>)")
        entries: list[Entry] = []
        languages: dict[str | None, str] = {}
        concepts = 0
        for concept in root.iter(CONCEPTS):
            concepts += 1
            terms: dict[str, list[tuple[str, str, int]]] = {}  # language -> (term, status, line)
            for lang_set in concept.iter(LANGUAGES):
                code = lang_set.attrs.get(XML_LANG) or lang_set.attrs.get("lang")
                if not code or not code.strip():
                    raise refused(f"{name}, line {lang_set.line}", f"a <{local(lang_set.tag)}> without xml:lang")
                code = code.strip()
                languages.setdefault(language(code), code)
                found = terms.setdefault(languages[language(code)], [])
                for term, status, line in lang_set_terms(lang_set):
                    if not term:
                        raise refused(f"{name}, line {line}", "an empty <term>")
                    found.append((term, status, line))
            for a, source_terms in terms.items():
                for b, target_terms in terms.items():
                    target = preferred(target_terms) if a != b else None
                    if target is None:
                        continue
                    for term, _, line in source_terms:
                        entries.append(Entry(term, target, a, b, origin=f"{name}, line {line}"))
        if not concepts:
            raise refused(name, "no <termEntry> or <conceptEntry> in this TBX file")
        codes = tuple(languages.values())
        default = None
        if len(codes) == 2:
            first = root.attrs.get(XML_LANG) or root.attrs.get("lang")
            src = next((c for c in codes if language(c) == language(first)), codes[0]) if first else codes[0]
            default = (src, next(c for c in codes if c != src))
        return cls(tuple(entries), name=name, case_sensitive=case_sensitive, languages=codes, default_pair=default)

    @classmethod
    def of(cls, items: "Glossary | Mapping[str, str] | Iterable[Entry | Sequence[str | None]]",
           case_sensitive: bool = False, name: str = "<glossary>") -> "Glossary":
        """A glossary from Python: a Glossary (returned), {source: target}, or entries / tuples of
        (source, target) or (source, target, source_lang, target_lang)."""
        if isinstance(items, Glossary):
            return items
        if isinstance(items, Mapping):
            items = list(items.items())
        entries = []
        for i, item in enumerate(items, 1):
            if isinstance(item, Entry):
                entries.append(item if item.origin else Entry(item.source, item.target, item.source_lang,
                                                              item.target_lang, origin=f"{name}, entry {i}"))
                continue
            fields = tuple(item)
            if len(fields) not in (2, 4) or not all(isinstance(f, str) for f in fields[:2]):
                raise refused(f"{name}, entry {i}", "expected (source, target) or (source, target, "
                                                    "source language, target language)")
            source, target = str(fields[0]), str(fields[1])
            src_lang, tgt_lang = (fields[2] or None, fields[3] or None) if len(fields) == 4 else (None, None)
            entries.append(Entry(nfc(source.strip()), nfc(target.strip()), src_lang, tgt_lang,
                                 origin=f"{name}, entry {i}"))
        return cls(tuple(entries), name=name, case_sensitive=case_sensitive)

    # -- using ------------------------------------------------------------------------------
    def pair(self, src_lang: str | None = None, tgt_lang: str | None = None) -> "Glossary":
        """The entries that apply to translating src_lang into tgt_lang: those without a language
        on a side apply to any; a language asked matches an entry's code as written (case and
        `_`/`-` aside), else, where no entry has it so, by the language it names (de-DE, deu_Latn,
        de: German), refused when that finds several codes. A side not asked must name at most
        one language among the entries (a bilingual TBX asked nothing gives its default pair)."""
        if src_lang is None and tgt_lang is None and self.default_pair is not None:
            src_lang, tgt_lang = self.default_pair
        src = self.side_matcher([e.source_lang for e in self.entries], src_lang, "src_lang")
        tgt = self.side_matcher([e.target_lang for e in self.entries], tgt_lang, "tgt_lang")
        chosen = tuple(e for e in self.entries if src(e.source_lang) and tgt(e.target_lang))
        for side, asked, setting in ((0, src_lang, "src_lang"), (1, tgt_lang, "tgt_lang")):
            named = {language(c): c for e in chosen for c in [(e.source_lang, e.target_lang)[side]] if c}
            if asked is None and len(named) > 1:
                raise InputError(f"the glossary {self.name} has entries for several "
                                 f"{'source' if side == 0 else 'target'} languages ({', '.join(named.values())}): "
                                 f"name the one to use with {{{setting}}}").naming(setting)
        pair = (src_lang, tgt_lang) if src_lang is not None and tgt_lang is not None else None
        langs = tuple(dict.fromkeys(c for e in chosen for c in (e.source_lang, e.target_lang) if c))
        return Glossary(chosen, name=self.name, case_sensitive=self.case_sensitive, languages=langs,
                        default_pair=pair)

    def side_matcher(self, codes: list[str | None], asked: str | None, setting: str):
        if asked is None:
            return lambda code: True
        want = language(asked)
        if any(language(c) == want for c in codes if c):
            return lambda code: code is None or language(code) == want
        from xform.runtime.text.codes import base_language
        base = base_language(asked)
        same = {language(c): c for c in codes if c and base_language(c) == base}
        if len(same) > 1:
            raise InputError(f"the glossary {self.name} has several codes for the language of {asked!r} "
                             f"({', '.join(same.values())}): name one of them with {{{setting}}}").naming(setting)
        return lambda code: code is None or language(code) in same

    @cached_property
    def index(self) -> dict[str, list[tuple[re.Pattern, Entry]]]:
        """Entries by their first word (NFC, lower-cased unless case_sensitive), longest first."""
        index: dict[str, list[tuple[re.Pattern, Entry]]] = {}
        for e in sorted(self.entries, key=lambda e: -len(e.source)):
            first = self.key(first_run(nfc(e.source.strip())), self.case_sensitive)
            index.setdefault(first, []).append((term_pattern(e.source.strip(), self.case_sensitive), e))
        return index

    def matches(self, text: str) -> list[Match]:
        """The terms in `text`, in text order, none overlapping: of overlapping occurrences the
        longest, then the leftmost (module docstring: whole words, case, whitespace)."""
        if not self.entries or not text:
            return []
        candidates = []
        n = len(text)
        for i, ch in enumerate(text):
            if ch.isspace() or (i > 0 and joined(text[i - 1], ch)):
                continue
            for pattern, entry in self.index.get(self.key(first_run(text, i), self.case_sensitive), ()):
                m = pattern.match(text, i)
                if m and m.end() > i and (m.end() == n or not joined(text[m.end() - 1], text[m.end()])):
                    candidates.append(Match(i, m.end(), entry))
        return select(candidates)

    def fingerprint(self) -> str:
        """A stable hash of the entries and the case rule (not their order or origins): a key part
        for a translation memory, so a changed glossary never serves old translations."""
        rows = sorted([e.source, e.target, e.source_lang or "", e.target_lang or ""] for e in self.entries)
        blob = json.dumps({"case_sensitive": self.case_sensitive, "entries": rows}, ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]

    def __len__(self) -> int:
        return len(self.entries)


def select(candidates: list) -> list:
    """Of spans with .start and .end, the non-overlapping ones taken longest first, then leftmost;
    in text order."""
    taken: list[tuple[int, int]] = []
    chosen = []
    for c in sorted(candidates, key=lambda c: (c.start - c.end, c.start)):
        if all(c.end <= s or c.start >= e for s, e in taken):
            taken.append((c.start, c.end))
            chosen.append(c)
    return sorted(chosen, key=lambda c: c.start)
