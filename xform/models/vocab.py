"""Vocabularies given beside a state dict (`--src-vocab FILE --tgt-vocab FILE`), turned into the
bundle's tokenizer: kind `xform-vocab`, one side each for source and target.

A side is a JSON list (index = id: torchtext's `vocab.get_itos()`), a JSON dict (token -> id:
`vocab.get_stoi()`, or a hand-made dict), or a sentencepiece `.model` whose own ids are the model's.
Text is split on whitespace or into characters (`--tokenize`), or by sentencepiece for a `.model`.
The source gets end-of-sentence appended, and start-of-sentence prepended with `--src-bos`.
No torch: the CLI imports this.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xform.errors import CheckpointError

TOKENIZE = {"whitespace": "word", "characters": "char", "sentencepiece": "spm"}
SIDE_FILES = {"source": "source.model", "target": "target.model"}


@dataclass(frozen=True)
class VocabFiles:
    src: Path
    tgt: Path
    tokenize: str | None = None  # a TOKENIZE key; None: sentencepiece for .model files, else whitespace
    src_bos: bool = False


def read_tokens(path: Path, flag: str) -> list[str | None]:
    """A JSON list or dict as a list indexed by id (None where the dict has no token for an id)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{flag} {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{flag} {path}: not a JSON vocabulary ({e}); expected a list of tokens, a dict "
                              "token -> id, or a sentencepiece .model") from None
    if isinstance(data, list) and all(isinstance(t, str) for t in data):
        tokens: list[str | None] = list(data)
    elif isinstance(data, dict) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                        for i in data.values()):
        tokens = [None] * (max(data.values(), default=-1) + 1)
        for t, i in data.items():
            if tokens[i] is not None:
                raise CheckpointError(f"{flag} {path}: id {i} is given to both {tokens[i]!r} and {t!r}")
            tokens[i] = t
    else:
        raise CheckpointError(f"{flag} {path}: expected a JSON list of strings or a dict of string -> "
                              f"non-negative int, found {type(data).__name__}")
    dupes = sorted({t for t in tokens if t is not None and tokens.count(t) > 1})
    if dupes:
        raise CheckpointError(f"{flag} {path}: tokens listed twice: {dupes[:5]}")
    return tokens


def spm_size(path: Path, flag: str) -> int:
    try:
        import sentencepiece
    except ImportError:
        raise CheckpointError(f"{flag} {path}: a sentencepiece model needs sentencepiece: pip install sentencepiece") from None
    proc = sentencepiece.SentencePieceProcessor()
    try:
        ok = proc.Load(str(path))
    except (OSError, RuntimeError) as e:
        raise CheckpointError(f"{flag} {path}: not a sentencepiece model ({e})") from None
    if not ok:
        raise CheckpointError(f"{flag} {path}: not a sentencepiece model")
    return proc.GetPieceSize()


def vocab_tokenizer(files: VocabFiles, config: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[Path, str]]]:
    """The tokenizer.json content and the files (path, name in the bundle's tokenizer/) it needs."""
    tokenize = files.tokenize
    spec: dict[str, Any] = {"kind": "xform-vocab"}
    copies: list[tuple[Path, str]] = []
    for side, path, flag, rows in (("source", files.src, "--src-vocab", config["src_vocab_size"]),
                                   ("target", files.tgt, "--tgt-vocab", config["tgt_vocab_size"])):
        path = Path(path)
        if path.suffix == ".model":
            if tokenize not in (None, "sentencepiece"):
                raise CheckpointError(f"{flag} {path}: a sentencepiece model, but --tokenize {tokenize}")
            size = spm_size(path, flag)
            spec[side] = {"unit": "spm", "model": SIDE_FILES[side]}
            copies.append((path, SIDE_FILES[side]))
        else:
            if tokenize == "sentencepiece":
                raise CheckpointError(f"{flag} {path}: --tokenize sentencepiece needs a sentencepiece .model file")
            tokens = read_tokens(path, flag)
            size = len(tokens)
            spec[side] = {"unit": TOKENIZE[tokenize or "whitespace"], "tokens": tokens, "unk": "<unk>"}
        if size > rows:
            raise CheckpointError(f"{flag} {path}: {size} tokens, but the model's {side} embedding has {rows} rows")
    if files.src_bos:
        spec["source_prefix"] = [config["bos_id"]]
    return spec, copies
