"""Resolve a MODEL argument to a model: a bundled name, an xform checkpoint directory, a Hugging
Face Marian / OPUS-MT directory, or a state dict file: a torch.nn.Transformer model or one of the
seed tutorials' models, recognised from its keys (`arch` "auto") or named by `arch`.

Returns the model, a description of the source (path, kind, sha256 of its weights) for the
manifest, and the tokenizer (its tokenizer.json spec and the files it needs) when the source
has one. Formats xform cannot read are refused by name, with what it can read.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from xform.errors import CheckpointError
from xform.files import read_json_object, sha256_file
from xform.models import STATE_DICT_ARCHS as ARCHS
from xform.models.checkpoint import CONFIG_FILE, WEIGHTS_FILE, load_checkpoint
from xform.models.huggingface import UnsupportedTokenizer
from xform.models.tokenizer_files import no_tokenizer_note
from xform.models.transformer import Seq2SeqTransformer
from xform.tokenizer_spec import TokenizerSpec, parse

BUNDLED = ("demo",)
TOKENIZER_FILE = "tokenizer.json"
KNOWN = (f"a bundled name ({', '.join(BUNDLED)}), an xform checkpoint directory ({CONFIG_FILE} + {WEIGHTS_FILE}), "
         "a Hugging Face Marian, M2M100 / NLLB, mBART, BART, T5 / Flan-T5 / MADLAD-400 or mT5 directory, or a state "
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
        arch = None  # a bundled name, a Marian or an xform checkpoint directory: recognised as always
    if arch is not None or (str(ref) not in BUNDLED and path.is_file()):
        return load_state_dict_file(path, arch or "auto", hparams or {})
    if hparams:
        raise CheckpointError(f"hyper-parameters {sorted(hparams)} are only for state dict files")
    if str(ref) in BUNDLED:
        return load_xform_dir(bundled_path(str(ref)), f"bundled:{ref}")
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory; MODEL is {KNOWN}")
    from xform.models import bart_family, marian, t5
    if marian.is_marian_dir(path):
        model, source = marian.load_marian(path)
        return with_tokenizer(path, model, source, marian.tokenizer_spec, marian.TEXT_FILES,
                              marian.generation_defaults(path))
    if bart_family.is_family_dir(path):
        model, source = bart_family.load_family(path)
        return with_tokenizer(path, model, source, bart_family.tokenizer_spec,
                              bart_family.TEXT_FILES[str(bart_family.model_type(path))],
                              bart_family.generation_defaults(path))
    if t5.is_t5_dir(path):
        model, source = t5.load_t5(path)
        return with_tokenizer(path, model, source, t5.tokenizer_spec, t5.TEXT_FILES, t5.generation_defaults(path))
    cfg_file = path / CONFIG_FILE
    if cfg_file.is_file():
        try:
            model_type = json.loads(cfg_file.read_text()).get("model_type")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            model_type = None
        if model_type in t5.REFUSED_TYPES:
            raise CheckpointError(f"{cfg_file}: model_type {model_type!r}: {t5.REFUSED_TYPES[model_type]}")
        if model_type is not None:
            raise CheckpointError(f"{cfg_file}: a Hugging Face config of model_type {model_type!r}; xform imports "
                                  "model_type marian, m2m_100 (M2M100, NLLB), mbart, bart, t5 (T5, Flan-T5, "
                                  "MADLAD-400), mt5 and xform checkpoints")
    return load_xform_dir(path, "xform-checkpoint")


def with_tokenizer(path: Path, model: Seq2SeqTransformer, source: dict[str, Any], spec_of: Callable[..., Any],
                   text_files: str, generation: dict[str, Any]) -> LoadedModel:
    """A Hugging Face directory's model with its tokenizer (`spec_of`: the importer's tokenizer_spec,
    which refuses an incomplete one); without any tokenizer file, or with one xform does not
    reproduce, the model alone and a note saying what text needs."""
    try:
        spec, files = spec_of(path, model.cfg)
    except UnsupportedTokenizer as e:
        spec, files = None, []
        source["notes"].append(str(e))
    else:
        if spec is None:
            source["notes"].append(no_tokenizer_note(path, text_files))
    return LoadedModel(model, source, spec, [(path / f, f) for f in files], generation)


def load_xform_dir(path: Path, kind: str) -> LoadedModel:
    model = load_checkpoint(path)
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
