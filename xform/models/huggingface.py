"""What the Hugging Face families share: marian.py, bart_family.py and t5.py import it, and none
of them imports another. Reading a directory's JSON files and weights (safetensors, or
`pytorch_model.bin` with `weights_only=True`), mapping weights onto xform's names with every
problem gathered (WeightMap) and the layer names of transformers' BART-derived models, which
Marian and the BART family share; the activations xform has; the generation settings xform
refuses or records as the bundle's decoding defaults; and UnsupportedTokenizer, the refusal that
lets a model export for token ids. Which model_type goes to which family is families.py's table.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from xform.config import TransformerConfig
from xform.errors import CheckpointError, ConfigError
from xform.files import read_json_object
from xform.models.checkpoint import load_torch_file

ACTIVATIONS = {"swish": "silu", "silu": "silu", "gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh"}
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
GENERATION_FILE = "generation_config.json"
# generation settings transformers applies and xform does not: refused when they would act
UNSUPPORTED_GENERATION = {"encoder_no_repeat_ngram_size": 0, "encoder_repetition_penalty": 1.0, "num_beam_groups": 1,
                          "diversity_penalty": 0.0, "exponential_decay_length_penalty": None,
                          "begin_suppress_tokens": None, "sequence_bias": None, "renormalize_logits": False}
# ... and those it does, recorded as the bundle's decoding defaults (BART-large-CNN's n-gram blocking)
RECORDED_GENERATION = {"no_repeat_ngram_size": 0, "repetition_penalty": 1.0, "suppress_tokens": None}


class UnsupportedTokenizer(CheckpointError):
    """The directory's tokenizer is not one xform reproduces: the model exports, taking ids."""


def read_json(path: Path) -> dict[str, Any]:
    return read_json_object(path, CheckpointError)


def read_generation(directory: Path) -> tuple[dict[str, Any], str]:
    """generation_config.json ({} without one), and the file the decoding defaults come from: it,
    else config.json."""
    path = directory / GENERATION_FILE
    if path.is_file():
        return read_json(path), str(path)
    return {}, str(directory / "config.json")


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


def refuse_problems(problems: list[str], generation: dict[str, Any], get: Callable[..., Any], source: str,
                    family: str) -> None:
    """Refuse a Hugging Face config with every reason at once: `problems` found by the family's
    reader, and each generation setting xform does not reproduce (generation_config.json's, else
    config.json's through `get`)."""
    for key, neutral in UNSUPPORTED_GENERATION.items():
        value = generation.get(key, get(key, neutral))
        if value not in (neutral, None) and not (isinstance(value, (list, dict)) and not value):
            problems.append(f"{key} {value!r}: xform does not reproduce it (remove it from generation_config.json "
                            "/ config.json to export; decoding then differs from transformers' with it)")
    if problems:
        raise ConfigError(f"{source}: this {family} config cannot be expressed by xform:\n  - "
                          + "\n  - ".join(problems))


# per stack of transformers' BART-derived models (Marian, M2M100, mBART, BART): xform's attention
# -> theirs, xform's residual block -> their LayerNorm
STACKS = {
    "encoder": ({"self_attn": "self_attn"}, {"attn_block": "self_attn_layer_norm", "ffn_block": "final_layer_norm"}),
    "decoder": ({"self_attn": "self_attn", "cross_attn": "encoder_attn"},
                {"self_block": "self_attn_layer_norm", "cross_block": "encoder_attn_layer_norm",
                 "ffn_block": "final_layer_norm"}),
}


def layer_names(cfg: TransformerConfig) -> dict[str, str]:
    """xform parameter name -> the BART-derived model's parameter name, for every layer parameter."""
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
    """xform embedding parameter -> the BART-derived names that may hold it. Tied weights may be
    saved once or under every name: the first present is used, any other present must equal it."""
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
        """The embedding tables by their aliases (the BART-derived names unless `aliases` gives others)."""
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


def generation_defaults(hf: dict[str, Any], generation: dict[str, Any], source: str) -> dict[str, Any]:
    """How the model is meant to decode, from generation_config.json (else config.json: `hf`), as
    the manifest records it (`source`: the file it came from): num_beams, length_penalty,
    early_stopping, max_length (with the start token, as transformers counts) and forced_eos
    (transformers' forced_eos_token_id). Marian's record."""
    def get(key, default):
        return generation.get(key, hf.get(key, default))

    eos = get("eos_token_id", None)
    eos = eos[0] if isinstance(eos, list) else eos
    forced = get("forced_eos_token_id", None)
    forced = forced[0] if isinstance(forced, list) else forced
    out = {"num_beams": int(get("num_beams", 1) or 1), "length_penalty": float(get("length_penalty", 1.0)),
           "early_stopping": get("early_stopping", False), "forced_eos": forced is not None and forced == eos,
           "source": source}
    if get("max_length", None) is not None:
        out["max_length"] = int(get("max_length", None))
    return out


def processor_defaults(hf: dict[str, Any], generation: dict[str, Any], source: str) -> dict[str, Any]:
    """generation_defaults plus the forced first token (transformers' forced_bos_token_id) when
    the model ships one, its min_length as min_new_tokens (end-of-sentence suppressed until then,
    as transformers does), the logits processors xform reproduces (RECORDED_GENERATION) and
    bad_words_ids' multi-token sequences: the BART and T5 families' record."""
    out = generation_defaults(hf, generation, source)
    forced = generation.get("forced_bos_token_id", hf.get("forced_bos_token_id"))
    if forced is not None:
        out["forced_bos_token_id"] = int(forced)
    min_length = generation.get("min_length", hf.get("min_length")) or 0
    if min_length > 1:  # transformers counts the decoder start in min_length
        out["min_new_tokens"] = int(min_length) - 1
    for key, neutral in RECORDED_GENERATION.items():
        value = generation.get(key, hf.get(key))
        if value is not None and value != neutral and value != []:
            out[key] = value
    bad_words = generation.get("bad_words_ids", hf.get("bad_words_ids")) or []
    sequences = [w for w in bad_words if len(w) > 1]  # single ids are the config's banned ids
    if sequences:
        out["bad_words_ids"] = sequences
    return out
