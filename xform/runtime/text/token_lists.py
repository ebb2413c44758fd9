"""CTranslate2's token lists, with CTranslate2's meanings (issue 54): a token list is ids through
the bundle's vocabularies, never text.

- A source token list is what the encoder reads, exactly: each piece its id in the source
  vocabulary (a piece the vocabulary lacks is `<unk>`), nothing added: the end token (`"</s>"`)
  and a language token (`"__en__"`, `"eng_Latn"`, `">>fra<<"`) are the caller's, as in
  CTranslate2, whose converted models add neither.
- A target prefix token list is the first target ids (`["__de__"]` the target language of
  M2M100 / NLLB); the hypotheses start with it.
- Hypotheses are token lists: the prefix and the generated pieces, the end token only with
  `return_end_token`. Scores are CTranslate2's: the sum of the generated tokens' log-probs (the
  prefix's count 0) over the hypothesis' length (prefix and end token included) to the power
  `length_penalty`, greedy and beams alike.
- `max_decoding_length` and `min_decoding_length` count the whole hypothesis, prefix and end
  token included; nothing is forced at the last step (CTranslate2 forces no end token) and no
  first token is forced (the prefix says the language). Beam search stops as CTranslate2's does
  (transformers' early_stopping=True, CTranslate2's patience 1); CTranslate2's defaults: beam_size
  2, min_decoding_length 1, max_decoding_length 256.
- `score_batch`: the target's ids, end token appended; tokens come back as pieces, `"</s>"` last.

This module maps and renders; the Translator (translator.py) decodes through its Session."""
from __future__ import annotations

import itertools
from functools import cached_property
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from xform.errors import InputError

END = "</s>"
UNK = "<unk>"
# CTranslate2's translate_batch defaults, where xform's differ (max_decoding_length: the bundle's
# cap, CTranslate2's 256 cut to the model's max_len)
CT2_DEFAULTS = {"num_beams": 2, "min_new_tokens": 1, "length_penalty": 1.0}
REFUSED = {"return_alternatives": "alternatives do not yet follow CTranslate2's (the end token is offered, "
                                  "scores are not its sums): pass texts for xform's",
           "prefix_bias_beta": "a soft prefix is not implemented; a target_prefix is always hard"}


def token_lists(items: Any) -> bool:
    """Whether a method's sources are CTranslate2's token lists (each a list of strings), not texts;
    a mix of the two is refused naming the first that differs."""
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes)) or not items:
        return False
    kinds = [isinstance(x, Sequence) and not isinstance(x, (str, bytes)) for x in items]
    if all(kinds):
        for i, x in enumerate(items):
            bad = next((t for t in x if not isinstance(t, str)), None)
            if bad is not None:
                raise InputError(f"source[{i}]: a token list holds strings (the vocabulary's pieces), found "
                                 f"{type(bad).__name__} {bad!r}")
        return True
    if any(kinds):
        first = kinds.index(not kinds[0])
        raise InputError(f"source[{first}]: {'a token list' if kinds[first] else 'a text'} among "
                         f"{'texts' if kinds[first] else 'token lists'}: give all texts or all token lists")
    return False


class Vocabularies:
    """The bundle's source and target vocabularies as CTranslate2 reads them: piece <-> id."""

    def __init__(self, tokenizer, config) -> None:
        self.tokenizer, self.config = tokenizer, config

    @cached_property
    def source(self) -> dict[str, int]:
        """Source piece -> id: a model of one vocabulary for both sides (share_embeddings: OPUS-MT,
        M2M100, NLLB, mBART, T5) reads the target's, special and language tokens included
        ("__en__", "eng_Latn", "en_XX"); else the source side's pieces, and the target's tokens
        the source side names at no id of its own."""
        if self.config.share_embeddings is True:
            return dict(self.target)
        index: dict[str, int] = {}
        names = [self.tokenizer.source_piece(i) for i in range(self.config.src_vocab_size)]
        for i, piece in enumerate(names):
            if piece:
                index.setdefault(piece, i)
        for piece, i in self.target.items():
            if piece not in index and 0 <= i < len(names) and not names[i]:
                index[piece] = i
        return index

    @cached_property
    def target(self) -> dict[str, int]:
        return dict(self.tokenizer.target_vocabulary())

    @cached_property
    def target_pieces(self) -> dict[int, str]:
        out: dict[int, str] = {}
        for piece, i in self.target.items():
            out.setdefault(i, piece)
        return out

    def source_ids(self, tokens: Sequence[str], name: str) -> list[int]:
        return self.ids(tokens, self.source, "source", name)

    def target_ids(self, tokens: Sequence[str], name: str) -> list[int]:
        return self.ids(tokens, self.target, "target", name)

    def ids(self, tokens: Sequence[str], index: dict[str, int], side: str, name: str) -> list[int]:
        """Each piece's id; a piece the vocabulary lacks is its <unk> (CTranslate2's rule)."""
        unk = index.get(UNK)
        out = []
        for t in tokens:
            i = index.get(t, unk)
            if i is None:
                raise InputError(f"{name}: {t!r} is not in the {side} vocabulary, which has no {UNK} to stand for it")
            out.append(i)
        return out

    def known_target_ids(self, tokens: Sequence[str], name: str) -> list[int]:
        """Target ids of tokens that must all be in the vocabulary (CTranslate2's suppress_sequences)."""
        if isinstance(tokens, str) or not tokens:
            raise InputError(f"{name}: expected a non-empty token list, got {tokens!r}")
        missing = [t for t in tokens if t not in self.target]
        if missing:
            raise InputError(f"{name}: {missing[0]!r} is not in the target vocabulary")
        return [self.target[t] for t in tokens]

    def pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.target_pieces.get(int(i), UNK) for i in ids]

    @property
    def target_unk(self) -> int | None:
        return self.target.get(UNK)


def cut(tokens: list[str], limit: int) -> list[str]:
    """A source cut to `limit` tokens as CTranslate2 cuts it (max_input_length): its end token kept
    last, and a language token after it (NLLB's "</s> eng_Latn") kept after it."""
    if not limit or len(tokens) <= limit:
        return tokens
    if tokens[-1] == END:
        return tokens[:max(0, limit - 1)] + [END]
    if len(tokens) > 1 and tokens[-2] == END:
        return tokens[:max(0, limit - 2)] + tokens[-2:]
    return tokens[:limit]


def hypothesis(ids: np.ndarray, eos_id: int, pad_id: int, return_end_token: bool) -> list[int]:
    """A result row's ids as CTranslate2's hypothesis: up to its end token (kept with
    `return_end_token`), no padding."""
    row = [int(i) for i in ids]
    if eos_id in row:
        row = row[:row.index(eos_id) + (1 if return_end_token else 0)]
    return [i for i in row if i != pad_id] if pad_id != eos_id else row


def ct2_score(token_scores: np.ndarray, ids: np.ndarray, eos_id: int, pad_id: int, length_penalty: float) -> float:
    """CTranslate2's hypothesis score: the tokens' log-probs summed (a prefix's are 0) over the
    hypothesis' length, prefix and a generated end token included, to the power length_penalty."""
    row = [int(i) for i in ids]
    n = row.index(eos_id) + 1 if eos_id in row else sum(1 for i in row if i != pad_id)
    total = float(np.sum(token_scores[:n], dtype=np.float64))
    return total / (max(n, 1) ** length_penalty) if length_penalty else total


def decoding_settings(settings: dict[str, Any], prefix_len: int, cap: int) -> dict[str, Any]:
    """xform's generation settings for CTranslate2's meanings over a prefix of `prefix_len` ids
    (`cap`: the bundle's max_decoding_length): its defaults, the lengths counting the whole
    hypothesis, its beam stopping; nothing forced (the caller clears a forced first token)."""
    out = {**CT2_DEFAULTS, **{k: v for k, v in settings.items() if v is not None}}
    max_len, min_len = int(out.pop("max_new_tokens", cap)), int(out["min_new_tokens"])
    if min_len > max_len:
        raise InputError(f"the minimum decoding length (min_decoding_length {min_len}) is greater than the maximum "
                         f"decoding length (max_decoding_length {max_len})")
    out["max_new_tokens"] = max_len - prefix_len
    out["min_new_tokens"] = max(0, min_len - prefix_len)
    out.update(forced_eos=False, early_stopping=True)
    return out


def generation(session, settings: dict[str, Any]):
    """The generation config of decoding_settings' `settings`, no first token forced (a bundle's
    default one included: the prefix says the target language)."""
    import dataclasses
    rest = dict(settings)
    max_new = rest.pop("max_new_tokens")
    return dataclasses.replace(session.generation_config(max_new, **rest), forced_bos_token_id=None)


def translate_call(translator, source: Sequence[Sequence[str]], target_prefix: Any, *, return_scores: bool,
                   return_end_token: bool, disable_unk: bool, max_batch_size: int, limit: int,
                   given: dict[str, Any], options: dict[str, Any]) -> list:
    """translate_batch's call over token lists, checked: the text-only options in `given` refused
    by name when set, the sources cut to `limit` (max_input_length), one prefix (a token list or
    None) a source."""
    taken = [name for name, value in given.items() if value]
    if taken:
        raise InputError(f"{', '.join(taken)} with token lists: a token list is what the model reads, languages "
                         "included (a source's language token, the target's as target_prefix); pass texts for "
                         f"{'these' if len(taken) > 1 else 'it'}")
    sources = [cut(list(t), limit) for t in source]
    prefixes = None
    if target_prefix is not None:
        if len(target_prefix) != len(sources):
            raise InputError(f"target_prefix has {len(target_prefix)} entries for {len(sources)} sources: one a source")
        prefixes = []
        for i, p in enumerate(target_prefix):
            if p is not None and (isinstance(p, (str, bytes)) or not all(isinstance(t, str) for t in p)):
                raise InputError(f"target_prefix[{i}]: expected a token list (or None) where the sources are token "
                                 f"lists, got {p!r}")
            prefixes.append(list(p or []))
    return translate(translator, sources, prefixes, return_scores=return_scores, return_end_token=return_end_token,
                     disable_unk=disable_unk, max_batch_size=max_batch_size, options=options)


def translate(translator, sources: list[list[str]], prefixes: list[list[str]] | None, *, return_scores: bool,
              return_end_token: bool, disable_unk: bool, max_batch_size: int, options: dict[str, Any]) -> list:
    """CTranslate2's translate_batch over token lists (the module's rules): TranslationResults of
    token lists. Sources are decoded in groups of one prefix length (the length caps count the
    prefix), at most `max_batch_size` at a time."""
    from xform.runtime.decoding.request import TranslationResult
    for name, why in REFUSED.items():
        if options.get(name):
            raise InputError(f"{name} with token lists: {why}")
    session, vocab = translator.session, translator.vocabularies
    src = [vocab.source_ids(t, f"source[{i}]") for i, t in enumerate(sources)]
    pre = [vocab.target_ids(p, f"target_prefix[{i}]") for i, p in enumerate(prefixes or [[]] * len(src))]
    options = dict(options)
    suppressed = options.pop("suppress_sequences", None)
    settings = {**translator.ct2_generation_settings(options)}
    if suppressed:
        settings["bad_words_ids"] = [vocab.known_target_ids(seq, f"suppress_sequences[{i}]")
                                     for i, seq in enumerate(suppressed)]
    if disable_unk and vocab.target_unk is not None:
        settings["bad_words_ids"] = [*settings.get("bad_words_ids", []), [vocab.target_unk]]
    cap = session.default_max_new_tokens()
    results: dict[int, TranslationResult] = {}
    groups: dict[int, list[int]] = {}
    for i in range(len(src)):
        groups.setdefault(len(pre[i]), []).append(i)
    for n, group in groups.items():
        gen_settings = decoding_settings(settings, n, cap)
        rows = [i for i in group if src[i] and gen_settings["max_new_tokens"] > 0]
        results.update({i: untouched(vocab, pre[i], gen_settings, n, return_scores, settings)
                        for i in group if i not in rows})
        step = max_batch_size or max(len(rows), 1)
        for at in range(0, len(rows), step):
            chunk = rows[at:at + step]
            results.update(zip(chunk, decoded(translator, [src[i] for i in chunk], [pre[i] for i in chunk],
                                              gen_settings, return_scores, return_end_token)))
    return [results[i] for i in range(len(src))]


def untouched(vocab: Vocabularies, prefix: list[int], settings: dict[str, Any], n: int, return_scores: bool,
              asked: dict[str, Any]):
    """CTranslate2's answer where the model is not run: an empty source, or a prefix that fills
    max_decoding_length: the prefix (cut to it), score 0."""
    from xform.runtime.decoding.request import TranslationResult
    keep = prefix[:max(0, settings["max_new_tokens"] + n)]
    k = int(asked.get("num_return_sequences") or 1)
    return TranslationResult([vocab.pieces(keep)] * k, [0.0] * k if return_scores else [])


def decoded(translator, src: list[list[int]], prefixes: list[list[int]], settings: dict[str, Any],
            return_scores: bool, return_end_token: bool) -> list:
    """One request over sources sharing a prefix length: their TranslationResults (sampled
    hypotheses sorted by score, best first, as CTranslate2 sorts them)."""
    from xform.runtime.decoding.request import TranslationResult
    session, vocab, cfg = translator.session, translator.vocabularies, translator.session.config
    gen = generation(session, settings)
    ids, lengths = session.pad(src)
    request = session.request(ids, lengths, generation=gen, target_prefix=prefixes if any(prefixes) else None,
                              return_token_scores=True)
    result = session.run(request)
    k = len(result) // request.batch
    out = []
    for b in range(request.batch):
        hyps = []
        for r in range(b * k, (b + 1) * k):
            assert result.token_scores is not None  # asked for
            score = ct2_score(result.token_scores[r], result.ids[r], cfg.eos_id, cfg.pad_id, gen.length_penalty)
            hyps.append((vocab.pieces(hypothesis(result.ids[r], cfg.eos_id, cfg.pad_id, return_end_token)), score))
        if gen.do_sample:
            hyps.sort(key=lambda h: -h[1])
        out.append(TranslationResult([h for h, _ in hyps], [s for _, s in hyps] if return_scores else []))
    return out


def score(translator, source: Any, target: Any) -> list:
    """CTranslate2's score_batch over token lists: each source's ids as given, its target's ids
    with the end token appended; ScoringResults of the target's pieces, "</s>" last, and each
    one's log-prob. An empty source scores its tokens 0, as CTranslate2 does."""
    from xform.runtime.decoding.request import ScoringResult
    if not (token_lists(source) and token_lists(target)):
        raise InputError("score_batch: sources and targets both token lists, or both texts")
    if len(source) != len(target):
        raise InputError(f"{len(source)} sources for {len(target)} targets: one target a source")
    session, vocab, eos = translator.session, translator.vocabularies, translator.session.config.eos_id
    src = [vocab.source_ids(t, f"source[{i}]") for i, t in enumerate(source)]
    tgt = [vocab.target_ids(t, f"target[{i}]") + [eos] for i, t in enumerate(target)]
    results = {i: ScoringResult(vocab.pieces(tgt[i]), [0.0] * len(tgt[i])) for i in range(len(src)) if not src[i]}
    todo = [i for i in range(len(src)) if src[i]]
    if todo:
        ids, lengths = session.pad([src[i] for i in todo])
        targets, n = session.pad([tgt[i] for i in todo])
        scored = session.score(ids, targets, lengths)
        for r, i in enumerate(todo):
            results[i] = ScoringResult(vocab.pieces(tgt[i]), [float(v) for v in scored["tokens"][r, :n[r]]])
    return [results[i] for i in range(len(src))]


def chunks(pairs: Iterable[tuple], size: int, prefixed: bool) -> Iterator[tuple[list, list | None]]:
    """(token lists, their prefixes) `size` at a time from a stream of (source, prefix) pairs; the
    prefixes None where the stream has none (`prefixed` False)."""
    pairs = iter(pairs)
    while batch := list(itertools.islice(pairs, size)):
        yield [s for s, _ in batch], [p for _, p in batch] if prefixed else None


def step_request(translator, source: list[str], prefix: list[str], settings: dict[str, Any],
                 return_log_prob: bool = False):
    """generate_tokens' request for a token list and its prefix (CTranslate2's meanings, greedy or
    sampling)."""
    session, vocab = translator.session, translator.vocabularies
    src, pre = vocab.source_ids(source, "source"), vocab.target_ids(prefix, "target_prefix")
    if not src:
        raise InputError("source: an empty token list; generate_tokens needs a source to decode")
    gen_settings = decoding_settings(settings, len(pre), session.default_max_new_tokens())
    if gen_settings["max_new_tokens"] <= 0:
        raise InputError(f"max_decoding_length {gen_settings['max_new_tokens'] + len(pre)}: the target_prefix's "
                         f"{len(pre)} tokens fill it")
    gen = generation(session, gen_settings)
    ids, lengths = session.pad([src])
    return session.request(ids, lengths, generation=gen, target_prefix=[pre] if pre else None,
                           return_token_scores=return_log_prob)
