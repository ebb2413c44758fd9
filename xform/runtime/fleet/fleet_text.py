"""The text methods of a one-bundle Translator on a `FleetTranslator` (`xform.Translator(DIR)`),
routed as its translate_batch routes (local.py): by `src_lang` / `tgt_lang` (or `model=`).

- Streams and files (`translate_iterable`, `translate_file`, `score_iterable`, `score_file`)
  are built on the batch calls, `max_batch_size` examples at a time, as CTranslate2 builds them;
  a pivot route serves translations (two hops, as translate_batch does).
- Scores, token steps and documents are one model's (`score_batch`, `generate_tokens`,
  `translate_document(s)`): their route must be one bundle, else they are refused saying so.
- Sources are texts: token lists, tokenize functions and `tokenized=True` are one bundle's
  vocabulary (open it: `xform.Translator(PATH)`), refused by name; so is `asynchronous`.
- The rest of a one-bundle Translator's public names are its internals or its one model's
  residency: `refused(name)` says why, and the fleet raises it as an XformError naming them."""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Iterable, Iterator

from xform.errors import InputError, XformError
from xform.runtime.decoding.request import ScoringResult
from xform.runtime.fleet.routes import Hop
from xform.runtime.text import ct2_files
from xform.runtime.text.call_words import refuse_one_text, with_prefixes
from xform.runtime.text.ct2_checks import check_call, check_iterable

# `fleet` below: the FleetTranslator (local.py) whose method called the function
FleetTranslator = Any

OPEN_ONE = "open the bundle itself for it: xform.Translator(PATH)"
# a one-bundle Translator's public names a directory of bundles does not offer, and why
INTERNALS = ("batches", "ct2_generation_settings", "generation", "joined", "opened", "piece", "pieces", "request",
             "results", "score_texts", "source_texts", "step_callback", "steps", "terminology", "text_request",
             "translate_lines", "translate_texts", "with_prefixes")
RESIDENCY = ("compute_type", "device", "device_index", "load_model", "model_is_loaded", "num_active_batches",
             "num_queued_batches", "num_translators", "unload_model")


class NotForFleet(XformError):
    """A one-bundle Translator's name a FleetTranslator does not offer, with the reason."""


def refused(name: str) -> str | None:
    """Why a FleetTranslator does not offer a one-bundle Translator's public `name` (None: not one)."""
    if name in INTERNALS:
        return (f"{name}: a one-bundle Translator's internals (its tokenizer and session); a directory's bundles "
                f"each have their own: {OPEN_ONE}, or use the routed methods (translate_batch, translate_iterable, "
                "translate_file, score_batch, score_iterable, score_file, generate_tokens, translate_document(s))")
    if name in RESIDENCY:
        return (f"{name}: one model's device and residency; a directory's bundles are opened and closed on demand "
                f"(stats() says which are loaded and their costs, close() unloads them, max_loaded / memory_budget "
                f"/ pinned / idle_unload bound them): {OPEN_ONE}")
    return None


def texts(items: Any, name: str) -> list[str]:
    """A list of texts (bytes decoded as UTF-8); token lists refused (one bundle's vocabulary)."""
    refuse_one_text(items, name)
    if not isinstance(items, Sequence):
        raise InputError(f"{name}: expected a list of texts, one a source, got {type(items).__name__}")
    return [text(t, f"{name}[{i}]") for i, t in enumerate(items)]


def text(item: Any, name: str) -> str:
    if isinstance(item, bytes):
        try:
            return item.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as e:
            raise InputError(f"{name}: not UTF-8 ({e})") from None
    if isinstance(item, str):
        return item
    if isinstance(item, Sequence):
        raise InputError(f"{name}: a token list; a directory of bundles takes texts (token lists are one bundle's "
                         f"vocabulary: {OPEN_ONE})")
    raise InputError(f"{name}: expected a text, got {type(item).__name__}")


def no_async(options: dict[str, Any]) -> None:
    if options.get("asynchronous"):
        raise InputError("asynchronous: a directory of bundles decodes a call on the caller's thread (its bundles "
                         "open on demand); call it from several threads (calls for different bundles run together)")


def one_hop(fleet: FleetTranslator, what: str, src_lang: str | None, tgt_lang: str | None,
            model: str | None) -> Hop:
    """The one bundle a call that is one model's goes to; a route through a pivot refused."""
    route = fleet.route(src_lang, tgt_lang, model)
    if len(route.hops) > 1:
        raise InputError(f"{what}: {route} takes two bundles (through the pivot); {what} is one model's: name a pair "
                         "one bundle translates, or the bundle (model=)")
    return route.hops[0]


def translate_iterable(fleet: FleetTranslator, source: Iterable[Any], target_prefix: Iterable[Any] | None = None,
                       *, max_batch_size: int = 32, batch_type: str = "examples", read_ahead: int = 8,
                       **options: Any) -> Iterator[Any]:
    """translate_batch over a stream of texts (and of prefixes, one a source), max_batch_size at a
    time, lazily, in order."""
    refuse_one_text(source, "source")
    check_iterable(source, "source")
    if target_prefix is not None:
        check_iterable(target_prefix, "target_prefix")
    check_call(max_batch_size=max_batch_size, batch_type=batch_type)
    no_async(options)
    pairs = ((s, None) for s in source) if target_prefix is None else with_prefixes(source, target_prefix)
    index = itertools.count()
    while batch := list(itertools.islice(pairs, max_batch_size or 32)):
        at = next(index) * (max_batch_size or 32)
        sources = [text(s, f"line {at + k}") for k, (s, _) in enumerate(batch)]
        prefixes = None if target_prefix is None else [None if p is None else text(p, f"target_prefix[{at + k}]")
                                                       for k, (_, p) in enumerate(batch)]
        yield from fleet.translate_batch(sources, prefixes, **options)


def files_take_texts(source_tokenize_fn: Any, target_tokenize_fn: Any, target_detokenize_fn: Any,
                     tokenized: Any) -> None:
    given = [n for n, v in (("source_tokenize_fn", source_tokenize_fn), ("target_tokenize_fn", target_tokenize_fn),
                            ("target_detokenize_fn", target_detokenize_fn), ("tokenized", tokenized)) if v]
    if given:
        raise InputError(f"{', '.join(given)}: a directory of bundles reads texts (token lists are one bundle's "
                         f"vocabulary: {OPEN_ONE})")


def translate_file(fleet: FleetTranslator, input_path: Any, output_path: Any, target_path: Any = None, *,
                   source_tokenize_fn: Any = None, target_tokenize_fn: Any = None, target_detokenize_fn: Any = None,
                   tokenized: Any = None, **options: Any) -> ct2_files.ExecutionStats:
    """A file of texts translated a line an example (ct2_files.translate_file's text file)."""
    files_take_texts(source_tokenize_fn, target_tokenize_fn, target_detokenize_fn, tokenized)
    return ct2_files.translate_file(fleet, input_path, output_path, target_path, tokenized=False, **options)


def score_batch(fleet: FleetTranslator, source: Any, target: Any, *, src_lang: str | None = None,
                tgt_lang: str | None = None, model: str | None = None, **options: Any) -> list[ScoringResult]:
    """Each target's log-likelihood by the one bundle of the pair (the source asked as it asks it)."""
    no_async(options)
    sources, targets = texts(source, "source"), texts(target, "target")
    hop = one_hop(fleet, "score_batch", src_lang, tgt_lang, model)
    asked = hop.asked
    with fleet.pool.lease(hop.model) as loaded, loaded.lock:
        return loaded.translator.score_batch([asked.prefix + s if s.strip() else s for s in sources], targets,
                                             src_lang=asked.src_lang, tgt_lang=asked.tgt_lang, **options)


def score_iterable(fleet: FleetTranslator, source: Iterable[Any], target: Iterable[Any], max_batch_size: int = 64,
                   batch_type: str = "examples", **options: Any) -> Iterator[ScoringResult]:
    """score_batch over two streams, max_batch_size pairs at a time; unequal streams refused."""
    refuse_one_text(source, "source")
    refuse_one_text(target, "target")
    check_iterable(source, "source")
    check_iterable(target, "target")
    check_call(max_batch_size=max_batch_size, batch_type=batch_type)
    ends = object()
    pairs = itertools.zip_longest(source, target, fillvalue=ends)
    while batch := list(itertools.islice(pairs, max_batch_size or 64)):
        if any(s is ends or t is ends for s, t in batch):
            raise InputError("score_iterable: as many targets as sources, one a source")
        yield from score_batch(fleet, [s for s, _ in batch], [t for _, t in batch], **options)


def score_file(fleet: FleetTranslator, source_path: Any, target_path: Any, output_path: Any, *,
               source_tokenize_fn: Any = None, target_tokenize_fn: Any = None, target_detokenize_fn: Any = None,
               tokenized: Any = None, **options: Any) -> ct2_files.ExecutionStats:
    """A parallel file of texts scored (ct2_files.score_file's text file)."""
    files_take_texts(source_tokenize_fn, target_tokenize_fn, target_detokenize_fn, tokenized)
    return ct2_files.score_file(fleet, source_path, target_path, output_path, tokenized=False, **options)


def generate_tokens(fleet: FleetTranslator, source: Any, target_prefix: Any = None, *, src_lang: str | None = None,
                    tgt_lang: str | None = None, model: str | None = None, **options: Any) -> Iterator[Any]:
    """One text's translation token by token, by the one bundle of the pair (held for the stream)."""
    source = text(source, "source")
    if target_prefix is not None:
        target_prefix = text(target_prefix, "target_prefix")
    hop = one_hop(fleet, "generate_tokens", src_lang, tgt_lang, model)
    asked = hop.asked
    with fleet.pool.lease(hop.model) as loaded, loaded.lock:
        yield from loaded.translator.generate_tokens(asked.prefix + source if source.strip() else source,
                                                     target_prefix, src_lang=asked.src_lang, tgt_lang=asked.tgt_lang,
                                                     **options)


def translate_documents(fleet: FleetTranslator, documents: Any, *, src_lang: str | None = None,
                        tgt_lang: str | None = None, model: str | None = None, **options: Any) -> list[str]:
    """Documents translated by the one bundle of the pair (its sentence rules and decoding)."""
    docs = texts(documents, "texts")
    if fleet.documents is None:
        raise InputError(f"translate_documents: this FleetTranslator was made without the documents door; {OPEN_ONE}")
    hop = one_hop(fleet, "translate_documents", src_lang, tgt_lang, model)
    asked = hop.asked
    if asked.prefix:
        raise InputError(f"translate_documents: {hop.model} is asked for {tgt_lang} by a prefix on each text, which "
                         f"a document's sentences do not carry; {OPEN_ONE} and give src_lang / tgt_lang")
    with fleet.pool.lease(hop.model) as loaded, loaded.lock:
        return fleet.documents(loaded.translator, docs, src_lang=asked.src_lang, tgt_lang=asked.tgt_lang, **options)
