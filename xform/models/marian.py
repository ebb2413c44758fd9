"""Import a Hugging Face Marian / OPUS-MT directory into xform's model, without transformers.

The converter template: read the config and refuse what xform cannot express (every reason at
once), map every weight by a declarative name table, check that tied and positional weights saved
beside the canonical ones agree with them, and load strictly. Weights come from safetensors or
from `pytorch_model.bin` loaded with `weights_only=True` (no arbitrary unpickling).
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
    WeightMap,
    layer_names,
    one_width_problems,
    read_json,
)
from xform.models.layers import sinusoid_table
from xform.tokenizer_spec import MarianSpmSpec

TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json", "target_vocab.json", "tokenizer_config.json")
TEXT_FILES = "source.spm, target.spm and vocab.json"  # what text needs, for the note of a model without them


def marian_config(hf: dict[str, Any], generation: dict[str, Any], source: str) -> TransformerConfig:
    """TransformerConfig from a Marian config.json (+ generation_config.json); refuses with every reason."""
    problems = []
    # any JSON value, or None when absent: TransformerConfig checks the type and range of each
    get: Callable[..., Any] = hf.get
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
