"""Session: batched decoding over any backend, one loop for every strategy; input checks at the boundary.

`generate` takes right-padded int64 source ids and returns generated ids, padded with the pad id
after each row's end-of-sentence. `translate` adds the bundle's tokenizer. What backend runs the
graphs is not this module's business (backend.py); it never imports torch.
"""
from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from xform.errors import InputError, XformError
from xform.runtime.backend import Backend, Restricting
from xform.runtime.batching import Batching, plan, windows
from xform.runtime.decoding import GenerationConfig, Special, decode_cap, int_id, log_softmax, make_strategy, named
from xform.runtime.scheduler import Batch, Decode
from xform.runtime.vocab_map import VocabMap

GENERATION_FIELDS = {f.name for f in fields(GenerationConfig)}
# one translation of a text: the text; with scores, (text, score); with token scores, (text, score, token log-probs)
Translation = str | tuple[str, float] | tuple[str, float, list[float]]
# generate()'s arguments that are not generation settings (Session.plan)
DECODE_OPTIONS = ("target_prefix", "return_scores", "return_token_scores", "return_attention", "on_step")


class Session:
    def __init__(self, backend: Backend, config: dict[str, Any], tokenizer=None, bundle=None):
        self.backend = backend
        self.config = config
        self.tokenizer = tokenizer
        self.bundle = bundle
        self.pad_id, self.eos_id = config["pad_id"], config["eos_id"]
        start = config.get("decoder_start_id")
        self.start_id = config["bos_id"] if start is None else start
        self.special = Special.from_config(config)
        # decoding defaults the bundle records (a Marian model's generation_config); greedy if none
        self.generation_defaults = dict(bundle.manifest.generation if bundle is not None else {})

    @property
    def backend_name(self) -> str:
        return self.backend.name

    def prepare(self, src_ids, src_lengths=None) -> tuple[np.ndarray, np.ndarray]:
        """Check the source batch; derive lengths from the pad id when not given."""
        if not isinstance(src_ids, np.ndarray):
            raise InputError(f"src_ids must be a numpy int64 array (batch, src_len), got {type(src_ids).__name__}")
        if src_ids.dtype != np.int64:
            raise InputError(f"src_ids must have dtype int64, got {src_ids.dtype}; use src_ids.astype(np.int64)")
        if src_ids.ndim != 2:
            raise InputError(f"src_ids must be 2-D (batch, src_len), got shape {src_ids.shape}")
        B, S = src_ids.shape
        if B == 0:
            raise InputError("src_ids is an empty batch (batch size 0); give at least one source")
        if S == 0:
            raise InputError("src_ids has src_len 0; every source needs at least one token")
        max_len, vocab = self.config["max_len"], self.config["src_vocab_size"]
        if S > max_len:
            raise InputError(f"src_ids has src_len {S}, longer than the model's max_len {max_len}")
        bad = np.argwhere((src_ids < 0) | (src_ids >= vocab))
        if len(bad):
            r, c = bad[0]
            raise InputError(f"src_ids[{r}, {c}] = {src_ids[r, c]} is outside the source vocabulary [0, {vocab})")
        if src_lengths is None:
            is_pad = src_ids == self.pad_id
            src_lengths = np.where(is_pad.any(1), is_pad.argmax(1), S).astype(np.int64)
            after = np.arange(S)[None, :] >= src_lengths[:, None]
            holes = np.argwhere(after & ~is_pad)
            if len(holes):
                r = holes[0][0]
                raise InputError(f"src_ids row {r} is not right-padded: a token follows the pad id "
                                 f"{self.pad_id} at column {src_lengths[r]}; pass src_lengths explicitly")
        else:
            if not isinstance(src_lengths, np.ndarray) or src_lengths.dtype != np.int64 or src_lengths.shape != (B,):
                raise InputError(f"src_lengths must be an int64 numpy array of shape ({B},), got "
                                 f"{getattr(src_lengths, 'dtype', type(src_lengths).__name__)} "
                                 f"{getattr(src_lengths, 'shape', '')}")
            if (src_lengths > S).any():
                r = int(np.argmax(src_lengths > S))
                raise InputError(f"src_lengths[{r}] = {src_lengths[r]} exceeds src_len {S}")
        if (src_lengths < 1).any():
            r = int(np.argmax(src_lengths < 1))
            raise InputError(f"source row {r} is empty (length 0); every source needs at least one token")
        return src_ids, src_lengths

    def generation_config(self, max_new_tokens: int | None = None, names: Mapping[str, str] | None = None,
                          **settings: Any) -> GenerationConfig:
        """The bundle's defaults (greedy unless its manifest records others), updated by `settings`
        (None keeps a default); checked against the model's max_len and target vocabulary. Errors
        name the settings by `names` (decoding.named: None, the CLI's flags)."""
        gen = GenerationConfig(**{k: v for k, v in self.generation_defaults.items() if k in GENERATION_FIELDS})
        gen = gen.updated(max_new_tokens=max_new_tokens, names=names, **settings)
        if gen.max_new_tokens > self.config["max_len"]:
            raise InputError(f"max_new_tokens {gen.max_new_tokens} exceeds the model's max_len "
                             f"{self.config['max_len']}")
        vocab = self.config["tgt_vocab_size"]
        if gen.forced_bos_token_id is not None and gen.forced_bos_token_id >= vocab:
            raise InputError(f"forced_bos_token_id {gen.forced_bos_token_id} is outside the target vocabulary "
                             f"of {vocab}")
        for name, ids in (("bad_words_ids", [i for w in gen.bad_words_ids for i in w]),
                          ("suppress_tokens", gen.suppress_tokens)):
            outside = sorted({i for i in ids if i >= vocab})
            if outside:
                raise InputError(f"{named(name, names)}: ids {outside[:5]} are outside the target vocabulary "
                                 f"of {vocab}")
        return gen

    def default_max_new_tokens(self) -> int:
        """The bundle's decode cap (decoding.decode_cap): set at export, else the model's
        max_length - 1, else 256; never beyond max_len."""
        return decode_cap(self.generation_defaults, self.config["max_len"])[0]

    def generate(self, src_ids, src_lengths=None, max_new_tokens: int | None = None,
                 min_new_tokens: int | None = None, *,
                 num_beams: int | None = None, length_penalty: float | None = None,
                 early_stopping: bool | str | None = None, num_return_sequences: int | None = None,
                 do_sample: bool | None = None, temperature: float | None = None, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None, forced_bos_token_id: int | None = None,
                 repetition_penalty: float | None = None, no_repeat_ngram_size: int | None = None,
                 bad_words_ids: list[list[int]] | None = None, suppress_tokens: list[int] | None = None,
                 return_alternatives: bool | None = None, target_prefix: list[list[int]] | None = None,
                 vocabulary=None, return_scores: bool = False, return_token_scores: bool = False,
                 return_attention: bool = False, on_step: Callable[[int], None] | None = None):
        """(B x num_return_sequences, n) int64 generated ids, no start token, pad after end-of-sentence;
        with return_scores, also their scores (float32: beam search's length-penalized sum of
        log-probs, else the sum of log-probs); with return_token_scores, also each token's
        log-prob (B x num_return_sequences, n), 0 in a prefix and after the end; with
        return_attention, last, each token's attention over the source (B x num_return_sequences,
        n, src_len): the cross-attention of the decoder layer the bundle was exported with
        (--with-attention), averaged over heads, 0 after the end. Unset settings take
        the bundle's defaults (max_new_tokens: the bundle's cap, decoding.decode_cap: 256 unless
        the bundle or the model sets one).

        `target_prefix`: one id list a source (empty allowed): decoding continues after it and the
        returned ids begin with it, as CTranslate2's hypotheses do; max_new_tokens and
        min_new_tokens count after it, as transformers' generate(decoder_input_ids=[start] +
        prefix) does. `return_alternatives` with num_return_sequences n: the n best tokens at the
        first position after the prefix, each continued greedily. repetition_penalty,
        no_repeat_ngram_size, bad_words_ids (sequences, besides the pad and the model's banned ids)
        and suppress_tokens act as transformers' processors of those names. `vocabulary` (target
        ids; a bundle exported --with-vocab-map, ort backend): the output projection runs over
        those ids (and end-of-sentence, unknown, forced and prefix ids) only, the others never
        generated: the full model's tokens with every other id's logit masked."""
        src_ids, src_lengths = self.prepare(src_ids, src_lengths)
        if max_new_tokens is None:
            max_new_tokens = self.default_max_new_tokens()
        gen = self.generation_config(max_new_tokens, min_new_tokens=min_new_tokens, num_beams=num_beams,
                                     length_penalty=length_penalty, early_stopping=early_stopping,
                                     num_return_sequences=num_return_sequences, do_sample=do_sample,
                                     temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                     forced_bos_token_id=forced_bos_token_id,
                                     repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
                                     bad_words_ids=bad_words_ids, suppress_tokens=suppress_tokens,
                                     return_alternatives=return_alternatives)
        return self.decode(src_ids, src_lengths, gen, return_scores, on_step, target_prefix=target_prefix,
                           return_token_scores=return_token_scores, return_attention=return_attention,
                           vocabulary=vocabulary)

    def check_prefix(self, target_prefix, batch: int, gen: GenerationConfig) -> list[list[int]] | None:
        """The target prefixes as id lists, checked: one a source, ids in the target vocabulary,
        shorter than the position table (max_new_tokens is cut to what remains of it)."""
        if target_prefix is None:
            return None
        if isinstance(target_prefix, (str, bytes)) or not hasattr(target_prefix, "__len__"):
            raise InputError("target_prefix must be a list of id lists, one a source, got "
                             f"{type(target_prefix).__name__}")
        if len(target_prefix) != batch:
            raise InputError(f"target_prefix has {len(target_prefix)} entries for {batch} sources: give one a "
                             "source (an empty list for none)")
        vocab, out = self.config["tgt_vocab_size"], []
        for i, p in enumerate(target_prefix):
            try:
                ids = [int_id(x) for x in p]
            except (TypeError, ValueError) as e:
                raise InputError(f"target_prefix[{i}]: expected a list of token ids, got {p!r} ({e})") from None
            outside = [x for x in ids if x >= vocab]
            if outside:
                raise InputError(f"target_prefix[{i}]: id {outside[0]} is outside the target vocabulary of {vocab}")
            out.append(ids)
        longest = max((len(p) for p in out), default=0)
        if longest >= self.config["max_len"]:
            raise InputError(f"target_prefix of {longest} tokens leaves no room in the model's max_len "
                             f"{self.config['max_len']} positions")
        return out

    def plan(self, src_ids, src_lengths=None, max_new_tokens: int | None = None, **settings: Any) -> Decode:
        """A checked request for a Batch or the Scheduler: the arguments of `generate` but
        `vocabulary` (a restriction holds for a whole batch, so it decodes alone: `generate`)."""
        options = {k: settings.pop(k) for k in DECODE_OPTIONS if k in settings}
        unknown = sorted(set(settings) - GENERATION_FIELDS)
        if unknown:
            known = sorted(GENERATION_FIELDS | set(DECODE_OPTIONS))
            raise InputError(f"unknown decoding settings {unknown}; known: {known}")
        src_ids, src_lengths = self.prepare(src_ids, src_lengths)
        if max_new_tokens is None:
            max_new_tokens = self.default_max_new_tokens()
        gen = self.generation_config(max_new_tokens, **settings)
        return self.decode_item(src_ids, src_lengths, gen, **options)

    def decode_item(self, src_ids, src_lengths, gen: GenerationConfig, return_scores: bool = False,
                    on_step: Callable[[int], None] | None = None, *, target_prefix=None,
                    return_token_scores: bool = False, return_attention: bool = False) -> Decode:
        """The request `decode` runs: sources checked, the prefix (after a forced first token),
        max_new_tokens cut to the position table, the strategy made."""
        src_ids, src_lengths = self.prepare(src_ids, src_lengths)
        prefix = self.check_prefix(target_prefix, src_ids.shape[0], gen)
        if gen.forced_bos_token_id is not None and (prefix is not None or gen.return_alternatives):
            # the forced first token (a target language) heads the prefix: what follows it is free
            prefix = [[gen.forced_bos_token_id] + p for p in (prefix or [[]] * src_ids.shape[0])]
            gen = replace(gen, forced_bos_token_id=None)
        room = self.config["max_len"] - max((len(p) for p in prefix or []), default=0)
        if gen.max_new_tokens > room:  # the position table ends there, whatever was asked
            gen = replace(gen, max_new_tokens=room, min_new_tokens=min(gen.min_new_tokens, room))
        want = return_scores or return_token_scores
        if return_attention and not getattr(self.backend, "has_attention", False):
            raise InputError("return_attention (--replace-unknowns): this bundle's decoder returns no attention; "
                             "export it with --with-attention")
        strategy = make_strategy(src_ids.shape[0], gen, self.special, want, prefix, self.start_id,
                                 src_ids.shape[1] if return_attention else 0)
        limit = getattr(self.backend, "max_rows", None)
        if limit is not None and strategy.rows > limit:
            raise InputError(f"batch {src_ids.shape[0]} x {gen.strategy} width "
                             f"{strategy.rows // src_ids.shape[0]} (--num-beams / --num-return-sequences) = "
                             f"{strategy.rows} rows exceeds the engines' profile batch {limit}; rebuild them "
                             "with a larger --max-batch or --max-beams")
        return Decode(strategy, src_ids, src_lengths, return_scores, return_token_scores, return_attention, on_step)

    def decode(self, src_ids, src_lengths, gen: GenerationConfig, return_scores: bool = False,
               on_step: Callable[[int], None] | None = None, *, target_prefix=None, return_token_scores: bool = False,
               return_attention: bool = False, vocabulary=None):
        """The one decoding loop, for every strategy and backend: one request through a Batch
        (scheduler.py) from its first step to its last. The strategy's row index (`beam_idx`)
        reorders the backend's rows for beam search and drops finished ones, so the rows run per
        step fall as sources end."""
        item = self.decode_item(src_ids, src_lengths, gen, return_scores, on_step, target_prefix=target_prefix,
                                return_token_scores=return_token_scores, return_attention=return_attention)
        restricted: Restricting | None = None
        if vocabulary is not None:
            if return_attention:
                raise InputError("vocabulary restriction and attention (--replace-unknowns) together: the restricted "
                                 "decoder returns no attention")
            prefix = item.strategy.prefix  # the checked prefix table: its ids are always allowed
            restricted = self.restrict(vocabulary, gen, [[int(i) for i in row if i >= 0] for row in prefix])
        try:
            batch = Batch(self.backend, self.start_id)
            batch.admit(item)
            while not item.done:
                batch.step()
            return item.output
        finally:
            if restricted is not None:
                restricted.restrict(None)

    def restrict(self, vocabulary, gen: GenerationConfig, prefix: list[list[int]] | None) -> Restricting:
        """Point the backend at `vocabulary` (target ids) and the ids a decode always needs; returns it."""
        backend = self.backend
        if not (isinstance(backend, Restricting) and backend.has_restriction):
            raise InputError("vocabulary: a restriction needs the restricted decoder on the ort backend: export the "
                             "bundle with --with-vocab-map and run it with --backend ort")
        try:
            ids = np.unique(np.asarray(vocabulary, dtype=np.int64).reshape(-1))
        except (TypeError, ValueError) as e:
            raise InputError(f"vocabulary: expected target ids, got {vocabulary!r} ({e})") from None
        vocab = self.config["tgt_vocab_size"]
        if len(ids) and (ids[0] < 0 or ids[-1] >= vocab):
            raise InputError(f"vocabulary: ids outside the target vocabulary of {vocab}")
        needed = {self.eos_id, *[i for p in prefix or [] for i in p]}
        if gen.forced_bos_token_id is not None:
            needed.add(gen.forced_bos_token_id)
        unk = getattr(self.tokenizer, "target_unk_id", None)
        if unk is not None:
            needed.add(unk)
        backend.restrict(np.union1d(ids, np.array(sorted(needed), np.int64)))
        return backend

    def teacher_forced(self, src_ids, src_lengths, tokens: np.ndarray, min_new_tokens: int = 0
                       ) -> tuple[np.ndarray, np.ndarray]:
        """Feed `tokens` (B, n) step by step; return this backend's choices (B, n) and logits (B, n, V)."""
        src_ids, src_lengths = self.prepare(src_ids, src_lengths)
        self.backend.start(src_ids, src_lengths)
        feed = np.concatenate([np.full((tokens.shape[0], 1), self.start_id, np.int64), tokens[:, :-1]], 1)
        choices: list[np.ndarray] = []
        logits: list[np.ndarray] = []
        for step in range(tokens.shape[1]):
            nxt, lg = self.backend.step(np.ascontiguousarray(feed[:, step]), min_new_tokens, want_logits=True)
            if lg is None:
                raise XformError(f"the {self.backend.name} backend returned no logits, though asked for them")
            choices.append(nxt)
            logits.append(lg)
        return np.stack(choices, 1), np.stack(logits, 1)

    def score(self, src_ids, tgt_ids, src_lengths=None) -> dict[str, np.ndarray]:
        """The log-likelihood of given translations, teacher-forced: `tgt_ids` (B, n) right-padded
        with the pad id, each row ending with end-of-sentence as the model generates it. Returns
        `tokens` (B, n) float32: each target token's log-probability (0 after the row), `total`
        (B,) their sum, `lengths` (B,) and `normalized` (B,) the sum over the length: what users
        filter parallel data and rerank by. transformers' loss on the same pairs is the mean of
        -tokens over the rows' tokens."""
        tgt = np.asarray(tgt_ids)
        if tgt.ndim != 2 or tgt.dtype != np.int64 or tgt.shape[1] == 0:
            raise InputError(f"target ids: expected a non-empty (batch, length) int64 array, found {tgt.dtype} "
                             f"{tgt.shape}")
        if ((tgt < 0) | (tgt >= self.config["tgt_vocab_size"])).any():
            raise InputError(f"target ids: outside the target vocabulary of {self.config['tgt_vocab_size']}")
        if tgt.shape[1] > self.config["max_len"]:
            raise InputError(f"target ids: {tgt.shape[1]} positions, more than the model's max_len "
                             f"{self.config['max_len']}")
        _, logits = self.teacher_forced(src_ids, src_lengths, tgt)
        lp = log_softmax(logits)
        tokens = np.take_along_axis(lp, tgt[:, :, None], 2)[:, :, 0].astype(np.float32)
        valid = tgt != self.pad_id
        tokens = np.where(valid, tokens, np.float32(0.0))
        lengths = valid.sum(1)
        total = tokens.sum(1, dtype=np.float32)
        return {"tokens": tokens, "total": total, "lengths": lengths,
                "normalized": (total / np.maximum(lengths, 1)).astype(np.float32)}

    def encode_texts(self, texts: list[str], src_lang: str | None = None, tgt_lang: str | None = None) -> np.ndarray:
        if self.tokenizer is None:
            raise XformError("this bundle has no tokenizer; pass token ids to generate() instead of text")
        if not texts:
            raise InputError("no text to translate (an empty batch)")
        return self.pad([self.encode_text(t, src_lang, tgt_lang=tgt_lang) for t in texts])[0]

    def encode_text(self, text: str, src_lang: str | None = None, flag: str = "--src-lang",
                    tgt_lang: str | None = None, tgt_flag: str = "--tgt-lang") -> list[int]:
        """Source ids of a text; `src_lang` names its language for a multilingual model's tokenizer
        (`flag`: how an error names it, the CLI's flag or a front door's own name). `tgt_lang`
        matters only where the target language is written into the source (MADLAD-400's <2xx>
        token: the tokenizer's `target_in_source`); elsewhere it is the forced first target token
        (target_language)."""
        if getattr(self.tokenizer, "target_in_source", False):
            if src_lang is not None:
                raise InputError(f"{flag} {src_lang}: this model takes no source language (its target language "
                                 f"goes into the source: {tgt_flag})")
            return self.tokenizer.encode(text, tgt_lang, tgt_flag)
        if not getattr(self.tokenizer, "languages", None):
            if src_lang is not None:
                raise InputError(f"{flag} {src_lang}: this model's tokenizer has no languages")
            return self.tokenizer.encode(text)
        return self.tokenizer.encode(text, src_lang, flag)

    def check_src_lang(self, src_lang: str, flag: str = "--src-lang") -> None:
        """Refuse (InputError, with the known ones) a source language this tokenizer lacks, before
        any text is read."""
        self.encode_text("", src_lang, flag)

    def target_ids(self, text: str) -> list[int]:
        """A text's target ids, nothing added (a prefix, a bad word)."""
        if self.tokenizer is None:
            raise XformError("this bundle has no tokenizer; give target ids instead of text")
        return self.tokenizer.target_ids(text)

    def encode_target(self, text: str, tgt_lang: str | None = None) -> list[int]:
        """The ids of a reference translation as the model would generate them: the forced first
        token (a target language, BART's <s>) if the decode has one, the text's ids,
        end-of-sentence. What transformers' tokenizer gives for text_target."""
        forced = self.target_language(tgt_lang)
        if forced is None:
            forced = self.generation_defaults.get("forced_bos_token_id")
        return ([forced] if forced is not None else []) + self.target_ids(text) + [self.eos_id]

    def target_language(self, tgt_lang: str | None, flag: str = "--tgt-lang") -> int | None:
        """The forced first token for `tgt_lang` (a multilingual model's target language), else
        the tokenizer's default target language's, else None (the bundle's default applies). A
        multilingual model with neither, and no recorded forced token, is refused with its languages
        (`flag`: how the error names tgt_lang)."""
        languages = getattr(self.tokenizer, "languages", None)
        if not languages:
            if tgt_lang is not None:
                raise InputError(f"{flag} {tgt_lang}: this model's tokenizer has no languages")
            return None
        if getattr(self.tokenizer, "target_in_source", False):  # MADLAD: a source token, not a first target token
            if tgt_lang is not None:
                self.tokenizer.language_token(tgt_lang, flag)  # an unknown code is refused here
            return None
        code = tgt_lang or self.tokenizer.tgt_lang
        if code is not None:
            return self.tokenizer.language_id(code, flag)
        if self.generation_defaults.get("forced_bos_token_id") is None:
            raise InputError(f"this model translates into the language {flag} names; known: "
                             f"{', '.join(self.tokenizer.codes)}")
        return None

    def pad(self, rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Id rows as a right-padded int64 batch and its lengths."""
        src = np.full((len(rows), max(len(r) for r in rows)), self.pad_id, np.int64)
        for i, r in enumerate(rows):
            src[i, :len(r)] = r
        return src, np.array([len(r) for r in rows], np.int64)

    def translate_lines(self, lines: Iterable[str | bytes], gen: GenerationConfig, batch_size: int | None = None, *,
                        batch_type: str = "examples", max_batch_tokens: int | None = None, read_ahead: int = 8,
                        max_rows: int | None = None, on_batch: Callable[[int, int], None] | None = None,
                        on_warning: Callable[[int, str], None] | None = None, return_scores: bool | str = False,
                        src_lang: str | None = None, truncate: bool = False, prefix_column: bool = False,
                        replace_unknowns: bool = False, vocab_map: "VocabMap | str | Path | None" = None,
                        tgt_lang: str | None = None) -> Iterator[tuple[str, list | None, str | None]]:
        """Translate a stream of lines, yielding in input order, for each line: (its text, its
        translations (num_return_sequences of them) or None, an error or None).

        Lines are read `read_ahead` batches' worth at a time (a window; memory holds one); a
        window is sorted by source length, cut into batches (`batch_type` examples: `batch_size`
        lines, default 32; tokens: at most `max_batch_tokens` padded source tokens, see
        batching.Batching; `max_rows`: decoder rows, lines x beams or samples, default
        batching.DEFAULT_MAX_ROWS), decoded, and its results yielded in input order. A blank line
        translates to nothing without decoding; a line that cannot be translated (not UTF-8, a
        word outside a vocabulary without <unk>, longer than max_len) gets its error and the
        other lines are translated. `on_batch(lines, tokens)`, when given, is called as lines
        are done: how many, and the target tokens generated for them. `on_warning(index, message)`,
        when given, hears of a line (0-based) most of whose tokens are unknown to the source
        vocabulary: it is translated, but likely not in the model's language or tokenization.
        With return_scores, each translation is a (text, score) pair, the score as generate()
        returns it; with return_scores "tokens", a (text, score, token log-probs) triple. A line
        may be a (source, target prefix) pair, or, with `prefix_column`, a line
        `source<TAB>target prefix`: its translation continues after the prefix (an empty prefix
        is none). With `replace_unknowns`, an unknown target token (<unk>) becomes the source
        word of the piece it attends to most (a bundle exported --with-attention; CTranslate2's
        replace_unknowns). With a `vocab_map` (a VocabMap or its file; a bundle exported
        --with-vocab-map), each batch decodes over the target ids its sources allow. A line of
        more source tokens than max_len fails alone, or with `truncate` is cut to max_len (its
        first max_len - 1 tokens and end-of-sentence, as CTranslate2's max_input_length does) and
        reported through `on_warning`. `tgt_lang`: a target language written into each source
        (MADLAD-400's <2xx>; a forced first token is the caller's `gen`). Bad settings raise
        InputError at once."""
        if self.tokenizer is None:
            raise XformError("this bundle has no tokenizer; pass token ids to generate() instead of text")
        batching = Batching(batch_type, batch_size, max_batch_tokens, read_ahead, max_rows)  # checked now
        if src_lang is not None or tgt_lang is not None:  # an unknown language is refused at the call
            self.encode_text("", src_lang, tgt_lang=tgt_lang)
        if replace_unknowns:
            self.check_replace_unknowns()
        vocab_map = self.vocab_map(vocab_map)
        return self.translate_windows(lines, gen, batching, on_batch, on_warning, return_scores, src_lang, truncate,
                                      prefix_column, replace_unknowns, vocab_map, tgt_lang)

    def vocab_map(self, vocab_map: "VocabMap | str | Path | None") -> VocabMap | None:
        """A vocabulary map (or the path of one) checked against this bundle: it needs the
        restricted decoder (export --with-vocab-map) and a tokenizer."""
        if vocab_map is None:
            return None
        if not getattr(self.backend, "has_restriction", False):
            raise InputError("a vocabulary map needs the restricted decoder on the ort backend: export the bundle "
                             "with --with-vocab-map and run it with --backend ort")
        if self.tokenizer is None or not hasattr(self.tokenizer, "target_vocabulary"):
            raise InputError("a vocabulary map names tokens: this bundle has no tokenizer to read them")
        if not isinstance(vocab_map, VocabMap):
            vocab_map = VocabMap.load(vocab_map, self.tokenizer.target_vocabulary())
        return vocab_map

    def check_replace_unknowns(self, flag: str = "--replace-unknowns") -> None:
        """Refuse replace_unknowns (named `flag` in the error) on a bundle that cannot do it."""
        if not getattr(self.backend, "has_attention", False):
            raise InputError(f"{flag} needs the decoder's attention: export the bundle with --with-attention")
        if getattr(self.tokenizer, "target_unk_id", None) is None:
            raise InputError(f"{flag}: this bundle's target vocabulary has no unknown token")

    def translate_windows(self, lines: Iterable, gen: GenerationConfig, batching: Batching,
                          on_batch: Callable[[int, int], None] | None = None,
                          on_warning: Callable[[int, str], None] | None = None, return_scores: bool | str = False,
                          src_lang: str | None = None, truncate: bool = False, prefix_column: bool = False,
                          replace_unknowns: bool = False, vocab_map: VocabMap | None = None,
                          tgt_lang: str | None = None):
        def encoded():
            for index, line in enumerate(lines):
                prefix_text = None
                if isinstance(line, tuple):
                    line, prefix_text = line
                elif prefix_column:  # source<TAB>prefix, split before decoding: the tab is one byte
                    line, _, prefix_text = line.partition(b"\t" if isinstance(line, bytes) else "\t")
                    if isinstance(prefix_text, bytes):
                        prefix_text = prefix_text.rstrip(b"\r\n").decode("utf-8", "replace")
                    prefix_text = prefix_text.rstrip("\r\n")
                text, ids, error = self.encode_line(line, src_lang, tgt_lang)
                prefix: list[int] = []
                if prefix_text and ids is not None:
                    try:
                        prefix = self.target_ids(prefix_text)
                    except InputError as e:
                        ids, error = None, f"target prefix: {e}"
                if ids is not None and len(ids) > self.config["max_len"]:
                    if truncate:
                        n = len(ids)
                        ids = self.truncated(ids)
                        if on_warning is not None:
                            on_warning(index, f"{n} source tokens cut to the model's max_len {len(ids)} (--truncate)")
                    else:
                        error = (f"{len(ids)} source tokens (end-of-sentence included), more than the "
                                 f"model's max_len {self.config['max_len']} (--truncate cuts such lines)")
                        ids = None
                if ids is not None and on_warning is not None:
                    warning = self.unknown_warning(ids)
                    if warning:
                        on_warning(index, warning)
                yield text, ids, error, prefix

        for window in windows(encoded(), lambda e: len(e[1]) if e[1] is not None else 1, batching):
            yield from self.translate_window(window, gen, batching, on_batch, return_scores, replace_unknowns,
                                             vocab_map)

    def translate_window(self, window: list[tuple[str, list[int] | None, str | None, list[int]]],
                         gen: GenerationConfig, batching: Batching, on_batch: Callable[[int, int], None] | None = None,
                         return_scores: bool | str = False, replace_unknowns: bool = False,
                         vocab_map: VocabMap | None = None):
        """The window's (text, translations or None, error or None) in input order; its sources
        decoded in batches of like length."""
        todo = [(i, ids) for i, (_, ids, _, _) in enumerate(window) if ids is not None]
        done: dict[int, list[Translation]] = {}
        per_line = gen.num_beams if gen.strategy == "beam" else gen.num_return_sequences  # decoder rows a line
        for batch in plan([len(ids) for _, ids in todo], batching, per_line):
            rows = [todo[j][0] for j in batch]
            prefixes = [window[i][3] for i in rows]
            texts = [window[i][0] for i in rows]
            done.update(zip(rows, self.translate_batch([todo[j][1] for j in batch], gen, on_batch, return_scores,
                                                       prefixes if any(prefixes) else None, texts, replace_unknowns,
                                                       vocab_map)))
        if on_batch is not None and len(todo) < len(window):
            on_batch(len(window) - len(todo), 0)  # blank and failed lines: done without decoding
        n = gen.num_return_sequences
        # nothing decoded: log-probability 0
        nothing: Translation = ("", 0.0, []) if return_scores == "tokens" else ("", 0.0) if return_scores else ""
        blank = [nothing] * n
        for i, (text, ids, error, _) in enumerate(window):
            yield text, done[i] if ids is not None else None if error else blank, error

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
            return line, None, str(e)
        return line, ids, None

    def truncated(self, ids: list[int]) -> list[int]:
        """A source cut to max_len: its first max_len - 1 ids and end-of-sentence."""
        n = self.config["max_len"]
        return ids[:n - 1] + [self.eos_id] if ids[-1] == self.eos_id else ids[:n]

    def unknown_warning(self, ids: list[int]) -> str | None:
        """A warning when more than half of an encoded source's text tokens are unknown, else None."""
        unknown, total = self.tokenizer.unknown(ids)
        if total and unknown * 2 > total:
            return (f"{unknown} of its {total} source tokens are unknown to the vocabulary: is it in the model's "
                    "source language, and does export's 'text in' line show the right tokenization?")
        return None

    def translate_batch(self, sources: list[list[int]], gen: GenerationConfig,
                        on_batch: Callable[[int, int], None] | None = None, return_scores: bool | str = False,
                        target_prefix: list[list[int]] | None = None, texts: list[str] | None = None,
                        replace_unknowns: bool = False, vocab_map: VocabMap | None = None) -> list[list[Translation]]:
        """Decode source id rows together: for each, its num_return_sequences translations (with
        return_scores, (text, score) pairs; "tokens": (text, score, token log-probs)). Given the
        sources' `texts`: with replace_unknowns, unknown target tokens are replaced by the source
        words of the pieces they attend to; with a vocab_map, the batch decodes over the target ids its
        sources' n-grams allow."""
        vocabulary = None
        if vocab_map is not None:
            if texts is None:
                raise XformError("a vocabulary map chooses a batch's target ids from its sources' texts: none given")
            vocabulary = self.allowed_ids(vocab_map, texts)
        result = self.decode(*self.pad(sources), gen, return_scores=bool(return_scores), target_prefix=target_prefix,
                             return_token_scores=return_scores == "tokens", return_attention=replace_unknowns,
                             vocabulary=vocabulary)
        rows = result[0] if isinstance(result, tuple) else result
        if on_batch is not None:
            on_batch(len(sources), int((rows != self.pad_id).sum()))  # the pad id is never generated
        n = gen.num_return_sequences
        decoded = self.decode_rows(rows, n, sources, texts, result[-1] if replace_unknowns else None)
        out: list[Translation]
        if return_scores == "tokens":
            scores, tokens = result[1], result[2]
            out = [(t, float(sc), [float(v) for v, i in zip(tk, r) if i != self.pad_id])
                   for t, sc, tk, r in zip(decoded, scores, tokens, rows)]
        elif return_scores:
            out = [(t, float(sc)) for t, sc in zip(decoded, result[1])]
        else:
            out = list(decoded)
        return [out[i * n:(i + 1) * n] for i in range(len(sources))]

    def allowed_ids(self, vocab_map: VocabMap, texts: list[str]) -> np.ndarray:
        """The target ids a vocabulary map allows a batch of source texts."""
        return vocab_map.ids_for([self.tokenizer.source_pieces(t) for t in texts])

    def decode_rows(self, rows: np.ndarray, n: int, sources: list[list[int]] | None = None,
                    texts: list[str] | None = None, attention: np.ndarray | None = None) -> list[str]:
        """Text of generated rows, n a source; with `attention`, each unknown target token written
        as the source word of the piece it attends to most (of `sources[k // n]`, as written in `texts`)."""
        if attention is None:
            return [self.tokenizer.decode(r) for r in rows]
        if sources is None:
            raise XformError("unknown tokens are replaced by source pieces: the rows' source ids are needed")
        return [self.tokenizer.decode(r, self.unknown_replacements(r, attention[k], sources[k // n],
                                                                   texts[k // n] if texts else None))
                for k, r in enumerate(rows)]

    def unknown_replacements(self, ids: np.ndarray, attention: np.ndarray, source: list[int],
                             text: str | None = None) -> dict[int, str]:
        """For each unknown target token of `ids` (its position), the source word whose token it
        attends to most, among the source's text tokens (not its language code or end-of-sentence):
        all the word's pieces (a sentencepiece word: from the piece that starts it to the next
        word's), as written in the source `text` when given (a word the vocabulary lacks is copied
        whole), else the vocabulary's pieces. Unknowns in a row aligned to one word copy it once."""
        unk = self.tokenizer.target_unk_id
        where = np.flatnonzero(ids == unk)
        if not len(where):
            return {}
        framing = {self.pad_id, self.eos_id, self.config["bos_id"]} | set(getattr(self.tokenizer, "skip", ()))
        body = [i not in framing for i in source] + [False] * (attention.shape[1] - len(source))
        if not any(body):
            return {}
        weights = np.where(np.array(body)[None, :], attention[where], -1.0)
        pieces = None
        if text is not None and hasattr(self.tokenizer, "source_pieces"):
            pieces = self.tokenizer.source_pieces(text)
            pieces = pieces if len(pieces) == len(source) else None  # a truncated source: the vocabulary's
        if pieces is None:
            pieces = [self.tokenizer.source_piece(i) for i in source]
        marked = getattr(self.tokenizer, "spm_words", False)
        out: dict[int, str] = {}
        previous = None
        for t, j in zip(where.tolist(), weights.argmax(1).tolist()):
            span = word_span(pieces, body, j) if marked else (j, j + 1)
            out[t] = "" if previous == (t - 1, span) else "".join(pieces[span[0]:span[1]])
            previous = (t, span)
        return out

    def translate(self, texts: list[str], max_new_tokens: int | None = None, *, src_lang: str | None = None,
                  tgt_lang: str | None = None, replace_unknowns: bool = False,
                  vocab_map: "VocabMap | str | Path | None" = None, **settings: Any) -> list[str]:
        """Translations in input order; with num_return_sequences n, n per text, one after another.
        `settings` are generate()'s keywords (num_beams, length_penalty, do_sample, ...);
        `src_lang` / `tgt_lang` are a multilingual model's language codes (NLLB's "fra_Latn", mBART-50's
        "fr_XX", M2M100's "fr"), the target's becoming the forced first token."""
        if settings.get("forced_bos_token_id") is None:
            settings["forced_bos_token_id"] = self.target_language(tgt_lang)
        elif tgt_lang is not None:
            raise InputError("tgt_lang and forced_bos_token_id both name the first token: give one")
        # text where ids go: a prefix or a bad word as the target tokenizer splits it
        if settings.get("target_prefix") is not None:
            settings["target_prefix"] = [self.target_ids(p) if isinstance(p, str) else p
                                         for p in settings["target_prefix"]]
        if settings.get("bad_words_ids") is not None:
            settings["bad_words_ids"] = [self.target_ids(w) if isinstance(w, str) else w
                                         for w in settings["bad_words_ids"]]
        src = self.encode_texts(list(texts), src_lang, tgt_lang)
        vocab_map = self.vocab_map(vocab_map)
        if vocab_map is not None:
            settings["vocabulary"] = self.allowed_ids(vocab_map, texts)
        if replace_unknowns:
            self.check_replace_unknowns()
            out, attention = self.generate(src, max_new_tokens=max_new_tokens, return_attention=True, **settings)
            sources = [[int(i) for i in row if i != self.pad_id] for row in src]
            return self.decode_rows(out, len(out) // len(src), sources, list(texts), attention)
        out = self.generate(src, max_new_tokens=max_new_tokens, **settings)
        return [self.tokenizer.decode(row) for row in out]


def word_span(pieces: list[str], body: list[bool], j: int) -> tuple[int, int]:
    """[start, end) of the sentencepiece word holding piece j: back to the piece that starts it
    (U+2581 first), on to the next such piece, within the text's pieces (`body`)."""
    start, end = j, j + 1
    while start > 0 and body[start - 1] and not pieces[start].startswith("\u2581"):
        start -= 1
    while end < len(pieces) and body[end] and not pieces[end].startswith("\u2581"):
        end += 1
    return start, end
