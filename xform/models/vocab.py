"""Vocabularies given beside a state dict (`--src-vocab FILE --tgt-vocab FILE`), turned into the
bundle's tokenizer: kind `xform-vocab`, one side each for source and target.

A side is a JSON list (index = id: torchtext's `vocab.get_itos()`), a JSON dict (token -> id:
`vocab.get_stoi()`, or a hand-made dict), or a sentencepiece `.model` whose own ids are the model's.
Text is split on whitespace or into characters (`--tokenize`; without it, characters when nearly
every token of the list is one character, else whitespace), or by sentencepiece for a `.model`.
The source gets end-of-sentence appended, and start-of-sentence prepended with `--src-bos`.
What was inferred, and where the vocabularies do not fit the model (a special token at another id
than the model's, fewer tokens than embedding rows), comes back as notes that export prints;
vocabularies larger than their embedding, or whose sizes fit the other side, are refused.
No torch: the CLI imports this.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xform.errors import CheckpointError
from xform.files import load_spm
from xform.tokenizer_spec import VocabSideSpec, VocabSpec

TOKENIZE = {"whitespace": "word", "characters": "char", "sentencepiece": "spm"}
SIDE_FILES = {"source": "source.model", "target": "target.model"}
CHAR_SHARE = 0.9  # a list whose plain tokens are at least this share single characters is a character vocabulary
# the names tutorials and libraries give special tokens, by the model's id they must sit at
SPECIAL_NAMES = {"pad_id": ("<pad>", "<blank>", "[PAD]"), "bos_id": ("<bos>", "<s>", "<sos>", "<start>", "[BOS]"),
                 "eos_id": ("<eos>", "</s>", "<end>", "[EOS]")}
ID_FLAGS = {"pad_id": "--pad-id", "bos_id": "--bos-id", "eos_id": "--eos-id"}


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


def looks_special(token: str) -> bool:
    return len(token) > 2 and (token[0], token[-1]) in (("<", ">"), ("[", "]"))


def infer_unit(tokens: list[str | None]) -> tuple[str, float, int]:
    """(char or word, the share of single characters, the count) among the plain (non-special) tokens."""
    plain = [t for t in tokens if t is not None and not looks_special(t)]
    share = sum(len(t) == 1 for t in plain) / len(plain) if plain else 0.0
    return ("char" if plain and share >= CHAR_SHARE else "word"), share, len(plain)


def role_notes(tokens: list[str | None], config: dict[str, Any], flag: str, path: Path) -> list[str]:
    """Warnings where the list names a special token at another id than the model's."""
    notes = []
    for key, names in SPECIAL_NAMES.items():
        want = config.get(key)
        found = {t: i for i, t in enumerate(tokens) if t in names}
        if want is None or not found or (want < len(tokens) and tokens[want] in names):
            continue
        token, at = next(iter(found.items()))
        notes.append(f"{flag} {path.name}: {token!r} is id {at}, but the model's {key} is {want} "
                     f"({ID_FLAGS[key]}): is this the vocabulary the model was trained with?")
    return notes


def spm_size(path: Path, flag: str) -> int:
    return load_spm(path, CheckpointError, flag).GetPieceSize()


def vocab_tokenizer(files: VocabFiles, config: dict[str, Any]
                    ) -> tuple[VocabSpec, list[tuple[Path, str]], list[str]]:
    """The tokenizer.json spec, the files (path, name in the bundle's tokenizer/) it needs, and
    notes for the user: what was inferred, and warnings where the vocabularies do not fit the model."""
    tokenize = files.tokenize
    spec: dict[str, VocabSideSpec] = {}
    copies: list[tuple[Path, str]] = []
    notes: list[str] = []
    sides = (("source", Path(files.src), "--src-vocab", config["src_vocab_size"]),
             ("target", Path(files.tgt), "--tgt-vocab", config["tgt_vocab_size"]))
    sizes = {}
    for side, path, flag, rows in sides:
        if path.suffix == ".model":
            if tokenize not in (None, "sentencepiece"):
                raise CheckpointError(f"{flag} {path}: a sentencepiece model, but --tokenize {tokenize}")
            sizes[side] = spm_size(path, flag)
            spec[side] = VocabSideSpec(unit="spm", model=SIDE_FILES[side])
            copies.append((path, SIDE_FILES[side]))
            continue
        if tokenize == "sentencepiece":
            raise CheckpointError(f"{flag} {path}: --tokenize sentencepiece needs a sentencepiece .model file")
        tokens = read_tokens(path, flag)
        sizes[side] = len(tokens)
        inferred, share, plain = infer_unit(tokens)
        if tokenize is None:
            unit = inferred
            notes.append(f"{flag} {path.name}: split into {'characters' if unit == 'char' else 'whitespace words'}, "
                         f"inferred: {share:.0%} of its {plain} plain tokens are single characters "
                         f"(--tokenize {'whitespace' if unit == 'char' else 'characters'} to override)")
        else:
            unit = TOKENIZE[tokenize]
            if unit != inferred:
                notes.append(f"warning: {flag} {path.name}: --tokenize {tokenize}, but {share:.0%} of its {plain} "
                             f"plain tokens are single characters: "
                             + ("a word is looked up whole, and most will be unknown" if unit == "word" else
                                "its multi-character tokens can never be produced from text"))
        if "<unk>" not in tokens:
            kind = "character" if unit == "char" else "word"
            notes.append(f"{flag} {path.name}: no '<unk>' token: a line with a {kind} outside the vocabulary fails "
                         "alone")
        notes += ["warning: " + n for n in role_notes(tokens, config, flag, path)]
        spec[side] = VocabSideSpec(unit=unit, tokens=tuple(tokens), unk="<unk>")
    (_, src_path, _, src_rows), (_, tgt_path, _, tgt_rows) = sides
    if src_rows != tgt_rows and sizes["source"] == tgt_rows and sizes["target"] == src_rows:
        raise CheckpointError(f"--src-vocab {src_path} has {sizes['source']} tokens, the rows of the model's target "
                              f"embedding, and --tgt-vocab {tgt_path} has {sizes['target']}, the source's: the two "
                              "look swapped")
    for side, path, flag, rows in sides:
        if sizes[side] > rows:
            raise CheckpointError(f"{flag} {path}: {sizes[side]} tokens, but the model's {side} embedding has "
                                  f"{rows} rows")
        if sizes[side] < rows:
            notes.append(f"warning: {flag} {path.name}: {sizes[side]} tokens for the {side} embedding's {rows} rows: "
                         f"ids {sizes[side]}..{rows - 1} have no text")
    prefix = (config["bos_id"],) if files.src_bos else ()
    return VocabSpec(source=spec["source"], target=spec["target"], source_prefix=prefix), copies, notes
