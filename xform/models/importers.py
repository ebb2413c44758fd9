"""Resolve a MODEL argument to a model: a bundled name, an xform checkpoint directory, a Hugging
Face directory of a family families.py's table imports (Marian, the BART and T5 families), or a
state dict file: a torch.nn.Transformer model or one of the seed tutorials' models, recognised from
its keys (`arch` "auto") or named by `arch`.

A directory's config.json is read once (read_model_config): without a model_type it is an xform
checkpoint's, with one the table's record of that type loads the directory (load_hf_dir).
Returns the model, a description of the source (path, kind, sha256 of its weights) for the
manifest, and the tokenizer (its tokenizer.json spec and the files it needs) when the source
has one. Formats xform cannot read are refused by name, with what it can read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from xform.errors import CheckpointError
from xform.files import read_json_object, sha256_file
from xform.models import STATE_DICT_ARCHS as ARCHS
from xform.models.checkpoint import CONFIG_FILE, WEIGHTS_FILE, config_from, load_checkpoint, load_state_into
from xform.models.families import Family, directories, family_of
from xform.models.huggingface import UnsupportedTokenizer, read_generation, read_weights
from xform.models.tokenizer_files import no_tokenizer_note
from xform.models.transformer import Seq2SeqTransformer
from xform.tokenizer_spec import TokenizerSpec, parse

BUNDLED = ("demo",)
TOKENIZER_FILE = "tokenizer.json"
KNOWN = (f"a bundled name ({', '.join(BUNDLED)}), an xform checkpoint directory ({CONFIG_FILE} + {WEIGHTS_FILE}), "
         f"a Hugging Face {directories()} directory, or a state "
         "dict file (.pt / .pth / .bin / .safetensors) of a torch.nn.Transformer or seed tutorial model")
TORCH_NN = "torch-nn-transformer"
# keys xform itself names its parameters with, to recognise a bare xform state dict
XFORM_KEYS = ("src_embed.weight", "encoder_layers.0.self_attn.q_proj.weight")


@dataclass
class LoadedModel:
    model: Seq2SeqTransformer
    source: dict
    tokenizer: TokenizerSpec | None = None  # the bundle's tokenizer.json
    # (file, name): copied into the bundle's tokenizer/ under that name
    tokenizer_files: list[tuple[Path, str]] = field(default_factory=list)
    generation: dict[str, Any] | None = None  # decoding defaults the model ships (Marian's generation_config)


def bundled_path(name: str) -> Path:
    return Path(str(resources.files("xform.data") / name))


def resolve_model(ref: str | Path, arch: str | None = None, hparams: dict[str, Any] | None = None) -> LoadedModel:
    """A state dict's source record says whether its layout was recognised (arch "auto")."""
    path = Path(ref)
    if arch == "auto" and not path.is_file():
        arch = None  # a bundled name, a Hugging Face or an xform checkpoint directory: recognised as always
    if arch is not None or (str(ref) not in BUNDLED and path.is_file()):
        return load_state_dict_file(path, arch or "auto", hparams or {})
    if hparams:
        raise CheckpointError(f"hyper-parameters {sorted(hparams)} are only for state dict files")
    if str(ref) in BUNDLED:
        return load_directory(bundled_path(str(ref)), f"bundled:{ref}")
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory; MODEL is {KNOWN}")
    return load_directory(path, "xform-checkpoint")


def read_model_config(directory: Path) -> dict[str, Any]:
    """A model directory's config.json, read and parsed once whatever the model (an xform
    checkpoint's, a Hugging Face model's): missing, unreadable, not JSON or not a JSON object is
    refused naming the file and what is wrong with it."""
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; MODEL is {KNOWN}")
    return read_json_object(path, CheckpointError)


def load_directory(path: Path, kind: str) -> LoadedModel:
    """An xform checkpoint (`kind`), or a Hugging Face directory by the record of its model_type."""
    config = read_model_config(path)
    if config.get("model_type") is None:
        return load_xform_dir(path, kind, config)
    return load_hf_dir(path, family_of(config["model_type"], path / CONFIG_FILE), config)


def load_hf_dir(path: Path, family: Family, hf: dict[str, Any]) -> LoadedModel:
    """A Hugging Face directory's model by its family's record (`hf`: config.json, read), with
    its tokenizer (the record's, which refuses an incomplete one); without any tokenizer file,
    or with one xform does not reproduce, the model alone and a note saying what text needs."""
    generation, generation_source = read_generation(path)
    cfg = family.config(hf, generation, str(path / CONFIG_FILE))
    theirs, weights = read_weights(path)
    model = load_state_into(Seq2SeqTransformer(cfg), family.convert(cfg, dict(theirs), str(weights)), str(weights))
    source: dict[str, Any] = {"path": str(path.resolve()), "kind": f"huggingface-{family.model_type}",
                              "sha256": sha256_file(weights), "weights": weights.name, "notes": []}
    defaults = family.generation(hf, generation, generation_source)
    try:
        spec, files = family.tokenizer(path, cfg)
    except UnsupportedTokenizer as e:
        spec, files = None, []
        source["notes"].append(str(e))
    else:
        if spec is None:
            source["notes"].append(no_tokenizer_note(path, family.text_files))
    return LoadedModel(model, source, spec, [(path / f, f) for f in files], defaults)


def load_xform_dir(path: Path, kind: str, config: dict[str, Any]) -> LoadedModel:
    model = load_checkpoint(path, config_from(config, path / CONFIG_FILE))
    tok = path / TOKENIZER_FILE
    tokenizer = None
    if tok.is_file():
        tokenizer = parse(read_json_object(tok, CheckpointError), str(tok), CheckpointError)
    return LoadedModel(model, {"path": str(path.resolve()), "kind": kind,
                               "sha256": sha256_file(path / WEIGHTS_FILE)}, tokenizer)


def load_state_dict_file(path: Path, arch: str, hparams: dict[str, Any]) -> LoadedModel:
    from xform.models import seeds, torch_nn

    if arch not in ARCHS:
        raise CheckpointError(f"--arch {arch!r}: expected one of {list(ARCHS)}")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory; --arch {arch} reads a state dict file "
                              "(a Marian or xform checkpoint directory needs no --arch)")
    state = seeds.read_state_dict(path)
    recognised = arch == "auto"
    if recognised:
        arch = detect_arch(state, str(path))
    try:
        nn_only = sorted(k for k in torch_nn.OPTIONS if hparams.get(k) is not None)
        if arch == TORCH_NN:
            model, source = torch_nn.load_torch_nn(path, hparams, state)
        elif nn_only:
            raise CheckpointError(f"{', '.join('--' + k.replace('_', '-') for k in nn_only)} only go with "
                                  f"--arch {TORCH_NN}; {path} is a {arch} state dict, whose code fixes them")
        else:
            model, source = seeds.load_seed(path, arch, hparams, state)
    except CheckpointError as e:
        layout = None if recognised else matching_layout(state, str(path))
        if layout is None or layout == arch:
            raise
        raise CheckpointError(f"{e}\n{path} is not a --arch {arch} state dict: its keys are a {layout} model's; "
                              f"pass --arch {layout}, or leave --arch out (auto recognises it)") from None
    return LoadedModel(model, {**source, "recognised": recognised})


def matching_layout(state: dict[str, Any], source: str) -> str | None:
    """The one layout the keys fit, or None (none or several)."""
    try:
        return detect_arch(state, source)
    except CheckpointError:
        return None


def detect_arch(state: dict[str, Any], source: str) -> str:
    """The one arch whose layout accounts for every key; refused, with the candidates, otherwise."""
    from xform.models import seeds, torch_nn

    if not state:
        raise CheckpointError(f"{source}: an empty state dict (no tensors)")
    left = {arch: seeds.unplaced(spec, state) for arch, spec in seeds.ARCH_SPECS.items()}
    fits = [arch for arch, keys in left.items() if not keys]
    if torch_nn.is_torch_nn(state):
        fits.append(TORCH_NN)
    if len(fits) == 1:
        return fits[0]
    if fits:
        raise CheckpointError(f"{source}: unsure which model this is: its keys fit {', '.join(fits)}; "
                              "pass --arch with the one it is")
    if all(k in state for k in XFORM_KEYS):
        raise CheckpointError(f"{source}: xform's own parameter names, without a config; export the checkpoint "
                              f"directory (save_checkpoint writes {CONFIG_FILE} + {WEIGHTS_FILE}) instead of a bare "
                              "state dict")
    best = min(left, key=lambda a: len(left[a]))
    keys = left[best]
    raise CheckpointError(f"{source}: not a layout xform knows ({', '.join(a for a in ARCHS if a != 'auto')}). "
                          f"Closest: {best}, which cannot place {len(keys)} of {len(state)} keys: {keys[:8]}"
                          f"{' ...' if len(keys) > 8 else ''}")
