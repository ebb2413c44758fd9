"""The Hugging Face families xform imports, one record per `model_type`, in one table.

resolve_model (importers.py) reads a directory's config.json once, looks its model_type up in
FAMILIES and hands the parsed config to the record's functions; a family module (marian.py,
bart_family.py, t5.py) is reached only through this table, and none imports another: what they
share is huggingface.py. A `Family` record says what xform does with the type: read its config
into a TransformerConfig (refusing, every reason at once, what xform cannot express), convert its
weights to xform's names, build its tokenizer spec, name the files text needs, and record its
decoding defaults. A `Refused` record names a type xform will not import and why. A new family is
a module with those functions and its records here; the messages that list what xform imports
(importers.KNOWN, the unknown model_type's) are made from this table.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable

import torch

from xform.config import TransformerConfig
from xform.errors import CheckpointError
from xform.models import bart_family, huggingface, marian, t5
from xform.tokenizer_spec import TokenizerSpec

Json = dict[str, Any]


@dataclass(frozen=True)
class Family:
    model_type: str
    names: tuple[str, ...]  # what its models are called, for the messages that list what xform imports
    # (config.json, generation_config.json or {}, config.json's path) -> the model's config
    config: Callable[[Json, Json, str], TransformerConfig]
    # (config, their state dict, the weights file's path) -> xform's state dict; every problem at once
    convert: Callable[[TransformerConfig, dict[str, torch.Tensor], str], dict[str, torch.Tensor]]
    # (directory, config) -> (the bundle's tokenizer spec, the files it copies); (None, []) without
    # tokenizer files; huggingface.UnsupportedTokenizer where xform does not reproduce it
    tokenizer: Callable[[Path, TransformerConfig], tuple[TokenizerSpec | None, list[str]]]
    text_files: str  # what text needs, for the note of a directory without tokenizer files
    # (config.json, generation_config.json or {}, the file they come from) -> decoding defaults
    generation: Callable[[Json, Json, str], dict[str, Any]]


@dataclass(frozen=True)
class Refused:
    model_type: str
    reason: str


def bart(model_type: str, *names: str) -> Family:
    """A type of the BART family: one reader, its differences looked up by model_type."""
    return Family(model_type, names, bart_family.family_config, partial(bart_family.convert_family_state, model_type),
                  partial(bart_family.tokenizer_spec, model_type), bart_family.TEXT_FILES[model_type],
                  huggingface.processor_defaults)


def t5_type(model_type: str, *names: str) -> Family:
    return Family(model_type, names, t5.t5_config, t5.convert_t5_state, t5.tokenizer_spec, t5.TEXT_FILES,
                  huggingface.processor_defaults)


def table(*records: Family | Refused) -> dict[str, Family | Refused]:
    """model_type -> its record; a type registered twice is a mistake in this file."""
    out: dict[str, Family | Refused] = {}
    for record in records:
        if record.model_type in out:
            raise ValueError(f"model_type {record.model_type!r} is registered twice")
        out[record.model_type] = record
    return out


FAMILIES = table(
    Family("marian", ("Marian",), marian.marian_config, marian.convert_state, marian.tokenizer_spec,
           marian.TEXT_FILES, huggingface.generation_defaults),
    bart("m2m_100", "M2M100", "NLLB"),
    bart("mbart", "mBART"),
    bart("bart", "BART"),
    t5_type("t5", "T5", "Flan-T5", "MADLAD-400"),
    t5_type("mt5", "mT5"),
    Refused("umt5", "UMT5 learns a relative position bias in every layer; xform shares one per stack"),
)


def imported() -> list[Family]:
    return [f for f in FAMILIES.values() if isinstance(f, Family)]


def directories() -> str:
    """The imported families by their models' names: "Marian, M2M100 / NLLB, ... or mT5"."""
    names = [" / ".join(f.names) for f in imported()]
    return f"{', '.join(names[:-1])} or {names[-1]}"


def family_of(model_type: object, config_file: Path) -> Family:
    """The record of a Hugging Face config's model_type; a refused or unknown type is refused,
    naming the file and what xform imports."""
    record = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if isinstance(record, Refused):
        raise CheckpointError(f"{config_file}: model_type {model_type!r}: {record.reason}")
    if record is None:
        types = ", ".join(f.model_type + (f" ({', '.join(f.names)})" if len(f.names) > 1 else "") for f in imported())
        raise CheckpointError(f"{config_file}: a Hugging Face config of model_type {model_type!r}; xform imports "
                              f"model_type {types} and xform checkpoints")
    return record
