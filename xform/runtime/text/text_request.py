"""One text request and its one conversion into the session's numeric `Request` (DESIGN 4).

Every text door parses what it was given into a frozen `TextRequest`: the sources (texts,
CTranslate2's token lists, ids, or lines a stream has encoded already), one target prefix a
source, bad words, the text options (`TextOptions`: languages, truncation, scores, unknown
replacement, a vocabulary map), the generation settings (or a config made already) and what to
return. `convert` is the one conversion: each capability check, each refusal, each source's ids
and the settings' meanings are said here once, and the doors (translate_batch, the line streams
and files, generate_tokens, score_batch's sources, the Triton handler, documents, the CLI, corpus
and `xform.ray`) only parse and render.

Two meanings share the one search (DESIGN 4, "names carry their meanings"): token lists mean
CTranslate2's (token_lists.py: ids through the vocabularies, the lengths counting the whole
hypothesis, its beam stopping, nothing forced); everything else transformers' (the target
language's first token forced, max_new_tokens counting generated tokens).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from xform.errors import InputError, SettingError
from xform.runtime.decoding.generation import GenerationConfig
from xform.runtime.decoding.request import Request, TextOptions
from xform.runtime.text.terminology import strip_dnt
from xform.runtime.text.text_policy import WITH_ATTENTION
from xform.runtime.text.token_lists import cut, decoding_settings

if TYPE_CHECKING:
    from xform.runtime.text.text_policy import TextPolicy


class SourceError(SettingError):
    """A source the conversion could not read (a language, a word, a length): the error as it was
    met, its settings named, so that a door can say which of its inputs held the source."""

    @classmethod
    def of(cls, e: InputError) -> "SourceError":
        return cls(e.template, *e.settings)


@dataclass(frozen=True)
class Marked:
    """A text with spans kept as written (a terminology's `<dnt>` tags, removed from the text)."""
    text: str
    kept: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Encoded(Marked):
    """A source a stream has encoded already (its line's text and ids, within max_len): the
    stream reads each line once, answering a line that cannot be encoded with its error."""
    ids: tuple[int, ...] = ()


# a source: a text, CTranslate2's token list (tuple of pieces), ids (tuple of ints), or Encoded
Source = Any


def kind(source: Source) -> str:
    """"text", "tokens" (CTranslate2's token list), "ids" or "encoded"."""
    if isinstance(source, Encoded):
        return "encoded"
    if isinstance(source, (str, Marked)):
        return "text"
    if isinstance(source, np.ndarray) or (len(source) and not isinstance(source[0], str)):
        return "ids"
    return "tokens"


def blank(source: Source) -> bool:
    """The empty-source rule of every door: a blank text or an empty token list is not decoded
    (it translates to empty hypotheses, score 0)."""
    if isinstance(source, str):
        return not source.strip()
    if isinstance(source, Encoded):
        return not source.ids
    if isinstance(source, Marked):
        return not source.text.strip()
    return len(source) == 0


@dataclass(frozen=True)
class TextRequest:
    """What a text door asks for, before any id: see the module's docstring. `settings` are the
    generation config's fields by its names (CTranslate2's already translated,
    controls.ct2_settings), `max_new_tokens` among them; or `generation`, a config made already
    (a stream's, made once for all its batches). `prefixes`: one a source (text, token list, ids,
    or None for none), or None. `bad_words`: texts the target tokenizer splits or id sequences
    (CTranslate2's suppress_sequences: token lists)."""

    sources: tuple[Source, ...]
    prefixes: tuple[Source | None, ...] | None = None
    bad_words: tuple[Any, ...] = ()
    options: TextOptions = field(default_factory=TextOptions)
    settings: Mapping[str, Any] = field(default_factory=dict)
    generation: GenerationConfig | None = None
    max_input_length: int = 0  # CTranslate2's: each source cut to N ids (0: no limit but max_len's)
    return_attention: bool = False
    disable_unk: bool = False  # CTranslate2's: <unk> never generated

    def __post_init__(self) -> None:
        if self.generation is not None and self.settings:
            raise InputError(f"a request takes a generation config or settings, not both: {sorted(self.settings)}")
        if self.prefixes is not None and len(self.prefixes) != len(self.sources):
            raise SettingError(f"target_prefix has {len(self.prefixes)} entries for {len(self.sources)} sources: "
                               "one a source", "target_prefix")

    @property
    def token_lists(self) -> bool:
        """Whether the sources are CTranslate2's token lists: CTranslate2's meanings apply."""
        return bool(self.sources) and kind(self.sources[0]) == "tokens"

    @property
    def texts(self) -> list[str] | None:
        """The sources as text, where they came as text (unknown replacement, a vocabulary map)."""
        if not all(kind(s) in ("text", "encoded") for s in self.sources):
            return None
        return [s.text if isinstance(s, Marked) else s for s in self.sources]

    def part(self, rows: Sequence[int]) -> "TextRequest":
        """The request for some of its sources (a batch of them)."""
        return dataclasses.replace(self, sources=tuple(self.sources[i] for i in rows),
                                   prefixes=None if self.prefixes is None else tuple(self.prefixes[i] for i in rows))


def convert(policy: "TextPolicy", request: TextRequest) -> Request:
    """The one conversion of a text request into the session's Request: the capability checks,
    each source's ids, the prefixes', the bad words', the generation config by the request's
    meanings, and what to return."""
    session, options = policy.session, request.options
    if not request.sources:
        raise InputError("no text to translate (an empty batch)")
    check(policy, request)
    request = dataclasses.replace(request, sources=tuple(marked(s, options, f"source[{i}]")
                                                         for i, s in enumerate(request.sources)))
    # the target language's rule before any source is read (a language refused as the door asked it)
    gen = None if request.token_lists else generation(policy, request)
    try:
        rows = [source_ids(policy, s, options, request.max_input_length, f"source[{i}]")
                for i, s in enumerate(request.sources)]
    except SourceError:
        raise
    except InputError as e:
        raise SourceError.of(e) from None
    prefixes = prefix_ids(policy, request)
    if gen is None:  # token lists: CTranslate2's lengths count the prefix
        gen = generation(policy, request, max((len(p) for p in prefixes or []), default=0))
    texts = request.texts
    vocabulary = None
    vocab_map = policy.vocab_map(options.vocab_map)
    if vocab_map is not None:
        if texts is None:
            raise InputError("{vocab_map} chooses a batch's target ids from its sources' texts: pass texts").naming(
                "vocab_map")
        vocabulary = policy.allowed_ids(vocab_map, texts)
    constraints = [[ids for ids in phrases(policy, s, options) if ids is not None and len(ids) <= gen.max_new_tokens]
                   for s in request.sources]  # one the cap or the vocabulary cannot hold is reported unmet
    src, lengths = session.pad(rows)
    return session.request(src, lengths, generation=gen, texts=texts, replace_unknowns=options.replace_unknowns,
                           target_prefix=prefixes if prefixes and any(prefixes) else None,
                           return_scores=bool(options.scores),
                           return_token_scores=options.scores == "tokens" or request.token_lists or options.qe,
                           return_attention=request.return_attention, vocabulary=vocabulary,
                           constraints=constraints if any(constraints) else None)


def phrases(policy: "TextPolicy", source: Source, options: TextOptions) -> list[list[int] | None]:
    """The target ids of what a source's translation must hold (`required`), each as the target
    tokenizer splits it; None for one it cannot write (a piece its vocabulary lacks: <unk>)."""
    unk = policy.tokenizer.target_unk_id if policy.tokenizer is not None else None
    out: list[list[int] | None] = []
    for text in required(source, options):
        ids = policy.target_ids(text)
        out.append(None if unk is not None and unk in ids else ids)
    return out


def marked(source: Source, options: TextOptions, name: str) -> Source:
    """A text source as the model reads it: with a terminology, its `<dnt>` tags removed and the
    spans they held kept (Marked); any other source as it is."""
    if options.terminology is None or not isinstance(source, str):
        return source
    text, kept = strip_dnt(source, name)
    return Marked(text, tuple(kept))


def required(source: Source, options: TextOptions) -> list[str]:
    """What the translation of a (marked) source must hold, as written, in source order: its
    kept spans and its glossary terms' targets (terminology.Terminology); none without a terminology."""
    terms = options.terminology
    if terms is None or not isinstance(source, (str, Marked)) or blank(source):
        return []
    source = marked(source, options, "source")
    assert isinstance(source, Marked)  # a text with a terminology is marked
    return terms.targets(source.text, source.kept)


def check(policy: "TextPolicy", request: TextRequest) -> None:
    """What the bundle must be able to do for the request, refused naming the setting."""
    options = request.options
    if any(kind(s) in ("text", "encoded") for s in request.sources):
        policy.text  # noqa: B018 - a bundle without a tokenizer is refused for text
    if options.replace_unknowns:
        if request.texts is None:
            raise InputError("{replace_unknowns} goes with texts (it copies source words)").naming("replace_unknowns")
        policy.check_replace_unknowns()
    if request.return_attention and not policy.capabilities.attention:
        raise InputError(f"{{return_attention}}: this bundle's decoder returns no attention: {WITH_ATTENTION}"
                         ).naming("return_attention")
    if options.terminology is not None and not all(kind(s) in ("text", "encoded") for s in request.sources):
        raise InputError("{glossary}: a glossary and kept spans find their terms in text: pass texts, not token lists "
                         "or ids").naming("glossary")
    if request.token_lists:
        taken = [name for name, value in (("src_lang", options.src_lang), ("tgt_lang", options.tgt_lang),
                                          ("replace_unknowns", options.replace_unknowns),
                                          ("truncate", options.truncate), ("vocab_map", options.vocab_map),
                                          ("qe", options.qe)) if value]
        if taken:
            raise InputError(f"{', '.join(taken)} with token lists: a token list is what the model reads, languages "
                             "included (a source's language token, the target's as target_prefix); pass texts for "
                             f"{'these' if len(taken) > 1 else 'it'}")


def source_ids(policy: "TextPolicy", source: Source, options: TextOptions, limit: int, name: str) -> list[int]:
    """One source's ids, by its kind: a text through the tokenizer (languages, `limit`, then
    max_len: cut with truncate, else refused), a token list through the source vocabulary (cut
    as CTranslate2 cuts it), ids as given (cut to max_len with truncate), an encoded line's."""
    what = kind(source)
    if what == "encoded":
        return list(source.ids)
    if what == "tokens":
        return policy.vocabularies.source_ids(cut(list(source), limit), name)
    if what == "ids":
        ids = [int(i) for i in source if int(i) != policy.pad_id]
        return policy.truncated(ids) if options.truncate else ids
    text = source.text if isinstance(source, Marked) else source
    ids = policy.encode_text(text, options.src_lang, options.tgt_lang)
    if limit:
        ids = policy.cut_source(ids, limit)
    return policy.fit(ids, options.truncate)


def prefix_ids(policy: "TextPolicy", request: TextRequest) -> list[list[int]] | None:
    """Each source's prefix ids: a text as the target tokenizer splits it, a token list through
    the target vocabulary, ids as given, None or empty for none."""
    if request.prefixes is None:
        return None
    out: list[list[int]] = []
    for i, p in enumerate(request.prefixes):
        if p is None or len(p) == 0:
            out.append([])
        elif isinstance(p, str):
            out.append(policy.target_ids(p))
        elif request.token_lists:
            if not all(isinstance(t, str) for t in p):
                raise InputError(f"target_prefix[{i}]: expected a token list (or None) where the sources are token "
                                 f"lists, got {p!r}")
            out.append(policy.vocabularies.target_ids(list(p), f"target_prefix[{i}]"))
        else:
            out.append(list(p))
    return out


def bad_word_ids(policy: "TextPolicy", request: TextRequest) -> list[list[int]]:
    """The bad words as target id sequences: text split by the target tokenizer, a token list
    (CTranslate2's suppress_sequences) through the target vocabulary, ids kept; <unk> with
    disable_unk."""
    out = []
    for i, w in enumerate(request.bad_words):
        if isinstance(w, str):
            out.append(policy.bad_word_ids([w])[0])
        elif request.token_lists or (len(w) and isinstance(w[0], str)):
            out.append(policy.vocabularies.known_target_ids(w, f"suppress_sequences[{i}]"))
        else:
            out.append(list(w))
    unk = policy.vocabularies.target_unk if request.disable_unk else None
    return out + ([[unk]] if unk is not None else [])


def generation(policy: "TextPolicy", request: TextRequest, prefix_len: int = 0) -> GenerationConfig:
    """The request's generation config: the one made already, else its settings by its meanings.
    Token lists: CTranslate2's (token_lists.decoding_settings: its defaults, lengths counting the
    whole hypothesis of a `prefix_len` prefix, nothing forced); else transformers' (the target
    language's first token forced unless the settings force one)."""
    session = policy.session
    settings = dict(request.settings)
    words = bad_word_ids(policy, request) if request.bad_words or request.disable_unk else []
    if request.generation is not None:
        if words:
            return dataclasses.replace(request.generation,
                                       bad_words_ids=(*request.generation.bad_words_ids, *map(tuple, words)))
        return request.generation
    if words:
        settings["bad_words_ids"] = [*settings.get("bad_words_ids", []), *words]
    if request.token_lists:
        settings = decoding_settings(settings, prefix_len, session.default_max_new_tokens())
        max_new = settings.pop("max_new_tokens")
        return dataclasses.replace(session.generation_config(max_new, **settings), forced_bos_token_id=None)
    policy.first_token(settings, request.options.tgt_lang)
    if settings.get("bad_words_ids"):
        settings["bad_words_ids"] = policy.bad_words(settings["bad_words_ids"])
    return session.generation_config(settings.pop("max_new_tokens", None), **settings)
