"""Kinds `fairseq-spm` (NLLB, mBART-50, M2M100) and `byte-bpe` (BART): the fairseq family's text,
as transformers' slow tokenizer classes give it, offline. sentencepiece and tokenizers are imported
only for the kinds that use them. No torch, no transformers.
"""
from __future__ import annotations

from pathlib import Path

from xform.config import TransformerConfig
from xform.errors import BundleError, Message, SettingError
from xform.files import read_json_object
from xform.runtime.text.tokenizer import Tokenizer, clean_up_spaces, join_spm_pieces, load_spm, target_pieces
from xform.tokenizer_spec import ByteBpeSpec, FairseqSpmSpec, language_code


class FairseqSpmTokenizer(Tokenizer):
    """NLLB's, mBART-50's and M2M100's tokenizers, as transformers' slow classes tokenize:
    sentencepiece pieces, each mapped to the model's id by fairseq's offset (spm id + 1; spm's
    unknown to `<unk>`) or through vocab.json (M2M100); the source framed by its language code and
    end-of-sentence; language codes and the other added tokens by the ids tokenizer_config.json
    gives them. `encode(text, src_lang)`; `language_id(code)` is the target's forced first token."""

    spm_words = True  # source pieces mark word starts with U+2581

    def __init__(self, spec: FairseqSpmSpec, config: TransformerConfig, root: Path, source: str):
        self.cfg = config
        self.clean = spec.clean_up_tokenization_spaces
        d = root / "tokenizer"
        name = spec.model
        if Path(name).name != name:
            raise BundleError(f"{source}: model must name a file in tokenizer/, found {name!r}")
        self.spm = load_spm(d / name, source)
        self.special: dict[str, int] = spec.special
        if not all(t in self.special for t in spec.languages):
            raise BundleError(f"{source}: languages must list tokens of special")
        self.languages: list[str] = list(spec.languages)
        unk_id = self.special.get(spec.unk_token)
        if unk_id is None:
            raise BundleError(f"{source}: no id for the unknown token {spec.unk_token!r}")
        self.unk_id: int = unk_id
        self.vocab = None
        if spec.vocab:
            self.vocab = read_json_object(d / spec.vocab, BundleError, "a vocabulary token -> id")
            self.pieces = {i: t for t, i in self.vocab.items()}
        self.offset = spec.offset
        self.template = list(spec.source)
        if sorted(self.template) != ["eos", "lang", "text"]:
            raise BundleError(f"{source}: source must order lang, text and eos, found {self.template!r}")
        self.src_lang, self.tgt_lang = spec.src_lang, spec.tgt_lang
        rows = config.src_vocab_size
        bad = sorted(t for t, i in self.special.items() if not 0 <= i < rows)
        if bad or self.spm.GetPieceSize() + self.offset > rows and self.vocab is None:
            raise BundleError(f"{source}: token ids outside the model's vocabulary of {rows} "
                              f"(for {bad[:3] or 'pieces'})")
        self.skip = set(self.special.values()) | {config.pad_id, config.eos_id, config.decoder_start_id}

    @property
    def codes(self) -> list[str]:
        """The language codes as users type them: M2M100's token "__fr__" is the code "fr"."""
        return [language_code(t) for t in self.languages]

    def language_id(self, code: str, setting: str = "tgt_lang") -> int:
        if code not in self.languages and f"__{code}__" in self.languages:  # M2M100's "fr" is its token "__fr__"
            code = f"__{code}__"
        if code not in self.languages:
            raise SettingError(f"{{{setting}}} {code!r}: not a language of this model; known: {', '.join(self.codes)}",
                               setting)
        return self.special[code]

    def piece_ids(self, text: str) -> list[int]:
        pieces = self.spm.encode(text, out_type=str)
        if self.vocab is not None:
            return [self.vocab.get(p, self.unk_id) for p in pieces]
        ids = []
        for p in pieces:
            i = self.spm.PieceToId(p)
            ids.append(i + self.offset if i and not self.spm.IsUnknown(i) else self.unk_id)
        return ids

    def target_ids(self, text: str) -> list[int]:
        """Target ids of a text: its pieces (the language token and end-of-sentence are the session's)."""
        return self.piece_ids(text)

    def encode(self, text: str, src_lang: str | None = None, setting: str = "src_lang") -> list[int]:
        """Source ids of a text in `src_lang` (else the default source language); `setting`: what
        an error names the language (errors.py's markers)."""
        lang = src_lang or self.src_lang
        if lang is None:
            raise SettingError(f"this model needs the source language ({{{setting}}}); known: "
                               f"{', '.join(self.codes)}", setting)
        parts = {"lang": [self.language_id(lang, setting)], "text": self.piece_ids(text),
                 "eos": [self.cfg.eos_id]}
        return [i for part in self.template for i in parts[part]]

    def decode(self, ids, replacements: dict[int, str] | None = None) -> str:
        pieces = [p for p in target_pieces(ids, self.cfg.eos_id, self.skip, self.source_piece, replacements) if p]
        text = join_spm_pieces(pieces) if replacements else self.spm.decode_pieces(pieces)
        return clean_up_spaces(text) if self.clean else text

    @property
    def target_unk_id(self) -> int | None:
        return self.unk_id

    def target_vocabulary(self) -> dict[str, int]:
        """Piece -> id, special tokens and language codes included (one vocabulary both sides)."""
        if self.vocab is not None:
            return {**self.vocab, **self.special}
        pieces = {self.spm.IdToPiece(i): i + self.offset for i in range(1, self.spm.GetPieceSize())}
        return {**pieces, **self.special}

    def source_pieces(self, text: str, src_lang: str | None = None) -> list[str]:
        """The source text's pieces as written, one per id of encode(text) (framing: empty)."""
        parts = {"lang": [""], "text": self.spm.encode(text, out_type=str), "eos": [""]}
        return [p for part in self.template for p in parts[part]]

    def source_piece(self, i: int) -> str:
        """A model id's piece (one vocabulary for source and target)."""
        if self.vocab is not None:
            return self.pieces.get(i, "")
        return self.spm.IdToPiece(i - self.offset) if 0 <= i - self.offset < self.spm.GetPieceSize() else ""

    def unknown(self, ids: list[int]) -> tuple[int, int]:
        body = ids[1:-1] if self.template[0] == "lang" else ids[:-2]
        return sum(i == self.unk_id for i in body), len(body)

    def describe(self) -> list[str]:
        sample = "Hello, world."
        lang = self.src_lang or self.languages[0]
        ids = self.encode(sample, lang)
        names = {i: t for t, i in self.special.items()}
        pieces = [names.get(i) or self.source_piece(i) for i in ids]
        frame = " ".join("<src_lang>" if p == "lang" else "..." if p == "text" else "</s>" for p in self.template)
        return [Message(f"text in: {self.spm.GetPieceSize()} sentencepiece pieces "
                        f"({'vocab.json' if self.vocab else 'ids + 1'}), framed as {frame}; "
                        f"{len(self.languages)} languages: {{src_lang}} / {{tgt_lang}} (default source "
                        f"{self.src_lang}, target {self.tgt_lang})", "src_lang", "tgt_lang"),
                f"sample: {sample!r} ({lang}) -> {' '.join(pieces)} (ids {' '.join(map(str, ids))})"]


class ByteBpeTokenizer(Tokenizer):
    """BART's tokenizer: GPT-2's byte-level BPE from vocab.json and merges.txt, through the
    `tokenizers` library, the source framed as `<s> ... </s>`; special tokens skipped on decode."""

    def __init__(self, spec: ByteBpeSpec, config: TransformerConfig, root: Path, source: str):
        try:
            from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        except ImportError:
            raise BundleError(f"{source}: this bundle's tokenizer needs tokenizers: pip install tokenizers") from None
        d = root / "tokenizer"
        for key, name in (("vocab", spec.vocab), ("merges", spec.merges)):
            if Path(name).name != name or not (d / name).is_file():
                raise BundleError(f"{source}: {key} must name a file in tokenizer/, found {name!r}")
        try:
            self.bpe = Tokenizer(models.BPE.from_file(str(d / spec.vocab), str(d / spec.merges)))
        except Exception as e:  # tokenizers raises its own exception type for a bad file
            raise BundleError(f"{d}: unreadable byte-level BPE files ({e})") from None
        self.bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=spec.add_prefix_space)
        self.bpe.decoder = decoders.ByteLevel()
        self.special = spec.special
        self.cfg, self.clean = config, spec.clean_up_tokenization_spaces
        rows = config.src_vocab_size
        if self.bpe.get_vocab_size() > rows:
            raise BundleError(f"{source}: the BPE vocabulary has {self.bpe.get_vocab_size()} ids, but the model's "
                              f"embedding has {rows} rows")
        self.bos = self.special.get(spec.bos_token)
        self.unk_id = self.special.get(spec.unk_token)
        self.skip = set(self.special.values()) | {config.pad_id, config.eos_id, config.decoder_start_id}

    def encode(self, text: str, lang: str | None = None, setting: str = "src_lang") -> list[int]:
        self.no_language(lang, setting)
        return [self.bos] + self.bpe.encode(text).ids + [self.cfg.eos_id]

    def target_ids(self, text: str) -> list[int]:
        """Target ids of a text: its BPE ids (the forced <s> and end-of-sentence are the session's)."""
        return self.bpe.encode(text).ids

    def source_pieces(self, text: str, lang: str | None = None) -> list[str]:
        """The source's BPE tokens, one per id of encode(text) (framing: empty)."""
        return [""] + self.bpe.encode(text).tokens + [""]

    def source_piece(self, i: int) -> str:
        return self.bpe.id_to_token(i) or ""

    def target_vocabulary(self) -> dict[str, int]:
        return {**self.bpe.get_vocab(), **self.special}

    def decode(self, ids, replacements: dict[int, str] | None = None) -> str:
        """Text of generated ids (`replacements` unused: a byte-level BPE spells any text, so no
        unknown tokens to replace)."""
        text = self.bpe.decode([int(i) for i in target_pieces(ids, self.cfg.eos_id, self.skip, int)],
                               skip_special_tokens=False)
        return clean_up_spaces(text) if self.clean else text

    def unknown(self, ids: list[int]) -> tuple[int, int]:
        return sum(i == self.unk_id for i in ids[1:-1]), len(ids) - 2

    def describe(self) -> list[str]:
        sample = "Hello, world."
        ids = self.encode(sample)
        return [f"text in: byte-level BPE (vocab.json, merges.txt) of {self.bpe.get_vocab_size()} tokens, framed as "
                f"<s> ... </s>",
                f"sample: {sample!r} -> {' '.join(self.bpe.id_to_token(i) or str(i) for i in ids)} "
                f"(ids {' '.join(map(str, ids))})"]
