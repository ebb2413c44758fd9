"""Session: batched decoding over any backend, one loop for every strategy; input checks at the boundary.

`generate` takes right-padded int64 source ids and returns generated ids, padded with the pad id
after each row's end-of-sentence. Text is a layer above (translator.py: `Translator(session)`);
this module never imports it. What backend runs the graphs is not this module's business
(backend.py); it never imports torch.
"""
from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, Callable, Sequence

import numpy as np

from xform.config import TransformerConfig
from xform.contract import Capabilities
from xform.errors import InputError, SettingError, XformError
from xform.runtime.backends.backend import Backend, Restricting
from xform.runtime.decoding.choice import make_strategy
from xform.runtime.decoding.constraints import check_constraints, constrained_generation
from xform.runtime.decoding.generation import GenerationConfig, decode_cap, int_id
from xform.runtime.decoding.loop import Batch, Decode
from xform.runtime.decoding.processors import Processors, Special, log_softmax
from xform.runtime.decoding.request import REQUEST_OPTIONS, Request, Result, one_a_source, refuse_unknown

__all__ = ["Session"]



def generation_fields() -> set[str]:
    """The generation config's fields: the settings `generate` and `request` take."""
    return {f.name for f in fields(GenerationConfig)}


class Session:
    def __init__(self, backend: Backend, config: TransformerConfig, tokenizer: Any = None, bundle=None):
        self.backend = backend
        self.config = config
        self.tokenizer = tokenizer  # the text layer's (runtime/text/tokenizer.py): read here for its unknown id
        self.bundle = bundle
        self.pad_id, self.eos_id = config.pad_id, config.eos_id
        start = config.decoder_start_id
        self.start_id = config.bos_id if start is None else start
        self.special = Special.from_config(config)
        # decoding defaults the bundle records (a Marian model's generation_config); greedy if none
        self.generation_defaults = dict(bundle.manifest.generation if bundle is not None else {})

    @property
    def backend_name(self) -> str:
        return self.backend.name

    @property
    def capabilities(self) -> Capabilities:
        return self.backend.capabilities

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
        max_len, vocab = self.config.max_len, self.config.src_vocab_size
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

    def generation_config(self, max_new_tokens: int | None = None, **settings: Any) -> GenerationConfig:
        """The bundle's defaults (greedy unless its manifest records others), updated by `settings`
        (None keeps a default); checked against the model's max_len and target vocabulary. Errors
        say which settings they are about (SettingError.settings), named by their markers, which
        each door words its own way (errors.py)."""
        fields = generation_fields()
        defaults = {k: v for k, v in self.generation_defaults.items() if k in fields}
        asked = {k for k, v in settings.items() if v is not None}
        if "num_beams" not in asked and (settings.get("do_sample") or settings.get("return_alternatives")):
            # sampling and alternatives are single-beam searches (CTranslate2: beam_size 1): asking
            # for them sets aside a bundle's default beams unless beams are asked for too
            defaults.pop("num_beams", None)
        if max_new_tokens is None:
            max_new_tokens = self.default_max_new_tokens()  # the bundle's cap, at every door
        try:
            gen = GenerationConfig(**defaults).updated(max_new_tokens=max_new_tokens, **settings)
        except SettingError as e:
            raise self.blame_defaults(e, defaults, asked) from None
        max_len = self.config.max_len
        if gen.max_new_tokens > max_len:
            raise SettingError(f"max_new_tokens {gen.max_new_tokens} exceeds the model's max_len {max_len}",
                               "max_new_tokens")
        vocab = self.config.tgt_vocab_size
        if gen.forced_bos_token_id is not None and gen.forced_bos_token_id >= vocab:
            raise SettingError(f"forced_bos_token_id {gen.forced_bos_token_id} is outside the target vocabulary "
                               f"of {vocab}", "forced_bos_token_id")
        for name, ids in (("bad_words_ids", [i for w in gen.bad_words_ids for i in w]),
                          ("suppress_tokens", gen.suppress_tokens)):
            outside = sorted({i for i in ids if i >= vocab})
            if outside:
                raise SettingError(f"{{{name}}}: ids {outside[:5]} are outside the target vocabulary of {vocab}",
                                   name)
        return gen

    def blame_defaults(self, error: SettingError, defaults: dict[str, Any], asked: set[str]) -> SettingError:
        """A combination refused because of a bundle default the caller never gave: the message
        says it is the bundle's default (its manifest's generation settings), not a flag typed."""
        plain = GenerationConfig()
        blamed = [f"{k} {v}" for k, v in defaults.items() if k not in asked and v != getattr(plain, k, v)
                  and k in str(error)]
        if not blamed:
            return error
        return SettingError(f"{error.template}\n  ({', '.join(blamed)}: this bundle's default, from its manifest's "
                            "generation settings; set it to decide otherwise)", *error.settings)

    def default_max_new_tokens(self) -> int:
        """The bundle's decode cap (generation.decode_cap): set at export, else the model's
        max_length - 1, else 256; never beyond max_len."""
        return decode_cap(self.generation_defaults, self.config.max_len)[0]

    def request(self, src_ids, src_lengths=None, max_new_tokens: int | None = None, *,
                generation: GenerationConfig | None = None, texts: Sequence[str] | None = None,
                replace_unknowns: bool = False, **settings: Any) -> Request:
        """The one builder of a Request, for every door: `generate`'s arguments checked. `settings`
        are the generation config's fields (generation.GenerationConfig: any of them) and the
        request's options (REQUEST_OPTIONS: target_prefix, what to return, vocabulary,
        constraints); None keeps a default. `generation`: a config made already
        (generation_config), instead of settings. `constraints`: per source, phrases (target id
        lists) every hypothesis must contain (constraints.check_constraints); a greedy request
        with them is promoted to beams (constraints.smallest_beam: Request.promoted_beams)."""
        options = {k: settings.pop(k) for k in REQUEST_OPTIONS if k in settings}
        refuse_unknown(settings, generation_fields() | set(REQUEST_OPTIONS), "decoding setting")
        if generation is not None and (settings or max_new_tokens is not None):
            raise InputError(f"a request takes a generation config or settings, not both: {sorted(settings)}")
        src_ids, src_lengths = self.prepare(src_ids, src_lengths)
        gen = generation or self.generation_config(max_new_tokens, **settings)
        prefix = self.check_prefix(options.get("target_prefix"), src_ids.shape[0], gen)
        constraints = self.check_constraints(options.get("constraints"), src_ids.shape[0], gen)
        gen, promoted = constrained_generation(gen, constraints)
        return Request(src_ids, src_lengths, gen, None if prefix is None else tuple(map(tuple, prefix)),
                       bool(options.get("return_scores")), bool(options.get("return_token_scores")),
                       bool(options.get("return_attention")), None if texts is None else tuple(texts),
                       replace_unknowns, options.get("vocabulary"), constraints, promoted)

    def check_constraints(self, constraints, batch: int, gen: GenerationConfig):
        """The constraints checked against this model (constraints.check_constraints): ids in the
        target vocabulary, none that is never generated, no phrase longer than max_new_tokens."""
        procs = Processors(gen, self.special)
        never = {self.eos_id, *procs.blocked, *procs.suppress}
        return check_constraints(constraints, batch, self.config.tgt_vocab_size, never, gen)

    def run(self, request: Request, on_step: Callable[[int], None] | None = None,
            watch: Callable[[Decode], None] | None = None) -> Result:
        """The one decoding loop, for every strategy and backend: one request through a Batch
        (loop.py) from its first step to its last. The strategy's row index (`beam_idx`)
        reorders the backend's rows for beam search and drops finished ones, so the rows run per
        step fall as sources end. `watch`, when given, is shown the decode before its first step
        (a step callback hooks its strategy: text/step_callback.py)."""
        item = self.decode_item(request, on_step)
        if watch is not None:
            watch(item)
        restricted: Restricting | None = None
        if request.vocabulary is not None:
            if request.wants_attention:
                raise InputError("a vocabulary restriction and {return_attention} together: the restricted decoder "
                                 "returns no attention").naming("return_attention")
            prefix = item.strategy.prefix  # the checked prefix table: its ids are always allowed
            phrases = [list(p) for c in request.constraints or () for p in c]  # and the constraints'
            restricted = self.restrict(request.vocabulary, request.generation,
                                       [[int(i) for i in row if i >= 0] for row in prefix] + phrases)
        try:
            batch = Batch(self.backend, self.start_id)
            batch.admit(item)
            while not item.done:
                batch.step()
            assert item.output is not None  # the request ended uncancelled: its result is made
            return item.output
        finally:
            if restricted is not None:
                restricted.restrict(None)

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
                 return_attention: bool = False, on_step: Callable[[int], None] | None = None, **more: Any):
        """(B x num_return_sequences, n) int64 generated ids, no start token, pad after end-of-sentence;
        with return_scores, also their scores (float32: beam search's length-penalized sum of
        log-probs, else the sum of log-probs); with return_token_scores, also each token's
        log-prob (B x num_return_sequences, n), 0 in a prefix and after the end; with
        return_attention, last, each token's attention over the source (B x num_return_sequences,
        n, src_len): the cross-attention of the decoder layer the bundle was exported with
        (--with-attention), averaged over heads, 0 after the end. Unset settings take
        the bundle's defaults (max_new_tokens: the bundle's cap, generation.decode_cap: 256 unless
        the bundle or the model sets one). `run(request(...))` gives the same as a named Result.

        `target_prefix`: one id list a source (empty allowed): decoding continues after it and the
        returned ids begin with it, as CTranslate2's hypotheses do; max_new_tokens and
        min_new_tokens count after it, as transformers' generate(decoder_input_ids=[start] +
        prefix) does. `return_alternatives` with num_return_sequences n: the n best tokens at the
        first position after the prefix, each continued greedily. repetition_penalty,
        no_repeat_ngram_size, bad_words_ids (sequences, besides the pad and the model's banned ids)
        and suppress_tokens act as transformers' processors of those names. `vocabulary` (target
        ids; a bundle exported --with-vocab-map, ort backend): the output projection runs over
        those ids (and end-of-sentence, unknown, forced and prefix ids) only, the others never
        generated: the full model's tokens with every other id's logit masked. `more`: any other
        field of the generation config (a control added to it and to runtime/decoding/controls.py)."""
        request = self.request(src_ids, src_lengths, max_new_tokens, min_new_tokens=min_new_tokens,
                               num_beams=num_beams, length_penalty=length_penalty, early_stopping=early_stopping,
                               num_return_sequences=num_return_sequences, do_sample=do_sample,
                               temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                               forced_bos_token_id=forced_bos_token_id, repetition_penalty=repetition_penalty,
                               no_repeat_ngram_size=no_repeat_ngram_size, bad_words_ids=bad_words_ids,
                               suppress_tokens=suppress_tokens, return_alternatives=return_alternatives,
                               target_prefix=target_prefix, vocabulary=vocabulary, return_scores=return_scores,
                               return_token_scores=return_token_scores, return_attention=return_attention, **more)
        return self.run(request, on_step).astuple()

    def check_prefix(self, target_prefix, batch: int, gen: GenerationConfig) -> list[list[int]] | None:
        """The target prefixes as id lists, checked: one a source, ids in the target vocabulary,
        shorter than the position table (max_new_tokens is cut to what remains of it)."""
        if target_prefix is None:
            return None
        one_a_source(target_prefix, batch, "target_prefix", "id lists", "target_prefix")
        vocab, out = self.config.tgt_vocab_size, []
        for i, p in enumerate(target_prefix):
            try:
                ids = [int_id(x) for x in p]
            except (TypeError, ValueError) as e:
                raise SettingError(f"target_prefix[{i}]: expected a list of token ids, got {p!r} ({e})",
                                   "target_prefix") from None
            outside = [x for x in ids if x >= vocab]
            if outside:
                raise SettingError(f"target_prefix[{i}]: id {outside[0]} is outside the target vocabulary of "
                                   f"{vocab}", "target_prefix")
            out.append(ids)
        longest = max((len(p) for p in out), default=0)
        if longest >= self.config.max_len:
            raise SettingError(f"target_prefix of {longest} tokens leaves no room in the model's max_len "
                               f"{self.config.max_len} positions", "target_prefix")
        return out

    def plan(self, src_ids, src_lengths=None, max_new_tokens: int | None = None, *,
             on_step: Callable[[int], None] | None = None, **settings: Any) -> Decode:
        """A checked request for a Batch or the Scheduler: the arguments of `generate` but
        `vocabulary` (a restriction holds for a whole batch, so it decodes alone: `generate`)."""
        if settings.get("vocabulary") is not None:
            raise InputError("vocabulary: a restriction holds for a whole batch, so it decodes alone (generate)")
        return self.decode_item(self.request(src_ids, src_lengths, max_new_tokens, **settings), on_step)

    def decode_item(self, request: Request, on_step: Callable[[int], None] | None = None) -> Decode:
        """The request as the loop runs it: the prefix (after a forced first token), max_new_tokens
        cut to the position table, the strategy made."""
        gen, batch = request.generation, request.batch
        prefix = request.prefixes()
        if gen.forced_bos_token_id is not None and (prefix is not None or gen.return_alternatives):
            # the forced first token (a target language) heads the prefix: what follows it is free
            prefix = [[gen.forced_bos_token_id] + p for p in (prefix or [[]] * batch)]
            gen = replace(gen, forced_bos_token_id=None)
        room = self.config.max_len - max((len(p) for p in prefix or []), default=0)
        if gen.max_new_tokens > room:  # the position table ends there, whatever was asked
            gen = replace(gen, max_new_tokens=room, min_new_tokens=min(gen.min_new_tokens, room))
        attention = request.wants_attention
        if attention and not self.capabilities.attention:
            raise InputError("{return_attention}: this bundle's decoder returns no attention; export it with "
                             "the decoder's attention (xform export MODEL -o BUNDLE --with-attention)").naming(
                                 "return_attention")
        strategy = make_strategy(batch, gen, self.special, request.wants_scores, prefix, self.start_id,
                                 request.src_ids.shape[1] if attention else 0, request.constraints)
        limit = self.capabilities.max_rows
        if limit is not None and strategy.rows > limit:
            raise InputError(f"batch {batch} x {gen.strategy} width {strategy.rows // batch} ({{num_beams}} / "
                             f"{{num_return_sequences}}) = {strategy.rows} rows exceeds the engines' profile batch "
                             f"{limit}; rebuild them with a larger one (xform build-engine BUNDLE --force "
                             "--max-batch N --max-beams N)").naming("num_beams", "num_return_sequences")
        return Decode(strategy, request.src_ids, request.src_lengths, request.return_scores,
                      request.return_token_scores, attention, on_step, promoted_beams=request.promoted_beams)

    def restrict(self, vocabulary, gen: GenerationConfig, prefix: list[list[int]] | None) -> Restricting:
        """Point the backend at `vocabulary` (target ids) and the ids a decode always needs; returns it."""
        backend = self.backend
        if not (isinstance(backend, Restricting) and self.capabilities.restriction):
            raise InputError("vocabulary: a restriction needs the restricted decoder on the ort backend: export the "
                             "bundle with it (xform export MODEL -o BUNDLE --with-vocab-map) and run it on the ort "
                             "backend")
        try:
            ids = np.unique(np.asarray(vocabulary, dtype=np.int64).reshape(-1))
        except (TypeError, ValueError) as e:
            raise InputError(f"vocabulary: expected target ids, got {vocabulary!r} ({e})") from None
        vocab = self.config.tgt_vocab_size
        if len(ids) and (ids[0] < 0 or ids[-1] >= vocab):
            raise InputError(f"vocabulary: ids outside the target vocabulary of {vocab}")
        needed = {self.eos_id, *[i for p in prefix or [] for i in p]}
        if gen.forced_bos_token_id is not None:
            needed.add(gen.forced_bos_token_id)
        unk = self.tokenizer.target_unk_id if self.tokenizer is not None else None
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
        if ((tgt < 0) | (tgt >= self.config.tgt_vocab_size)).any():
            raise InputError(f"target ids: outside the target vocabulary of {self.config.tgt_vocab_size}")
        if tgt.shape[1] > self.config.max_len:
            raise InputError(f"target ids: {tgt.shape[1]} positions, more than the model's max_len "
                             f"{self.config.max_len}")
        _, logits = self.teacher_forced(src_ids, src_lengths, tgt)
        lp = log_softmax(logits)
        tokens = np.take_along_axis(lp, tgt[:, :, None], 2)[:, :, 0].astype(np.float32)
        valid = tgt != self.pad_id
        tokens = np.where(valid, tokens, np.float32(0.0))
        lengths = valid.sum(1)
        total = tokens.sum(1, dtype=np.float32)
        return {"tokens": tokens, "total": total, "lengths": lengths,
                "normalized": (total / np.maximum(lengths, 1)).astype(np.float32)}

    def pad(self, rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Id rows as a right-padded int64 batch and its lengths."""
        src = np.full((len(rows), max(len(r) for r in rows)), self.pad_id, np.int64)
        for i, r in enumerate(rows):
            src[i, :len(r)] = r
        return src, np.array([len(r) for r in rows], np.int64)
