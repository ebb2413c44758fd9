"""The text-level translator above the numeric session: the text policy (text_policy.py), line
streams (text_lines.py), and CTranslate2's calls.

`Session` (session.py) keeps the numbers: sources checked, the generation config, the request,
the decoding loop, teacher-forced scoring. The `Translator` owns text: languages, target
prefixes and bad words given as text, truncation, vocabulary maps, unknown replacement (the rules
in TextPolicy, which every door calls), and line and file streams. Its public methods follow
CTranslate2's `Translator` where they mean the same thing (`translate_batch`,
`translate_iterable`, `translate_file`, `score_batch`, `generate_tokens`; `beam_size`,
`num_hypotheses`, `max_decoding_length`, `return_scores`, `target_prefix`; results with
`hypotheses` and `scores`); docs/python.md says which arguments differ and why. The layer is
one way: a Translator holds its Session (`Translator(session)`), the session never knows it.
"""
from __future__ import annotations

import functools
import inspect
import itertools
from contextlib import contextmanager
from dataclasses import fields
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from xform.errors import InputError, XformError
from xform.files import atomic_file
from xform.runtime.decoding.controls import CT2_NAMES, ct2_settings
from xform.runtime.decoding.generation import GenerationConfig
from xform.runtime.decoding.loop import Batch
from xform.runtime.decoding.request import (
    REQUEST_OPTIONS,
    GenerationStepResult,
    Request,
    ScoringResult,
    TextOptions,
    TranslationResult,
    refuse_unknown,
)
from xform.runtime.scheduling.batching import Batching, plan
from xform.runtime.text import token_lists as token_lists_module
from xform.runtime.text.async_results import may_run_asynchronously
from xform.runtime.text.text_lines import LineStream
from xform.runtime.text.token_lists import Vocabularies, token_lists
from xform.runtime.text.vocab_map import VocabMap


def generation_settings(options: dict[str, Any]) -> dict[str, Any]:
    """A translator method's options as generation settings (controls.ct2_settings): CTranslate2's
    names, the generation config's and the request's; another name is refused with the nearest.
    CTranslate2's max_input_length, which only translate_batch takes, is refused saying so."""
    if "max_input_length" in options:
        raise InputError("max_input_length: CTranslate2's option (cut each source to N tokens) is taken by "
                         "translate_batch only; here truncate=True cuts a source longer than the model's max_len")
    refuse_unknown(options, [*CT2_NAMES, *(f.name for f in fields(GenerationConfig)), *REQUEST_OPTIONS])
    return ct2_settings(options)


@contextmanager
def reworded(options: Mapping[str, Any]) -> Iterator[None]:
    """An error inside about a setting the caller gave by CTranslate2's name (max_decoding_length
    for max_new_tokens, beam_size, ...) names it by that name, as the caller wrote it."""
    given = {CT2_NAMES[k]: k for k in options if k in CT2_NAMES}
    try:
        yield
    except XformError as e:
        if given and set(e.settings) & set(given):
            e.args = (e.render(lambda s: "{" + given.get(s, s) + "}"),
                      *(given.get(a, a) if isinstance(a, str) else a for a in e.args[1:]))
            e.settings = tuple(given.get(s, s) for s in e.settings)
        raise


F = TypeVar("F", bound=Callable[..., Any])


def in_callers_words(method: F) -> F:
    """A CTranslate2-named method whose errors name each setting as its caller did (`reworded`)."""
    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def stream(self, *args, **kwargs):
            with reworded(kwargs):
                yield from method(self, *args, **kwargs)
        return stream  # type: ignore[return-value]

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with reworded(kwargs):
            return method(self, *args, **kwargs)
    return call  # type: ignore[return-value]


def refuse_one_text(items: Any, name: str) -> None:
    """A str or bytes where a list of texts belongs (it would translate each character): refused."""
    if isinstance(items, (str, bytes)):
        raise InputError(f"{name}: expected a list of texts, one a source, got a {type(items).__name__} (it would "
                         "translate each character): wrap one text in a list, [text]")


def prefix_lines(path: Path) -> Iterator[str]:
    """A file's lines as target prefixes (UTF-8, the line end dropped)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield line.rstrip("\r\n")


def with_prefixes(source: Iterable, prefixes: Iterable) -> Iterator[tuple]:
    """(source, prefix) pairs of two streams, one prefix a source: more or fewer is refused."""
    ends = object()
    prefix_iter = iter(prefixes)
    for i, line in enumerate(source):
        p = next(prefix_iter, ends)
        if p is ends:
            raise InputError(f"target_prefix: {i} prefixes for more sources; give one a source (None for none)")
        yield line, p
    if next(prefix_iter, ends) is not ends:
        raise InputError("target_prefix: more prefixes than sources; give one a source")


def input_limit(max_input_length: Any) -> int:
    """CTranslate2's max_input_length checked: an integer >= 0 (0 or None: no limit)."""
    if max_input_length is None:
        return 0
    if isinstance(max_input_length, bool) or not isinstance(max_input_length, int) or max_input_length < 0:
        raise InputError(f"max_input_length must be an integer >= 0 (the source tokens kept; 0: no limit), got "
                         f"{max_input_length!r}")
    return max_input_length


def ct2_batching(max_batch_size: int, batch_type: str, read_ahead: int = 8) -> Batching:
    """CTranslate2's max_batch_size and batch_type as a Batching: examples, or padded source tokens."""
    tokens = batch_type == "tokens"
    return Batching(batch_type, None if tokens else max_batch_size, max_batch_size if tokens else None, read_ahead)


class Translator(LineStream):
    """Text in, text out, over a Session (`Translator(xform.load(...))`): the text policy
    (text_policy.py), line streams (text_lines.py) and CTranslate2's calls."""

    # -- CTranslate2's Translator ---------------------------------------------------------------
    @may_run_asynchronously
    @in_callers_words
    def translate_batch(self, source: Sequence[str] | Sequence[Sequence[str]],
                        target_prefix: Sequence[str | Sequence[str] | None] | None = None, *, max_batch_size: int = 0,
                        batch_type: str = "examples", return_scores: bool = False, src_lang: str | None = None,
                        tgt_lang: str | None = None, replace_unknowns: bool = False, truncate: bool = False,
                        vocab_map: "VocabMap | str | Path | None" = None,
                        suppress_sequences: Sequence[str] | None = None, max_input_length: int | None = None,
                        return_end_token: bool = False, disable_unk: bool = False,
                        **options: Any) -> list[TranslationResult]:
        """Translate texts; one TranslationResult a text, in order. `options`: CTranslate2's names
        (beam_size, num_hypotheses, length_penalty, max_decoding_length, min_decoding_length,
        sampling_topk / topp / temperature, repetition_penalty, no_repeat_ngram_size,
        return_alternatives) or the generation config's; a name neither knows is refused with the
        nearest. A source is a text, or CTranslate2's token list where the tokenizer's pieces
        join back into text (SentencePiece); an empty one translates to empty hypotheses, as a
        blank line does. `max_batch_size` > 0 decodes at most that many sources (`batch_type`
        "tokens": padded source tokens) at a time, longest first. `target_prefix`: one text (or
        None) a source; `suppress_sequences`: phrases never generated (CTranslate2: token lists);
        `truncate` cuts a source over max_len (else refused); `max_input_length` N > 0
        (CTranslate2's) cuts each source to its first N tokens as the model reads them (language
        and end-of-sentence tokens included, end-of-sentence kept last), 0 or None no limit but
        max_len's (CTranslate2's default 1024 is not applied); `vocab_map` restricts each batch to
        the target ids its sources allow (a bundle exported --with-vocab-map). Token lists
        (CTranslate2's, each source a list of pieces) mean what they mean to CTranslate2, as
        token_lists.py says: ids through the vocabularies, token lists out, CTranslate2's scores,
        lengths and defaults; `return_end_token` and `disable_unk` are theirs."""
        if token_lists(source):
            return token_lists_module.translate_call(
                self, source, target_prefix, return_scores=return_scores, return_end_token=return_end_token,
                disable_unk=disable_unk, max_batch_size=max_batch_size, limit=input_limit(max_input_length),
                given={"src_lang": src_lang, "tgt_lang": tgt_lang, "replace_unknowns": replace_unknowns,
                       "truncate": truncate, "vocab_map": vocab_map},
                options={**options, "suppress_sequences": suppress_sequences})
        for name, value in (("return_end_token", return_end_token), ("disable_unk", disable_unk)):
            if value:
                raise InputError(f"{name}: CTranslate2's option for token lists (pass each source as its list of "
                                 "tokens); a text's translation is text, with no end token or <unk> in it")
        limit = input_limit(max_input_length)
        texts = self.source_texts(source, "source")
        prefixes = None if target_prefix is None else self.source_texts(target_prefix, "target_prefix", True)
        if prefixes is not None and len(prefixes) != len(texts):
            raise InputError(f"target_prefix has {len(prefixes)} entries for {len(texts)} sources: one a source")
        settings = generation_settings(options)
        if suppress_sequences:
            settings["bad_words_ids"] = list(suppress_sequences)
        todo = [i for i, t in enumerate(texts) if t.strip()]
        results: dict[int, TranslationResult] = {}
        for batch in self.batches([texts[i] for i in todo], max_batch_size, batch_type, src_lang, tgt_lang, limit):
            rows = [todo[j] for j in batch]
            if prefixes is not None:
                settings["target_prefix"] = [prefixes[i] or "" for i in rows]
            request = self.text_request([texts[i] for i in rows], src_lang=src_lang, tgt_lang=tgt_lang,
                                        replace_unknowns=replace_unknowns, return_scores=return_scores,
                                        truncate=truncate, vocab_map=vocab_map, max_input_length=limit,
                                        **settings)
            results.update(zip(rows, self.results(request, [texts[i] for i in rows], replace_unknowns)))
        n = (len(next(iter(results.values())).hypotheses) if results else
             settings.get("num_return_sequences") or self.generation_defaults.get("num_return_sequences") or 1)
        blank = TranslationResult([""] * n, [0.0] * n if return_scores else [])  # nothing decoded: log-prob 0
        return [results.get(i, blank) for i in range(len(texts))]

    @cached_property
    def vocabularies(self) -> Vocabularies:
        """The bundle's vocabularies as CTranslate2's token lists read them."""
        return Vocabularies(self.text, self.session.config)

    def ct2_generation_settings(self, options: dict[str, Any]) -> dict[str, Any]:
        return generation_settings(options)

    def results(self, request: Request, texts: list[str], replace_unknowns: bool) -> list[TranslationResult]:
        """A text request run: its TranslationResults, one a source."""
        result = self.session.run(request)
        n = len(result) // request.batch
        decoded = self.decode_rows(result.ids, n, request.sources(), texts,
                                   result.attention if replace_unknowns else None)
        scores = [float(s) for s in result.scores] if result.scores is not None else []
        return [TranslationResult(decoded[i * n:(i + 1) * n], scores[i * n:(i + 1) * n]) for i in range(request.batch)]

    def batches(self, texts: list[str], max_batch_size: int, batch_type: str, src_lang: str | None,
                tgt_lang: str | None, max_input_length: int = 0) -> list[list[int]]:
        """translate_batch's batches: indices into `texts`, all at once without max_batch_size, else
        as batching.plan groups them (longest first; "tokens" counts padded source tokens)."""
        if not texts:
            return []
        if not max_batch_size:
            return [list(range(len(texts)))]
        return plan([len(self.encode_text(t, src_lang, tgt_lang)) if not max_input_length else
                     min(len(self.encode_text(t, src_lang, tgt_lang)), max_input_length) for t in texts],
                    ct2_batching(max_batch_size, batch_type))

    def source_texts(self, items: Any, name: str, optional: bool = False) -> list[str]:
        """A method's list of texts: each a text, or CTranslate2's token list joined back into text
        where the tokenizer's pieces mark words (SentencePiece's ▁); `optional`: None for none. A
        string where the list belongs, or anything else, is refused in one sentence."""
        refuse_one_text(items, name)
        if not isinstance(items, Sequence):
            raise InputError(f"{name}: expected a list of texts, one a source, got {type(items).__name__}")
        out = []
        for i, item in enumerate(items):
            if item is None and optional:
                out.append("")
            elif isinstance(item, str):
                out.append(item)
            elif isinstance(item, Sequence) and all(isinstance(t, str) for t in item):
                out.append(self.joined(item, f"{name}[{i}]"))
            else:
                raise InputError(f"{name}[{i}]: expected a text (or a list of tokens), got {type(item).__name__}")
        return out

    def joined(self, tokens: Sequence[str], name: str) -> str:
        """CTranslate2's token list as the text it spells: SentencePiece pieces, ▁ marking a word's
        start. Other tokenizers' tokens do not say where words begin: refused, asking for text."""
        if not self.text.spm_words:
            raise InputError(f"{name}: a list of tokens; this bundle's tokenizer is not SentencePiece, so its tokens "
                             "do not spell the text back: pass the text itself (the bundle tokenizes it)")
        return "".join(tokens).replace("\u2581", " ").strip()

    @in_callers_words
    def translate_iterable(self, source: Iterable[str | bytes],
                           target_prefix: Iterable[str | Sequence[str] | None] | None = None, *,
                           max_batch_size: int = 32, batch_type: str = "examples", read_ahead: int = 8,
                           return_scores: bool = False, src_lang: str | None = None, tgt_lang: str | None = None,
                           truncate: bool = False, **options: Any) -> Iterator[TranslationResult]:
        """Translate a stream of texts lazily, a window at a time (batching.py), in input order.
        A line that cannot be translated raises InputError naming it (0-based); `truncate` cuts a
        line longer than max_len instead. `target_prefix`: a stream of prefixes (a text, a token
        list or None), one a source. A stream of token lists (CTranslate2's) is translated as
        translate_batch translates them, `max_batch_size` at a time, as CTranslate2 builds
        translate_iterable on translate_batch."""
        refuse_one_text(source, "source")
        items = iter(source)
        first = next(items, None)
        if first is None:
            return
        source = itertools.chain([first], items)
        if not isinstance(first, (str, bytes)):
            if src_lang or tgt_lang or truncate:
                raise InputError("src_lang, tgt_lang, truncate with token lists: pass texts for them")
            pairs = ((t, None) for t in source) if target_prefix is None else with_prefixes(source, target_prefix)
            for sources, prefixes in token_lists_module.chunks(pairs, max_batch_size or 32, target_prefix is not None):
                yield from self.translate_batch(sources, prefixes, return_scores=return_scores, **options)
            return
        gen = self.generation(tgt_lang, options)
        batching = ct2_batching(max_batch_size, batch_type, read_ahead)
        text = TextOptions(return_scores, src_lang, tgt_lang, truncate)
        lines = source if target_prefix is None else self.with_prefixes(source, target_prefix)
        for i, line in enumerate(self.translate_lines(lines, gen, batching, text)):
            if line.error is not None:
                raise InputError(f"line {i}: {line.error}")
            yield TranslationResult(line.hypotheses, line.scores)

    def with_prefixes(self, source: Iterable[str | bytes], prefixes: Iterable) -> Iterator[tuple]:
        """(source, prefix text) pairs, one prefix a source: more or fewer is refused."""
        refuse_one_text(prefixes, "target_prefix")
        for i, (line, p) in enumerate(with_prefixes(source, prefixes)):
            yield line, self.source_texts([p], f"target_prefix[{i}]", True)[0]

    def translate_file(self, input_path: str | Path, output_path: str | Path, target_path: str | Path | None = None,
                       *, max_batch_size: int = 32, src_lang: str | None = None, tgt_lang: str | None = None,
                       **options: Any) -> int:
        """Translate a file, one line a line, into `output_path`: one translation a line (the
        best), written atomically (a reader sees the old file or the whole new one). Returns
        the lines translated. `target_path`: a file of target prefixes, a line a source line
        (CTranslate2's). A line that cannot be translated raises InputError; nothing is written."""
        n = 0
        with open(input_path, "rb") as f, atomic_file(Path(output_path)) as out:
            prefixes = None if target_path is None else prefix_lines(Path(target_path))
            for result in self.translate_iterable(f, prefixes, max_batch_size=max_batch_size, src_lang=src_lang,
                                                  tgt_lang=tgt_lang, **options):
                out.write(result.hypotheses[0] + "\n")
                n += 1
        return n

    @in_callers_words
    def translate_document(self, text: str, *, format: str = "text", memory: "str | Path | None" = None,
                           src_lang: str | None = None, tgt_lang: str | None = None,
                           skip_target_language: bool = False, truncate: bool = False, max_batch_size: int = 32,
                           batch_type: str = "examples", **options: Any) -> str:
        """Translate a document: its paragraphs split into sentences (sentencex, by `src_lang`'s
        rules), decoded together, and joined back with the text's whitespace, line and paragraph
        breaks; `format` "markdown" leaves code, URLs, link targets and HTML tags as they are.
        `memory`: an SQLite translation memory (created when missing): sentences it holds for this
        bundle and these settings are not decoded again. `src_lang` "auto" (a multilingual model):
        each paragraph's language identified (py3langid); `skip_target_language`: paragraphs
        already in `tgt_lang` kept as they are. A sentence over max_len is cut at its clauses, else
        truncated with `truncate`, else refused. `options`: translate_batch's."""
        return self.translate_documents([text], format=format, memory=memory, src_lang=src_lang, tgt_lang=tgt_lang,
                                        skip_target_language=skip_target_language, truncate=truncate,
                                        max_batch_size=max_batch_size, batch_type=batch_type, **options)[0]

    @in_callers_words
    def translate_documents(self, texts: Sequence[str], *, format: str = "text", memory: "str | Path | None" = None,
                            src_lang: str | None = None, tgt_lang: str | None = None,
                            skip_target_language: bool = False, truncate: bool = False, max_batch_size: int = 32,
                            batch_type: str = "examples", **options: Any) -> list[str]:
        """Documents translated as translate_document does one, their sentences decoded together."""
        from xform.runtime.documents.memory import TranslationMemory
        from xform.runtime.documents.translate import DocumentTranslator

        refuse_one_text(texts, "texts")
        gen = self.generation(tgt_lang, options)
        text = TextOptions(False, src_lang, tgt_lang, truncate)
        opened = TranslationMemory(memory) if memory is not None else None
        try:
            documents = DocumentTranslator(self, gen, ct2_batching(max_batch_size, batch_type), text, markup=format,
                                           memory=opened, skip_target_language=skip_target_language)
            return [r.text for r in documents.translate([(f"texts[{i}]", t) for i, t in enumerate(texts)])]
        finally:
            if opened is not None:
                opened.close()

    @may_run_asynchronously
    def score_batch(self, source: Sequence[Any], target: Sequence[Any], *, src_lang: str | None = None,
                    tgt_lang: str | None = None, **options: Any) -> list[ScoringResult]:
        """The log-likelihood of each target given its source, teacher-forced (Session.score).
        An empty source scores nothing (no tokens), as it translates to nothing. Token lists
        (CTranslate2's) score as CTranslate2 scores them (token_lists.score): the target's pieces
        and "</s>" back, each with its log-prob."""
        refuse_unknown(options, ["src_lang", "tgt_lang"], "scoring option")
        if token_lists(source) or token_lists(target):
            if src_lang or tgt_lang:
                raise InputError("src_lang, tgt_lang with token lists: a token list is what the model reads, its "
                                 "language tokens included; pass texts for them")
            return token_lists_module.score(self, source, target)
        texts, targets = self.source_texts(source, "source"), self.source_texts(target, "target")
        if len(texts) != len(targets):
            raise InputError(f"{len(texts)} sources for {len(targets)} targets: one target a source")
        todo = [i for i, t in enumerate(texts) if t.strip()]
        results = {i: ScoringResult([], []) for i in range(len(texts))}
        if todo:
            src = self.encode_batch([texts[i] for i in todo], src_lang, tgt_lang)
            tgt, lengths = self.session.pad([self.encode_target(targets[i], tgt_lang) for i in todo])
            scored = self.session.score(src, tgt)
            for r, (i, n) in enumerate(zip(todo, lengths)):
                results[i] = ScoringResult([int(t) for t in tgt[r, :n]], [float(v) for v in scored["tokens"][r, :n]])
        return [results[i] for i in range(len(texts))]

    def score_iterable(self, source: Iterable[Any], target: Iterable[Any], max_batch_size: int = 64,
                       batch_type: str = "examples", **options: Any) -> Iterator[ScoringResult]:
        """score_batch over two streams (texts or token lists, one target a source), `max_batch_size`
        pairs at a time, as CTranslate2 builds score_iterable on score_batch; more sources than
        targets, or fewer, is refused."""
        if batch_type not in ("examples", "tokens"):
            raise InputError(f"batch_type: examples or tokens, got {batch_type!r}")
        refuse_one_text(source, "source")
        refuse_one_text(target, "target")
        ends = object()
        sources, targets = iter(source), iter(target)
        while True:
            pairs = list(itertools.islice(itertools.zip_longest(sources, targets, fillvalue=ends),
                                          max_batch_size or 64))
            if any(s is ends or t is ends for s, t in pairs):
                raise InputError("score_iterable: as many targets as sources, one a source")
            if not pairs:
                return
            yield from self.score_batch([s for s, _ in pairs], [t for _, t in pairs], **options)

    @in_callers_words
    def generate_tokens(self, source: str | Sequence[str], target_prefix: str | Sequence[str] | None = None, *,
                        src_lang: str | None = None, tgt_lang: str | None = None, return_log_prob: bool = False,
                        **options: Any) -> Iterator[GenerationStepResult]:
        """Yield the translation of one text token by token as the loop makes them: greedy or
        sampling (beam search decides its tokens only at its end; CTranslate2's generate_tokens
        takes beam_size 1 only), the end token's step last. A token list (CTranslate2's) as
        translate_batch takes it (token_lists.py): its prefix's tokens are the first steps, as
        CTranslate2 yields them. `return_log_prob`: each step's log-prob (a prefix's 0), as
        CTranslate2's: summed and divided by the steps, the translation's score."""
        settings = generation_settings(options)
        if settings.get("num_beams", 1) != 1:
            raise InputError("generate_tokens: beam_size 1 only (beam search decides its tokens at its end)")
        settings["num_beams"] = 1  # greedy or sampling, whatever beams the bundle decodes with by default
        if not isinstance(source, str):
            if src_lang or tgt_lang or isinstance(target_prefix, str):
                raise InputError("generate_tokens with a token list: its languages are tokens (the target's as a "
                                 "token list target_prefix); pass a text for src_lang, tgt_lang or a text prefix")
            request = token_lists_module.step_request(self, list(source), list(target_prefix or []), settings,
                                                      return_log_prob)
        else:
            if target_prefix:
                settings["target_prefix"] = [target_prefix]
            request = self.text_request([source], src_lang=src_lang, tgt_lang=tgt_lang,
                                        return_token_scores=return_log_prob, **settings)
        yield from self.steps(request)

    def steps(self, request: Request) -> Iterator[GenerationStepResult]:
        """A one-source greedy or sampling request's tokens as the loop makes them."""
        decode = self.session.decode_item(request)
        batch = Batch(self.session.backend, self.session.start_id)
        batch.admit(decode)
        out = decode.strategy.out
        assert out is not None  # greedy and sampling keep their tokens as they go
        scored = request.return_token_scores
        while not decode.done:
            batch.step()
            step = decode.step - 1
            token = int(out[0, step])
            last = decode.done or token == self.eos_id
            yield GenerationStepResult(step, token, self.piece(token), last,
                                       float(decode.strategy.per_token()[0, step]) if scored else None)
            if last:
                return

    @cached_property
    def pieces(self) -> dict[int, str]:
        """Target id -> the vocabulary's token (read once, at the first generate_tokens)."""
        return {i: t for t, i in self.text.target_vocabulary().items()}

    def piece(self, token_id: int) -> str:
        """A target id as the vocabulary writes it (CTranslate2's tokens): SentencePiece's pieces
        keep their word-start mark, so joined they spell the text ("".join(tokens) with "▁" as a
        space); end-of-sentence and the like as the vocabulary names them."""
        return self.pieces.get(token_id, "")

    # -- the Python door for text ---------------------------------------------------------------
    def generation(self, tgt_lang: str | None, options: dict[str, Any]) -> GenerationConfig:
        """A generation config from CTranslate2's option names or the config's, the target
        language's first token forced."""
        settings = generation_settings(options)
        self.first_token(settings, tgt_lang)
        if settings.get("bad_words_ids"):
            settings["bad_words_ids"] = self.bad_words(settings["bad_words_ids"])
        return self.session.generation_config(settings.pop("max_new_tokens", None), **settings)

    def text_request(self, texts: list[str], max_new_tokens: int | None = None, *, src_lang: str | None = None,
                     tgt_lang: str | None = None, replace_unknowns: bool = False,
                     vocab_map: "VocabMap | str | Path | None" = None, truncate: bool = False,
                     max_input_length: int = 0, **settings: Any) -> Request:
        """The Python door for text: texts and text settings (the target language, prefixes and
        bad words as text, a vocabulary map, unknown replacement, truncation to max_len) as the
        session's Request."""
        self.first_token(settings, tgt_lang)
        if settings.get("target_prefix") is not None:  # a prefix as the target tokenizer splits it
            settings["target_prefix"] = self.prefix_ids(settings["target_prefix"])
        if settings.get("bad_words_ids") is not None:
            settings["bad_words_ids"] = self.bad_words(settings["bad_words_ids"])
        src = self.encode_batch(texts, src_lang, tgt_lang, truncate=truncate, max_input_length=max_input_length)
        vocab_map = self.vocab_map(vocab_map)
        if vocab_map is not None:
            settings["vocabulary"] = self.allowed_ids(vocab_map, texts)
        if replace_unknowns:
            self.check_replace_unknowns()
        return self.session.request(src, None, max_new_tokens, texts=texts, replace_unknowns=replace_unknowns,
                                    **settings)

    def translate(self, texts: list[str], max_new_tokens: int | None = None, *, src_lang: str | None = None,
                  tgt_lang: str | None = None, replace_unknowns: bool = False,
                  vocab_map: "VocabMap | str | Path | None" = None, **settings: Any) -> list[str]:
        """Translations in input order; with num_return_sequences n, n per text, one after another.
        `settings` are generate()'s keywords (num_beams, length_penalty, do_sample, ...);
        `src_lang` / `tgt_lang` are a multilingual model's language codes (NLLB's "fra_Latn", mBART-50's
        "fr_XX", M2M100's "fr"), the target's becoming the forced first token."""
        refuse_one_text(texts, "texts")
        request = self.text_request(list(texts), max_new_tokens, src_lang=src_lang, tgt_lang=tgt_lang,
                                    replace_unknowns=replace_unknowns, vocab_map=vocab_map, **settings)
        result = self.session.run(request)
        return self.decode_rows(result.ids, len(result) // request.batch, request.sources(), list(texts),
                                result.attention if replace_unknowns else None)
