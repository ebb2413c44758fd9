"""Streams of lines translated: the one path of the CLI's `run`, `xform corpus`, `xform.ray`, `eval`
and the translator's `translate_iterable` / `translate_file`.

Lines are read a window at a time (batching.windows), each line's source encoded by the text
policy (a line that cannot be translated keeps its error, the others go on), a window's sources
decoded in batches of like length through the session's one request builder, and each line
answered in input order as a named `LineResult` (request.py), whatever was asked: no tuple whose
shape depends on the options. `TextOptions` (request.py) carries the text settings.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

import numpy as np

from xform.errors import InputError, Message, XformError, message
from xform.runtime.decoding.generation import GenerationConfig
from xform.runtime.decoding.request import LineResult, TextOptions
from xform.runtime.scheduling.batching import Batching, plan, windows
from xform.runtime.text.text_policy import TextPolicy
from xform.runtime.text.unknowns import decode_rows, unknown_warning
from xform.runtime.text.vocab_map import VocabMap

# a line read and encoded: (its text, its source ids or None, its error or None, its target prefix ids);
# an error is a Message (errors.py): a door words the settings it names its own way
Encoded = tuple[str, "list[int] | None", "str | None", list[int]]


class LineStream(TextPolicy):
    """Lines in, LineResults out, in input order, over a Session."""

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
        self.text  # noqa: B018 - a bundle without a tokenizer is refused now
        self.check_languages(text.src_lang, text.tgt_lang)  # an unknown language is refused at the call
        if text.replace_unknowns:
            self.check_replace_unknowns()
        vocab_map = self.vocab_map(text.vocab_map)
        encoded = self.encoded_lines(lines, text, on_warning)
        return (result for window in windows(encoded, lambda e: len(e[1]) if e[1] is not None else 1, batching)
                for result in self.translate_window(window, gen, batching, text, vocab_map, on_batch))

    def encoded_lines(self, lines: Iterable, text: TextOptions,
                      on_warning: Callable[[int, str], None] | None) -> Iterator[Encoded]:
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
            source, ids, error = self.encode_line(line, text.src_lang, text.tgt_lang)
            prefix: list[int] = []
            if prefix_text and ids is not None:
                try:
                    prefix = self.target_ids(prefix_text)
                except InputError as e:
                    ids, error = None, message(e).after("target prefix: ")
            if ids is not None:  # within max_len: the rule every door shares (TextPolicy.fit)
                try:
                    cut = self.fit(ids, text.truncate)
                except InputError as e:
                    ids, error = None, message(e)
                else:
                    if len(cut) < len(ids) and on_warning is not None:
                        on_warning(index, Message(f"{len(ids)} source tokens cut to the model's max_len {len(cut)} "
                                                  "({truncate})", "truncate"))
                    ids = cut
            if ids is not None and on_warning is not None:
                warning = unknown_warning(self.text, ids)
                if warning:
                    on_warning(index, warning)
            yield source, ids, error, prefix

    def translate_window(self, window: list[Encoded], gen: GenerationConfig, batching: Batching,
                         text: TextOptions, vocab_map: VocabMap | None = None,
                         on_batch: Callable[[int, int], None] | None = None) -> Iterator[LineResult]:
        """The window's LineResults in input order; its sources decoded in batches of like length."""
        todo = [(i, ids) for i, (_, ids, _, _) in enumerate(window) if ids is not None]
        done: dict[int, LineResult] = {}
        per_line = gen.num_beams if gen.strategy == "beam" else gen.num_return_sequences  # decoder rows a line
        for batch in plan([len(ids) for _, ids in todo], batching, per_line):
            rows = [todo[j][0] for j in batch]
            prefixes = [window[i][3] for i in rows]
            done.update(zip(rows, self.decode_sources([todo[j][1] for j in batch], gen, text,
                                                       [window[i][0] for i in rows], prefixes if any(prefixes) else
                                                       None, vocab_map, on_batch)))
        if on_batch is not None and len(todo) < len(window):
            on_batch(len(window) - len(todo), 0)  # blank and failed lines: done without decoding
        n = gen.num_return_sequences
        for i, (source, ids, error, _) in enumerate(window):
            if error is not None:
                yield LineResult(source, [], error=error)
            elif ids is None:  # blank: nothing decoded, log-probability 0
                yield LineResult(source, [""] * n, [0.0] * n if text.scores else [],
                                 [[] for _ in range(n)] if text.scores == "tokens" else [])
            else:
                yield done[i]

    def encode_line(self, line: str | bytes, src_lang: str | None = None,
                    tgt_lang: str | None = None) -> tuple[str, list[int] | None, str | None]:
        if isinstance(line, bytes):
            raw = line.rstrip(b"\r\n")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return raw.decode("utf-8", "replace"), None, f"not UTF-8 ({e})"
        line = line.rstrip("\r\n")
        if not line.strip():
            return line, None, None
        try:
            ids = self.encode_text(line, src_lang, tgt_lang=tgt_lang)
        except InputError as e:
            return line, None, message(e)
        return line, ids, None

    def decode_sources(self, sources: list[list[int]], gen: GenerationConfig, text: TextOptions,
                       texts: list[str], target_prefix: list[list[int]] | None = None,
                       vocab_map: VocabMap | None = None,
                       on_batch: Callable[[int, int], None] | None = None) -> list[LineResult]:
        """Decode source id rows together (`texts`: the lines they came from): a LineResult each.
        With text.replace_unknowns, unknown target tokens are replaced by the source words of the
        pieces they attend to; with a vocab_map, the batch decodes over the target ids its
        sources' n-grams allow."""
        vocabulary = None
        if vocab_map is not None:
            if texts is None:
                raise XformError("a vocabulary map chooses a batch's target ids from its sources' texts: none given")
            vocabulary = self.allowed_ids(vocab_map, texts)
        request = self.session.request(*self.session.pad(sources), generation=gen, target_prefix=target_prefix,
                                       return_scores=bool(text.scores), return_token_scores=text.scores == "tokens",
                                       return_attention=text.replace_unknowns, vocabulary=vocabulary)
        result = self.session.run(request)
        rows = result.ids
        if on_batch is not None:
            on_batch(len(sources), int((rows != self.pad_id).sum()))  # the pad id is never generated
        n = gen.num_return_sequences
        decoded = self.decode_rows(rows, n, sources, texts, result.attention if text.replace_unknowns else None)
        scores = [] if result.scores is None else [float(s) for s in result.scores]
        tokens = [] if result.token_scores is None else [
            [float(v) for v, i in zip(tk, r) if i != self.pad_id] for tk, r in zip(result.token_scores, rows)]
        return [LineResult(texts[k], decoded[k * n:(k + 1) * n], scores[k * n:(k + 1) * n], tokens[k * n:(k + 1) * n])
                for k in range(len(sources))]

    def decode_rows(self, rows: np.ndarray, n: int, sources: list[list[int]] | None = None,
                    texts: list[str] | None = None, attention: np.ndarray | None = None) -> list[str]:
        """Text of generated rows, n a source; with `attention`, each unknown target token written
        as the source word of the piece it attends to most (of `sources[k // n]`, as written in `texts`)."""
        framing = {self.pad_id, self.eos_id, self.config.bos_id}
        return decode_rows(self.text, framing, rows, n, sources, texts, attention)
