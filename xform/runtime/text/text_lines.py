"""Streams of lines translated: the one path of the CLI's `run`, `xform corpus`, `xform.ray`, `eval`
and the translator's `translate_iterable` / `translate_file`.

Lines are read a window at a time (batching.windows), each line's source encoded by the text
policy (a line that cannot be translated keeps its error, the others go on), a window's sources
decoded in batches of like length through the session's one request builder, and each line
answered in input order as a named `LineResult` (request.py), whatever was asked: no tuple whose
shape depends on the options. `TextOptions` (request.py) carries the text settings.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Iterable, Iterator, Protocol

from xform.errors import InputError, Message, message
from xform.runtime.decoding.generation import GenerationConfig
from xform.runtime.decoding.request import LineResult, Request, TextOptions
from xform.runtime.scheduling.batching import Batching, plan, windows
from xform.runtime.text.results import render
from xform.runtime.text.text_policy import TextPolicy
from xform.runtime.text.text_request import Encoded, Marked, TextRequest, marked
from xform.runtime.text.unknowns import unknown_warning

# a line read and encoded: (its text, its source ids or None, its error or None, its target prefix ids,
# the spans kept as written: a terminology's <dnt> tags, removed from its text);
# an error is a Message (errors.py): a door words the settings it names its own way
Line = tuple[str, "list[int] | None", "str | None", list[int], "tuple[tuple[int, int], ...]"]


class Translator(Protocol):
    """What a stream is given (translator.py's Translator): its session, its text policy and the
    one conversion of a text request."""

    session: Any
    policy: TextPolicy

    def request(self, asked: TextRequest) -> Request: ...


class LineStream:
    """Lines in, LineResults out, in input order, through the translator it is given (its text
    policy and its one conversion of a text request)."""

    def __init__(self, translator: "Translator"):
        self.translator, self.policy, self.session = translator, translator.policy, translator.session

    def translate_lines(self, lines: Iterable[str | bytes | tuple], gen: GenerationConfig,
                        batching: Batching | None = None, text: TextOptions | None = None, *,
                        on_batch: Callable[[int, int], None] | None = None,
                        on_warning: Callable[[int, str], None] | None = None) -> Iterator[LineResult]:
        """Translate a stream of lines, yielding a LineResult a line in input order.

        Lines are read `batching.read_ahead` batches' worth at a time (a window; memory holds
        one); a window is sorted by source length, cut into batches (batching.Batching: examples,
        at most batch_size lines, default 32; tokens, at most max_batch_tokens padded source
        tokens; max_rows decoder rows, lines x beams or samples), decoded, and answered in input
        order. A blank line translates to nothing without decoding; a line that cannot be
        translated (not UTF-8, a word outside a vocabulary without <unk>, longer than max_len)
        gets its error and the other lines are translated. `on_batch(lines, tokens)`, when
        given, is called as lines are done: how many, and the target tokens generated for them.
        `on_warning(index, message)`, when given, hears of a line (0-based) most of whose tokens
        are unknown to the source vocabulary, or that was truncated (a line's error and a warning
        are errors.Message: str in Python's words, which a door renders in its own). A line may be a (source,
        target prefix) pair, or, with `text.prefix_column`, a line `source<TAB>target prefix`:
        its translation continues after the prefix. The text options (TextOptions): languages,
        truncation to max_len (else the line fails), scores, unknown replacement (a bundle
        exported --with-attention), a vocabulary map (a bundle exported --with-vocab-map: each
        batch decodes over the target ids its sources allow). Bad settings raise InputError at once."""
        batching = batching or Batching()
        text = text or TextOptions()
        policy = self.policy
        policy.text  # noqa: B018 - a bundle without a tokenizer is refused now
        policy.check_languages(text.src_lang, text.tgt_lang)  # an unknown language is refused at the call
        if text.replace_unknowns:
            policy.check_replace_unknowns()
        text = replace(text, vocab_map=policy.vocab_map(text.vocab_map))  # loaded once, for every batch
        encoded = self.encoded_lines(lines, text, on_warning)
        return (result for window in windows(encoded, lambda e: len(e[1]) if e[1] is not None else 1, batching)
                for result in self.translate_window(window, gen, batching, text, on_batch))

    def encoded_lines(self, lines: Iterable, text: TextOptions,
                      on_warning: Callable[[int, str], None] | None) -> Iterator[Line]:
        """Each line's (text, source ids or None, error or None, target prefix ids)."""
        for index, line in enumerate(lines):
            prefix_text = None
            if isinstance(line, tuple):
                line, prefix_text = line
            elif text.prefix_column:  # source<TAB>prefix, split before decoding: the tab is one byte
                line, _, prefix_text = line.partition(b"\t" if isinstance(line, bytes) else "\t")
                if isinstance(prefix_text, bytes):
                    prefix_text = prefix_text.rstrip(b"\r\n").decode("utf-8", "replace")
                prefix_text = prefix_text.rstrip("\r\n")
            source, ids, error, kept = self.encode_line(line, text)
            prefix: list[int] = []
            if prefix_text and ids is not None:
                try:
                    prefix = self.policy.target_ids(prefix_text)
                except InputError as e:
                    ids, error = None, message(e).after("target prefix: ")
            if ids is not None:  # within max_len: the rule every door shares (TextPolicy.fit)
                try:
                    cut = self.policy.fit(ids, text.truncate)
                except InputError as e:
                    ids, error = None, message(e)
                else:
                    if len(cut) < len(ids) and on_warning is not None:
                        on_warning(index, Message(f"{len(ids)} source tokens cut to the model's max_len {len(cut)} "
                                                  "({truncate})", "truncate"))
                    ids = cut
            if ids is not None and on_warning is not None:
                warning = unknown_warning(self.policy.text, ids)
                if warning:
                    on_warning(index, warning)
            yield source, ids, error, prefix, kept

    def translate_window(self, window: list[Line], gen: GenerationConfig, batching: Batching,
                         text: TextOptions, on_batch: Callable[[int, int], None] | None = None
                         ) -> Iterator[LineResult]:
        """The window's LineResults in input order; its sources decoded in batches of like length."""
        todo = [(i, ids) for i, (_, ids, _, _, _) in enumerate(window) if ids is not None]
        done: dict[int, LineResult] = {}
        per_line = gen.num_beams if gen.strategy == "beam" else gen.num_return_sequences  # decoder rows a line
        for batch in plan([len(ids) for _, ids in todo], batching, per_line):
            rows = [todo[j][0] for j in batch]
            prefixes = [window[i][3] for i in rows]
            asked = TextRequest(tuple(Encoded(window[i][0], window[i][4], tuple(ids))
                                      for i, ids in (todo[j] for j in batch)),
                                tuple(prefixes) if any(prefixes) else None, options=text, generation=gen)
            done.update(zip(rows, self.decode_sources(asked, on_batch)))
        if on_batch is not None and len(todo) < len(window):
            on_batch(len(window) - len(todo), 0)  # blank and failed lines: done without decoding
        n = gen.num_return_sequences
        for i, (source, ids, error, _, _) in enumerate(window):
            if error is not None:
                yield LineResult(source, [], error=error)
            elif ids is None:  # blank: nothing decoded, log-probability 0
                yield LineResult(source, [""] * n, [0.0] * n if text.scores else [],
                                 [[] for _ in range(n)] if text.scores == "tokens" else [])
            else:
                yield done[i]

    def encode_line(self, line: str | bytes, text: TextOptions
                    ) -> tuple[str, list[int] | None, str | None, tuple[tuple[int, int], ...]]:
        """A line's (text, source ids or None, error or None, kept spans): UTF-8 checked, the line
        end dropped, a blank line not encoded; with a terminology, its `<dnt>` tags removed from
        the text and the spans they held kept (text_request.marked)."""
        if isinstance(line, bytes):
            raw = line.rstrip(b"\r\n")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return raw.decode("utf-8", "replace"), None, f"not UTF-8 ({e})", ()
        line = line.rstrip("\r\n")
        if not line.strip():
            return line, None, None, ()
        try:
            source = marked(line, text, "line")
            clean, kept = (source.text, source.kept) if isinstance(source, Marked) else (line, ())
            ids = self.policy.encode_text(clean, text.src_lang, tgt_lang=text.tgt_lang)
        except InputError as e:
            return line, None, message(e), ()
        return clean, ids, None, kept

    def decode_sources(self, asked: TextRequest,
                       on_batch: Callable[[int, int], None] | None = None) -> list[LineResult]:
        """Decode a batch of encoded lines together (its sources Encoded): a LineResult each. With
        replace_unknowns, unknown target tokens are replaced by the source words of the pieces they
        attend to; with a vocabulary map, the batch decodes over the target ids its sources'
        n-grams allow (text_request.convert)."""
        request = self.translator.request(asked)
        result = self.session.run(request)
        if on_batch is not None:
            on_batch(request.batch, int((result.ids != self.policy.pad_id).sum()))  # the pad id is never generated
        texts = asked.texts or []
        return [LineResult(texts[k], r.hypotheses, r.scores, r.token_scores, confidence=r.confidence, unmet=r.unmet,
                           promoted_beams=r.promoted_beams)
                for k, r in enumerate(render(self.policy, asked, request, result))]
