"""Resolve a MODEL argument to a model: a bundled name, an xform checkpoint directory, a Hugging
Face Marian / OPUS-MT directory, or a seed tutorial's state dict with `arch`.

Returns the model, a description of the source (path, kind, sha256 of its weights) for the
manifest, and the tokenizer (its tokenizer.json content and the files it needs) when the source
has one. Formats xform cannot read are refused by name, with what it can read.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from xform.errors import CheckpointError
from xform.models.checkpoint import CONFIG_FILE, WEIGHTS_FILE, load_checkpoint
from xform.runtime.bundle import sha256_file
from xform.models.transformer import Seq2SeqTransformer

BUNDLED = ("demo",)
TOKENIZER_FILE = "tokenizer.json"
KNOWN = (f"a bundled name ({', '.join(BUNDLED)}), an xform checkpoint directory ({CONFIG_FILE} + {WEIGHTS_FILE}), "
         "a Hugging Face Marian directory, or a seed tutorial's state dict with --arch")


@dataclass
class LoadedModel:
    model: Seq2SeqTransformer
    source: dict
    tokenizer: dict[str, Any] | None = None  # the bundle's tokenizer.json
    tokenizer_files: list[Path] = field(default_factory=list)  # copied into the bundle's tokenizer/
    generation: dict[str, Any] | None = None  # decoding defaults the model ships (Marian's generation_config)


def bundled_path(name: str) -> Path:
    return Path(str(resources.files("xform.data") / name))


def resolve_model(ref: str | Path, arch: str | None = None, hparams: dict[str, Any] | None = None) -> LoadedModel:
    if arch is not None:
        from xform.models.seeds import load_seed
        model, source = load_seed(Path(ref), arch, hparams or {})
        return LoadedModel(model, source)
    if hparams:
        raise CheckpointError(f"hyper-parameters {sorted(hparams)} are only for --arch seed-00x checkpoints")
    if str(ref) in BUNDLED:
        return load_xform_dir(bundled_path(str(ref)), f"bundled:{ref}")
    path = Path(ref)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory; MODEL is {KNOWN}")
    if not path.is_dir():
        raise CheckpointError(f"{path}: is a file; MODEL is {KNOWN} (a state dict file needs --arch)")
    from xform.models import marian
    if marian.is_marian_dir(path):
        model, source = marian.load_marian(path)
        spec = marian.tokenizer_spec(path)
        return LoadedModel(model, source, spec, [path / f for f in spec["files"]] if spec else [],
                           marian.generation_defaults(path))
    cfg_file = path / CONFIG_FILE
    if cfg_file.is_file():
        try:
            model_type = json.loads(cfg_file.read_text()).get("model_type")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            model_type = None
        if model_type is not None:
            raise CheckpointError(f"{cfg_file}: a Hugging Face config of model_type {model_type!r}; xform imports "
                                  "model_type 'marian' and xform checkpoints")
    return load_xform_dir(path, "xform-checkpoint")


def load_xform_dir(path: Path, kind: str) -> LoadedModel:
    model = load_checkpoint(path)
    tok = path / TOKENIZER_FILE
    tokenizer = None
    if tok.is_file():
        try:
            tokenizer = json.loads(tok.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{tok}: not valid JSON ({e})") from None
    return LoadedModel(model, {"path": str(path.resolve()), "kind": kind,
                               "sha256": sha256_file(path / WEIGHTS_FILE)}, tokenizer)
