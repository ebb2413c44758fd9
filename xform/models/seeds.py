"""Import state dicts saved from the seed tutorials' model classes (shared/seeds 000 to 004).

Each arch is data: the config its code implies, rename rules from its parameter names to xform's,
the names it defines but never uses in `forward`, and where its position table comes from. Sizes
and biases are read from the weights' shapes and cross-checked with any hyper-parameters given;
the number of heads and the special ids, which no weight records, must be given.

- seed-000: post-LN, bias-free attention and FFN linears, ReLU, output linear with bias, no
  embedding scaling; sinusoidal positions computed in float32 (not saved), max_len 512 by default.
- seed-001: pre-LN, GELU, hand-written LayerNorm (gamma / beta, eps 1e-10), biases; the Encoder
  and Decoder define a final LayerNorm but never apply it, so it is ignored; positions are the
  saved `pe` buffers, used as saved (its div_term multiplies where the paper divides).
- seed-002: post-LN, ReLU, biases, embeddings scaled by sqrt(d_model); the saved `pe` buffer.
- seed-003 (d2l): post-LN AddNorm, W_q / W_k / W_v / W_o of width query_size x heads (any width),
  FFN dense1 / dense2, embeddings scaled by sqrt(d_model), its float32 sinusoids (an attribute,
  not saved; max_len 1000), the decoder's output `dense` with bias; blocks named block0, block1...
- seed-004 (nanoGPT): encoder blocks `x = ln_1(x); x = x + attn(x); x = x + mlp(ln_2(x))`, decoder
  blocks `x = ln(x); x = x + f(x)` for all three sublayers, final LayerNorms, one token table
  `wte` for both sides, the saved `wpe.pe` buffer, linears and LayerNorms biased or not together
  (its config.bias), a separate bias-free lm_head.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from xform.config import TransformerConfig
from xform.errors import CheckpointError, ConfigError
from xform.files import sha256_file
from xform.models.checkpoint import load_state_into, load_torch_file
from xform.models.transformer import Seq2SeqTransformer

HPARAMS = ("n_heads", "pad_id", "bos_id", "eos_id", "max_len", "d_model", "d_ff", "src_vocab_size",
           "tgt_vocab_size", "n_encoder_layers", "n_decoder_layers")
ATTN = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}


def float32_sinusoids(max_len: int, d_model: int, pow_form: bool = False) -> torch.Tensor:
    """Interleaved sinusoids in the tutorials' float32 arithmetic: seed 000 divides by
    `10000 ** (2i / d)`; seed 003 by `torch.pow(10000, 2i / d)` on float32 ranges."""
    if pow_form:
        fraction = torch.arange(max_len, dtype=torch.float32).reshape(-1, 1) / torch.pow(
            10000, torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
    else:
        fraction = torch.arange(0, max_len).unsqueeze(1) * (1 / 10000 ** (torch.arange(0, d_model, 2) / d_model))
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(fraction)
    pe[:, 1::2] = torch.cos(fraction)
    return pe


def seed000_positions(max_len: int, d_model: int) -> torch.Tensor:
    return float32_sinusoids(max_len, d_model)


def seed003_positions(max_len: int, d_model: int) -> torch.Tensor:
    return float32_sinusoids(max_len, d_model, pow_form=True)


@dataclass(frozen=True)
class SeedArch:
    config: dict[str, Any]  # what the tutorial's code fixes (biases are read from the weights)
    rules: tuple[tuple[str, str], ...]  # (their name regex, xform name template)
    ignored: tuple[tuple[str, str], ...] = ()  # (their name regex, why it is not used)
    # their names of the encoder / decoder position tables; None: computed by `positions`
    position_keys: tuple[str, str] | None = None
    positions: Callable[[int, int], torch.Tensor] | None = None
    default_pad: int = 0
    defaults: dict[str, Any] = field(default_factory=dict)


def layer_rules(their_enc: str, their_dec: str, attn: dict[str, tuple[str | dict[str, str], dict[str, str]]],
                ffn: tuple[str, str, str], norms_enc: tuple[str, str], norms_dec: tuple[str, str, str],
                norm_params: dict[str, str]) -> list[tuple[str, str]]:
    """Rename rules for the layers of both stacks from a description of one arch's names.
    their_enc / their_dec: the regex before a layer's index (`encoder\\.layers\\.`)."""
    rules = []
    for side, theirs, ours in (("enc", their_enc, "encoder_layers"), ("dec", their_dec, "decoder_layers")):
        for our_attn, (their_attn, projs) in attn.items():
            if side == "enc" and our_attn == "cross_attn":
                continue
            their_attn = their_attn[side] if isinstance(their_attn, dict) else their_attn
            for their_p, our_p in projs.items():
                rules.append((rf"{theirs}(\d+)\.{their_attn}\.{their_p}\.(weight|bias)",
                              rf"{ours}.\1.{our_attn}.{our_p}.\2"))
        prefix, fc1, fc2 = ffn
        rules.append((rf"{theirs}(\d+)\.{prefix}{fc1}\.(weight|bias)", rf"{ours}.\1.ffn.fc1.\2"))
        rules.append((rf"{theirs}(\d+)\.{prefix}{fc2}\.(weight|bias)", rf"{ours}.\1.ffn.fc2.\2"))
        blocks = ("attn_block", "ffn_block") if side == "enc" else ("self_block", "cross_block", "ffn_block")
        for their_norm, block in zip(norms_enc if side == "enc" else norms_dec, blocks):
            for their_param, our_param in norm_params.items():
                rules.append((rf"{theirs}(\d+)\.{their_norm}\.{their_param}", rf"{ours}.\1.{block}.norm.{our_param}"))
    return rules


LN = {"weight": "weight", "bias": "bias"}
W_QKVO = {f"W_{k}": v for k, v in ATTN.items()}
QKVO_004 = {"c_attns\\.0": "q_proj", "c_attns\\.1": "k_proj", "c_attns\\.2": "v_proj", "c_proj": "out_proj"}
ARCH_SPECS: dict[str, SeedArch] = {
    "seed-000": SeedArch(
        config=dict(norm_position="post", activation="relu", tie_output=False, scale_embedding=False,
                    layer_norm_eps=1e-5, positions="learned"),
        rules=(("encoder\\.embedding\\.weight", "src_embed.weight"),
               ("decoder\\.embedding\\.weight", "tgt_embed.weight"),
               ("linear\\.weight", "lm_head.weight"), ("linear\\.bias", "output_bias"),
               *layer_rules("encoder\\.encode_layers\\.", "decoder\\.decoder_layes\\.",
                            {"self_attn": ("(?:self_multi_head_att|masked_att)",
                                           {"q_linear": "q_proj", "k_linear": "k_proj", "v_linear": "v_proj",
                                            "linear": "out_proj"}),
                             "cross_attn": ("att", {"q_linear": "q_proj", "k_linear": "k_proj", "v_linear": "v_proj",
                                                    "linear": "out_proj"})},
                            ("ffn\\.ffn\\.", "0", "2"), ("norms\\.0", "norms\\.1"),
                            ("norms\\.0", "norms\\.1", "norms\\.2"), LN)),
        positions=seed000_positions, default_pad=0, defaults={"max_len": 512}),
    "seed-001": SeedArch(
        config=dict(norm_position="pre", final_norm=False, activation="gelu", layer_norm_eps=1e-10,
                    tie_output=False, scale_embedding=False, positions="learned"),
        rules=(("encoder\\.embedding(?:\\.embedding)?\\.weight", "src_embed.weight"),
               ("decoder\\.embedding(?:\\.embedding)?\\.weight", "tgt_embed.weight"),
               ("output_projection\\.weight", "lm_head.weight"), ("output_projection\\.bias", "output_bias"),
               *layer_rules("encoder\\.layers\\.", "decoder\\.layers\\.",
                            {"self_attn": ("self_attention", {"query": "q_proj", "key": "k_proj", "value": "v_proj",
                                                              "proj": "out_proj"}),
                             "cross_attn": ("cross_attention", {"query": "q_proj", "key": "k_proj", "value": "v_proj",
                                                                "proj": "out_proj"})},
                            ("feed_forward\\.", "fc1", "fc2"), ("residual1\\.norm", "residual2\\.norm"),
                            ("residual1\\.norm", "residual2\\.norm", "residual3\\.norm"),
                            {"gamma": "weight", "beta": "bias"})),
        ignored=(("(?:encoder|decoder)\\.norm\\.(?:gamma|beta)",
                  "Encoder.norm / Decoder.norm are defined but never applied in forward"),),
        position_keys=("encoder.positional_encoding.pe", "decoder.positional_encoding.pe"), default_pad=1),
    "seed-002": SeedArch(
        config=dict(norm_position="post", activation="relu", tie_output=False, scale_embedding=True,
                    layer_norm_eps=1e-5, positions="learned"),
        rules=(("encoder_embedding\\.weight", "src_embed.weight"), ("decoder_embedding\\.weight", "tgt_embed.weight"),
               ("fc_out\\.weight", "lm_head.weight"), ("fc_out\\.bias", "output_bias"),
               *layer_rules("encoder_layers\\.", "decoder_layers\\.",
                            {"self_attn": ("self_attn", W_QKVO), "cross_attn": ("cross_attn", W_QKVO)},
                            ("feed_forward\\.", "fc1", "fc2"), ("norm1", "norm2"), ("norm1", "norm2", "norm3"), LN)),
        position_keys=("pos_encoding.pe", "pos_encoding.pe"), default_pad=0),
    "seed-003": SeedArch(
        config=dict(norm_position="post", activation="relu", tie_output=False, scale_embedding=True,
                    layer_norm_eps=1e-5, positions="learned"),
        rules=(("encoder\\.embedding\\.weight", "src_embed.weight"),
               ("decoder\\.embedding\\.weight", "tgt_embed.weight"),
               ("decoder\\.dense\\.weight", "lm_head.weight"), ("decoder\\.dense\\.bias", "output_bias"),
               *layer_rules("encoder\\.blks\\.block", "decoder\\.blks\\.block",
                            {"self_attn": ({"enc": "attention", "dec": "attention1"}, W_QKVO),
                             "cross_attn": ("attention2", W_QKVO)},
                            ("ffn\\.", "dense1", "dense2"), ("addnorm1\\.ln", "addnorm2\\.ln"),
                            ("addnorm1\\.ln", "addnorm2\\.ln", "addnorm3\\.ln"), LN)),
        positions=seed003_positions, default_pad=0, defaults={"max_len": 1000}),
    "seed-004": SeedArch(
        config=dict(encoder_norm_positions=("pre_normed_residual", "pre"),
                    decoder_norm_positions=("pre_normed_residual",) * 3,
                    final_norm=True, activation="relu", share_embeddings=True, tie_output=False, scale_embedding=False,
                    layer_norm_eps=1e-5, positions="learned"),
        rules=(("transformer\\.wte\\.weight", "src_embed.weight"), ("lm_head\\.weight", "lm_head.weight"),
               ("transformer\\.encoder\\.norm\\.(weight|bias)", "encoder_norm.\\1"),
               ("transformer\\.decoder\\.norm\\.(weight|bias)", "decoder_norm.\\1"),
               *layer_rules("transformer\\.encoder\\.layers\\.", "transformer\\.decoder\\.layers\\.",
                            {"self_attn": ({"enc": "attn", "dec": "m_attn"}, QKVO_004),
                             "cross_attn": ("attn", QKVO_004)},
                            ("mlp\\.", "c_fc", "c_proj"), ("ln_1", "ln_2"), ("ln_1", "ln_2", "ln_3"), LN)),
        ignored=(("transformer\\.(?:en|de)coder\\.layers\\.\\d+\\.(?:m_)?attn\\.bias",
                  "the causal mask buffer of its non-flash attention path (PyTorch < 2.0)"),),
        position_keys=("transformer.wpe.pe", "transformer.wpe.pe"), default_pad=0),
}
ARCHS = tuple(ARCH_SPECS)


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A state dict from .pt / .pth / .bin (weights_only) or .safetensors; training wrappers and a
    DataParallel `module.` prefix are unwrapped."""
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file; --arch expects a state dict file "
                              "(torch.save(model.state_dict()))")
    state: object  # whatever the file holds, until checked below
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        try:
            state = load_file(str(path))
        except Exception as e:  # safetensors raises several types for a corrupt file
            raise CheckpointError(f"{path}: not a readable safetensors file ({type(e).__name__}: {e})") from None
    else:
        state = load_torch_file(path)  # one line for a file that is not a checkpoint, never torch's advice
    for key in ("state_dict", "model_state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise CheckpointError(f"{path}: expected a dict of parameter names to tensors (a state dict)")
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    return state


def rename(spec: SeedArch, theirs: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    ours: dict[str, torch.Tensor] = {}
    unknown = unplaced(spec, theirs)
    if unknown:
        raise CheckpointError(f"{source}: parameters not of a {spec_name(spec)} model: {unknown[:8]}"
                              f"{' ...' if len(unknown) > 8 else ''}")
    for name, tensor in theirs.items():
        for rx, template in spec.rules:
            m = re.fullmatch(rx, name)
            if m:
                ours[m.expand(template)] = tensor
                break
    return ours


def unplaced(spec: SeedArch, theirs: dict[str, torch.Tensor]) -> list[str]:
    """Their names this arch's rules, ignored names and position tables do not account for."""
    known = set(spec.position_keys or ())
    return [name for name in theirs if name not in known
            and not any(re.fullmatch(rx, name) for rx, _ in (*spec.ignored, *spec.rules))]


def spec_name(spec: SeedArch) -> str:
    return next(k for k, v in ARCH_SPECS.items() if v is spec)


def count_layers(ours: dict[str, torch.Tensor], prefix: str) -> int:
    return len({int(m.group(1)) for k in ours if (m := re.match(rf"{prefix}\.(\d+)\.", k))})


def read_sizes(ours: dict[str, torch.Tensor], hparams: dict[str, Any], source: str, kind: str,
               problems: list[str]) -> dict[str, Any]:
    """What the weights (in xform's names) say: sizes, attention width, biases. Checks the
    hyper-parameters given against them and the LayerNorms' shapes, appending to `problems`."""
    try:
        q = ours["encoder_layers.0.self_attn.q_proj.weight"]
        found = {"src_vocab_size": ours["src_embed.weight"].shape[0], "d_model": ours["src_embed.weight"].shape[1],
                 "tgt_vocab_size": ours["lm_head.weight"].shape[0],
                 "d_ff": ours["encoder_layers.0.ffn.fc1.weight"].shape[0],
                 "n_encoder_layers": count_layers(ours, "encoder_layers"),
                 "n_decoder_layers": count_layers(ours, "decoder_layers")}
    except KeyError as e:
        raise CheckpointError(f"{source}: missing {e.args[0]} (as xform names it); not a {kind} state dict") from None
    for k, v in found.items():
        if hparams.get(k) is not None and hparams[k] != v:
            problems.append(f"{k} is {hparams[k]} as given, but the weights say {v}")
    for name, t in ours.items():
        if ".norm." in name and t.dim() != 1:
            problems.append(f"LayerNorm {name} normalizes over {tuple(t.shape)}; xform normalizes over the last "
                            f"axis (d_model) only, as a decoder that grows one token at a time must "
                            "(seed 003's normalized_shape must be [d_model], not [seq_size, d_model])")
    widths = {p: ours[f"encoder_layers.0.self_attn.{p}_proj.weight"].shape[0] for p in "qkv"}
    if len(set(widths.values())) > 1:
        problems.append(f"query / key / value widths differ ({widths}); xform's attention and cache need one width")
    heads = hparams.get("n_heads")
    if heads and q.shape[0] != found["d_model"]:
        if q.shape[0] % heads:
            problems.append(f"attention width {q.shape[0]} is not divisible by --n-heads {heads}")
        else:
            found["attention_head_dim"] = q.shape[0] // heads
    found.update(attn_bias="encoder_layers.0.self_attn.q_proj.bias" in ours,
                 ffn_bias="encoder_layers.0.ffn.fc1.bias" in ours,
                 norm_bias="encoder_layers.0.attn_block.norm.bias" in ours,
                 output_bias="output_bias" in ours)
    return found


def build_config(fixed: dict[str, Any], found: dict[str, Any], hparams: dict[str, Any], problems: list[str],
                 table_rows: int | None, default_max_len: int | None, default_pad: int, source: str,
                 kind: str) -> TransformerConfig:
    """The config from what the code fixes, what the weights say and what the user gave; every
    problem is reported at once."""
    unknown = sorted(set(hparams) - set(HPARAMS))
    if unknown:
        problems.append(f"unknown hyper-parameters {unknown}; known: {list(HPARAMS)}")
    if hparams.get("n_heads") is None:
        problems.append("n_heads is not recorded in the weights: pass --n-heads")
    for k in ("bos_id", "eos_id"):
        if hparams.get(k) is None:
            problems.append(f"{k} is not recorded in the weights: pass --{k.replace('_', '-')}")
    if table_rows is None:
        max_len = hparams.get("max_len") or default_max_len
    else:
        max_len = hparams.get("max_len") or table_rows
        if max_len > table_rows:
            problems.append(f"max_len {max_len} exceeds the saved position table's {table_rows} rows")
    if problems:
        raise ConfigError(f"{source}: cannot import as {kind}:\n  - " + "\n  - ".join(problems))
    pad = hparams.get("pad_id")
    cfg = dict(fixed, **found, n_heads=hparams["n_heads"], pad_id=default_pad if pad is None else pad,
               bos_id=hparams["bos_id"], eos_id=hparams["eos_id"], max_len=max_len)
    try:
        return TransformerConfig(**cfg)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def position_table(t: torch.Tensor, name: str, d_model: int, source: str) -> torch.Tensor:
    """A saved position table as (max_len, d_model), whatever its layout: (L, d), (L, 1, d), (1, L, d)."""
    if t.dim() < 2 or t.shape[-1] != d_model or t.numel() != t.shape[-1] * max(t.shape[:-1]):
        raise CheckpointError(f"{source}: position table {name} has shape {tuple(t.shape)}; expected (max_len, "
                              f"{d_model}) with any singleton axes, e.g. (max_len, 1, {d_model}) or "
                              f"(1, max_len, {d_model})")
    return t.reshape(-1, d_model).float()


def assemble(ours: dict[str, torch.Tensor], cfg: TransformerConfig, tables: list[torch.Tensor], source: str,
             ) -> Seq2SeqTransformer:
    """Load xform-named weights and the two position tables (trimmed to max_len) into a model."""
    ours = dict(ours)
    ours["src_pos.weight"], ours["tgt_pos.weight"] = (t[: cfg.max_len] for t in tables)
    return load_state_into(Seq2SeqTransformer(cfg), ours, source)


def source_record(path: Path, kind: str, hparams: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"path": str(path.resolve()), "kind": kind, "sha256": sha256_file(path),
            "hyper_parameters": {k: v for k, v in hparams.items() if v is not None}, **extra}


def load_seed(path: Path, arch: str, hparams: dict[str, Any],
              state: dict[str, torch.Tensor] | None = None) -> tuple[Seq2SeqTransformer, dict[str, Any]]:
    if arch not in ARCH_SPECS:
        raise ConfigError(f"--arch {arch!r}: expected one of {list(ARCH_SPECS)}")
    spec = ARCH_SPECS[arch]
    theirs = read_state_dict(path) if state is None else state
    ours = rename(spec, theirs, str(path))
    problems: list[str] = []
    found = read_sizes(ours, hparams, str(path), arch, problems)
    tables = None
    if spec.position_keys is not None:
        missing = [k for k in spec.position_keys if k not in theirs]
        if missing:
            raise CheckpointError(f"{path}: missing the position table {missing[0]} of a {arch} model")
        tables = [position_table(theirs[k], k, found["d_model"], str(path)) for k in spec.position_keys]
    cfg = build_config(spec.config, found, hparams, problems, tables[0].shape[0] if tables else None,
                       spec.defaults.get("max_len"), spec.default_pad, str(path), arch)
    if tables is None:
        assert spec.positions is not None, f"{arch}: a SeedArch without position_keys computes its positions"
        tables = [spec.positions(cfg.max_len, cfg.d_model)] * 2
    return assemble(ours, cfg, tables, str(path)), source_record(path, arch, hparams)
