"""The text policy every door shares: what a text, a language, a target prefix or a bad word
given as text becomes in ids, and the rules that go with them (the target language's first token,
truncation to max_len, a vocabulary map's restriction, unknown replacement's conditions). The
Translator (translator.py) is this policy plus the ways text arrives (CTranslate2's calls, line
and file streams); the CLI and the Triton handler call the same methods, so each rule is written
once. An error names a setting by its marker (`{src_lang}`, errors.py), which each door words its
own way (the CLI's flag, the server's input, the Python keyword).
"""
from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from xform.config import TransformerConfig
from xform.errors import InputError, SettingError, XformError
from xform.runtime.text.token_lists import Vocabularies
from xform.runtime.text.tokenizer import Tokenizer, no_languages
from xform.runtime.text.unknowns import decode_rows
from xform.runtime.text.vocab_map import VocabMap

if TYPE_CHECKING:
    from xform.runtime.session import Session

# what a bundle that lacks a graph's capability is told to do: export it again with it
WITH_ATTENTION = "export the bundle with the decoder's attention (xform export MODEL -o BUNDLE --with-attention)"
RESTRICTED = ("export the bundle with the restricted decoder (xform export MODEL -o BUNDLE --with-vocab-map) and "
              "run it on the ort backend")


class TextPolicy:
    """Text to ids over a Session, by one rule for every door."""

    def __init__(self, session: "Session"):
        self.session = session

    @property
    def config(self) -> TransformerConfig:
        return self.session.config

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.session.tokenizer

    @property
    def text(self) -> Tokenizer:
        """The tokenizer, for what needs text: a bundle without one is refused."""
        if self.session.tokenizer is None:
            raise XformError("this bundle has no tokenizer; pass token ids to generate() instead of text")
        return self.session.tokenizer

    @property
    def pad_id(self) -> int:
        return self.session.pad_id

    @property
    def eos_id(self) -> int:
        return self.session.eos_id

    @property
    def capabilities(self):
        return self.session.capabilities

    @property
    def generation_defaults(self) -> dict[str, Any]:
        return self.session.generation_defaults

    @cached_property
    def vocabularies(self) -> Vocabularies:
        """The bundle's vocabularies as CTranslate2's token lists read them."""
        return Vocabularies(self.text, self.session.config)

    def bad_words(self, words: Sequence[str | Sequence[int]]) -> list:
        """Bad words as id sequences: text split by the target tokenizer (bad_word_ids), ids kept."""
        return [self.bad_word_ids([w])[0] if isinstance(w, str) else w for w in words]

    def encode_texts(self, texts: list[str], src_lang: str | None = None, tgt_lang: str | None = None) -> np.ndarray:
        """The padded source ids of texts, as long as they are (encode_batch cuts or refuses)."""
        return self.session.pad(self.source_rows(texts, src_lang, tgt_lang))[0]

    def source_rows(self, texts: Sequence[str], src_lang: str | None = None,
                    tgt_lang: str | None = None) -> list[list[int]]:
        """Each text's source ids; a bundle without a tokenizer and an empty batch are refused."""
        self.text  # noqa: B018 - refuses a bundle without a tokenizer
        if not texts:
            raise InputError("no text to translate (an empty batch)")
        return [self.encode_text(t, src_lang, tgt_lang) for t in texts]

    def encode_text(self, text: str, src_lang: str | None = None, tgt_lang: str | None = None) -> list[int]:
        """Source ids of a text; `src_lang` names its language for a multilingual model's
        tokenizer. `tgt_lang` matters only where the target language is written into the source
        (MADLAD-400's <2xx> token: the tokenizer's `target_in_source`); elsewhere it is the forced
        first target token (target_language)."""
        if self.text.target_in_source:
            if src_lang is not None:
                raise SettingError(f"{{src_lang}} {src_lang}: this model takes no source language (its target "
                                   "language goes into the source: {tgt_lang})", "src_lang", "tgt_lang")
            return self.text.encode(text, tgt_lang, "tgt_lang")
        if src_lang is not None and not self.text.languages:
            raise self.one_way(src_lang, "src_lang")
        return self.text.encode(text, src_lang, "src_lang")

    def check_languages(self, src_lang: str | None, tgt_lang: str | None) -> None:
        """Refuse an unknown source or target language before any text is read."""
        if src_lang is not None or tgt_lang is not None:
            self.encode_text("", src_lang, tgt_lang=tgt_lang)

    def check_src_lang(self, src_lang: str) -> None:
        """Refuse (InputError, with the known ones) a source language this tokenizer lacks, before
        any text is read."""
        self.encode_text("", src_lang)

    def target_ids(self, text: str) -> list[int]:
        """A text's target ids, nothing added (a prefix, a bad word)."""
        if self.tokenizer is None:
            raise XformError("this bundle has no tokenizer; give target ids instead of text")
        return self.tokenizer.target_ids(text)

    def bad_word_ids(self, phrases: Sequence[str]) -> list[list[int]]:
        """Bad words given as text, as target id sequences: each phrase as the target tokenizer
        splits it. A phrase that gives no tokens, or more than max_len (it could never be
        generated), is refused (a SettingError about bad_words_ids)."""
        ids = [self.target_ids(p) for p in phrases]
        if any(not w for w in ids):
            raise SettingError(f"{{bad_words_ids}}: a phrase gives no target tokens ({list(phrases)})", "bad_words_ids")
        if any(len(w) > self.config.max_len for w in ids):
            raise SettingError(f"{{bad_words_ids}}: a phrase of more tokens than the model's max_len "
                               f"{self.config.max_len} (it could never be generated)", "bad_words_ids")
        return ids

    def encode_target(self, text: str, tgt_lang: str | None = None) -> list[int]:
        """The ids of a reference translation as the model would generate them: the forced first
        token (a target language, BART's <s>) if the decode has one, the text's ids,
        end-of-sentence. What transformers' tokenizer gives for text_target."""
        forced = self.target_language(tgt_lang)
        if forced is None:
            forced = self.generation_defaults.get("forced_bos_token_id")
        return ([forced] if forced is not None else []) + self.target_ids(text) + [self.eos_id]

    def target_language(self, tgt_lang: str | None) -> int | None:
        """The forced first token for `tgt_lang` (a multilingual model's target language), else
        the tokenizer's default target language's, else None (the bundle's default applies). A
        multilingual model with neither, and no recorded forced token, is refused with its languages."""
        if self.tokenizer is None or not self.tokenizer.languages:
            if tgt_lang is not None:
                raise self.one_way(tgt_lang, "tgt_lang")
            return None
        if self.tokenizer.target_in_source:  # MADLAD: a source token, not a first target token
            if tgt_lang is not None:
                self.tokenizer.language_token(tgt_lang, "tgt_lang")  # an unknown code is refused here
            return None
        code = tgt_lang or self.tokenizer.tgt_lang
        if code is not None:
            return self.tokenizer.language_id(code, "tgt_lang")
        if self.generation_defaults.get("forced_bos_token_id") is None:
            raise SettingError(f"this model translates into the language {{tgt_lang}} names; known: "
                               f"{', '.join(self.tokenizer.codes)}", "tgt_lang")
        return None

    def one_way(self, code: str, setting: str) -> SettingError:
        """The refusal of a language (the value of `setting`) by a bundle whose tokenizer takes
        none: what the bundle translates, as its files record it (runtime/text/languages.py:
        the manifest's languages, a Marian's tokenizer_config.json, its OPUS-MT name), or, where
        they record nothing, that its tokenizer has no languages."""
        from xform.runtime.text.languages import PREFIX, bundle_languages, same, spelled

        bundle = self.session.bundle
        try:
            languages = bundle_languages(bundle.path) if bundle is not None else None
        except (XformError, OSError):
            languages = None
        if languages is None or not languages.known:
            return no_languages(code, setting)
        side, into = (1, "into") if setting == "tgt_lang" else (0, "from")
        codes = languages.targets if side else languages.sources
        served = any(same(pair[side], code) for pair in languages.pairs) or (
            codes is None or spelled(code, codes) is not None) and bool(languages.targets)
        what = (f"{{{setting}}} {code}: this bundle translates {'; '.join(languages.summary())} only (from its "
                f"{languages.origin})")
        if languages.ask.kind == PREFIX and setting == "tgt_lang":
            how = f"ask for a target with >>{code}<< at the start of the text" if served else \
                f"it cannot translate {into} {code}"
            return SettingError(f"{what} and takes no {{{setting}}}: {how}", setting)
        if served:
            return SettingError(f"{what} and takes no {{{setting}}}: leave it out", setting)
        return SettingError(f"{what}, so {{{setting}}} {code} cannot be served: it does not translate {into} {code} "
                            f"(and takes no {{{setting}}}); use a bundle that does", setting)

    def vocab_map(self, vocab_map: "VocabMap | str | Path | None") -> VocabMap | None:
        """A vocabulary map (or the path of one) checked against this bundle: it needs the
        restricted decoder (export --with-vocab-map) and a tokenizer."""
        if vocab_map is None:
            return None
        if not self.capabilities.restriction:
            raise InputError(f"{{vocab_map}}: a vocabulary map needs the restricted decoder on the ort backend: "
                             f"{RESTRICTED}").naming("vocab_map")
        if self.tokenizer is None:
            raise InputError("{vocab_map}: a vocabulary map names tokens: this bundle has no tokenizer to read them"
                             ).naming("vocab_map")
        if not isinstance(vocab_map, VocabMap):
            vocab_map = VocabMap.load(vocab_map, self.tokenizer.target_vocabulary())
        return vocab_map

    def check_replace_unknowns(self) -> None:
        """Refuse replace_unknowns on a bundle that cannot do it."""
        if not self.capabilities.attention:
            raise InputError(f"{{replace_unknowns}} needs the decoder's attention: {WITH_ATTENTION}").naming(
                "replace_unknowns")
        if self.tokenizer is None or self.tokenizer.target_unk_id is None:
            raise InputError("{replace_unknowns}: this bundle's target vocabulary has no unknown token").naming(
                "replace_unknowns")

    def fit(self, ids: list[int], truncate: bool) -> list[int]:
        """A source's ids within the model's max_len, the one rule of every door: cut to it with
        `truncate` (truncated), else refused (an InputError naming truncate, which cuts it)."""
        max_len = self.config.max_len
        if len(ids) <= max_len:
            return ids
        if truncate:
            return self.truncated(ids)
        raise InputError(f"{len(ids)} source tokens, more than the model's max_len {max_len} ({{truncate}} to cut "
                         "it)").naming("truncate")

    def truncated(self, ids: list[int]) -> list[int]:
        """A source cut to max_len: its first max_len - 1 ids and end-of-sentence."""
        return self.cut_source(ids, self.config.max_len)

    def cut_source(self, ids: list[int], n: int) -> list[int]:
        """A source cut to `n` ids: its first n - 1 and end-of-sentence (where it ends in one)."""
        if len(ids) <= n:
            return ids
        return ids[:n - 1] + [self.eos_id] if ids[-1] == self.eos_id else ids[:n]

    def allowed_ids(self, vocab_map: VocabMap, texts: list[str]) -> np.ndarray:
        """The target ids a vocabulary map allows a batch of source texts."""
        return vocab_map.ids_for([self.text.source_pieces(t) for t in texts])

    def first_token(self, settings: dict[str, Any], tgt_lang: str | None) -> None:
        """The target language's rule: the first token is the target language's (`tgt_lang`,
        else the tokenizer's default) unless `settings` force one; both naming it is refused."""
        if settings.get("forced_bos_token_id") is None:
            settings["forced_bos_token_id"] = self.target_language(tgt_lang)
        elif tgt_lang is not None:
            raise SettingError("{tgt_lang} and {forced_bos_token_id} both name the first token: give one",
                               "tgt_lang", "forced_bos_token_id")

    def encode_batch(self, texts: Sequence[str], src_lang: str | None = None, tgt_lang: str | None = None, *,
                     truncate: bool = False, max_input_length: int = 0) -> np.ndarray:
        """The padded source ids of texts: each through the tokenizer, cut to `max_input_length`
        ids (CTranslate2's; 0: no limit), then cut to max_len when `truncate`, else refused
        when longer."""
        rows = self.source_rows(texts, src_lang, tgt_lang)
        if max_input_length:
            rows = [self.cut_source(r, max_input_length) for r in rows]
        return self.session.pad([self.fit(r, truncate) for r in rows])[0]

    def prefix_ids(self, prefixes: Sequence[str | Sequence[int] | None]) -> list[list[int] | Sequence[int]]:
        """Target prefixes as ids: a text as the target tokenizer splits it ('' or None: none),
        ids kept. Their count and length are the session's to check (Session.check_prefix)."""
        return [[] if p is None or (isinstance(p, str) and not p) else self.target_ids(p) if isinstance(p, str) else p
                for p in prefixes]

    def decode_rows(self, rows: np.ndarray, n: int, sources: list[list[int]] | None = None,
                    texts: list[str] | None = None, attention: np.ndarray | None = None) -> list[str]:
        """Text of generated rows, n a source; with `attention`, each unknown target token written
        as the source word of the piece it attends to most (of `sources[k // n]`, as written in `texts`)."""
        framing = {self.pad_id, self.eos_id, self.config.bos_id}
        return decode_rows(self.text, framing, rows, n, sources, texts, attention)
