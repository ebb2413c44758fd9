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

This module maps and renders; token_calls.py makes CTranslate2's calls over token lists through the
one conversion (text_request.py), and the Translator (translator.py) holds them."""
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


def chunks(pairs: Iterable[tuple], size: int, prefixed: bool) -> Iterator[tuple[list, list | None]]:
    """(token lists, their prefixes) `size` at a time from a stream of (source, prefix) pairs; the
    prefixes None where the stream has none (`prefixed` False)."""
    pairs = iter(pairs)
    while batch := list(itertools.islice(pairs, size)):
        yield [s for s, _ in batch], [p for _, p in batch] if prefixed else None
