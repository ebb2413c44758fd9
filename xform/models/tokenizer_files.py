"""The tokenizer files of a Hugging Face directory, checked before they go into a bundle.

A tokenizer needs all of its files: a directory with some of them is refused, naming the ones
missing (a target side tokenized with the source's sentencepiece model scores and continues
nonsense); a directory with none of them exports for token ids, with a note that text needs a
tokenizer. The files present must agree with each other and with the model: vocabulary ids inside
the embedding, sentencepiece pieces found in the vocabulary that maps them to ids. Which files
each tokenizer needs is the importer's (marian.py, bart_family.py, t5.py); the checks are here. No torch.
"""
from __future__ import annotations

from pathlib import Path

from xform.errors import CheckpointError
from xform.files import load_spm, read_json_object

COPY = "copy {} from the model's download; a directory without any tokenizer files exports for token ids"


def and_list(names: list[str] | tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def present(directory: Path, names: tuple[str, ...]) -> list[str]:
    """The files of `names` the directory holds, in that order."""
    return [n for n in names if (Path(directory) / n).is_file()]


def refuse_missing(directory: Path, have: list[str], needs: list[str], what: str) -> None:
    """CheckpointError naming the files `what` (a tokenizer) needs that the directory lacks."""
    missing = [n for n in needs if n not in have]
    if not missing:
        return
    found = f"has {and_list(have)} but no" if have else "has no"
    raise CheckpointError(f"{directory}: {found} {and_list(missing)}; {what} needs {and_list(needs)} "
                          f"({COPY.format('it' if len(missing) == 1 else 'them')})")


def no_tokenizer_note(directory: Path, files: str) -> str:
    """The source note of a model exported without a tokenizer (export prints it on one line)."""
    return (f"{directory}: no tokenizer files ({files}): the bundle takes token ids; text needs a tokenizer "
            "(copy its files from the model's download, or export with --src-vocab / --tgt-vocab)")


def read_vocab(path: Path, rows: int, side: str) -> dict[str, int]:
    """A vocabulary token -> id whose ids all lie inside the model's `side` embedding of `rows`."""
    vocab = read_json_object(path, CheckpointError, "a vocabulary token -> id")
    bad = [t for t, i in vocab.items() if isinstance(i, bool) or not isinstance(i, int) or i < 0]
    if bad:
        raise CheckpointError(f"{path}: ids must be non-negative integers, found {bad[:3]}")
    top = max(vocab.values(), default=-1)
    if top >= rows:
        raise CheckpointError(f"{path}: {len(vocab)} tokens with ids up to {top}, but the model's {side} embedding "
                              f"has {rows} rows: is it this model's {path.name}?")
    return vocab


def spm_pieces(path: Path):
    """(the sentencepiece model, the pieces its encode can produce: no control or unknown pieces)."""
    proc = load_spm(path, CheckpointError)
    return proc, [proc.IdToPiece(i) for i in range(proc.GetPieceSize())
                  if not (proc.IsControl(i) or proc.IsUnknown(i) or proc.IsUnused(i))]


def refuse_uncovered(spm_path: Path, vocab_path: Path, vocab: dict[str, int]) -> None:
    """A sentencepiece model most of whose pieces its vocabulary lacks belongs to another model
    (a vocabulary built from training data may lack a few pieces, never most)."""
    _, pieces = spm_pieces(spm_path)
    absent = [p for p in pieces if p not in vocab]
    if 2 * len(absent) > len(pieces):
        raise CheckpointError(f"{spm_path}: {len(absent)} of its {len(pieces)} pieces are not in {vocab_path.name} "
                              f"(for {absent[:3]}): the two are not one model's tokenizer ({COPY.format('both')})")
