"""Import state dicts saved from the seed tutorials' model classes (shared/seeds 000, 001, 002).

Each arch is data: the config its code implies, rename rules from its parameter names to xform's,
the names it defines but never uses in `forward`, and where its position table comes from. Sizes
are read from the weights' shapes and cross-checked with any hyper-parameters given; the number of
heads and the special ids, which no weight records, must be given.

- seed-000: post-LN, bias-free attention and FFN linears, ReLU, output linear with bias, no
  embedding scaling; sinusoidal positions computed in float32 (not saved), max_len 512 by default.
- seed-001: pre-LN, GELU, hand-written LayerNorm (gamma / beta, eps 1e-10), biases; the Encoder
  and Decoder define a final LayerNorm but never apply it, so it is ignored; positions are the
  saved `pe` buffers, used as saved (its div_term multiplies where the paper divides).
- seed-002: post-LN, ReLU, biases, embeddings scaled by sqrt(d_model); the saved `pe` buffer.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from xform.errors import CheckpointError, ConfigError
from xform.models.checkpoint import load_state_into
from xform.runtime.bundle import sha256_file
from xform.models.config import TransformerConfig
from xform.models.transformer import Seq2SeqTransformer

ARCHS = ("seed-000", "seed-001", "seed-002")
HPARAMS = ("n_heads", "pad_id", "bos_id", "eos_id", "max_len", "d_model", "d_ff", "src_vocab_size",
           "tgt_vocab_size", "n_encoder_layers", "n_decoder_layers")
ATTN = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}


def seed000_positions(max_len: int, d_model: int) -> torch.Tensor:
    """Seed 000's PositionEncoding, in its float32 arithmetic."""
    position = torch.arange(0, max_len).unsqueeze(1)
    item = 1 / 10000 ** (torch.arange(0, d_model, 2) / d_model)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(position * item)
    pe[:, 1::2] = torch.cos(position * item)
    return pe


@dataclass(frozen=True)
class SeedArch:
    config: dict[str, Any]  # what the tutorial's code fixes
    rules: tuple[tuple[str, str], ...]  # (their name regex, xform name template)
    ignored: tuple[tuple[str, str], ...] = ()  # (their name regex, why it is not used)
    # their names of the encoder / decoder position tables; None: computed by `positions`
    position_keys: tuple[str, str] | None = None
    positions: Callable[[int, int], torch.Tensor] | None = None
    default_pad: int = 0
    defaults: dict[str, Any] = field(default_factory=dict)


def layer_rules(their_enc: str, their_dec: str, attn: dict[str, tuple[str, dict[str, str]]],
                ffn: tuple[str, str, str], norms_enc: tuple[str, str], norms_dec: tuple[str, str, str],
                norm_params: dict[str, str]) -> list[tuple[str, str]]:
    """Rename rules for the layers of both stacks from a description of one arch's names."""
    rules = []
    for side, theirs, ours in (("enc", their_enc, "encoder_layers"), ("dec", their_dec, "decoder_layers")):
        for our_attn, (their_attn, projs) in attn.items():
            if side == "enc" and our_attn == "cross_attn":
                continue
            for their_p, our_p in projs.items():
                rules.append((rf"{theirs}\.(\d+)\.{their_attn}\.{their_p}\.(weight|bias)", rf"{ours}.\1.{our_attn}.{our_p}.\2"))
        prefix, fc1, fc2 = ffn
        rules.append((rf"{theirs}\.(\d+)\.{prefix}{fc1}\.(weight|bias)", rf"{ours}.\1.ffn.fc1.\2"))
        rules.append((rf"{theirs}\.(\d+)\.{prefix}{fc2}\.(weight|bias)", rf"{ours}.\1.ffn.fc2.\2"))
        blocks = ("attn_block", "ffn_block") if side == "enc" else ("self_block", "cross_block", "ffn_block")
        for their_norm, block in zip(norms_enc if side == "enc" else norms_dec, blocks):
            for their_param, our_param in norm_params.items():
                rules.append((rf"{theirs}\.(\d+)\.{their_norm}\.{their_param}", rf"{ours}.\1.{block}.norm.{our_param}"))
    return rules


LN = {"weight": "weight", "bias": "bias"}
ARCH_SPECS: dict[str, SeedArch] = {
    "seed-000": SeedArch(
        config=dict(norm_position="post", attn_bias=False, ffn_bias=False, activation="relu", output_bias=True,
                    tie_output=False, scale_embedding=False, layer_norm_eps=1e-5, positions="learned"),
        rules=(("encoder\\.embedding\\.weight", "src_embed.weight"), ("decoder\\.embedding\\.weight", "tgt_embed.weight"),
               ("linear\\.weight", "lm_head.weight"), ("linear\\.bias", "output_bias"),
               *layer_rules("encoder\\.encode_layers", "decoder\\.decoder_layes",
                            {"self_attn": ("(?:self_multi_head_att|masked_att)",
                                           {"q_linear": "q_proj", "k_linear": "k_proj", "v_linear": "v_proj", "linear": "out_proj"}),
                             "cross_attn": ("att", {"q_linear": "q_proj", "k_linear": "k_proj", "v_linear": "v_proj",
                                                    "linear": "out_proj"})},
                            ("ffn\\.ffn\\.", "0", "2"), ("norms\\.0", "norms\\.1"), ("norms\\.0", "norms\\.1", "norms\\.2"), LN)),
        positions=seed000_positions, default_pad=0, defaults={"max_len": 512}),
    "seed-001": SeedArch(
        config=dict(norm_position="pre", final_norm=False, activation="gelu", layer_norm_eps=1e-10,
                    output_bias=True, tie_output=False, scale_embedding=False, positions="learned"),
        rules=(("encoder\\.embedding(?:\\.embedding)?\\.weight", "src_embed.weight"),
               ("decoder\\.embedding(?:\\.embedding)?\\.weight", "tgt_embed.weight"),
               ("output_projection\\.weight", "lm_head.weight"), ("output_projection\\.bias", "output_bias"),
               *layer_rules("encoder\\.layers", "decoder\\.layers",
                            {"self_attn": ("self_attention", {"query": "q_proj", "key": "k_proj", "value": "v_proj", "proj": "out_proj"}),
                             "cross_attn": ("cross_attention", {"query": "q_proj", "key": "k_proj", "value": "v_proj",
                                                                "proj": "out_proj"})},
                            ("feed_forward\\.", "fc1", "fc2"), ("residual1\\.norm", "residual2\\.norm"),
                            ("residual1\\.norm", "residual2\\.norm", "residual3\\.norm"), {"gamma": "weight", "beta": "bias"})),
        ignored=(("(?:encoder|decoder)\\.norm\\.(?:gamma|beta)",
                  "Encoder.norm / Decoder.norm are defined but never applied in forward"),),
        position_keys=("encoder.positional_encoding.pe", "decoder.positional_encoding.pe"), default_pad=1),
    "seed-002": SeedArch(
        config=dict(norm_position="post", activation="relu", output_bias=True, tie_output=False, scale_embedding=True,
                    layer_norm_eps=1e-5, positions="learned"),
        rules=(("encoder_embedding\\.weight", "src_embed.weight"), ("decoder_embedding\\.weight", "tgt_embed.weight"),
               ("fc_out\\.weight", "lm_head.weight"), ("fc_out\\.bias", "output_bias"),
               *layer_rules("encoder_layers", "decoder_layers",
                            {"self_attn": ("self_attn", {f"W_{k}": v for k, v in ATTN.items()}),
                             "cross_attn": ("cross_attn", {f"W_{k}": v for k, v in ATTN.items()})},
                            ("feed_forward\\.", "fc1", "fc2"), ("norm1", "norm2"), ("norm1", "norm2", "norm3"), LN)),
        position_keys=("pos_encoding.pe", "pos_encoding.pe"), default_pad=0),
}


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A state dict from .pt / .pth / .bin (weights_only) or .safetensors; training wrappers and a
    DataParallel `module.` prefix are unwrapped."""
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file; --arch expects a state dict file (torch.save(model.state_dict()))")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file
            state = load_file(str(path))
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # torch / safetensors raise several types for a corrupt or unsafe file
        raise CheckpointError(f"{path}: not a readable state dict ({type(e).__name__}: {e})") from None
    for key in ("state_dict", "model_state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: expected a dict of tensors (a state dict)")
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    return state


def rename(spec: SeedArch, theirs: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    ours: dict[str, torch.Tensor] = {}
    unknown = []
    position_keys = set(spec.position_keys or ())
    for name, tensor in theirs.items():
        if name in position_keys or any(re.fullmatch(rx, name) for rx, _ in spec.ignored):
            continue
        for rx, template in spec.rules:
            m = re.fullmatch(rx, name)
            if m:
                ours[m.expand(template)] = tensor
                break
        else:
            unknown.append(name)
    if unknown:
        raise CheckpointError(f"{source}: parameters not of a {spec_name(spec)} model: {unknown[:8]}"
                              f"{' ...' if len(unknown) > 8 else ''}")
    return ours


def spec_name(spec: SeedArch) -> str:
    return next(k for k, v in ARCH_SPECS.items() if v is spec)


def count_layers(ours: dict[str, torch.Tensor], prefix: str) -> int:
    return len({int(m.group(1)) for k in ours if (m := re.match(rf"{prefix}\.(\d+)\.", k))})


def infer_config(spec: SeedArch, ours: dict[str, torch.Tensor], hparams: dict[str, Any], table_rows: int | None,
                 source: str) -> TransformerConfig:
    problems = []
    unknown = sorted(set(hparams) - set(HPARAMS))
    if unknown:
        problems.append(f"unknown hyper-parameters {unknown}; known: {list(HPARAMS)}")
    try:
        found = {"src_vocab_size": ours["src_embed.weight"].shape[0], "d_model": ours["src_embed.weight"].shape[1],
                 "tgt_vocab_size": ours["tgt_embed.weight"].shape[0], "d_ff": ours["encoder_layers.0.ffn.fc1.weight"].shape[0],
                 "n_encoder_layers": count_layers(ours, "encoder_layers"),
                 "n_decoder_layers": count_layers(ours, "decoder_layers")}
    except KeyError as e:
        raise CheckpointError(f"{source}: missing {e.args[0]} (as xform names it); not a {spec_name(spec)} state dict") from None
    for k, v in found.items():
        if hparams.get(k) is not None and hparams[k] != v:
            problems.append(f"{k} is {hparams[k]} as given, but the weights say {v}")
    if hparams.get("n_heads") is None:
        problems.append("n_heads is not recorded in the weights: pass --n-heads")
    for k in ("bos_id", "eos_id"):
        if hparams.get(k) is None:
            problems.append(f"{k} is not recorded in the weights: pass --{k.replace('_', '-')}")
    max_len = hparams.get("max_len") or (table_rows if table_rows is not None else spec.defaults.get("max_len"))
    if table_rows is not None and max_len > table_rows:
        problems.append(f"max_len {max_len} exceeds the saved position table's {table_rows} rows")
    if problems:
        raise ConfigError(f"{source}: cannot import as {spec_name(spec)}:\n  - " + "\n  - ".join(problems))
    pad = hparams.get("pad_id")
    cfg = dict(spec.config, **found, n_heads=hparams["n_heads"], pad_id=spec.default_pad if pad is None else pad,
               bos_id=hparams["bos_id"], eos_id=hparams["eos_id"], max_len=max_len)
    try:
        return TransformerConfig(**cfg)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def load_seed(path: Path, arch: str, hparams: dict[str, Any]) -> tuple[Seq2SeqTransformer, dict[str, Any]]:
    if arch not in ARCH_SPECS:
        raise ConfigError(f"--arch {arch!r}: expected one of {list(ARCH_SPECS)}")
    spec = ARCH_SPECS[arch]
    theirs = read_state_dict(path)
    ours = rename(spec, theirs, str(path))
    tables = None
    if spec.position_keys is not None:
        missing = [k for k in spec.position_keys if k not in theirs]
        if missing:
            raise CheckpointError(f"{path}: missing the position table {missing[0]} of a {arch} model")
        tables = [theirs[k].reshape(theirs[k].shape[-2], theirs[k].shape[-1]).float() for k in spec.position_keys]
    cfg = infer_config(spec, ours, hparams, tables[0].shape[0] if tables else None, str(path))
    if tables is None:
        tables = [spec.positions(cfg.max_len, cfg.d_model)] * 2
    ours["src_pos.weight"], ours["tgt_pos.weight"] = (t[: cfg.max_len] for t in tables)
    model = load_state_into(Seq2SeqTransformer(cfg), ours, str(path))
    return model, {"path": str(path.resolve()), "kind": arch, "sha256": sha256_file(path),
                   "hyper_parameters": {k: v for k, v in hparams.items() if v is not None}}
