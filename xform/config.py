"""TransformerConfig: every hyper-parameter and architectural choice of the seq2seq model.

Pure Python, at the bottom of the layers: the models build from it, and the runtime validates a
bundle manifest's config with the same `problems()` (xform/manifest.py). The config expresses the
variants the seed tutorials, torch.nn.Transformer and Marian use: where each sublayer's LayerNorm sits (post, pre, or
pre_normed_residual; one position for all sublayers or one per sublayer), a final LayerNorm, ReLU /
GELU / SiLU, gated or plain feed-forward, LayerNorm or RMS norm, biases on or off separately, an
attention width other than d_model, attention and output scaling, embedding scaling and
normalization, tied or separate embeddings, positions (a table, or T5's bucketed relative bias),
special ids. (A position offset, as BART's learned table and M2M100's sinusoids have, is taken out
at import: row i of xform's table is the vector of position i.)
It does not own weights (see checkpoint.py) or graph names (see xform/contract.py).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, TypeGuard

from xform.errors import ConfigError

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
# Where a sublayer f's LayerNorm sits, with x the residual stream:
#   post:                x = norm(x + f(x))         (Vaswani; seeds 000, 002, 003; Marian)
#   pre:                 x = x + f(norm(x))         (seed 001; nn.Transformer(norm_first=True))
#   pre_normed_residual: x = norm(x); x = x + f(x)  (seed 004: the residual carries the normed x)
NORM_POSITIONS = ("post", "pre", "pre_normed_residual")
# sinusoidal: sin on even, cos on odd channels (Vaswani, the tutorials);
# sinusoidal_split: sin on the first half, cos on the second (Marian / fairseq);
# learned: a trained table of max_len rows;
# relative: no position vectors; a learned bias per head and bucket of key - query distance, added
# to every self-attention's scores (T5: bidirectional buckets in the encoder, causal in the decoder;
# models/position_bias.py)
POSITIONS = ("sinusoidal", "sinusoidal_split", "learned", "relative")
# layer: LayerNorm (mean and variance, weight and bias); rms: T5's RMS norm (no mean, no bias)
NORM_KINDS = ("layer", "rms")
# Fields added after bundle format 4: a config at their defaults is written without them, so the
# manifests and bundles of every earlier family stay byte-identical, and a manifest without them
# reads as the defaults (what every model exported before them was).
LATER_FIELDS: dict[str, Any] = {"norm_kind": "layer", "ffn_gated": False, "scale_attention": True,
                                "scale_output": False, "relative_attention_buckets": 32,
                                "relative_attention_max_distance": 128, "fp32_ffn_output": False}
# Upper bounds no real model reaches: a config beyond them (a hostile manifest's) is refused before
# anything is allocated from it.
LIMITS = {"src_vocab_size": 1 << 22, "tgt_vocab_size": 1 << 22, "d_model": 1 << 16, "n_heads": 1 << 10,
          "d_ff": 1 << 18, "n_encoder_layers": 1 << 10, "n_decoder_layers": 1 << 10, "max_len": 1 << 20}
HEAD_DIM_LIMIT = 1 << 12


def is_int(v: object) -> TypeGuard[int]:
    """An int that is not a bool (JSON's true is not a size)."""
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class TransformerConfig:
    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512
    n_heads: int = 8
    # per-head width when n_heads * head width != d_model (d2l's query_size, seed 003);
    # None: d_model // n_heads
    attention_head_dim: int | None = None
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    activation: str = "relu"
    norm_position: str = "post"
    # one position per sublayer, overriding norm_position: (self-attention, FFN) for the encoder,
    # (self-attention, cross-attention, FFN) for the decoder; seed 004 mixes them
    encoder_norm_positions: tuple[str, str] | None = None
    decoder_norm_positions: tuple[str, str, str] | None = None
    # Pre-LN stacks usually end with a LayerNorm (nanoGPT, seed 004); some do not.
    final_norm: bool = False
    layer_norm_eps: float = 1e-5
    norm_bias: bool = True
    attn_bias: bool = True
    ffn_bias: bool = True
    output_bias: bool = False
    scale_embedding: bool = False
    # a LayerNorm over embeddings + positions, one per side (mBART's and BART's layernorm_embedding)
    embedding_norm: bool = False
    positions: str = "sinusoidal"
    # share_embeddings: one table for source and target tokens (needs equal vocab sizes)
    share_embeddings: bool = False
    # tie_output: the output projection reuses the target embedding table
    tie_output: bool = True
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    # the first decoder input; Marian starts from the pad id. None means bos_id.
    decoder_start_id: int | None = None
    max_len: int = 256
    dropout: float = 0.0
    # LATER_FIELDS, described there and here
    norm_kind: str = "layer"
    # the feed-forward's hidden is act(fc1(x)) * gate(x) (T5 v1.1's gated-gelu) instead of act(fc1(x))
    ffn_gated: bool = False
    # attention scores scaled by head_dim ** -0.5 (T5's are not: the scale is folded into its init)
    scale_attention: bool = True
    # the decoder's output scaled by d_model ** -0.5 before the projection (T5's tied output)
    scale_output: bool = False
    # positions "relative": buckets per direction pair and the distance from which all share one
    relative_attention_buckets: int = 32
    relative_attention_max_distance: int = 128
    # reduced-precision graphs keep the feed-forward output projection and the residual stream in
    # fp32 (T5: its activations overflow fp16 there; transformers' _keep_in_fp32_modules ["wo"])
    fp32_ffn_output: bool = False
    # ids greedy decoding never picks, besides the pad id (Marian's single-token bad_words_ids)
    banned_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ConfigError("invalid TransformerConfig:\n  - " + "\n  - ".join(problems), problems)

    def problems(self) -> list[str]:
        """Every reason this config is invalid, gathered (empty when valid). The one validation of a
        model config: a TransformerConfig built in PyTorch and a bundle manifest's config (hostile
        until proved otherwise: any value of any type) both pass through it, so each check looks at
        the type before the value, and sizes have upper bounds no real model reaches."""
        p: list[str] = []
        ok: dict[str, int] = {}  # the sizes and ids that passed, for the checks between them
        for name, limit in LIMITS.items():
            v = getattr(self, name)
            if is_int(v) and 1 <= v <= limit:
                ok[name] = v
            else:
                p.append(f"{name} is {v!r}, expected an integer in [1, {limit}]")
        head = self.attention_head_dim
        if head is not None and not (is_int(head) and 1 <= head <= HEAD_DIM_LIMIT):
            p.append(f"attention_head_dim is {head!r}, expected an integer in [1, {HEAD_DIM_LIMIT}] or None")
        elif head is None and "d_model" in ok and "n_heads" in ok and ok["d_model"] % ok["n_heads"]:
            p.append(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}) "
                     "unless attention_head_dim is given")
        p += self.position_problems(ok) + self.kind_problems()
        if self.share_embeddings is True and self.src_vocab_size != self.tgt_vocab_size:
            p.append("share_embeddings needs src_vocab_size == tgt_vocab_size, got "
                     f"{self.src_vocab_size} and {self.tgt_vocab_size}")
        p += self.id_problems(ok)
        return p

    def position_problems(self, ok: dict[str, int]) -> list[str]:
        """The positions' kind and, for relative positions, the buckets and their distance."""
        p: list[str] = []
        if self.positions not in POSITIONS:
            p.append(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        elif self.positions.startswith("sinusoidal") and "d_model" in ok and ok["d_model"] % 2:
            p.append(f"sinusoidal positions need an even d_model, got {self.d_model}")
        elif self.positions == "relative":
            buckets, distance = self.relative_attention_buckets, self.relative_attention_max_distance
            if not (is_int(buckets) and 4 <= buckets <= 1 << 12):
                p.append(f"relative_attention_buckets is {buckets!r}, expected an integer in [4, {1 << 12}]")
            elif not (is_int(distance) and buckets // 2 < distance <= 1 << 20):
                # the bucketing divides by log(max_distance / (buckets // 2)) (causal): it must be > 0
                p.append(f"relative_attention_max_distance is {distance!r}, expected an integer in "
                         f"[{buckets // 2 + 1}, {1 << 20}] (more than half the buckets)")
        return p

    def kind_problems(self) -> list[str]:
        """The enumerated choices, the flags and the two floats."""
        p: list[str] = []
        if self.norm_kind not in NORM_KINDS:
            p.append(f"norm_kind must be one of {NORM_KINDS}, got {self.norm_kind!r}")
        if self.activation not in ACTIVATIONS:
            p.append(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.norm_position not in NORM_POSITIONS:
            p.append(f"norm_position must be one of {NORM_POSITIONS}, got {self.norm_position!r}")
        for name, n in (("encoder_norm_positions", 2), ("decoder_norm_positions", 3)):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, tuple) and len(v) == n and all(x in NORM_POSITIONS for x in v)):
                p.append(f"{name} must be None or a tuple of {n} of {NORM_POSITIONS}, got {v!r}")
        for name in ("final_norm", "norm_bias", "attn_bias", "ffn_bias", "output_bias", "scale_embedding",
                     "embedding_norm", "share_embeddings", "tie_output", "ffn_gated", "scale_attention", "scale_output",
                     "fp32_ffn_output"):
            if not isinstance(getattr(self, name), bool):
                p.append(f"{name} must be true or false, got {getattr(self, name)!r}")
        eps = self.layer_norm_eps
        if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and 0 < eps < 1):
            p.append(f"layer_norm_eps must be in (0, 1), got {eps!r}")
        drop = self.dropout
        if not (isinstance(drop, (int, float)) and not isinstance(drop, bool) and 0.0 <= drop < 1.0):
            p.append(f"dropout must be in [0, 1), got {drop!r}")
        return p

    def id_problems(self, ok: dict[str, int]) -> list[str]:
        """The special ids within the vocabularies, the banned ids, eos and pad apart."""
        p: list[str] = []
        tgt, src = ok.get("tgt_vocab_size"), ok.get("src_vocab_size")
        ids = {"pad_id": self.pad_id, "bos_id": self.bos_id, "eos_id": self.eos_id,
               "decoder_start_id": self.start_id}
        for name, v in ids.items():
            if not is_int(v) or v < 0:
                p.append(f"{name} is {v!r}, expected a non-negative integer")
            elif tgt is not None and v >= tgt:
                p.append(f"{name} is {v}, expected an id below tgt_vocab_size ({tgt})")
        if is_int(self.pad_id) and src is not None and self.pad_id >= src:
            p.append(f"pad_id is {self.pad_id}, expected an id below src_vocab_size ({src})")
        if not isinstance(self.banned_ids, tuple) or not all(
                is_int(i) and 0 <= i < (tgt or 0) for i in self.banned_ids):
            p.append(f"banned_ids must be a tuple of ids below tgt_vocab_size, got {self.banned_ids!r}")
        elif self.eos_id in self.banned_ids:
            p.append(f"banned_ids must not contain eos_id ({self.eos_id})")
        if self.eos_id == self.pad_id:
            p.append(f"eos_id and pad_id must differ, both are {self.eos_id}")
        return p

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.d_model // self.n_heads

    @property
    def encoder_norms(self) -> tuple[str, str]:
        """Norm position of the encoder's (self-attention, FFN) sublayers."""
        return self.encoder_norm_positions or (self.norm_position,) * 2

    @property
    def decoder_norms(self) -> tuple[str, str, str]:
        """Norm position of the decoder's (self-attention, cross-attention, FFN) sublayers."""
        return self.decoder_norm_positions or (self.norm_position,) * 3

    @property
    def never_generated(self) -> tuple[int, ...]:
        """The target ids no decoding step emits: the pad id and the banned ids, sorted."""
        return tuple(sorted({self.pad_id, *self.banned_ids}))

    @property
    def start_id(self) -> int:
        return self.bos_id if self.decoder_start_id is None else self.decoder_start_id

    def to_dict(self) -> dict[str, Any]:
        """Every field, less the LATER_FIELDS at their defaults (the relative-position ones also
        when positions are not relative)."""
        d = dataclasses.asdict(self)
        relative = self.positions == "relative"
        for name, default in LATER_FIELDS.items():
            if d[name] == default and not (relative and name.startswith("relative_")):
                del d[name]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "config", complete: bool = False) -> "TransformerConfig":
        """From a dict (JSON): unknown keys are refused; with `complete` (a manifest, which records
        every field), missing keys too, rather than taking defaults the model was not exported with."""
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: a config is an object of TransformerConfig fields, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown TransformerConfig keys {unknown}; known: {sorted(known)}")
        missing = sorted(known - set(d) - set(LATER_FIELDS))
        if complete and missing:
            raise ConfigError(f"{source}: missing TransformerConfig keys {missing}")
        for key in ("banned_ids", "encoder_norm_positions", "decoder_norm_positions"):
            if isinstance(d.get(key), list):  # JSON has no tuples
                d = {**d, key: tuple(d[key])}
        try:
            return cls(**d)
        except TypeError as e:  # a required key is missing
            raise ConfigError(f"{source}: {e}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def replace(self, **changes: Any) -> "TransformerConfig":
        return dataclasses.replace(self, **changes)


# Presets by exact name. `tiny` has distinct sizes so that a swapped axis fails in tests.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(src_vocab_size=37, tgt_vocab_size=41, d_model=48, n_heads=3, d_ff=72,
                 n_encoder_layers=2, n_decoder_layers=3, max_len=64),
    "base": dict(src_vocab_size=32000, tgt_vocab_size=32000, d_model=512, n_heads=8, d_ff=2048,
                 n_encoder_layers=6, n_decoder_layers=6, share_embeddings=True, max_len=512),
}


def preset(name: str, **overrides: Any) -> TransformerConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; known presets: {sorted(PRESETS)}")
    return TransformerConfig(**{**PRESETS[name], **overrides})
