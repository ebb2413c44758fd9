"""Text in and out: the bundle's tokenizer file turned into ids and back, offline.

Kind `xform-vocab`: for source and target each, a token list split into characters or
whitespace-separated words, or a sentencepiece model whose ids are the model's. Kind
`marian-spm`: Marian's sentencepiece models and vocabularies, tokenized as transformers'
MarianTokenizer does (language-code prefix, pieces, <unk> fallback, end-of-sentence appended).
Kinds `fairseq-spm` (NLLB, mBART-50, M2M100) and `byte-bpe` (BART): fairseq_tokenizer.py; `t5`
(T5, mT5, MADLAD-400): t5_tokenizer.py. Every kind keeps the `Tokenizer` contract. sentencepiece and
tokenizers are imported only for the kinds that use them. No torch.
"""
from __future__ import annotations

import re
from abc import ABC, abstractmethod
from pathlib import Path

from xform import files
from xform.config import TransformerConfig
from xform.errors import BundleError, InputError, SettingError
from xform.files import read_json_object
from xform.tokenizer_spec import (
    MarianSpmSpec,
    VocabSideSpec,
    VocabSpec,
)


def target_pieces(ids, eos_id: int, special: set, piece, replacements: dict[int, str] | None = None) -> list:
    """The pieces of generated ids up to end-of-sentence, special ids left out; a position in
    `replacements` gives its string instead (--replace-unknowns: the aligned source word)."""
    pieces = []
    for pos, i in enumerate(ids):
        i = int(i)
        if i == eos_id:
            break
        if replacements and pos in replacements:
            pieces.append(replacements[pos])
        elif i not in special:
            pieces.append(piece(i))
    return pieces


def join_spm_pieces(pieces: list[str]) -> str:
    """Sentencepiece pieces as text, word boundaries from the U+2581 marks (for pieces that are not
    all in one model's vocabulary: a target with source words copied in): one space a boundary,
    as sentencepiece's decoding of its own normalized pieces gives (a target's lone U+2581 piece
    before a copied word that starts with one is one space, not two)."""
    return re.sub("\u2581+", " ", "".join(pieces)).strip()


def load_spm(path: Path, source: str):
    """A bundle's sentencepiece model (xform.files.load_spm, naming the tokenizer file that uses it)."""
    return files.load_spm(path, BundleError, f"{source}:")


class Tokenizer(ABC):
    """The contract every kind keeps with the request path (translator.py, unknowns.py): text to
    source ids, target ids back to text, the pieces unknown-word replacement copies, and the
    model's languages. The defaults are a one-pair model's; multilingual kinds override them."""

    languages: list[str] = []  # a multilingual model's language tokens; empty for one pair
    target_in_source = False  # the target language is written into the source (MADLAD's <2xx>)
    tgt_lang: str | None = None  # the default target language
    skip: set = set()  # ids left out of decoded text besides pad / eos / bos

    @abstractmethod
    def encode(self, text: str, lang: str | None = None, setting: str = "src_lang") -> list[int]:
        """Source ids of a text, framed as the model was trained; `lang`: the language a
        multilingual kind needs, the value of `setting` (src_lang, or MADLAD's tgt_lang: what an
        error names)."""

    @abstractmethod
    def target_ids(self, text: str) -> list[int]:
        """A text's target ids, nothing added (a prefix, a bad word)."""

    @abstractmethod
    def decode(self, ids, replacements: dict[int, str] | None = None) -> str:
        """Text of generated ids; `replacements`: text for the unknown tokens at those positions."""

    @abstractmethod
    def target_vocabulary(self) -> dict[str, int]:
        """Target token -> id (vocabulary maps name tokens)."""

    @abstractmethod
    def source_pieces(self, text: str, lang: str | None = None) -> list[str]:
        """The source's pieces as written in the text, one per source id."""

    @abstractmethod
    def source_piece(self, i: int) -> str:
        """A source id's piece, as the vocabulary holds it."""

    @abstractmethod
    def unknown(self, ids: list[int]) -> tuple[int, int]:
        """(unknown tokens, tokens) of source ids, for the warning about unknown words."""

    @abstractmethod
    def describe(self) -> list[str]:
        """Lines saying how text goes in and out, with a sample."""

    @property
    def spm_words(self) -> bool:
        """Whether source pieces mark word starts with U+2581 (a word spans several pieces)."""
        return False

    @property
    def target_unk_id(self) -> int | None:
        """The target's unknown token (None: replace-unknowns has nothing to replace)."""
        return None

    @property
    def codes(self) -> list[str]:
        """The language codes src_lang / tgt_lang take."""
        return []

    def language_id(self, code: str, setting: str = "tgt_lang") -> int:
        """The forced first target token of a language, the value of `setting` (what an error names)."""
        raise no_languages(code, setting)

    def language_token(self, code: str, setting: str = "tgt_lang") -> str:
        """The source token that asks for a target language (MADLAD)."""
        raise no_languages(code, setting)

    def no_language(self, lang: str | None, setting: str) -> None:
        """Refuse a language given to a kind that has none."""
        if lang is not None:
            raise no_languages(lang, setting)


def no_languages(code: str, setting: str) -> SettingError:
    """The refusal of a language code (the value of `setting`) by a tokenizer without languages."""
    return SettingError(f"{{{setting}}} {code}: this model's tokenizer has no languages", setting)


class VocabSide:
    """One side of an xform-vocab tokenizer: a token list split into words or characters, or a
    sentencepiece model (`unit` spm) whose ids are the model's. Ids beyond the model's `rows`
    are refused at load."""

    def __init__(self, spec: VocabSideSpec, root: Path, source: str, side: str = "source", rows: int | None = None):
        self.unit: str = spec.unit
        if self.unit == "spm":
            name = spec.model
            if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
                raise BundleError(f"{source}: a sentencepiece side names a file in tokenizer/, found {name!r}")
            self.spm = load_spm(root / "tokenizer" / name, source)
            size = self.spm.GetPieceSize()
        else:
            self.tokens: list[str | None] = list(spec.tokens)
            size = len(self.tokens)
        if rows is not None and size > rows:
            raise BundleError(f"{source}: the {side} vocabulary has {size} ids, but the model's {side} embedding has "
                              f"{rows} rows: ids {rows}..{size - 1} are outside it")
        if self.unit == "spm":
            return
        self.index = {t: i for i, t in enumerate(self.tokens) if t is not None}
        self.unk = self.index.get(spec.unk)
        self.keep_spaces = " " in self.index  # a character vocabulary with a space token

    def split(self, text: str) -> list[str]:
        if self.unit == "char":
            return list(text if self.keep_spaces else text.replace(" ", ""))
        return text.split()

    def encode(self, text: str) -> list[int]:
        if self.unit == "spm":
            return list(self.spm.encode(text, out_type=int))
        ids = []
        for piece in self.split(text):
            i = self.index.get(piece, self.unk)
            if i is None:
                raise InputError(f"source text {text!r}: {piece!r} is not in the source vocabulary "
                                 f"and it has no <unk>")
            ids.append(i)
        return ids

    @property
    def size(self) -> int:
        return self.spm.GetPieceSize() if self.unit == "spm" else len(self.tokens)

    @property
    def unk_id(self) -> int | None:
        return self.spm.unk_id() if self.unit == "spm" else self.unk

    def piece(self, i: int) -> str:
        if self.unit == "spm":
            return self.spm.IdToPiece(i) if 0 <= i < self.size else f"<id {i}>"
        return (self.tokens[i] if 0 <= i < self.size else None) or f"<id {i}>"

    def describe(self) -> str:
        unit = {"char": "characters", "word": "whitespace-separated words", "spm": "sentencepiece pieces"}[self.unit]
        return f"{unit} of a {self.size}-token vocabulary"

    def sample_text(self) -> str:
        """A short text made of the vocabulary's own plain tokens (letters first), to show a split."""
        if self.unit == "spm":
            ids = [i for i in range(self.size) if not (self.spm.IsControl(i) or self.spm.IsUnknown(i))
                   and self.spm.IdToPiece(i).lstrip("\u2581").isalpha()]
            return self.spm.decode(ids[len(ids) // 3:len(ids) // 3 + 4]) if ids else "hello"
        plain = [t for t in self.tokens if t and not (len(t) > 2 and t[0] in "<[" and t[-1] in ">]") and t != " "]
        plain = [t for t in plain if t.isalpha()] or plain
        if self.unit == "char":
            return "".join(plain[:8])
        return " ".join(plain[:4])

    def decode(self, ids: list[int]) -> str:
        if self.unit == "spm":
            return self.spm.decode([i for i in ids if i < self.spm.GetPieceSize()])
        return self.join([self.tokens[i] or "" if i < len(self.tokens) else "" for i in ids])

    def join(self, pieces: list[str]) -> str:
        """Piece strings as text, as this side's unit joins them."""
        if self.unit == "spm":
            return join_spm_pieces(pieces)
        return ("" if self.unit == "char" else " ").join(pieces)


class VocabTokenizer(Tokenizer):
    def __init__(self, spec: VocabSpec, config: TransformerConfig, root: Path, source: str):
        self.src = VocabSide(spec.source, root, source, "source", config.src_vocab_size)
        self.tgt = VocabSide(spec.target, root, source, "target", config.tgt_vocab_size)
        self.prefix = list(spec.source_prefix)
        if not all(0 <= i < config.src_vocab_size for i in self.prefix):
            raise BundleError(f"{source}: source_prefix {self.prefix!r} must be ids below src_vocab_size "
                              f"{config.src_vocab_size}")
        self.cfg = config
        self.special = {config.pad_id, config.bos_id, config.eos_id, config.decoder_start_id}

    @property
    def spm_words(self) -> bool:
        """Whether source pieces mark word starts with U+2581 (a word spans several pieces)."""
        return self.src.unit == "spm"

    def encode(self, text: str, lang: str | None = None, setting: str = "src_lang") -> list[int]:
        self.no_language(lang, setting)
        return self.prefix + self.src.encode(text) + [self.cfg.eos_id]

    def target_ids(self, text: str) -> list[int]:
        """Target ids of a text (a reference translation, a prefix, a bad word): the target side's
        split, no end-of-sentence."""
        return self.tgt.encode(text)

    def decode(self, ids, replacements: dict[int, str] | None = None) -> str:
        if replacements:
            return self.tgt.join(target_pieces(ids, self.cfg.eos_id, self.special, self.tgt.piece, replacements))
        return self.tgt.decode([int(i) for i in target_pieces(ids, self.cfg.eos_id, self.special, int)])

    @property
    def target_unk_id(self) -> int | None:
        return self.tgt.unk_id

    def target_vocabulary(self) -> dict[str, int]:
        """Target piece -> id (a vocabulary map's target tokens)."""
        if self.tgt.unit == "spm":
            return {self.tgt.spm.IdToPiece(i): i for i in range(self.tgt.size)}
        return dict(self.tgt.index)

    def source_piece(self, i: int) -> str:
        return self.src.piece(i)

    def source_pieces(self, text: str, lang: str | None = None) -> list[str]:
        """The source text's pieces as written, one per id of encode(text) (framing: empty)."""
        body = self.src.spm.encode(text, out_type=str) if self.src.unit == "spm" else self.src.split(text)
        return [""] * len(self.prefix) + list(body) + [""]

    def unknown(self, ids: list[int]) -> tuple[int, int]:
        """(unknown tokens, text tokens) of an encoded source: the framing is not counted."""
        body = ids[len(self.prefix):-1]
        unk = self.src.unk_id
        return (sum(i == unk for i in body) if unk is not None else 0), len(body)

    def describe(self) -> list[str]:
        """How text becomes ids and back, for export's report, with a sample split."""
        frame = [self.src.piece(i) for i in self.prefix]
        eos = self.src.piece(self.cfg.eos_id)
        sample = self.src.sample_text()
        ids = self.encode(sample)
        start = (f"start-of-sentence {' '.join(frame)} (id {' '.join(map(str, self.prefix))}) first"
                 if self.prefix else "no start token")
        return [f"text in: {self.src.describe()}, then end-of-sentence {eos} (id {self.cfg.eos_id}); {start}",
                f"text out: {self.tgt.describe()}, joined with "
                f"{'nothing' if self.tgt.unit == 'char' else 'spaces' if self.tgt.unit == 'word' else 'sentencepiece'}",
                f"sample: {sample!r} -> {' '.join(self.src.piece(i) for i in ids)} (ids {' '.join(map(str, ids))})"]


class SpmTokenizer(Tokenizer):
    """Marian's tokenizer: sentencepiece pieces mapped through vocab.json (target_vocab.json for
    the target side when the vocabularies are separate)."""

    spm_words = True  # source pieces mark word starts with U+2581

    LANGUAGE_CODE = re.compile(">>.+<<")

    def __init__(self, spec: MarianSpmSpec, config: TransformerConfig, root: Path, source: str):
        self.cfg = config
        d = root / "tokenizer"

        def spm(name):
            return load_spm(d / name, source)

        def vocab(name):
            return read_json_object(d / name, BundleError, "a vocabulary token -> id")

        self.spm_source = spm("source.spm")
        if not (d / "target.spm").is_file():  # exported before xform refused such models: target text would be
            # read with the source's pieces (scores of -558 for a line that scores -0.0004)
            raise BundleError(f"{d}: has source.spm but no target.spm, so target text (prefixes, scoring, bad "
                              "words) cannot be tokenized; re-export from a Marian directory holding both")
        self.spm_target = spm("target.spm")
        self.encoder = vocab("vocab.json")
        self.separate = spec.separate_vocabs
        target = vocab("target_vocab.json") if self.separate else self.encoder
        for name, vocab_map, rows in (("vocab.json", self.encoder, config.src_vocab_size),
                                      ("target_vocab.json" if self.separate else "vocab.json", target,
                                       config.tgt_vocab_size)):
            bad = [t for t, i in vocab_map.items()
                   if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < rows]
            if bad:
                raise BundleError(f"{d / name}: ids outside the model's vocabulary of {rows} (for {bad[:3]})")
        self.decoder = {i: t for t, i in target.items()}
        unk = self.unk_token = spec.unk_token
        if unk not in self.encoder:
            raise BundleError(f"{d / 'vocab.json'}: has no unknown token {unk!r}")
        self.unk_id = self.encoder[unk]
        self.special = {config.pad_id, config.eos_id, self.unk_id, config.decoder_start_id}

    def encode(self, text: str, lang: str | None = None, setting: str = "src_lang") -> list[int]:
        self.no_language(lang, setting)
        match = self.LANGUAGE_CODE.match(text)
        code = [match.group(0)] if match else []
        pieces = code + self.spm_source.encode(self.LANGUAGE_CODE.sub("", text), out_type=str)
        return [self.encoder.get(p, self.unk_id) for p in pieces] + [self.cfg.eos_id]

    def target_ids(self, text: str) -> list[int]:
        """Target ids of a text, as MarianTokenizer(text_target=...) gives them less end-of-sentence."""
        target = {t: i for i, t in self.decoder.items()}
        unk = target.get(self.unk_token, self.unk_id)
        return [target.get(p, unk) for p in self.spm_target.encode(text, out_type=str)]

    def decode(self, ids, replacements: dict[int, str] | None = None) -> str:
        pieces = target_pieces(ids, self.cfg.eos_id, self.special, lambda i: self.decoder.get(i, ""), replacements)
        if replacements:
            return join_spm_pieces(pieces)
        return self.spm_target.decode_pieces(pieces).replace("\u2581", " ").strip()

    @property
    def target_unk_id(self) -> int | None:
        return next((i for i, t in self.decoder.items() if t == self.unk_token), None)

    def target_vocabulary(self) -> dict[str, int]:
        """Target piece -> id (a vocabulary map's target tokens)."""
        return {t: i for i, t in self.decoder.items()}

    def source_pieces(self, text: str, lang: str | None = None) -> list[str]:
        """The source text's pieces as written, one per id of encode(text) (end-of-sentence: empty)."""
        match = self.LANGUAGE_CODE.match(text)
        code = [match.group(0)] if match else []
        return code + self.spm_source.encode(self.LANGUAGE_CODE.sub("", text), out_type=str) + [""]

    def source_piece(self, i: int) -> str:
        if not hasattr(self, "source_names"):
            self.source_names = {j: t for t, j in self.encoder.items()}
        return self.source_names.get(i, "")

    def unknown(self, ids: list[int]) -> tuple[int, int]:
        """(unknown tokens, text tokens) of an encoded source, end-of-sentence not counted."""
        return sum(i == self.unk_id for i in ids[:-1]), len(ids) - 1

    def describe(self) -> list[str]:
        names = {i: t for t, i in self.encoder.items()}
        sample = "Hello, world."
        ids = self.encode(sample)
        return [f"text in: Marian sentencepiece pieces (source.spm) looked up in vocab.json ({len(self.encoder)} "
                f"tokens), a >>lang<< code first when the text starts with one, then end-of-sentence (id "
                f"{self.cfg.eos_id})",
                f"text out: {'target_vocab.json' if self.separate else 'vocab.json'}, pieces joined by "
                "target.spm",
                f"sample: {sample!r} -> {' '.join(names.get(i, f'<id {i}>') for i in ids)} "
                f"(ids {' '.join(map(str, ids))})"]


def clean_up_spaces(text: str) -> str:
    """transformers' clean_up_tokenization (spaces before punctuation and English contractions)."""
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
                 (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text
