"""Text in and out: the bundle's tokenizer file turned into ids and back.

Kind `xform-vocab`: explicit token lists for source and target, split into characters or
whitespace-separated words. Pure Python; no torch.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from xform.errors import BundleError, InputError

TOKENIZER_FILE = "tokenizer.json"


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

    @classmethod
    def from_file(cls, path: Path, config: dict[str, Any]) -> "VocabTokenizer":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise BundleError(f"{path}: unreadable tokenizer ({e})") from None
        return cls(data, config, str(path))

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
        pieces = []
        for i in ids:
            i = int(i)
            if i == self.cfg["eos_id"]:
                break
            if i not in self.special:
                pieces.append(self.tgt.tokens[i])
        return self.tgt.join(pieces)
