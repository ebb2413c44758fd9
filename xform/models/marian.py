"""Import a Hugging Face Marian / OPUS-MT directory into xform's model, without transformers.

The converter template: read the config and refuse what xform cannot express (every reason at
once), map every weight by a declarative name table, check that tied and positional weights saved
beside the canonical ones agree with them, and load strictly. Weights come from safetensors or
from `pytorch_model.bin` loaded with `weights_only=True` (no arbitrary unpickling).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch

from xform.config import TransformerConfig
from xform.errors import CheckpointError, ConfigError
from xform.files import read_json_object, sha256_file
from xform.models import tokenizer_files
from xform.models.checkpoint import load_state_into, load_torch_file
from xform.models.layers import sinusoid_table
from xform.models.transformer import Seq2SeqTransformer
from xform.tokenizer_spec import MarianSpmSpec

ACTIVATIONS = {"swish": "silu", "silu": "silu", "gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh"}
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json", "target_vocab.json", "tokenizer_config.json")
TEXT_FILES = "source.spm, target.spm and vocab.json"  # what text needs, for the note of a model without them


def is_marian_dir(path: Path) -> bool:
    cfg = path / "config.json"
    if not cfg.is_file():
        return False
    try:
        return json.loads(cfg.read_text()).get("model_type") == "marian"
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False


def read_json(path: Path) -> dict[str, Any]:
    return read_json_object(path, CheckpointError)


def one_width_problems(hf: dict[str, Any]) -> list[str]:
    """xform has one head count and one d_ff for both stacks; a config with two is refused."""
    get, problems = hf.get, []
    if get("encoder_attention_heads") != get("decoder_attention_heads"):
        problems.append(f"encoder_attention_heads ({get('encoder_attention_heads')}) differs from "
                        f"decoder_attention_heads ({get('decoder_attention_heads')}); xform has one head count")
    if get("encoder_ffn_dim") != get("decoder_ffn_dim"):
        problems.append(f"encoder_ffn_dim ({get('encoder_ffn_dim')}) differs from decoder_ffn_dim "
                        f"({get('decoder_ffn_dim')}); xform has one d_ff")
    return problems


def marian_config(hf: dict[str, Any], generation: dict[str, Any], source: str) -> TransformerConfig:
    """TransformerConfig from a Marian config.json (+ generation_config.json); refuses with every reason."""
    problems = []
    # any JSON value, or None when absent: TransformerConfig checks the type and range of each
    get: Callable[..., Any] = hf.get
    if get("model_type") != "marian":
        problems.append(f"model_type is {get('model_type')!r}, not 'marian'")
    problems += one_width_problems(hf)
    act = get("activation_function", "gelu")
    if act not in ACTIVATIONS:
        problems.append(f"activation_function {act!r} is not one of {sorted(ACTIVATIONS)}")
    if get("normalize_before"):
        problems.append("normalize_before is true (pre-LN Marian); Marian checkpoints are post-LN")
    for flag in ("add_final_layer_norm", "layernorm_embedding", "add_bias_logits"):
        if get(flag):
            problems.append(f"{flag} is true; Marian has no such layer")
    if get("static_position_embeddings") is False:
        problems.append("static_position_embeddings is false; Marian positions are sinusoidal")
    bad_words = generation.get("bad_words_ids", get("bad_words_ids")) or []
    long_bad = [w for w in bad_words if len(w) != 1]
    if long_bad:
        problems.append(f"bad_words_ids has multi-token sequences {long_bad[:3]}; xform bans single tokens only")
    shared = get("share_encoder_decoder_embeddings", True)
    vocab = get("vocab_size")
    dec_vocab = get("decoder_vocab_size") or vocab
    if shared and dec_vocab != vocab:
        problems.append(f"share_encoder_decoder_embeddings with vocab_size {vocab} != decoder_vocab_size {dec_vocab}")
    if problems:
        raise ConfigError(f"{source}: this Marian config cannot be expressed by xform:\n  - " + "\n  - ".join(problems))
    pad = get("pad_token_id")
    start = generation.get("decoder_start_token_id", get("decoder_start_token_id", pad))
    eos = generation.get("eos_token_id", get("eos_token_id"))
    if isinstance(eos, list):
        eos = eos[0]
    banned = tuple(sorted({w[0] for w in bad_words} - {pad}))
    try:
        return TransformerConfig(
            src_vocab_size=vocab, tgt_vocab_size=dec_vocab, d_model=get("d_model"),
            n_heads=get("encoder_attention_heads"), d_ff=get("encoder_ffn_dim"),
            n_encoder_layers=get("encoder_layers"), n_decoder_layers=get("decoder_layers"),
            activation=ACTIVATIONS[act], norm_position="post", final_norm=False, layer_norm_eps=1e-5,
            norm_bias=True, attn_bias=True, ffn_bias=True, output_bias=True,
            scale_embedding=bool(get("scale_embedding", False)), positions="sinusoidal_split",
            share_embeddings=bool(shared), tie_output=bool(get("tie_word_embeddings", True)),
            pad_id=pad, bos_id=start, eos_id=eos, decoder_start_id=start,
            max_len=get("max_position_embeddings", 512), banned_ids=banned)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


# per stack: xform's attention -> Marian's, xform's residual block -> Marian's LayerNorm
STACKS = {
    "encoder": ({"self_attn": "self_attn"}, {"attn_block": "self_attn_layer_norm", "ffn_block": "final_layer_norm"}),
    "decoder": ({"self_attn": "self_attn", "cross_attn": "encoder_attn"},
                {"self_block": "self_attn_layer_norm", "cross_block": "encoder_attn_layer_norm",
                 "ffn_block": "final_layer_norm"}),
}


def layer_names(cfg: TransformerConfig) -> dict[str, str]:
    """xform parameter name -> Marian parameter name, for every layer parameter of the model."""
    names: dict[str, str] = {}
    depth = {"encoder": cfg.n_encoder_layers, "decoder": cfg.n_decoder_layers}
    for side, (attns, norms) in STACKS.items():
        for i in range(depth[side]):
            ours, theirs = f"{side}_layers.{i}", f"model.{side}.layers.{i}"
            for kind in ("weight", "bias"):
                for our_attn, their_attn in attns.items():
                    for p in ("q_proj", "k_proj", "v_proj", "out_proj"):
                        names[f"{ours}.{our_attn}.{p}.{kind}"] = f"{theirs}.{their_attn}.{p}.{kind}"
                for block, their_norm in norms.items():
                    names[f"{ours}.{block}.norm.{kind}"] = f"{theirs}.{their_norm}.{kind}"
                for fc in ("fc1", "fc2"):
                    names[f"{ours}.ffn.{fc}.{kind}"] = f"{theirs}.{fc}.{kind}"
    return names


def embedding_aliases(cfg: TransformerConfig) -> dict[str, list[str]]:
    """xform embedding parameter -> the Marian names that may hold it. Tied weights may be saved
    once or under every name: the first present is used, any other present must equal it."""
    tied_head = ["lm_head.weight"] if cfg.tie_output else []
    if cfg.share_embeddings:
        out = {"src_embed.weight": ["model.shared.weight", "model.encoder.embed_tokens.weight",
                                    "model.decoder.embed_tokens.weight", *tied_head]}
    else:
        out = {"src_embed.weight": ["model.encoder.embed_tokens.weight", "model.shared.weight"],
               "tgt_embed.weight": ["model.decoder.embed_tokens.weight", *tied_head]}
    if not cfg.tie_output:
        out["lm_head.weight"] = ["lm_head.weight"]
    return out


def read_weights(directory: Path) -> tuple[dict[str, torch.Tensor], Path]:
    for name in WEIGHT_FILES:
        path = directory / name
        if not path.is_file():
            continue
        if not name.endswith(".safetensors"):
            state = load_torch_file(path)
            if not isinstance(state, dict):
                raise CheckpointError(f"{path}: expected a dict of parameter names to tensors, found "
                                      f"{type(state).__name__}")
            return state, path
        try:
            from safetensors.torch import load_file
            return load_file(str(path)), path
        except Exception as e:  # safetensors raises several types for a corrupt file
            raise CheckpointError(f"{path}: unreadable weights ({type(e).__name__}: {e})") from None
    raise CheckpointError(f"{directory}: no weights; expected one of {WEIGHT_FILES}")


class WeightMap:
    """Their state dict mapped onto xform's names, with every problem gathered: the embedding
    aliases (tied tables saved under one or several names, which must agree), named parameters,
    and at the end whatever was neither used nor expected. Shared by the Marian, BART-family and
    T5 importers."""

    def __init__(self, theirs: dict[str, torch.Tensor]):
        self.theirs = theirs
        self.ours: dict[str, torch.Tensor] = {}
        self.used: set[str] = set()
        self.problems: list[str] = []

    def embeddings(self, cfg: TransformerConfig, aliases: dict[str, list[str]] | None = None) -> None:
        """The embedding tables by their aliases (Marian's names unless `aliases` gives others)."""
        for name, candidates in (aliases or embedding_aliases(cfg)).items():
            present = [c for c in candidates if c in self.theirs]
            if not present:
                self.problems.append(f"missing {' or '.join(candidates)}")
                continue
            self.ours[name] = self.theirs[present[0]]
            for other in present[1:]:
                if not torch.equal(self.theirs[other], self.theirs[present[0]]):
                    self.problems.append(f"{other} should be tied to {present[0]} but differs")
            self.used.update(present)

    def named(self, names: dict[str, str]) -> None:
        for name, their_name in names.items():
            if their_name in self.theirs:
                self.ours[name] = self.theirs[their_name]
                self.used.add(their_name)
            else:
                self.problems.append(f"missing {their_name}")

    def output_bias(self, cfg: TransformerConfig) -> None:
        bias = self.theirs.get("final_logits_bias")
        self.ours["output_bias"] = bias.reshape(-1) if bias is not None else torch.zeros(cfg.tgt_vocab_size)
        self.used.add("final_logits_bias")

    def result(self, source: str, what: str) -> dict[str, torch.Tensor]:
        unexpected = sorted(set(self.theirs) - self.used)
        if unexpected:
            self.problems.append(f"unexpected weights {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
        if self.problems:
            raise CheckpointError(f"{source}: weights do not match {what} of this config:\n  - "
                                  + "\n  - ".join(self.problems))
        return self.ours


def convert_state(cfg: TransformerConfig, theirs: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    w = WeightMap(theirs)
    w.embeddings(cfg)
    w.named(layer_names(cfg))
    tgt = w.ours.get("tgt_embed.weight")
    if tgt is not None and tgt.shape[0] > cfg.tgt_vocab_size:
        # transformers copies the encoder's table (vocab_size rows) as the decoder's input table
        # while the output has decoder_vocab_size rows; the decoder only ever reads ids below that
        w.ours["tgt_embed.weight"] = tgt[: cfg.tgt_vocab_size]
    w.output_bias(cfg)
    table = sinusoid_table(cfg.max_len, cfg.d_model, split=True)
    for side in ("encoder", "decoder"):
        key = f"model.{side}.embed_positions.weight"
        if key in theirs:
            w.used.add(key)
            if theirs[key].shape != table.shape or not torch.allclose(theirs[key].float(), table, atol=1e-5):
                w.problems.append(f"{key} is not Marian's sinusoidal table for max_position_embeddings {cfg.max_len}")
    return w.result(source, "a Marian model")


def load_marian(directory: str | Path) -> tuple[Seq2SeqTransformer, dict[str, Any]]:
    """(model, source description) from a Marian directory."""
    directory = Path(directory)
    hf = read_json(directory / "config.json")
    gen_path = directory / "generation_config.json"
    generation = read_json(gen_path) if gen_path.is_file() else {}
    cfg = marian_config(hf, generation, str(directory / "config.json"))
    theirs, weights_path = read_weights(directory)
    state = convert_state(cfg, {k: v for k, v in theirs.items()}, str(weights_path))
    model = load_state_into(Seq2SeqTransformer(cfg), state, str(weights_path))
    source = {"path": str(directory.resolve()), "kind": "huggingface-marian", "sha256": sha256_file(weights_path),
              "weights": weights_path.name, "notes": []}
    return model, source


def generation_defaults(directory: str | Path) -> dict[str, Any]:
    """How the model is meant to decode, from generation_config.json (else config.json), as the
    manifest records it: num_beams, length_penalty, early_stopping, max_length (with the start
    token, as transformers counts) and forced_eos (transformers' forced_eos_token_id)."""
    directory = Path(directory)
    hf = read_json(directory / "config.json")
    gen_path = directory / "generation_config.json"
    generation = read_json(gen_path) if gen_path.is_file() else {}

    def get(key, default):
        return generation.get(key, hf.get(key, default))

    eos = get("eos_token_id", None)
    eos = eos[0] if isinstance(eos, list) else eos
    forced = get("forced_eos_token_id", None)
    forced = forced[0] if isinstance(forced, list) else forced
    out = {"num_beams": int(get("num_beams", 1) or 1), "length_penalty": float(get("length_penalty", 1.0)),
           "early_stopping": get("early_stopping", False), "forced_eos": forced is not None and forced == eos,
           "source": str(gen_path if gen_path.is_file() else directory / "config.json")}
    if get("max_length", None) is not None:
        out["max_length"] = int(get("max_length", None))
    return out


def tokenizer_spec(directory: Path, cfg: TransformerConfig) -> tuple[MarianSpmSpec | None, list[str]]:
    """(the bundle's tokenizer.json spec, the files it needs from the directory); (None, [])
    without any tokenizer file. MarianTokenizer needs source.spm, target.spm and vocab.json, and
    target_vocab.json with separate_vocabs: one missing, ids beyond the model's embeddings, or a
    sentencepiece model whose pieces its vocabulary lacks is refused by name."""
    directory = Path(directory)
    have = tokenizer_files.present(directory, TOKENIZER_FILES)
    if not have:
        return None, []
    tok_cfg = read_json(directory / "tokenizer_config.json") if "tokenizer_config.json" in have else {}
    separate = bool(tok_cfg.get("separate_vocabs", False))
    needs = ["source.spm", "target.spm", "vocab.json"] + (["target_vocab.json"] if separate else [])
    what = "a Marian tokenizer with separate_vocabs (tokenizer_config.json)" if separate else "a Marian tokenizer"
    tokenizer_files.refuse_missing(directory, have, needs, what)
    source = tokenizer_files.read_vocab(directory / "vocab.json", cfg.src_vocab_size, "source")
    target_name = "target_vocab.json" if separate else "vocab.json"
    target = tokenizer_files.read_vocab(directory / target_name, cfg.tgt_vocab_size, "target")
    unk = tok_cfg.get("unk_token", "<unk>")
    unk = unk.get("content") if isinstance(unk, dict) else unk  # an AddedToken as saved
    if not isinstance(unk, str) or unk not in source:
        raise CheckpointError(f"{directory / 'vocab.json'}: no id for the unknown token {unk!r}")
    tokenizer_files.refuse_uncovered(directory / "source.spm", directory / "vocab.json", source)
    tokenizer_files.refuse_uncovered(directory / "target.spm", directory / target_name, target)
    spec = MarianSpmSpec(files=tuple(have), separate_vocabs=separate, unk_token=unk,
                         eos_token=tok_cfg.get("eos_token", "</s>"), pad_token=tok_cfg.get("pad_token", "<pad>"))
    return spec, have
