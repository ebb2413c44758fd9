"""Import Hugging Face T5 directories (`model_type` t5: T5, Flan-T5, MADLAD-400; mt5: mT5), without
transformers.

T5 is the encoder-decoder of the other families with these differences, each a TransformerConfig
field (docs/design.md "The T5 family"):

| | T5 / Flan-T5 | T5 v1.1, mT5, MADLAD-400 |
| --- | --- | --- |
| norms | RMS norm before each sublayer, final norms (`norm_kind` rms, pre, `final_norm`) | same |
| positions | a bucketed relative bias, learned in each stack's first layer (`positions` relative) | same |
| attention | no 1/sqrt(d) scaling (`scale_attention` false); width num_heads x d_kv | same |
| feed-forward | relu | gated-gelu: gelu(tanh) x a linear gate (`ffn_gated`) |
| output | tied to the embeddings, scaled by d_model ** -0.5 (`scale_output`) | untied, unscaled |
| biases | none anywhere | none |

The decoder starts from the pad id. In fp16 graphs the feed-forward output projection and the
residual stream stay fp32 (`fp32_ffn_output`; docs/design.md, "T5 in fp16"). What the config names
and xform cannot express is refused by name: UMT5 (its own model_type, refused by families.py's
table: a relative bias in every layer), a `feed_forward_proj` of an activation xform lacks, a
decoder-only config.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from xform.config import TransformerConfig
from xform.errors import CheckpointError, ConfigError
from xform.models import tokenizer_files
from xform.models.huggingface import (
    ACTIVATIONS,
    UnsupportedTokenizer,
    WeightMap,
    read_json,
    refuse_problems,
)
from xform.tokenizer_spec import T5Spec

TIED_BY_DEFAULT = {"t5": True, "mt5": False}  # T5Config's and MT5Config's tie_word_embeddings default
DEFAULT_MAX_LEN = 512  # T5's n_positions where a config records it; relative positions have no table


def feed_forward(proj: object) -> tuple[str | None, bool, str | None]:
    """(xform activation, gated, problem) of a feed_forward_proj, parsed as transformers' T5Config
    does: `ACT` or `gated-ACT`, gated-gelu meaning gelu with the tanh approximation."""
    if not isinstance(proj, str):
        return None, False, f"feed_forward_proj {proj!r} is not a string"
    parts = proj.split("-")
    if (len(parts) > 1 and parts[0] != "gated") or len(parts) > 2:
        return None, False, f"feed_forward_proj {proj!r} is not `ACT` or `gated-ACT`"
    act = "gelu_new" if proj == "gated-gelu" else parts[-1]
    if act not in ACTIVATIONS:
        return None, False, (f"feed_forward_proj {proj!r}: activation {act!r} is not one of "
                             f"{sorted(ACTIVATIONS)}")
    return ACTIVATIONS[act], parts[0] == "gated", None


def t5_config(hf: dict[str, Any], generation: dict[str, Any], source: str) -> TransformerConfig:
    """TransformerConfig from a T5 / mT5 config.json (+ generation_config.json); refuses with every
    reason at once."""
    get: Callable[..., Any] = hf.get
    family = get("model_type")
    problems = []
    activation, gated, problem = feed_forward(get("feed_forward_proj", "relu"))
    if problem:
        problems.append(problem)
    if get("is_encoder_decoder", True) is not True:
        problems.append("is_encoder_decoder is false (a decoder-only T5); xform exports encoder-decoders")
    refuse_problems(problems, generation, get, source, family)
    pad = get("pad_token_id", 0)
    eos = generation.get("eos_token_id", get("eos_token_id", 1))
    eos = eos[0] if isinstance(eos, list) else eos
    start = generation.get("decoder_start_token_id", get("decoder_start_token_id"))
    start = pad if start is None else start
    tied = get("tie_word_embeddings", TIED_BY_DEFAULT.get(str(family), True))
    layers = get("num_layers")
    bad_words = generation.get("bad_words_ids", get("bad_words_ids")) or []
    try:
        return TransformerConfig(
            src_vocab_size=get("vocab_size"), tgt_vocab_size=get("vocab_size"), d_model=get("d_model"),
            n_heads=get("num_heads"), attention_head_dim=get("d_kv"), d_ff=get("d_ff"),
            n_encoder_layers=layers, n_decoder_layers=get("num_decoder_layers") or layers,
            activation=activation or "relu", ffn_gated=gated, norm_kind="rms", norm_position="pre", final_norm=True,
            layer_norm_eps=get("layer_norm_epsilon", 1e-6), norm_bias=False, attn_bias=False, ffn_bias=False,
            output_bias=False, scale_embedding=False, scale_attention=False, scale_output=bool(tied),
            positions="relative", relative_attention_buckets=get("relative_attention_num_buckets", 32),
            relative_attention_max_distance=get("relative_attention_max_distance", 128),
            share_embeddings=True, tie_output=bool(tied), pad_id=pad, bos_id=start, eos_id=eos,
            decoder_start_id=start, max_len=get("n_positions") or DEFAULT_MAX_LEN, fp32_ffn_output=True,
            banned_ids=tuple(sorted({w[0] for w in bad_words if len(w) == 1} - {pad})))
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


STACKS = {  # xform sublayer -> T5's layer index in a block, and its attention module's name
    "encoder": {"attn_block": (0, "SelfAttention"), "ffn_block": (1, None)},
    "decoder": {"self_block": (0, "SelfAttention"), "cross_block": (1, "EncDecAttention"), "ffn_block": (2, None)},
}
OUR_ATTENTION = {"attn_block": "self_attn", "self_block": "self_attn", "cross_block": "cross_attn"}
FFN = {"fc1": "wi", "fc2": "wo"}
GATED_FFN = {"fc1": "wi_0", "gate": "wi_1", "fc2": "wo"}


def layer_names(cfg: TransformerConfig) -> dict[str, str]:
    """xform parameter name -> T5 parameter name, for every parameter but the embeddings."""
    names: dict[str, str] = {}
    depth = {"encoder": cfg.n_encoder_layers, "decoder": cfg.n_decoder_layers}
    for side, blocks in STACKS.items():
        for i in range(depth[side]):
            ours, theirs = f"{side}_layers.{i}", f"{side}.block.{i}.layer"
            for block, (j, attention) in blocks.items():
                names[f"{ours}.{block}.norm.weight"] = f"{theirs}.{j}.layer_norm.weight"
                if attention is not None:
                    for p, t in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("out_proj", "o")):
                        names[f"{ours}.{OUR_ATTENTION[block]}.{p}.weight"] = f"{theirs}.{j}.{attention}.{t}.weight"
                else:
                    for p, t in (GATED_FFN if cfg.ffn_gated else FFN).items():
                        names[f"{ours}.ffn.{p}.weight"] = f"{theirs}.{j}.DenseReluDense.{t}.weight"
        names[f"{side}_norm.weight"] = f"{side}.final_layer_norm.weight"
    names["src_bias.weight"] = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    names["tgt_bias.weight"] = "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    return names


def embedding_aliases(cfg: TransformerConfig) -> dict[str, list[str]]:
    """One table for both stacks (and the output when tied), saved under any of these names."""
    tied_head = ["lm_head.weight"] if cfg.tie_output else []
    out = {"src_embed.weight": ["shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
                                *tied_head]}
    if not cfg.tie_output:
        out["lm_head.weight"] = ["lm_head.weight"]
    return out


def convert_t5_state(cfg: TransformerConfig, theirs: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    w = WeightMap(theirs)
    w.embeddings(cfg, embedding_aliases(cfg))
    w.named(layer_names(cfg))
    return w.result(source, "a T5 model")


SPM_FILE = "spiece.model"
TOKENIZER_FILES = (SPM_FILE, "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
TEXT_FILES = f"{SPM_FILE} (or tokenizer.json)"
LANGUAGE_TOKEN = r"<2[^<>\s]+>"  # MADLAD-400's target-language tokens: <2de>, <2pt>, <2zh_Latn>


def tokenizer_spec(directory: Path, cfg: TransformerConfig) -> tuple[T5Spec | None, list[str]]:
    """(the bundle's tokenizer.json spec, the files it needs); (None, []) without any tokenizer
    file. T5Tokenizer's sentencepiece model (spiece.model), whose ids are the model's, with its
    extra ids (<extra_id_N>) after the pieces; or, without it, the fast tokenizer's tokenizer.json.
    A MADLAD-400 vocabulary's <2xx> pieces are recorded as its target languages."""
    import re

    directory = Path(directory)
    have = tokenizer_files.present(directory, TOKENIZER_FILES)
    if SPM_FILE not in have and "tokenizer.json" not in have:
        if have:
            tokenizer_files.refuse_missing(directory, have, [SPM_FILE], "a T5 tokenizer")
        return None, []
    tok = read_json(directory / "tokenizer_config.json") if "tokenizer_config.json" in have else {}

    def token(key: str, default: str) -> str:
        t = tok.get(key, default)
        t = t.get("content") if isinstance(t, dict) else t
        return t if isinstance(t, str) else default

    if tok.get("legacy") is False and SPM_FILE in have and "tokenizer.json" not in have:
        raise UnsupportedTokenizer(
            f"{directory / 'tokenizer_config.json'}: legacy false (T5Tokenizer's non-legacy handling of the text "
            "after special tokens) is not one xform reproduces from spiece.model: the bundle takes token ids")
    extra_ids = int(tok.get("extra_ids", 100))
    slow = SPM_FILE in have and tok.get("legacy") is not False  # T5Tokenizer's spiece.model, else the fast file
    if slow:
        proc, _ = tokenizer_files.spm_pieces(directory / SPM_FILE)
        pieces = [proc.IdToPiece(i) for i in range(proc.GetPieceSize())]
        size, files = proc.GetPieceSize() + extra_ids, [SPM_FILE]
    else:
        from xform.files import read_json_object
        data = read_json_object(directory / "tokenizer.json", CheckpointError, "a tokenizers file")
        vocab = (data.get("model") or {}).get("vocab")
        if not isinstance(vocab, list):
            raise CheckpointError(f"{directory / 'tokenizer.json'}: not a Unigram tokenizer (T5's fast tokenizer)")
        pieces = [p[0] for p in vocab if isinstance(p, list) and p]
        added = [t.get("id") for t in data.get("added_tokens") or [] if isinstance(t, dict)]
        size, files = max([len(pieces) - 1, *[i for i in added if isinstance(i, int)]]) + 1, ["tokenizer.json"]
    if size > cfg.src_vocab_size:
        raise CheckpointError(f"{directory / files[0]}: {size} token ids, but the model's embedding has "
                              f"{cfg.src_vocab_size} rows: is it this model's tokenizer?")
    spec = T5Spec(unk_token=token("unk_token", "<unk>"), extra_ids=extra_ids,
                  clean_up_tokenization_spaces=bool(tok.get("clean_up_tokenization_spaces", False)),
                  model=SPM_FILE if slow else None, fast=None if slow else "tokenizer.json",
                  languages=tuple(p for p in pieces if re.fullmatch(LANGUAGE_TOKEN, p)))
    return spec, files
