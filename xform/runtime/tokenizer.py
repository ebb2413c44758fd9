"""Text in and out: the bundle's tokenizer file turned into ids and back, offline.

Kind `xform-vocab`: explicit token lists for source and target, split into characters or
whitespace-separated words. Kind `marian-spm`: Marian's sentencepiece models and vocabularies,
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


class VocabSide:
    def __init__(self, spec: dict[str, Any], source: str):
        self.tokens: list[str] = spec["tokens"]
        self.unit: str = spec["unit"]
        if self.unit not in ("char", "word"):
            raise BundleError(f"{source}: unit must be char or word, found {self.unit!r}")
        self.index = {t: i for i, t in enumerate(self.tokens)}
        self.unk = self.index.get(spec.get("unk", "<unk>"))

    def split(self, text: str) -> list[str]:
        return list(text.replace(" ", "")) if self.unit == "char" else text.split()

    def join(self, pieces: list[str]) -> str:
        return ("" if self.unit == "char" else " ").join(pieces)


class VocabTokenizer:
    def __init__(self, data: dict[str, Any], config: dict[str, Any], source: str):
        if data.get("kind") != "xform-vocab":
            raise BundleError(f"{source}: unknown tokenizer kind {data.get('kind')!r}; expected xform-vocab")
        self.src = VocabSide(data["source"], source)
        self.tgt = VocabSide(data["target"], source)
        self.cfg = config
        self.special = {config["pad_id"], config["bos_id"], config["eos_id"], config.get("decoder_start_id")}


    def encode(self, text: str) -> list[int]:
        ids = []
        for piece in self.src.split(text):
            i = self.src.index.get(piece, self.src.unk)
            if i is None:
                raise InputError(f"source text {text!r}: {piece!r} is not in the source vocabulary "
                                 f"and it has no <unk>")
            ids.append(i)
        return ids + [self.cfg["eos_id"]]

    def decode(self, ids) -> str:
        return self.tgt.join(target_pieces(ids, self.cfg["eos_id"], self.special, self.tgt.tokens.__getitem__))


class SpmTokenizer:
    """Marian's tokenizer: sentencepiece pieces mapped through vocab.json (target_vocab.json for
    the target side when the vocabularies are separate)."""

    LANGUAGE_CODE = re.compile(">>.+<<")

    def __init__(self, data: dict[str, Any], config: dict[str, Any], root: Path, source: str):
        try:
            import sentencepiece
        except ImportError:
            raise BundleError(f"{source}: this bundle's tokenizer needs sentencepiece: pip install sentencepiece") from None
        self.cfg = config
        d = root / "tokenizer"

        def spm(name):
            proc = sentencepiece.SentencePieceProcessor()
            if not (d / name).is_file() or not proc.Load(str(d / name)):
                raise BundleError(f"{d / name}: missing or not a sentencepiece model")
            return proc

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
        return VocabTokenizer(data, config, str(path))
    if kind == "marian-spm":
        return SpmTokenizer(data, config, path.parent, str(path))
    raise BundleError(f"{path}: unknown tokenizer kind {kind!r}; expected xform-vocab or marian-spm")
