"""Text in and out: the bundle's tokenizer file turned into ids and back, offline.

Kind `xform-vocab`: for source and target each, a token list split into characters or
whitespace-separated words, or a sentencepiece model whose ids are the model's. Kind `marian-spm`: Marian's sentencepiece models and vocabularies,
tokenized as transformers' MarianTokenizer does (language-code prefix, pieces, <unk> fallback,
end-of-sentence appended). sentencepiece is imported only for the latter. No torch.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from xform.errors import BundleError, InputError

TOKENIZER_FILE = "tokenizer.json"


def target_pieces(ids, eos_id: int, special: set, piece) -> list[str]:
    """The pieces of generated ids up to end-of-sentence, special ids left out."""
    pieces = []
    for i in ids:
        i = int(i)
        if i == eos_id:
            break
        if i not in special:
            pieces.append(piece(i))
    return pieces


def load_spm(path: Path, source: str):
    try:
        import sentencepiece
    except ImportError:
        raise BundleError(f"{source}: this bundle's tokenizer needs sentencepiece: pip install sentencepiece") from None
    proc = sentencepiece.SentencePieceProcessor()
    if not path.is_file() or not proc.Load(str(path)):
        raise BundleError(f"{path}: missing or not a sentencepiece model")
    return proc


class VocabSide:
    """One side of an xform-vocab tokenizer: a token list split into words or characters, or a
    sentencepiece model (`unit` spm) whose ids are the model's."""

    def __init__(self, spec: dict[str, Any], root: Path, source: str):
        self.unit: str = spec["unit"]
        if self.unit not in ("char", "word", "spm"):
            raise BundleError(f"{source}: unit must be char, word or spm, found {self.unit!r}")
        if self.unit == "spm":
            name = spec.get("model")
            if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
                raise BundleError(f"{source}: a sentencepiece side names a file in tokenizer/, found {name!r}")
            self.spm = load_spm(root / "tokenizer" / name, source)
            return
        self.tokens: list[str | None] = spec["tokens"]
        self.index = {t: i for i, t in enumerate(self.tokens) if t is not None}
        self.unk = self.index.get(spec.get("unk", "<unk>"))
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

    def decode(self, ids: list[int]) -> str:
        if self.unit == "spm":
            return self.spm.decode([i for i in ids if i < self.spm.GetPieceSize()])
        pieces = [self.tokens[i] or "" if i < len(self.tokens) else "" for i in ids]
        return ("" if self.unit == "char" else " ").join(pieces)


class VocabTokenizer:
    def __init__(self, data: dict[str, Any], config: dict[str, Any], root: Path, source: str):
        if data.get("kind") != "xform-vocab":
            raise BundleError(f"{source}: unknown tokenizer kind {data.get('kind')!r}; expected xform-vocab")
        self.src = VocabSide(data["source"], root, source)
        self.tgt = VocabSide(data["target"], root, source)
        self.prefix = [int(i) for i in data.get("source_prefix", [])]
        self.cfg = config
        self.special = {config["pad_id"], config["bos_id"], config["eos_id"], config.get("decoder_start_id")}

    def encode(self, text: str) -> list[int]:
        return self.prefix + self.src.encode(text) + [self.cfg["eos_id"]]

    def decode(self, ids) -> str:
        return self.tgt.decode([int(i) for i in target_pieces(ids, self.cfg["eos_id"], self.special, int)])


class SpmTokenizer:
    """Marian's tokenizer: sentencepiece pieces mapped through vocab.json (target_vocab.json for
    the target side when the vocabularies are separate)."""

    LANGUAGE_CODE = re.compile(">>.+<<")

    def __init__(self, data: dict[str, Any], config: dict[str, Any], root: Path, source: str):
        self.cfg = config
        d = root / "tokenizer"

        def spm(name):
            return load_spm(d / name, source)

        def vocab(name):
            try:
                return json.loads((d / name).read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise BundleError(f"{d / name}: unreadable vocabulary ({e})") from None

        self.spm_source = spm("source.spm")
        self.spm_target = spm("target.spm") if (d / "target.spm").is_file() else self.spm_source
        self.encoder = vocab("vocab.json")
        target = vocab("target_vocab.json") if data.get("separate_vocabs") else self.encoder
        self.decoder = {i: t for t, i in target.items()}
        unk = data.get("unk_token", "<unk>")
        if unk not in self.encoder:
            raise BundleError(f"{d / 'vocab.json'}: has no unknown token {unk!r}")
        self.unk_id = self.encoder[unk]
        self.special = {config["pad_id"], config["eos_id"], self.unk_id, config.get("decoder_start_id")}

    def encode(self, text: str) -> list[int]:
        match = self.LANGUAGE_CODE.match(text)
        code = [match.group(0)] if match else []
        pieces = code + self.spm_source.encode(self.LANGUAGE_CODE.sub("", text), out_type=str)
        return [self.encoder.get(p, self.unk_id) for p in pieces] + [self.cfg["eos_id"]]

    def decode(self, ids) -> str:
        pieces = target_pieces(ids, self.cfg["eos_id"], self.special, lambda i: self.decoder.get(i, ""))
        return self.spm_target.decode_pieces(pieces).replace("\u2581", " ").strip()


def load_tokenizer(path: Path, config: dict[str, Any]):
    """The bundle's tokenizer, by the kind its tokenizer.json names."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BundleError(f"{path}: unreadable tokenizer ({e})") from None
    kind = data.get("kind")
    if kind == "xform-vocab":
        return VocabTokenizer(data, config, path.parent, str(path))
    if kind == "marian-spm":
        return SpmTokenizer(data, config, path.parent, str(path))
    raise BundleError(f"{path}: unknown tokenizer kind {kind!r}; expected xform-vocab or marian-spm")
