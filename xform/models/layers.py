"""The building blocks of the encoder-decoder Transformer: attention, feed-forward, layers, positions.

Shapes: B batch, S source length, T target (new) length, P past length, H heads, Dh head dim,
D d_model. Attention is `(Q * scale) @ K^T + additive mask -> softmax -> @ V` on 4-D
[B, H, *, Dh] tensors, the form TensorRT fuses. Masks are additive float tensors (0 or MASK_VALUE),
with a relative position bias (position_bias.py) already added where the config has one.

Dtypes: the residual stream has the dtype of the feed-forward's output projection (`fc2`) and
every other weight the compute dtype; each projection casts its input to its weight's dtype, so an
fp16 model whose `fc2` stays fp32 (config `fp32_ffn_output`, T5) keeps an fp32 residual stream.
In an fp32 model every such cast is a no-op and traces to nothing.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from xform.config import TransformerConfig
from xform.contract import MASK_VALUE  # noqa: F401 - the graphs' and the runtime's one value

# One layer's self-attention cache: keys and values, each [B, H, P, Dh].
LayerKV = tuple[Tensor, Tensor]


def activation_fn(name: str):
    return {
        "relu": F.relu,
        "gelu": F.gelu,
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "silu": F.silu,
    }[name]


def sinusoid_table(max_len: int, d_model: int, split: bool) -> Tensor:
    """[max_len, d_model] fixed positions; interleaved sin/cos, or sin | cos halves (Marian)."""
    pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (L, 1)
    inv = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * -(math.log(10000.0) / d_model))
    angles = pos * inv  # (L, D/2)
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    if split:
        table[:, : d_model // 2] = torch.sin(angles)
        table[:, d_model // 2:] = torch.cos(angles)
    else:
        table[:, 0::2] = torch.sin(angles)
        table[:, 1::2] = torch.cos(angles)
    return table.float()


class Positions(nn.Module):
    """Position vectors for positions [offset, offset + T)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.kind = cfg.positions
        if self.kind == "learned":
            self.weight = nn.Parameter(torch.zeros(cfg.max_len, cfg.d_model))
            nn.init.normal_(self.weight, std=0.02)
        else:
            self.register_buffer(
                "weight", sinusoid_table(cfg.max_len, cfg.d_model, self.kind == "sinusoidal_split"),
                persistent=False)

    def forward(self, offset: Tensor | int, length: int) -> Tensor:
        return self.weight[offset: offset + length]  # (T, D)


class Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        d, self.n_heads, self.head_dim = cfg.d_model, cfg.n_heads, cfg.head_dim
        inner = self.n_heads * self.head_dim  # d_model unless attention_head_dim says otherwise
        self.q_proj = nn.Linear(d, inner, bias=cfg.attn_bias)
        self.k_proj = nn.Linear(d, inner, bias=cfg.attn_bias)
        self.v_proj = nn.Linear(d, inner, bias=cfg.attn_bias)
        self.out_proj = nn.Linear(inner, d, bias=cfg.attn_bias)
        self.scale = self.head_dim ** -0.5 if cfg.scale_attention else None  # T5: no scaling
        self.dropout = cfg.dropout
        # when a list: each attention's probabilities averaged over heads are appended to it,
        # (B, T, S) from `attend`, (R, S) from `attend_shared` (alignments: the decoder graph's
        # `attention` output, and the eager reference of it)
        self.record: list[Tensor] | None = None

    def split_heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def project_kv(self, x: Tensor) -> LayerKV:
        x = x.to(self.k_proj.weight.dtype)
        return self.split_heads(self.k_proj(x)), self.split_heads(self.v_proj(x))

    def query(self, x: Tensor) -> Tensor:
        """The scaled queries (B, T, inner), before the heads are split."""
        q = self.q_proj(x.to(self.q_proj.weight.dtype))
        return q if self.scale is None else q * self.scale

    def attend(self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        q = self.split_heads(self.query(x))  # (B, H, T, Dh)
        scores = (q @ k.transpose(-2, -1)).float()  # (B, H, T, S); softmax always in fp32
        if mask is not None:
            scores = scores + mask
        probs = scores.softmax(dim=-1)
        if self.record is not None:
            self.record.append(probs.mean(dim=1))
        if self.training and self.dropout:
            probs = F.dropout(probs, self.dropout)
        out = probs.to(v.dtype) @ v  # (B, H, T, Dh)
        return self.merge(out)

    def attend_shared(self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """One new position a row over keys / values held once per source: x (R, 1, D) where the
        rows of source i are rows i*g .. i*g+g-1 (a source's beams or samples); k, v (Bs, H, S, Dh)
        with R = Bs x g; mask (Bs, 1, 1, S). The g rows are g queries of one attention (CTranslate2's
        treatment of beams): the same numbers as `attend` over keys repeated g times, without the
        copies. With g = 1 the ops are exactly `attend`'s."""
        R, T, _ = x.shape
        Bs = k.shape[0]
        q = self.query(x).view(Bs, -1, self.n_heads, self.head_dim).transpose(1, 2)  # (Bs, H, g, Dh)
        scores = (q @ k.transpose(-2, -1)).float() + mask  # (Bs, H, g, S)
        probs = scores.softmax(dim=-1)
        if self.record is not None:
            self.record.append(probs.mean(dim=1).reshape(R, -1))
        out = probs.to(v.dtype) @ v  # (Bs, H, g, Dh)
        return self.out_proj(out.transpose(1, 2).reshape(R, T, self.n_heads * self.head_dim))

    def merge(self, out: Tensor) -> Tensor:
        B, _, T, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))

    def attend_cache(self, x: Tensor, cache: LayerKV, new: LayerKV, cache_mask: Tensor,
                     new_bias: Tensor | None = None) -> Tensor:
        """One new position attending over a fixed-capacity cache and itself, without joining them:
        x (B, 1, D); cache keys / values (B, H, C, Dh), of which cache_mask (B or 1, 1 or H, 1, C)
        (additive, fp32: a relative position bias included) leaves the valid positions; new keys /
        values (B, H, 1, Dh), whose score gets `new_bias` (B or 1, H, 1, 1) when given. The same
        softmax as `attend` over cat(valid cache, new), computed as two score blocks so no step
        copies the cache. Masked positions get probability exactly 0, and 0 x any finite value is 0."""
        q = self.split_heads(self.query(x))  # (B, H, 1, Dh)
        s_cache = (q @ cache[0].transpose(-2, -1)).float() + cache_mask  # (B, H, 1, C)
        s_new = (q @ new[0].transpose(-2, -1)).float()  # (B, H, 1, 1)
        if new_bias is not None:
            s_new = s_new + new_bias
        probs = torch.cat([s_cache, s_new], dim=-1).softmax(dim=-1)
        C = cache[0].shape[2]
        p_cache, p_new = probs[..., :C], probs[..., C:]
        out = p_cache.to(cache[1].dtype) @ cache[1] + p_new.to(new[1].dtype) * new[1]  # (B, H, 1, Dh)
        return self.merge(out)


class FeedForward(nn.Module):
    """fc2(act(fc1(x))), or with `ffn_gated` fc2(act(fc1(x)) * gate(x)) (T5 v1.1's gated-gelu: its
    wi_0, wi_1 and wo). The result has fc2's dtype: the residual stream's."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.ffn_bias)
        self.gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.ffn_bias) if cfg.ffn_gated else None
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.ffn_bias)
        self.act = activation_fn(cfg.activation)
        self.dropout = cfg.dropout

    def forward(self, x: Tensor) -> Tensor:
        x = x.to(self.fc1.weight.dtype)
        h = self.act(self.fc1(x))
        if self.gate is not None:
            h = h * self.gate(x)
        if self.training and self.dropout:
            h = F.dropout(h, self.dropout)
        return self.fc2(h.to(self.fc2.weight.dtype))


class LayerNorm(nn.LayerNorm):
    """LayerNorm computed in fp32 whatever the weights' dtype; the result has the input's dtype.

    In an fp32 model the casts are no-ops and trace to nothing.
    """

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight.float()
        b = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, w, b, self.eps).to(x.dtype)


class RMSNorm(nn.Module):
    """T5's layer norm: x / sqrt(mean(x^2) + eps) x weight, no mean and no bias; computed in fp32
    whatever the weights' dtype (as T5LayerNorm accumulates), the result in the input's dtype."""

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * h).to(x.dtype)


NORMS = (LayerNorm, RMSNorm)  # kept in fp32 in fp16 models (transformer.to_fp16)


def layer_norm(cfg: TransformerConfig) -> LayerNorm | RMSNorm:
    if cfg.norm_kind == "rms":
        return RMSNorm(cfg.d_model, cfg.layer_norm_eps)
    return LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.norm_bias)


class Sublayer(nn.Module):
    """Residual wrapper around f, by norm position (config.NORM_POSITIONS): post-LN
    `norm(x + f(x))`, pre-LN `x + f(norm(x))`, or pre_normed_residual `norm(x) + f(norm(x))`."""

    def __init__(self, cfg: TransformerConfig, position: str):
        super().__init__()
        self.norm = layer_norm(cfg)
        self.position = position
        self.dropout = cfg.dropout

    def forward(self, x: Tensor, f) -> Tensor:
        if self.position == "post":
            return self.norm(x + self.drop(f(x)).to(x.dtype))
        h = self.norm(x)
        return (h if self.position == "pre_normed_residual" else x) + self.drop(f(h)).to(x.dtype)

    def drop(self, y: Tensor) -> Tensor:
        return F.dropout(y, self.dropout) if self.training and self.dropout else y


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.ffn = FeedForward(cfg)
        self.attn_block, self.ffn_block = (Sublayer(cfg, pos) for pos in cfg.encoder_norms)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        def attn(h):
            k, v = self.self_attn.project_kv(h)
            return self.self_attn.attend(h, k, v, mask)
        x = self.attn_block(x, attn)
        return self.ffn_block(x, self.ffn)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.cross_attn = Attention(cfg)
        self.ffn = FeedForward(cfg)
        self.self_block, self.cross_block, self.ffn_block = (Sublayer(cfg, pos) for pos in cfg.decoder_norms)

    def forward(self, x: Tensor, past: LayerKV | None, cross: LayerKV, self_mask: Tensor | None,
                cross_mask: Tensor) -> tuple[Tensor, LayerKV]:
        present: list[LayerKV] = []

        def self_attn(h):
            k, v = self.self_attn.project_kv(h)  # (B, H, T, Dh)
            if past is not None:
                k = torch.cat([past[0], k], dim=2)  # (B, H, P + T, Dh)
                v = torch.cat([past[1], v], dim=2)
            present.append((k, v))
            return self.self_attn.attend(h, k, v, self_mask)

        cross_attn = lambda h: self.cross_attn.attend(h, cross[0], cross[1], cross_mask)  # noqa: E731
        return self.blocks(x, self_attn, cross_attn), present[0]

    def step(self, x: Tensor, cache: LayerKV, cache_mask: Tensor, cross: LayerKV,
             cross_mask: Tensor, new_bias: Tensor | None = None) -> tuple[Tensor, LayerKV]:
        """One new token a row (R, 1, D) against a fixed-capacity cache (Attention.attend_cache)
        and its source's cross keys / values, held once per source (Attention.attend_shared);
        returns the layer's output and the token's own keys and values (R, H, 1, Dh), for the
        caller to store at its position. `new_bias`: the relative position bias of the token's
        score against itself, when the model has one (`cache_mask` holds the cache's)."""
        new: list[LayerKV] = []

        def self_attn(h):
            new.append(self.self_attn.project_kv(h))
            return self.self_attn.attend_cache(h, cache, new[0], cache_mask, new_bias)

        cross_attn = lambda h: self.cross_attn.attend_shared(h, cross[0], cross[1], cross_mask)  # noqa: E731
        return self.blocks(x, self_attn, cross_attn), new[0]

    def blocks(self, x: Tensor, self_attn, cross_attn) -> Tensor:
        """The three sublayers around the self- and cross-attention functions."""
        x = self.self_block(x, self_attn)
        x = self.cross_block(x, cross_attn)
        return self.ffn_block(x, self.ffn)
