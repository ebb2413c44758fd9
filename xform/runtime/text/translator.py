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

import itertools
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from xform.errors import InputError
from xform.runtime.decoding.generation import GenerationConfig
from xform.runtime.decoding.loop import Batch
from xform.runtime.decoding.request import (
    REQUEST_OPTIONS,
    GenerationStepResult,
    LineResult,
    Request,
    ScoringResult,
    TextOptions,
    TranslationResult,
    refuse_unknown,
)
from xform.runtime.scheduling.batching import Batching, plan
from xform.runtime.text import ct2_files, token_calls
from xform.runtime.text.async_results import may_run_asynchronously
from xform.runtime.text.call_words import (
    ct2_batching,
    generation_settings,
    in_callers_words,
    input_limit,
    one_map,
    refuse_one_text,
    refuse_token_options,
    with_prefixes,
)
from xform.runtime.text.ct2_checks import check_call, check_iterable
from xform.runtime.text.ct2_files import ExecutionStats
from xform.runtime.text.results import render
from xform.runtime.text.step_callback import StepCallback
from xform.runtime.text.step_callback import checked as checked_callback
from xform.runtime.text.terminology import Terminology, terminology
from xform.runtime.text.text_lines import LineStream
from xform.runtime.text.text_policy import TextPolicy
from xform.runtime.text.text_request import TextRequest, blank, convert, generation
from xform.runtime.text.token_lists import chunks, token_lists
from xform.runtime.text.vocab_map import VocabMap, bundle_map

if TYPE_CHECKING:
    from xform.runtime.session import Session


class Translator:
    """Text in, text out, over a Session (`Translator(xform.load(...))`): it has a text policy
    (text_policy.py: the rules from text to ids), the one conversion of a text request
    (text_request.py), a line stream (text_lines.py, given this translator) and CTranslate2's
    calls. A door opens one and holds it."""

    def __init__(self, session: "Session", *, glossary: Any = None, keep: str | Sequence[str] = ()):
        self.session = session
        self.policy = TextPolicy(session)
        self.lines = LineStream(self)
        self.glossary, self.keep = glossary, keep  # every call's terminology unless it gives its own

    def terminology(self, glossary: Any, keep: str | Sequence[str], src_lang: str | None,
                    tgt_lang: str | None) -> Terminology | None:
        """A call's terminology (terminology.terminology): its glossary and keep patterns, else the
        translator's, for the call's language pair."""
        if glossary is None and not keep:
            glossary, keep = self.glossary, self.keep
        return terminology(glossary, keep, src_lang, tgt_lang)

    def request(self, asked: TextRequest) -> Request:
        """The one conversion of a text request into the session's Request (text_request.convert)."""
        return convert(self.policy, asked)

    def translate_lines(self, lines: Iterable[str | bytes | tuple], gen: GenerationConfig,
                        batching: Batching | None = None, text: TextOptions | None = None, *,
                        on_batch: Callable[[int, int], None] | None = None,
                        on_warning: Callable[[int, str], None] | None = None) -> Iterator[LineResult]:
        """A stream of lines translated, a LineResult a line in input order (text_lines.py)."""
        return self.lines.translate_lines(lines, gen, batching, text, on_batch=on_batch, on_warning=on_warning)

    # -- CTranslate2's Translator ---------------------------------------------------------------
    @may_run_asynchronously
    @in_callers_words
    def translate_batch(self, source: Sequence[str] | Sequence[Sequence[str]],
                        target_prefix: Sequence[str | Sequence[str] | None] | None = None, *, max_batch_size: int = 0,
                        batch_type: str = "examples", return_scores: bool = False, src_lang: str | None = None,
                        tgt_lang: str | None = None, replace_unknowns: bool = False, truncate: bool = False,
                        vocab_map: "VocabMap | str | Path | None" = None,
                        suppress_sequences: Sequence[str] | None = None, max_input_length: int | None = None,
                        return_end_token: bool = False, disable_unk: bool = False, glossary: Any = None,
                        keep: str | Sequence[str] = (), qe: bool = False, callback: Any = None,
                        use_vmap: bool = False, **options: Any) -> list[TranslationResult]:
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
        lengths and defaults; `return_end_token` and `disable_unk` are theirs. xform's additions:
        `glossary` (a TSV or TBX file, a Glossary, {source: target}; else the translator's) and
        `keep` (regular expressions): each term found in a source must appear in its translation
        as the glossary writes it, each kept span as written (`<dnt>...</dnt>` marks one too),
        enforced in the beam search (a greedy request is promoted to the beam the terms need:
        `promoted_beams`); a term the length cap leaves no room for is in the result's `unmet`.
        `qe`: each hypothesis' `confidence` in [0, 1] (docs/terminology.md's formula).
        `callback` (CTranslate2's, step_callback.py): each token's GenerationStepResult as decoded
        (beam_size 1), True ends that example; `use_vmap` (CTranslate2's): the bundle's vmap.txt."""
        if "return_log_prob" in options:
            raise InputError("return_log_prob: generate_tokens' option (CTranslate2's translate_batch has none); "
                             "translate_batch's callback is given each token's log_prob with return_scores=True")
        check_call(max_batch_size=max_batch_size, batch_type=batch_type, src_lang=src_lang, tgt_lang=tgt_lang,
                   suppress_sequences=suppress_sequences, **options)
        stepper = self.step_callback(callback, return_scores)
        vmap = bundle_map(self.policy) if use_vmap else None
        if token_lists(source):
            return token_calls.translate_call(
                self, source, target_prefix, return_scores=return_scores, return_end_token=return_end_token,
                disable_unk=disable_unk, max_batch_size=max_batch_size, limit=input_limit(max_input_length),
                given={"src_lang": src_lang, "tgt_lang": tgt_lang, "replace_unknowns": replace_unknowns,
                       "truncate": truncate, "vocab_map": vocab_map, "qe": qe,
                       "terminology": terminology(glossary, keep)},  # the call's own: refused with token lists
                options={**options, "suppress_sequences": suppress_sequences}, stepper=stepper, vmap=vmap)
        refuse_token_options(return_end_token=return_end_token, disable_unk=disable_unk)
        prefixes = None if target_prefix is None else self.source_texts(target_prefix, "target_prefix", True)
        text = TextOptions(return_scores, src_lang, tgt_lang, truncate, replace_unknowns=replace_unknowns,
                           vocab_map=one_map(vocab_map, vmap), terminology=self.terminology(glossary, keep, src_lang,
                                                                                            tgt_lang), qe=qe)
        return self.translate_texts(TextRequest(tuple(self.source_texts(source, "source")),
                                                None if prefixes is None else tuple(prefixes),
                                                tuple(suppress_sequences or ()), text, generation_settings(options),
                                                max_input_length=input_limit(max_input_length)),
                                    max_batch_size, batch_type, stepper)

    def translate_texts(self, asked: TextRequest, max_batch_size: int, batch_type: str,
                        stepper: StepCallback | None = None) -> list[TranslationResult]:
        """translate_batch's texts: the blank ones answered without decoding (empty hypotheses, log-prob
        0), the others decoded in translate_batch's batches."""
        texts, text = list(asked.sources), asked.options
        todo = [i for i, t in enumerate(texts) if not blank(t)]
        results: dict[int, TranslationResult] = {}
        for batch in self.batches([texts[i] for i in todo], max_batch_size, batch_type, text.src_lang, text.tgt_lang,
                                  asked.max_input_length):
            rows = [todo[j] for j in batch]
            results.update(zip(rows, self.results(asked.part(rows), None if stepper is None else stepper.watch(rows))))
        n = (len(next(iter(results.values())).hypotheses) if results else
             asked.settings.get("num_return_sequences") or
             self.policy.generation_defaults.get("num_return_sequences") or 1)
        blank_result = TranslationResult([""] * n, [0.0] * n if text.scores else [])
        return [results.get(i, blank_result) for i in range(len(texts))]

    def ct2_generation_settings(self, options: dict[str, Any]) -> dict[str, Any]:
        return generation_settings(options)

    def step_callback(self, callback: Any, scored: bool) -> StepCallback | None:
        """translate_batch's `callback` over its decodes (step_callback.py), None for none."""
        callback = checked_callback(callback)
        if callback is None:
            return None
        vocab = self.policy.vocabularies
        return StepCallback(callback, lambda i: vocab.pieces([i])[0], scored)

    def results(self, asked: TextRequest, watch: Callable[[Any], None] | None = None) -> list[TranslationResult]:
        """A text request decoded: its TranslationResults, one a source (results.render); `watch`:
        a step callback's hook (Session.run)."""
        request = self.request(asked)
        return [TranslationResult(r.hypotheses, r.scores, r.confidence, r.unmet, r.promoted_beams)
                for r in render(self.policy, asked, request, self.session.run(request, watch=watch))]

    def batches(self, texts: list[str], max_batch_size: int, batch_type: str, src_lang: str | None,
                tgt_lang: str | None, max_input_length: int = 0) -> list[list[int]]:
        """translate_batch's batches: indices into `texts`, all at once without max_batch_size, else
        as batching.plan groups them (longest first; "tokens" counts padded source tokens)."""
        if not texts:
            return []
        if not max_batch_size:
            return [list(range(len(texts)))]
        return plan([len(self.policy.encode_text(t, src_lang, tgt_lang)) if not max_input_length else
                     min(len(self.policy.encode_text(t, src_lang, tgt_lang)), max_input_length) for t in texts],
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
        if not self.policy.text.spm_words:
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
        check_iterable(source, "source")
        if target_prefix is not None:
            check_iterable(target_prefix, "target_prefix")
        check_call(max_batch_size=max_batch_size, batch_type=batch_type, src_lang=src_lang, tgt_lang=tgt_lang)
        items = iter(source)
        first = next(items, None)
        if first is None:
            return
        source = itertools.chain([first], items)
        if not isinstance(first, (str, bytes)):
            if src_lang or tgt_lang or truncate:
                raise InputError("src_lang, tgt_lang, truncate with token lists: pass texts for them")
            pairs = ((t, None) for t in source) if target_prefix is None else with_prefixes(source, target_prefix)
            for sources, prefixes in chunks(pairs, max_batch_size or 32, target_prefix is not None):
                yield from self.translate_batch(sources, prefixes, return_scores=return_scores, **options)
            return
        if options.get("callback") is not None:
            raise InputError("callback: translate_batch's (and a stream of token lists', built on it); a stream of "
                             "texts decodes windows of lines together: call translate_batch for step results")
        options.pop("callback", None)
        vmap = bundle_map(self.policy) if options.pop("use_vmap", False) else None  # CTranslate2's use_vmap
        gen = self.generation(tgt_lang, options)
        batching = ct2_batching(max_batch_size, batch_type, read_ahead)
        text = TextOptions(return_scores, src_lang, tgt_lang, truncate, vocab_map=vmap)
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

    @in_callers_words
    def translate_file(self, input_path: str | Path, output_path: str | Path, target_path: str | Path | None = None,
                       *, max_batch_size: int = 32, read_batch_size: int = 0, batch_type: str = "examples",
                       with_scores: bool = False, source_tokenize_fn: Callable[[str], list[str]] | None = None,
                       target_tokenize_fn: Callable[[str], list[str]] | None = None,
                       target_detokenize_fn: Callable[[list[str]], str] | None = None, tokenized: bool | None = None,
                       **options: Any) -> ExecutionStats:
        """Translate a file, a line an example, into `output_path` (ct2_files.py): each
        hypothesis on its line (`with_scores`: `score ||| translation`), written atomically (a
        reader sees the old file or the whole new one). Returns CTranslate2's ExecutionStats.
        `target_path`: a file of target prefixes, a line a source line (CTranslate2's). With
        `source_tokenize_fn` / `target_detokenize_fn` (`target_tokenize_fn` for the prefixes),
        each line is the token list the function makes, with CTranslate2's meanings; without,
        a file of tokens (`tokenized=True`, or a first line with SentencePiece's "▁" or "</s>")
        is split on spaces as CTranslate2 splits it, and a file of texts is translated with the
        bundle's tokenizer (xform's addition). A line that cannot be translated raises
        InputError; nothing is written. `options`: translate_batch's."""
        return ct2_files.translate_file(self, input_path, output_path, target_path, max_batch_size=max_batch_size,
                                        read_batch_size=read_batch_size, batch_type=batch_type,
                                        with_scores=with_scores, source_tokenize_fn=source_tokenize_fn,
                                        target_tokenize_fn=target_tokenize_fn,
                                        target_detokenize_fn=target_detokenize_fn, tokenized=tokenized, **options)

    def score_file(self, source_path: str | Path, target_path: str | Path, output_path: str | Path, *,
                   max_batch_size: int = 32, read_batch_size: int = 0, batch_type: str = "examples",
                   max_input_length: int | None = None, offset: int = 0, with_tokens_score: bool = False,
                   source_tokenize_fn: Callable[[str], list[str]] | None = None,
                   target_tokenize_fn: Callable[[str], list[str]] | None = None,
                   target_detokenize_fn: Callable[[list[str]], str] | None = None, tokenized: bool | None = None,
                   **options: Any) -> ExecutionStats:
        """Score a parallel file (CTranslate2's score_file, ct2_files.py): a line `score |||
        target` an example (the mean of its tokens' log-probs, the end token's included;
        `with_tokens_score`: `||| ` and each token's), written atomically; CTranslate2's
        ExecutionStats. Tokenize functions (all three or none), tokens and texts as translate_file
        reads them; `options`: score_batch's."""
        return ct2_files.score_file(self, source_path, target_path, output_path, max_batch_size=max_batch_size,
                                    read_batch_size=read_batch_size, batch_type=batch_type,
                                    max_input_length=max_input_length, offset=offset,
                                    with_tokens_score=with_tokens_score, source_tokenize_fn=source_tokenize_fn,
                                    target_tokenize_fn=target_tokenize_fn, target_detokenize_fn=target_detokenize_fn,
                                    tokenized=tokenized, **options)

    @may_run_asynchronously
    def score_batch(self, source: Sequence[Any], target: Sequence[Any], *, max_batch_size: int = 0,
                    batch_type: str = "examples", max_input_length: int | None = None, offset: int = 0,
                    src_lang: str | None = None, tgt_lang: str | None = None, **options: Any) -> list[ScoringResult]:
        """The log-likelihood of each target given its source, teacher-forced (Session.score).
        An empty source scores nothing (no tokens), as it translates to nothing. Token lists
        (CTranslate2's) score as CTranslate2 scores them (token_lists.score): the target's pieces
        and "</s>" back, each with its log-prob. CTranslate2's `max_batch_size` / `batch_type`
        (at most that many examples, or padded source tokens, scored at a time), `max_input_length`
        (each source cut to N tokens, its end token kept; 0 or None: no limit) and `offset` (the
        first N target tokens left out of the result)."""
        refuse_unknown(options, ["src_lang", "tgt_lang"], "scoring option")
        check_call(max_batch_size=max_batch_size, batch_type=batch_type, offset=offset, src_lang=src_lang,
                   tgt_lang=tgt_lang)
        limit = input_limit(max_input_length)
        refuse_one_text(source, "source")
        refuse_one_text(target, "target")
        if token_lists(source) or token_lists(target):
            if src_lang or tgt_lang:
                raise InputError("src_lang, tgt_lang with token lists: a token list is what the model reads, its "
                                 "language tokens included; pass texts for them")
            results = token_calls.score(self, source, target, limit, max_batch_size, batch_type)
        else:
            results = self.score_texts(source, target, src_lang, tgt_lang, limit, max_batch_size, batch_type)
        return [ScoringResult(r.tokens[offset:], r.log_probs[offset:]) for r in results] if offset else results

    def score_texts(self, source: Sequence[Any], target: Sequence[Any], src_lang: str | None, tgt_lang: str | None,
                    limit: int, max_batch_size: int, batch_type: str) -> list[ScoringResult]:
        """score_batch over texts: each target's ids (as the model would generate them) and their
        log-probs, scored `max_batch_size` at a time."""
        texts, targets = self.source_texts(source, "source"), self.source_texts(target, "target")
        if len(texts) != len(targets):
            raise InputError(f"{len(texts)} sources for {len(targets)} targets: one target a source")
        todo = [i for i, t in enumerate(texts) if t.strip()]
        results = {i: ScoringResult([], []) for i in range(len(texts))}
        if todo:
            rows = [self.policy.encode_batch([texts[i]], src_lang, tgt_lang, max_input_length=limit)[0] for i in todo]
            for part in token_calls.score_chunks([len(r) for r in rows], max_batch_size, batch_type):
                src, _ = self.session.pad([list(rows[j]) for j in part])
                tgt, lengths = self.session.pad([
                    token_calls.cut_ids(self.policy.encode_target(targets[todo[j]], tgt_lang), limit) for j in part])
                scored = self.session.score(src, tgt)
                for r, (j, n) in enumerate(zip(part, lengths)):
                    results[todo[j]] = ScoringResult([int(t) for t in tgt[r, :n]],
                                                     [float(v) for v in scored["tokens"][r, :n]])
        return [results[i] for i in range(len(texts))]

    def score_iterable(self, source: Iterable[Any], target: Iterable[Any], max_batch_size: int = 64,
                       batch_type: str = "examples", **options: Any) -> Iterator[ScoringResult]:
        """score_batch over two streams (texts or token lists, one target a source), `max_batch_size`
        pairs at a time, as CTranslate2 builds score_iterable on score_batch; more sources than
        targets, or fewer, is refused."""
        check_call(max_batch_size=max_batch_size, batch_type=batch_type)
        refuse_one_text(source, "source")
        refuse_one_text(target, "target")
        check_iterable(source, "source")
        check_iterable(target, "target")
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
        taken = [k for k in REQUEST_OPTIONS if k in options]
        if taken:
            raise InputError(f"{', '.join(taken)}: translate_batch's; generate_tokens takes target_prefix as its "
                             "second argument and return_log_prob for each step's log-prob")
        check_call(src_lang=src_lang, tgt_lang=tgt_lang)
        if not isinstance(source, str) and not (isinstance(source, Sequence) and not isinstance(source, bytes)
                                                and all(isinstance(t, str) for t in source)):
            raise InputError(f"source: one text, or one token list (a list of str), got {source!r}")
        if target_prefix is not None and not isinstance(target_prefix, str) and not (
                isinstance(target_prefix, Sequence) and not isinstance(target_prefix, bytes)
                and all(isinstance(t, str) for t in target_prefix)):
            raise InputError(f"target_prefix: a text, or a token list (a list of str), got {target_prefix!r}")
        settings = generation_settings(options)
        if settings.get("num_beams", 1) != 1:
            raise InputError("generate_tokens: beam_size 1 only (beam search decides its tokens at its end)")
        settings["num_beams"] = 1  # greedy or sampling, whatever beams the bundle decodes with by default
        if not isinstance(source, str):
            if src_lang or tgt_lang or isinstance(target_prefix, str):
                raise InputError("generate_tokens with a token list: its languages are tokens (the target's as a "
                                 "token list target_prefix); pass a text for src_lang, tgt_lang or a text prefix")
            request = token_calls.step_request(self, list(source), list(target_prefix or []), settings,
                                                      return_log_prob)
        else:
            request = self.request(TextRequest((source,), (target_prefix,) if target_prefix else None,
                                               options=TextOptions("tokens" if return_log_prob else False, src_lang,
                                                                   tgt_lang), settings=settings))
        yield from self.steps(request, return_log_prob)

    def steps(self, request: Request, scored: bool) -> Iterator[GenerationStepResult]:
        """A one-source greedy or sampling request's tokens as the loop makes them (with each
        one's log-prob where `scored`)."""
        decode = self.session.decode_item(request)
        batch = Batch(self.session.backend, self.session.start_id)
        batch.admit(decode)
        out = decode.strategy.out
        assert out is not None  # greedy and sampling keep their tokens as they go
        while not decode.done:
            batch.step()
            step = decode.step - 1
            token = int(out[0, step])
            last = decode.done or token == self.policy.eos_id
            yield GenerationStepResult(step, token, self.piece(token), last,
                                       float(decode.strategy.per_token()[0, step]) if scored else None)
            if last:
                return

    @cached_property
    def pieces(self) -> dict[int, str]:
        """Target id -> the vocabulary's token (read once, at the first generate_tokens)."""
        return {i: t for t, i in self.policy.text.target_vocabulary().items()}

    def piece(self, token_id: int) -> str:
        """A target id as the vocabulary writes it (CTranslate2's tokens): SentencePiece's pieces
        keep their word-start mark, so joined they spell the text ("".join(tokens) with "▁" as a
        space); end-of-sentence and the like as the vocabulary names them."""
        return self.pieces.get(token_id, "")

    # -- the Python door for text ---------------------------------------------------------------
    def generation(self, tgt_lang: str | None, options: dict[str, Any]) -> GenerationConfig:
        """A generation config from CTranslate2's option names or the config's, the target
        language's first token forced: the one conversion's rule (text_request.generation), for a
        stream or documents that decode many batches with one config."""
        return generation(self.policy, TextRequest((), options=TextOptions(tgt_lang=tgt_lang),
                                                   settings=generation_settings(options)))

    def text_request(self, texts: Sequence[str], max_new_tokens: int | None = None, *, src_lang: str | None = None,
                     tgt_lang: str | None = None, replace_unknowns: bool = False,
                     vocab_map: "VocabMap | str | Path | None" = None, truncate: bool = False,
                     **settings: Any) -> TextRequest:
        """The Python door's keywords (generate()'s: the generation config's and target_prefix, as
        texts or ids) as a TextRequest."""
        prefixes = settings.pop("target_prefix", None)
        if max_new_tokens is not None:
            settings["max_new_tokens"] = max_new_tokens
        return TextRequest(tuple(texts), None if prefixes is None else tuple(prefixes),
                           options=TextOptions(False, src_lang, tgt_lang, truncate, replace_unknowns=replace_unknowns,
                                               vocab_map=vocab_map), settings=settings)

    def translate(self, texts: list[str], max_new_tokens: int | None = None, *, src_lang: str | None = None,
                  tgt_lang: str | None = None, replace_unknowns: bool = False,
                  vocab_map: "VocabMap | str | Path | None" = None, **settings: Any) -> list[str]:
        """Translations in input order; with num_return_sequences n, n per text, one after another.
        `settings` are generate()'s keywords (num_beams, length_penalty, do_sample, ...);
        `src_lang` / `tgt_lang` are a multilingual model's language codes (NLLB's "fra_Latn", mBART-50's
        "fr_XX", M2M100's "fr"), the target's becoming the forced first token."""
        refuse_one_text(texts, "texts")
        asked = self.text_request(texts, max_new_tokens, src_lang=src_lang, tgt_lang=tgt_lang,
                                  replace_unknowns=replace_unknowns, vocab_map=vocab_map, **settings)
        return [h for r in self.results(asked) for h in r.hypotheses]
