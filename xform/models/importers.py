"""Resolve a MODEL argument to a model: a bundled name, or an xform checkpoint directory.

Returns the model, a description of the source (path, kind, sha256 of its weights) for the
manifest, and the tokenizer file when the source has one. Formats xform cannot read are refused
by name, with what it can read.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from xform.errors import CheckpointError
from xform.models.checkpoint import CONFIG_FILE, WEIGHTS_FILE, load_checkpoint, sha256_file
from xform.models.transformer import Seq2SeqTransformer

BUNDLED = ("demo",)
TOKENIZER_FILE = "tokenizer.json"


@dataclass
class LoadedModel:
    model: Seq2SeqTransformer
    source: dict
    tokenizer: Path | None


def bundled_path(name: str) -> Path:
    return Path(str(resources.files("xform.data") / name))


def resolve_model(ref: str | Path) -> LoadedModel:
    if str(ref) in BUNDLED:
        path, kind = bundled_path(str(ref)), f"bundled:{ref}"
    else:
        path, kind = Path(ref), "xform-checkpoint"
        if not path.exists():
            raise CheckpointError(f"{path}: no such file or directory; MODEL is a bundled name "
                                  f"({', '.join(BUNDLED)}) or an xform checkpoint directory")
        if not path.is_dir():
            raise CheckpointError(f"{path}: is a file; MODEL is a bundled name ({', '.join(BUNDLED)}) or a "
                                  f"directory with {CONFIG_FILE} and {WEIGHTS_FILE}")
        cfg_file = path / CONFIG_FILE
        if cfg_file.is_file():
            try:
                model_type = json.loads(cfg_file.read_text()).get("model_type")
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                model_type = None
            if model_type is not None:
                raise CheckpointError(f"{cfg_file}: a Hugging Face config (model_type {model_type!r}); this xform "
                                      "reads xform checkpoints only")
    model = load_checkpoint(path)
    tok = path / TOKENIZER_FILE
    return LoadedModel(model, {"path": str(path.resolve()), "kind": kind,
                               "sha256": sha256_file(path / WEIGHTS_FILE)},
                       tok if tok.is_file() else None)
