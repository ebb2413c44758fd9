"""xform checkpoints: a directory with `config.json` and `model.safetensors`.

Loading is strict: every parameter the config implies must be present with its exact shape, and
nothing else; tied weights are stored once (under the first name `named_parameters` gives them).
"""
from __future__ import annotations

import pickle
import re
from pathlib import Path

import torch

from xform.config import TransformerConfig
from xform.errors import CheckpointError, ConfigError
from xform.files import read_json_object
from xform.models.transformer import Seq2SeqTransformer

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def canonical_state(model: Seq2SeqTransformer) -> dict[str, torch.Tensor]:
    """Parameters, each tensor once, plus persistent buffers."""
    state = {name: p.detach() for name, p in model.named_parameters()}
    state.update({name: b.detach() for name, b in model.named_buffers()
                  if name in model.state_dict()})
    return state


def save_checkpoint(model: Seq2SeqTransformer, directory: str | Path) -> Path:
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous().to(torch.float32) for k, v in canonical_state(model).items()}
    # one metadata key: safetensors writes the metadata map in a random order per process, so two
    # keys make the bytes (and the sha256 recorded in manifests) differ between identical saves
    save_file(state, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    (directory / CONFIG_FILE).write_text(model.cfg.to_json() + "\n")
    return directory


def read_config(directory: str | Path) -> TransformerConfig:
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; an xform checkpoint is a directory with {CONFIG_FILE} and "
                              f"{WEIGHTS_FILE}")
    return config_from(read_json_object(path, CheckpointError), path)


def config_from(data: dict, path: Path) -> TransformerConfig:
    """The TransformerConfig an xform checkpoint's parsed config.json (at `path`) holds."""
    try:
        return TransformerConfig.from_dict(data, source=str(path))
    except ConfigError as e:
        raise CheckpointError(str(e)) from None


def load_state_into(model: Seq2SeqTransformer, state: dict[str, torch.Tensor], source: str) -> Seq2SeqTransformer:
    """Copy `state` into `model` after checking keys and shapes exactly (dtype cast to the model's is explicit)."""
    expected = canonical_state(model)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [f"{k}: expected {tuple(expected[k].shape)}, found {tuple(state[k].shape)}"
             for k in sorted(set(expected) & set(state)) if tuple(expected[k].shape) != tuple(state[k].shape)]
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing keys {missing}")
        if unexpected:
            parts.append(f"unexpected keys {unexpected}")
        if wrong:
            parts.append("shape mismatches: " + "; ".join(wrong))
        raise CheckpointError(f"{source}: weights do not match the config: " + "; ".join(parts))
    with torch.no_grad():
        for name, t in expected.items():
            if not state[name].is_floating_point():
                raise CheckpointError(f"{source}: tensor {name} has dtype {state[name].dtype}, expected a float tensor")
            t.copy_(state[name].to(t.dtype))
    return model.eval()


def load_checkpoint(directory: str | Path, cfg: TransformerConfig | None = None) -> Seq2SeqTransformer:
    """The checkpoint's model; its config read from the directory unless given (already read)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(directory)
    cfg = cfg or read_config(directory)
    path = directory / WEIGHTS_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: missing weights file")
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None
    return load_state_into(Seq2SeqTransformer(cfg), state, str(path))


MAGIC = ((b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
         (b"%PDF", "a PDF document"), (b"\x1f\x8b", "gzip data"), (b"7z\xbc\xaf", "a 7z archive"),
         (b"\x93NUMPY", "a numpy array file"), (b"\x89HDF", "an HDF5 file (Keras / TensorFlow?)"))


def what_file(head: bytes) -> str:
    """What a file that torch cannot read looks like, from its first bytes."""
    for magic, kind in MAGIC:
        if head.startswith(magic):
            return kind
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return "binary data of no known kind"
    return "a text file" if "\0" not in text else "binary data of no known kind"


def load_torch_file(path: Path) -> object:
    """torch.load(weights_only=True) of `path`, or one line saying what the file is instead: a
    text file, an image, a truncated archive, a pickle of Python objects beyond tensors. Never
    torch's advice to load with weights_only=False, which runs whatever code the file holds."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(512)
    if not head:
        raise CheckpointError(f"{path}: not a PyTorch checkpoint (an empty file)")
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):  # torch.save's zip, or a legacy pickle
        raise CheckpointError(f"{path}: not a PyTorch checkpoint ({what_file(head)})")
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        raise CheckpointError(
            f"{path}: holds Python objects besides tensors{' (' + found[1] + ')' if found else ''}, which xform does "
            "not unpickle (it could run any code): save the weights alone, torch.save(model.state_dict(), path)"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError) as e:
        first = str(e).split(". ")[0].strip() or type(e).__name__
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint, truncated or corrupt ({first})") from None
