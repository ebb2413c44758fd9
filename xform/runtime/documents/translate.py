"""Documents translated: each split into sentences with its layout (layout.py, markdown.py), the
sentences of all of them decoded together through the one line stream (text_lines.py: sorted by
length, batched as files are), each distinct sentence once and none the memory holds
(memory.py), and each document joined back with its layout.

A sentence longer than the model's max_len is cut at its clause boundaries (segmenter.clauses)
and its pieces' translations joined by a space; one that no cut fits is truncated with
`truncate`, else refused before anything is decoded, named by document and line.

Terms (docs/terminology.md): the text options' terminology (a glossary, kept patterns) applies to
each sentence, and a `<dnt>...</dnt>` span in plain text or Markdown is kept as written, its tags
removed (each sentence is decoded with a terminology, an empty one where none was given: the
conversion strips the tags and makes the span a constraint); in HTML, an element with
`translate="no"` is kept byte for byte (html.py). The memory's key holds the terminology's
fingerprint."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from xform.errors import InputError, message
from xform.files import sha256_file
from xform.manifest import MANIFEST
from xform.runtime.decoding.generation import GenerationConfig
from xform.runtime.decoding.request import TextOptions
from xform.runtime.documents.alignment import Alignment, can_align, decode_aligned
from xform.runtime.documents.detect import Detector
from xform.runtime.documents.layout import Document, plain
from xform.runtime.documents.marks import with_marks
from xform.runtime.documents.memory import TranslationMemory
from xform.runtime.documents.segmenter import clauses
from xform.runtime.scheduling.batching import Batching
from xform.runtime.text.codes import base_language, codes_for
from xform.runtime.text.terminology import Terminology
from xform.runtime.text.translator import Translator

FORMATS = ("text", "markdown", "html")
AUTO = "auto"
STORE_EVERY = 64  # translations written to the memory in one transaction


@dataclass(frozen=True)
class DocumentOptions:
    """How texts are taken as documents: their `markup` (text or markdown), a translation memory's
    path, and whether paragraphs already in the target language are kept as they are."""
    markup: str = "text"
    memory: str | None = None
    skip_target_language: bool = False

    def to_dict(self) -> dict:
        return {"markup": self.markup, "memory": self.memory, "skip_target_language": self.skip_target_language}


@dataclass
class DocumentResult:
    """A document translated: its `name`, its `text`, its sentences, those left as they were
    (`kept`: already in the target language), its paragraphs by source language, its
    `paragraphs` of sentences, those kept (`kept_paragraphs`) and the target language that kept
    them (`target`, with skip_target_language)."""
    name: str
    text: str
    sentences: int
    kept: int = 0
    languages: dict[str, int] = field(default_factory=dict)
    paragraphs: int = 0
    kept_paragraphs: int = 0
    target: str | None = None
    # with qe: each translated sentence's (line, sentence, translation, confidence: the lowest of
    # its pieces'; None where the memory held it or it was decoded for its alignment)
    scored: list[tuple[int, str, str, float | None]] = field(default_factory=list)


@dataclass
class Tally:
    """A run's counts: sentences, the distinct ones to translate, the distinct `pieces` they are
    translated as (more where a sentence over max_len is cut at its clauses), the memory's hits
    and those decoded (pieces both); `unmet`: decoded pieces whose translation lacks a term or
    kept span the search found no room for (or the target vocabulary cannot write)."""
    documents: int = 0
    sentences: int = 0
    distinct: int = 0
    pieces: int = 0
    remembered: int = 0
    decoded: int = 0
    unmet: int = 0


class DocumentTranslator:
    """Documents in, DocumentResults out, given a Translator, the decoding settings
    (`gen`, `batching`, `text`: text.src_lang may be "auto") and the document options: `markup`
    (text or markdown), a translation `memory`, `skip_target_language` (paragraphs already in the
    target language left as they are)."""

    def __init__(self, translator: Translator, gen: GenerationConfig, batching: Batching | None = None,
                 text: TextOptions | None = None, *, markup: str = "text", memory: TranslationMemory | None = None,
                 skip_target_language: bool = False, on_batch: Callable[[int, int], None] | None = None,
                 on_total: Callable[[int], None] | None = None):
        if markup not in FORMATS:
            raise InputError(f"{{format}}: expected one of {', '.join(FORMATS)}, got {markup!r}").naming("format")
        self.translator, self.policy = translator, translator.policy
        self.gen, self.batching = gen, batching or Batching()
        self.options = text or TextOptions()
        self.markup, self.memory, self.on_batch = markup, memory, on_batch
        self.on_total = on_total  # told the sentences to decode as they are known (a progress bar's total)
        self.skip_target_language = skip_target_language
        self.detector = self.language_detector()
        self.aligns = can_align(translator, self.options)  # marks placed around the words they became
        self.tally = Tally()
        self.sure: dict[str, float] = {}  # with qe: each decoded piece's confidence
        self.pieces_of: dict[str, list[str]] = {}  # a sentence's pieces within max_len (fitted)
        self.context: dict[str | None, str] = {}

    def language_detector(self) -> Detector | None:
        """A Detector over the bundle's source codes for src_lang "auto", or over all languages to
        find paragraphs already in the target language; "auto" with a bundle that takes no source
        language, and keeping the target language's paragraphs without knowing it, are refused."""
        src = self.options.src_lang
        codes = list(self.policy.text.codes)
        if src == AUTO:
            if not codes or not self.takes_source(codes[0]):
                raise InputError("{src_lang} auto: this bundle takes no source language (it is not a multilingual "
                                 "model such as NLLB, M2M100 or mBART-50); give its source language or none"
                                 ).naming("src_lang")
            return Detector(codes)
        if src is not None:
            self.policy.check_src_lang(src)
        if self.skip_target_language:
            return Detector(codes if self.target_language() in {base_language(c) for c in codes} else ())
        return None

    def target_language(self) -> str:
        """The language translations are in (ISO 639-1 where it has one): tgt_lang, else the one
        pair the bundle declares (xform export --languages, its tokenizer, its OPUS-MT name)."""
        if self.options.tgt_lang is not None:
            return base_language(self.options.tgt_lang)
        bundle = self.translator.session.bundle
        if bundle is not None:
            from xform.runtime.text.languages import bundle_languages
            languages = bundle_languages(bundle.path)
            if languages.one_pair:
                return base_language(languages.pairs[0][1])
        raise InputError("{skip_target_language}: name the target language ({tgt_lang}); this bundle does not "
                         "declare one pair").naming("skip_target_language", "tgt_lang")

    def takes_source(self, code: str) -> bool:
        try:
            self.policy.check_src_lang(code)
        except InputError:
            return False
        return True

    def translate(self, documents: Iterable[tuple[str, str]]) -> list[DocumentResult]:
        """Each (name, text) translated, in order."""
        parsed = [self.parse(name, text) for name, text in documents]
        wanted: dict[str | None, dict[str, list[str]]] = {}
        marked: dict[str | None, set[str]] = {}
        for document, languages in parsed:
            for segment, language in zip(document.segments, languages):
                if isinstance(language, bool):  # False: kept as it is
                    continue
                wanted.setdefault(language, {}).setdefault(segment.source, []).append(
                    f"{document.name}:{segment.line}" if document.name else f"line {segment.line}")
                if segment.marks:
                    marked.setdefault(language, set()).add(segment.source)
        done = {language: self.translated(language, sources, marked.get(language, set()))
                for language, sources in wanted.items()}
        self.tally.documents += len(parsed)
        return [self.result(document, languages, done) for document, languages in parsed]

    def translate_each(self, documents: Sequence[tuple[str, str]]) -> list[DocumentResult | InputError]:
        """Each document translated, or the error that refused it: all together first, and where
        one is refused, each alone, so that one bad document fails alone (a corpus's records)."""
        try:
            return list(self.translate(documents))
        except InputError:
            pass
        out: list[DocumentResult | InputError] = []
        for document in documents:
            try:
                out.extend(self.translate([document]))
            except InputError as e:
                out.append(e)
        return out

    def parse(self, name: str, text: str) -> tuple[Document, list[str | None | bool]]:
        """A document's sentences and each one's source language (False: kept as it is)."""
        split = self.splitter()
        if self.detector is None:
            document = split(text, self.options.src_lang, name)
            return document, [self.options.src_lang] * len(document.segments)
        document = split(text, None, name)  # the generic rules first: paragraphs to identify
        found = {p: self.detector.language(body) for p, body in document.paragraphs().items()}
        auto = self.options.src_lang == AUTO
        of_paragraph = {p: codes_for(iso, self.detector.codes)[0] if auto else self.options.src_lang
                        for p, iso in found.items()}
        if auto:  # again, each paragraph by its language's rules
            document = self.resplit(document, of_paragraph, split)
        target = self.target_language() if self.skip_target_language else None
        return document, [False if found[s.paragraph] == target else of_paragraph[s.paragraph]
                          for s in document.segments]

    def splitter(self) -> Callable[[str, str | None, str], Document]:
        if self.markup == "markdown":
            from xform.runtime.documents.markdown import markdown
            return markdown
        if self.markup == "html":
            from xform.runtime.documents.html import html_document
            return html_document
        return lambda text, language, name: plain(text, language, name)

    def resplit(self, document: Document, of_paragraph: dict[int, str | None],
                split: Callable[[str, str | None, str], Document]) -> Document:
        """The document split again, each paragraph by its own language's rules."""
        languages = set(of_paragraph.values())
        if len(languages) == 1:
            return split(document.text, languages.pop(), document.name)
        by_language = {code: split(document.text, code, document.name) for code in languages}
        segments = [s for code, d in by_language.items() for s in d.segments if of_paragraph.get(s.paragraph) == code]
        return Document(document.text, sorted(segments, key=lambda s: s.start), document.name)

    def result(self, document: Document, languages: list, done: dict) -> DocumentResult:
        escape = document.escape or str
        translations = [None if language is False else with_marks(escape(done[language][0][segment.source]),
                                                                  segment, done[language][1].get(segment.source))
                        for segment, language in zip(document.segments, languages)]
        self.tally.sentences += len(document.segments)
        of_paragraph = {s.paragraph: lang for s, lang in zip(document.segments, languages)}
        paragraphs = Counter(lang for lang in of_paragraph.values() if isinstance(lang, str))
        return DocumentResult(document.name, document.render(translations), len(document.segments),
                              translations.count(None), dict(paragraphs), len(of_paragraph),
                              list(of_paragraph.values()).count(False),
                              self.target_language() if self.skip_target_language else None,
                              self.scored(document, languages, done) if self.options.qe else [])

    def scored(self, document: Document, languages: list, done: dict) -> list[tuple[int, str, str, float | None]]:
        """Each translated sentence's line, source, translation and confidence (DocumentResult.scored)."""
        return [(s.line, s.source, done[lang][0][s.source], self.confidence(s.source))
                for s, lang in zip(document.segments, languages) if lang is not False]

    def confidence(self, source: str) -> float | None:
        """A sentence's confidence: its one piece's, or the lowest of its clauses' (None: not decoded here)."""
        pieces = self.pieces_of.get(source, [source])
        values = [self.sure.get(p) for p in pieces]
        return None if any(v is None for v in values) else min(v for v in values if v is not None)

    # -- the sentences of one source language ---------------------------------------------------
    def translated(self, language: str | None, sources: dict[str, list[str]], marked: set[str]
                   ) -> tuple[dict[str, str], dict[str, Alignment]]:
        """Each distinct sentence's translation (its pieces, fitted to max_len, from the memory or
        decoded, joined by a space) and, for a whole sentence with marks where the bundle can say,
        its word alignment (from the memory, else decoded with the attention)."""
        pieces = {source: self.fitted(source, language, where) for source, where in sources.items()}
        self.pieces_of.update(pieces)
        units = list(dict.fromkeys(p for ps in pieces.values() for p in ps))
        self.tally.distinct += len(pieces)
        self.tally.pieces += len(units)
        known: dict[str, str] = {}
        aligned: dict[str, Alignment] = {}
        to_align = [s for s in marked if pieces[s] == [s]] if self.aligns else []
        if self.memory is not None:
            known = self.memory.lookup(self.memory_context(language), units)
            aligned = self.memory.alignments(self.memory_context(language), to_align)
            self.tally.remembered += len(known)
        with_attention = [u for u in to_align if u not in aligned]
        known.update(self.decoded([u for u in units if u not in known and u not in with_attention], language))
        if with_attention:
            self.tally.decoded += len(with_attention)
            got = decode_aligned(self.translator, with_attention, self.gen,
                                 replace(self.options, src_lang=language, terminology=self.terminology, qe=False))
            known.update({u: t for u, (t, _) in got.items()})
            aligned.update({u: a or [] for u, (_, a) in got.items()})  # []: none could be made, none asked again
            if self.memory is not None:
                self.memory.store(self.memory_context(language), {u: t for u, (t, _) in got.items()}, aligned)
        return {source: " ".join(known[p] for p in ps) for source, ps in pieces.items()}, aligned

    def fitted(self, source: str, language: str | None, where: list[str]) -> list[str]:
        """A sentence as pieces within max_len: itself, else cut at clauses, else itself (truncated
        with `truncate`), else refused naming where it is."""
        if self.fits(source, language):
            return [source]
        cut = clauses(source, lambda piece: self.fits(piece, language))
        if cut is not None:
            return cut
        if self.options.truncate:
            return [source]
        n = len(self.policy.encode_text(source, language, self.options.tgt_lang))
        raise InputError(f"{where[0]}: a sentence of {n} source tokens, more than the model's max_len "
                         f"{self.policy.config.max_len}, with no clause boundary that cuts it short enough "
                         "({truncate} to cut it)").naming("truncate")

    def fits(self, text: str, language: str | None) -> bool:
        return len(self.policy.encode_text(text, language, self.options.tgt_lang)) <= self.policy.config.max_len

    def decoded(self, units: Sequence[str], language: str | None) -> dict[str, str]:
        """Sentences decoded through the line stream (a window at a time, sorted, batched); stored in
        the memory as they come. A sentence that cannot be translated is refused by its text."""
        if not units:
            return {}
        if self.on_total is not None:
            self.on_total(len(units))
        text = TextOptions(False, language, self.options.tgt_lang, self.options.truncate,
                           replace_unknowns=self.options.replace_unknowns, vocab_map=self.options.vocab_map,
                           terminology=self.terminology, qe=self.options.qe)
        out: dict[str, str] = {}
        pending: dict[str, str] = {}
        for unit, line in zip(units, self.translator.translate_lines(units, self.gen, self.batching, text,
                                                               on_batch=self.on_batch)):
            if line.error is not None:
                said = message(line.error).after(f"the sentence {unit[:60]!r}: ")
                raise InputError(said.template).naming(*said.settings)
            out[unit] = pending[unit] = line.hypotheses[0]
            if line.confidence:
                self.sure[unit] = line.confidence[0]
            self.tally.unmet += bool(line.unmet and line.unmet[0])
            if self.memory is not None and len(pending) >= STORE_EVERY:
                self.memory.store(self.memory_context(language), pending)
                pending = {}
        if self.memory is not None:
            self.memory.store(self.memory_context(language), pending)
        self.tally.decoded += len(out)
        return out

    @property
    def terminology(self) -> Terminology:
        """What each sentence's translation must hold: the options' terminology, else an empty one
        (a `<dnt>` span is still kept)."""
        return self.options.terminology if self.options.terminology is not None else Terminology()

    def memory_context(self, language: str | None) -> str:
        """The memory's key for this bundle, these settings and this source language."""
        if language not in self.context:
            assert self.memory is not None
            self.context[language] = self.memory.context(self.settings(language))
        return self.context[language]

    def settings(self, language: str | None) -> dict[str, Any]:
        """What makes a translation what it is, as the corpus's record counts it: the sha256 of the
        bundle's manifest (which holds every file's) and of the vocabulary map's file, the
        decoding and the text options; with a terminology, its fingerprint (a changed glossary or
        kept pattern never serves an old translation; none: the key as before terminologies)."""
        bundle = self.translator.session.bundle
        vocab_map = self.options.vocab_map
        out = {"manifest": sha256_file(Path(bundle.path) / MANIFEST) if bundle is not None else None,
               "generation": self.gen.to_dict(), "src_lang": language, "tgt_lang": self.options.tgt_lang,
               "truncate": self.options.truncate, "replace_unknowns": self.options.replace_unknowns,
               "vocab_map": None if vocab_map is None else sha256_file(getattr(vocab_map, "source", vocab_map))}
        if self.options.terminology:
            out["terminology"] = self.options.terminology.fingerprint()
        return out
