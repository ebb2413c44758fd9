"""Import Hugging Face directories of the BART family: M2M100 and NLLB (`model_type` m2m_100),
mBART / mBART-50 (mbart) and BART (bart), without transformers.

They are Marian's encoder-decoder (the same parameter names, huggingface.layer_names) with these
differences, each expressed in the TransformerConfig or taken out at import:

| | M2M100 / NLLB | mBART | BART |
| --- | --- | --- | --- |
| norm position | pre, final encoder / decoder LayerNorm | pre, final norms | post |
| after the embeddings | - | LayerNorm (`embedding_norm`) | LayerNorm |
| positions | fairseq's sinusoids from position pad_id + 1 | learned, offset 2 | learned, offset 2 |
| output | tied | tied, `final_logits_bias` | tied, `final_logits_bias` |

A position offset is taken out of the table: xform's row i is the vector transformers adds at
the i-th token (M2M100 counts positions over non-pad tokens, which for right-padded sources and
generated tokens is the index plus pad_id + 1). The decoder starts from `decoder_start_token_id`
(`</s>`), and the generation defaults record `forced_bos_token_id` (the target language) when
the model ships one. transformers' modeling reads only the config keys checked here; the
generation settings xform reproduces (n-gram blocking, repetition penalty, suppressed tokens)
become the bundle's decoding defaults, and those it cannot (the encoder's n-gram blocking and
repetition penalty, beam groups, ...: UNSUPPORTED_GENERATION) are refused by name when set.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, TypedDict

import torch

from xform.config import TransformerConfig
from xform.errors import CheckpointError, ConfigError
from xform.models import tokenizer_files
from xform.models.huggingface import (
    ACTIVATIONS,
    UnsupportedTokenizer,
    WeightMap,
    layer_names,
    one_width_problems,
    read_json,
    refuse_problems,
)
from xform.tokenizer_spec import ByteBpeSpec, FairseqSpmSpec, TokenizerSpec


class Shape(TypedDict):
    norm_position: str
    final_norm: bool
    embedding_norm: bool
    output_bias: bool


# what each family is, in TransformerConfig terms
SHAPES = {
    "m2m_100": Shape(norm_position="pre", final_norm=True, embedding_norm=False, output_bias=False),
    "mbart": Shape(norm_position="pre", final_norm=True, embedding_norm=True, output_bias=True),
    "bart": Shape(norm_position="post", final_norm=False, embedding_norm=True, output_bias=True),
}
LEARNED_OFFSET = 2  # BART's and mBART's learned position tables start two rows in


def family_config(hf: dict[str, Any], generation: dict[str, Any], source: str) -> TransformerConfig:
    """TransformerConfig from a config.json of the family (+ generation_config.json); refuses
    with every reason at once."""
    # any JSON value, or None when absent: TransformerConfig checks the type and range of each
    get: Callable[..., Any] = hf.get
    family = get("model_type")
    problems = one_width_problems(hf)
    act = get("activation_function", "gelu" if family != "m2m_100" else "relu")
    if act not in ACTIVATIONS:
        problems.append(f"activation_function {act!r} is not one of {sorted(ACTIVATIONS)}")
    if not get("tie_word_embeddings", True):
        problems.append("tie_word_embeddings is false; the family's output projection is the shared embedding")
    bad_words = generation.get("bad_words_ids", get("bad_words_ids")) or []
    refuse_problems(problems, generation, get, source, family)
    pad = get("pad_token_id", 1)
    eos = generation.get("eos_token_id", get("eos_token_id", 2))
    eos = eos[0] if isinstance(eos, list) else eos
    start = generation.get("decoder_start_token_id", get("decoder_start_token_id", eos))
    try:
        return TransformerConfig(
            src_vocab_size=get("vocab_size"), tgt_vocab_size=get("vocab_size"), d_model=get("d_model"),
            n_heads=get("encoder_attention_heads"), d_ff=get("encoder_ffn_dim"),
            n_encoder_layers=get("encoder_layers"), n_decoder_layers=get("decoder_layers"),
            activation=ACTIVATIONS[act], layer_norm_eps=1e-5, norm_bias=True, attn_bias=True,
            ffn_bias=True, scale_embedding=bool(get("scale_embedding", family == "m2m_100")), **SHAPES[family],
            positions="learned", share_embeddings=True, tie_output=True, pad_id=pad, bos_id=start, eos_id=eos,
            decoder_start_id=start, max_len=get("max_position_embeddings", 1024),
            banned_ids=tuple(sorted({w[0] for w in bad_words if len(w) == 1} - {pad})))
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def fairseq_sinusoids(rows: int, dim: int, padding_idx: int) -> torch.Tensor:
    """transformers' M2M100SinusoidalPositionalEmbedding.get_embedding, step for step in float32."""
    half = dim // 2
    scale = math.log(10000) / (half - 1)
    freq = torch.exp(torch.arange(half, dtype=torch.int64).float() * -scale)
    angles = torch.arange(rows, dtype=torch.int64).float().unsqueeze(1) * freq.unsqueeze(0)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1).view(rows, -1)
    if dim % 2:
        table = torch.cat([table, torch.zeros(rows, 1)], dim=1)
    table[padding_idx, :] = 0
    return table


def position_table(cfg: TransformerConfig, family: str, theirs: dict[str, torch.Tensor], side: str,
                   problems: list[str]) -> torch.Tensor | None:
    """xform's (max_len, d_model) table for one side: row i is what transformers adds at index i."""
    if family == "m2m_100":  # not saved (a buffer); positions count from pad_id + 1
        first = cfg.pad_id + 1
        return fairseq_sinusoids(cfg.max_len + first, cfg.d_model, cfg.pad_id)[first:]
    key = f"model.{side}.embed_positions.weight"
    table = theirs.get(key)
    if table is None:
        problems.append(f"missing {key}")
        return None
    if tuple(table.shape) != (cfg.max_len + LEARNED_OFFSET, cfg.d_model):
        problems.append(f"{key} has shape {tuple(table.shape)}, expected ({cfg.max_len + LEARNED_OFFSET}, "
                        f"{cfg.d_model}): max_position_embeddings + 2 rows")
        return None
    return table[LEARNED_OFFSET:]


def convert_family_state(family: str, cfg: TransformerConfig, theirs: dict[str, torch.Tensor],
                         source: str) -> dict[str, torch.Tensor]:
    w = WeightMap(theirs)
    w.embeddings(cfg)
    names = layer_names(cfg)
    for side, our_side in (("encoder", "src"), ("decoder", "tgt")):
        table = position_table(cfg, family, theirs, side, w.problems)
        if table is not None:
            w.ours[f"{our_side}_pos.weight"] = table
        if family != "m2m_100":  # M2M100's sinusoids are a buffer, never saved
            w.used.add(f"model.{side}.embed_positions.weight")
        if cfg.embedding_norm:
            for kind in ("weight", "bias"):
                names[f"{our_side}_embed_norm.{kind}"] = f"model.{side}.layernorm_embedding.{kind}"
        if cfg.final_norm:
            for kind in ("weight", "bias"):
                names[f"{side}_norm.{kind}"] = f"model.{side}.layer_norm.{kind}"
    w.named(names)
    if cfg.output_bias:
        w.output_bias(cfg)
    return w.result(source, f"a {family} model")


# transformers' tokenizer classes of the family whose text xform reproduces: sentencepiece pieces,
# mapped to model ids by fairseq's offset (NLLB, mBART-50) or through vocab.json (M2M100), with
# language codes as added tokens; and where the source's language code goes
FAIRSEQ_SPM = {"NllbTokenizer": "offset", "NllbTokenizerFast": "offset", "MBart50Tokenizer": "offset",
               "MBart50TokenizerFast": "offset", "M2M100Tokenizer": "vocab"}
SPM_FILE = "sentencepiece.bpe.model"
# transformers' default source language when tokenizer_config.json records none
DEFAULT_SRC_LANG = {"NllbTokenizer": "eng_Latn", "NllbTokenizerFast": "eng_Latn", "MBart50Tokenizer": "en_XX",
                    "MBart50TokenizerFast": "en_XX"}


# transformers" M2M100Tokenizer FAIRSEQ_LANGUAGE_CODES (tokenization_m2m_100.py): M2M100"s language tokens
# are "__<code>__" at ids len(vocab.json) + index; its tokenizer_config.json does not list them
M2M100_LANGUAGES = {
    "m2m100": ("af", "am", "ar", "ast", "az", "ba", "be", "bg", "bn", "br", "bs", "ca", "ceb", "cs", "cy", "da", "de",
         "el", "en", "es", "et", "fa", "ff", "fi", "fr", "fy", "ga", "gd", "gl", "gu", "ha", "he", "hi", "hr",
         "ht", "hu", "hy", "id", "ig", "ilo", "is", "it", "ja", "jv", "ka", "kk", "km", "kn", "ko", "lb", "lg",
         "ln", "lo", "lt", "lv", "mg", "mk", "ml", "mn", "mr", "ms", "my", "ne", "nl", "no", "ns", "oc", "or",
         "pa", "pl", "ps", "pt", "ro", "ru", "sd", "si", "sk", "sl", "so", "sq", "sr", "ss", "su", "sv", "sw",
         "ta", "th", "tl", "tn", "tr", "uk", "ur", "uz", "vi", "wo", "xh", "yi", "yo", "zh", "zu"),
    "wmt21": ("en", "ha", "is", "ja", "cs", "ru", "zh", "de"),
}


# the files a family's tokenizers read; a directory with none of them exports for token ids
TOKENIZER_FILES = (SPM_FILE, "vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json")
TEXT_FILES = {"m2m_100": f"{SPM_FILE} and tokenizer_config.json, plus vocab.json for M2M100",
              "mbart": f"{SPM_FILE} and tokenizer_config.json", "bart": "vocab.json and merges.txt"}
FAMILY_TOKENIZERS = {"m2m_100": "an NLLB or M2M100 tokenizer", "mbart": "an mBART tokenizer",
                     "bart": "a BART tokenizer"}


def tokenizer_config(family: str, directory: Path, have: list[str]) -> dict[str, Any]:
    """tokenizer_config.json with its tokenizer_class; without a class, the one transformers'
    AutoTokenizer falls back on for the model type (M2M100's by its vocab.json). Without the file,
    only where that class needs nothing from it (BART's, M2M100's): else refused, naming it."""
    if "tokenizer_config.json" not in have:
        guess = {"bart": "BartTokenizer", "m2m_100": "M2M100Tokenizer" if "vocab.json" in have else None}.get(family)
        if guess is None:
            tokenizer_files.refuse_missing(directory, have, [SPM_FILE, "tokenizer_config.json"],
                                           FAMILY_TOKENIZERS.get(family, "its tokenizer"))
        return {"tokenizer_class": guess}
    tok = read_json(directory / "tokenizer_config.json")
    if not tok.get("tokenizer_class"):  # AutoTokenizer's fallback: the model type's tokenizer
        guesses = {"bart": "BartTokenizer",  # mBART's two tokenizers frame differently: not guessed
                   "m2m_100": "M2M100Tokenizer" if "vocab.json" in have else "NllbTokenizer"}
        tok["tokenizer_class"] = guesses.get(family)
    return tok


def tokenizer_spec(family: str, directory: Path, cfg: TransformerConfig) -> tuple[TokenizerSpec | None, list[str]]:
    """(the bundle's tokenizer.json spec, the files it needs from the directory); (None, [])
    without any tokenizer file. A file the tokenizer needs that is missing, or files that do not
    fit each other or the model's embedding, is refused by name; a tokenizer class xform does not
    reproduce is UnsupportedTokenizer (the model exports, taking ids)."""
    directory = Path(directory)
    have = tokenizer_files.present(directory, TOKENIZER_FILES)
    if not have:
        return None, []
    tok = tokenizer_config(family, directory, have)
    tokenizer_class = tok.get("tokenizer_class")
    if tokenizer_class in BYTE_BPE:
        return byte_bpe_spec(directory, tok, have, cfg.src_vocab_size)
    if not isinstance(tokenizer_class, str) or tokenizer_class not in FAIRSEQ_SPM:
        raise UnsupportedTokenizer(f"{directory / 'tokenizer_config.json'}: tokenizer_class {tokenizer_class!r} is "
                                   f"not one xform reproduces ({', '.join([*FAIRSEQ_SPM, *BYTE_BPE])}): the bundle "
                                   "takes token ids")
    kind = FAIRSEQ_SPM[tokenizer_class]
    files = [SPM_FILE] + (["vocab.json"] if kind == "vocab" else [])
    tokenizer_files.refuse_missing(directory, have, files, f"its {tokenizer_class}")
    special, languages = special_tokens(directory, tok, kind, cfg.src_vocab_size)
    unk = tok.get("unk_token", "<unk>")
    unk = unk.get("content") if isinstance(unk, dict) else unk
    if not isinstance(unk, str):
        raise CheckpointError(f"{directory / 'tokenizer_config.json'}: unk_token {unk!r} is not a token")
    legacy = bool(tok.get("legacy_behaviour", False)) and tokenizer_class.startswith("Nllb")
    spec = FairseqSpmSpec(
        tokenizer_class=tokenizer_class, model=SPM_FILE, vocab="vocab.json" if kind == "vocab" else None, offset=1,
        unk_token=unk, special=special, languages=tuple(languages),
        # where the source language's code goes: NLLB's legacy_behaviour puts it last
        source=("text", "eos", "lang") if legacy else ("lang", "text", "eos"),
        src_lang=tok.get("src_lang") or DEFAULT_SRC_LANG.get(tokenizer_class), tgt_lang=tok.get("tgt_lang"),
        clean_up_tokenization_spaces=bool(tok.get("clean_up_tokenization_spaces", False)))
    return spec, files


def special_tokens(directory: Path, tok: dict[str, Any], kind: str, rows: int) -> tuple[dict[str, int], list[str]]:
    """(added token -> id, the language codes among them) of a fairseq tokenizer, once its
    sentencepiece pieces (and M2M100's vocab.json) are checked against the model's `rows`."""
    cfg_path = directory / "tokenizer_config.json"
    spm_path = directory / SPM_FILE
    special: dict[str, int] = {}
    for i, entry in (tok.get("added_tokens_decoder") or {}).items():
        if isinstance(entry, dict) and isinstance(entry.get("content"), str):
            special[entry["content"]] = int(i)
    languages = [t for t in tok.get("additional_special_tokens") or [] if isinstance(t, str) and t in special]
    vocab: dict[str, int] = {}
    if kind == "vocab":
        vocab = tokenizer_files.read_vocab(directory / "vocab.json", rows, "shared")
        tokenizer_files.refuse_uncovered(spm_path, directory / "vocab.json", vocab)
    else:
        proc, _ = tokenizer_files.spm_pieces(spm_path)
        if proc.GetPieceSize() + 1 > rows:
            raise CheckpointError(f"{spm_path}: {proc.GetPieceSize()} pieces at model ids 1..{proc.GetPieceSize()} "
                                  f"(fairseq's offset), but the model's embedding has {rows} rows: is it this "
                                  f"model's {SPM_FILE}?")
    if not languages and kind == "vocab":  # M2M100: computed, not saved
        codes = M2M100_LANGUAGES.get(tok.get("language_codes", "m2m100"))
        if codes is None:
            raise CheckpointError(f"{cfg_path}: language_codes {tok.get('language_codes')!r} is not one of "
                                  f"{sorted(M2M100_LANGUAGES)}")
        for name in ("<s>", "<pad>", "</s>", "<unk>"):  # configs from before added_tokens_decoder
            if name in vocab:
                special.setdefault(name, vocab[name])
        languages = [f"__{c}__" for c in codes]
        special.update({t: len(vocab) + i for i, t in enumerate(languages)})
    if not languages:
        raise CheckpointError(f"{cfg_path}: a {tok.get('tokenizer_class')} without language codes among its "
                              "additional_special_tokens / added_tokens_decoder")
    beyond = sorted(t for t, i in special.items() if not 0 <= i < rows)
    if beyond:
        raise CheckpointError(f"{cfg_path if kind == 'offset' else directory / 'vocab.json'}: special tokens and "
                              f"language codes at ids beyond the model's embedding of {rows} rows (for {beyond[:3]})")
    return special, languages


BYTE_BPE = ("BartTokenizer", "BartTokenizerFast")
BPE_FILES = ("vocab.json", "merges.txt")


def byte_bpe_spec(directory: Path, tok: dict[str, Any], have: list[str],
                  rows: int) -> tuple[ByteBpeSpec, list[str]]:
    """BART's byte-level BPE (GPT-2's): vocab.json and merges.txt, `<s> text </s>`."""
    tokenizer_files.refuse_missing(directory, have, list(BPE_FILES), f"its {tok['tokenizer_class']}")
    vocab = tokenizer_files.read_vocab(directory / "vocab.json", rows, "shared")
    refuse_unfit_merges(directory)

    def token(key, default):
        t = tok.get(key, default)
        return t.get("content") if isinstance(t, dict) else t

    names = {key: token(f"{key}_token", default) for key, default in
             (("bos", "<s>"), ("eos", "</s>"), ("pad", "<pad>"), ("unk", "<unk>"), ("mask", "<mask>"))}
    absent = sorted(n for n in names.values() if n not in vocab)
    if absent:
        raise CheckpointError(f"{directory / 'vocab.json'}: no ids for the special tokens {absent}")
    spec = ByteBpeSpec(vocab="vocab.json", merges="merges.txt",
                       add_prefix_space=bool(tok.get("add_prefix_space", False)),
                       clean_up_tokenization_spaces=bool(tok.get("clean_up_tokenization_spaces", False)),
                       special={n: vocab[n] for n in names.values()}, bos_token=names["bos"], eos_token=names["eos"],
                       unk_token=names["unk"])
    return spec, list(BPE_FILES)


def refuse_unfit_merges(directory: Path) -> None:
    """merges.txt whose tokens vocab.json lacks (another model's) is refused as the runtime's
    tokenizers would refuse it, at export instead of at load."""
    try:
        from tokenizers import models
    except ImportError:
        raise CheckpointError(f"{directory}: BART's tokenizer needs tokenizers: pip install tokenizers") from None
    try:
        models.BPE.from_file(str(directory / "vocab.json"), str(directory / "merges.txt"))
    except Exception as e:  # tokenizers raises its own exception type for a bad file
        raise CheckpointError(f"{directory / 'merges.txt'}: does not fit vocab.json ({e}): the two are not one "
                              f"model's tokenizer ({tokenizer_files.COPY.format('both')})") from None
