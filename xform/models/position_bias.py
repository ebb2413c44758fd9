"""T5's relative position bias: a learned (buckets, heads) table indexed by the bucket of each
key - query distance, added to the self-attention scores of every layer of a stack (positions
"relative" in the config). Cross-attention has none.

Buckets follow transformers' `T5Attention._relative_position_bucket` (Mesh TensorFlow's): half of
them exact distances, the other half logarithmically wider up to `max_distance`, beyond which all
distances share the last bucket; bidirectional stacks (the encoder) split the buckets between keys
before and after the query, causal ones (the decoder) map every key after the query to bucket 0.
The bucket of each distance in [-max_distance, max_distance] is computed once, here, with
transformers' own float32 arithmetic, and stored as an integer table: the graphs look buckets up
(a Gather at clamp(distance)) instead of recomputing a log whose last bit could round the other
way in another runtime, and distances past max_distance are the last bucket either way.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from xform.config import TransformerConfig


def relative_bucket(distance: Tensor, bidirectional: bool, buckets: int, max_distance: int) -> Tensor:
    """The bucket of each key - query distance (int64), as transformers computes it."""
    out = torch.zeros_like(distance)
    if bidirectional:
        buckets //= 2
        out = out + (distance > 0).long() * buckets
        distance = distance.abs()
    else:
        distance = -torch.min(distance, torch.zeros_like(distance))
    exact = buckets // 2
    small = distance < exact
    # clamp(min=1): log(0) is only ever taken where `small` chooses the exact bucket anyway
    large = exact + (torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact)
                     * (buckets - exact)).long()
    large = torch.min(large, torch.full_like(large, buckets - 1))
    return out + torch.where(small, distance, large)


class RelativePositionBias(nn.Module):
    """bias(queries, keys) -> (..., H, Tq, Tk) fp32 from query and key positions."""

    def __init__(self, cfg: TransformerConfig, bidirectional: bool):
        super().__init__()
        self.bidirectional = bidirectional
        self.max_distance = cfg.relative_attention_max_distance
        self.weight = nn.Parameter(torch.zeros(cfg.relative_attention_buckets, cfg.n_heads))
        nn.init.normal_(self.weight, std=0.1)
        distances = torch.arange(-self.max_distance, self.max_distance + 1)
        self.register_buffer("buckets", relative_bucket(distances, bidirectional, cfg.relative_attention_buckets,
                                                        self.max_distance), persistent=False)

    def forward(self, queries: Tensor, keys: Tensor) -> Tensor:
        """queries (..., Tq) and keys (..., Tk) int64 positions, broadcastable on the leading axes."""
        distance = keys.unsqueeze(-2) - queries.unsqueeze(-1)  # (..., Tq, Tk)
        index = distance.clamp(-self.max_distance, self.max_distance) + self.max_distance
        buckets: Tensor = self.buckets  # type: ignore[assignment]  # a buffer
        bias = self.weight.float()[buckets[index]]  # (..., Tq, Tk, H): two Gathers
        n = bias.dim()  # a permutation with non-negative axes: ONNX's Transpose takes no negative ones
        return bias.permute(*range(n - 3), n - 1, n - 3, n - 2)  # (..., H, Tq, Tk)
