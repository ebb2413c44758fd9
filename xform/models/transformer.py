"""Seq2SeqTransformer: the model, its two export seams (`encode`, `decode`) and the greedy oracle.

`encode` is exactly the encoder graph: source ids and lengths in, the cross-attention K/V of every
decoder layer and the additive source mask out. `decode_step` is exactly the decoder graph: one
token a row, a fixed-capacity self-attention cache and its valid length, the cross K/V and the
mask in; logits and the token's own K/V out. `decode` is the general form (any number of new
tokens, the past as a growing list): training, the eager backend and the reference for the step.
`greedy_decode` re-runs the decoder over the whole prefix every step, without a cache; it is the
oracle everything else is compared with.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor, nn

from xform.config import TransformerConfig
from xform.models.layers import MASK_VALUE, NORMS, DecoderLayer, EncoderLayer, LayerKV, Positions, layer_norm
from xform.models.position_bias import RelativePositionBias


@dataclass
class EncoderOutput:
    cross_kv: list[LayerKV]  # per decoder layer: keys and values, each (B, H, S, Dh)
    src_mask: Tensor  # (B, S) additive: 0 where a real token, MASK_VALUE where padding


class Seq2SeqTransformer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.src_embed = nn.Embedding(cfg.src_vocab_size, d)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else nn.Embedding(cfg.tgt_vocab_size, d)
        relative = cfg.positions == "relative"
        # position vectors added to the embeddings, or (relative) a bias added to self-attention scores
        self.src_pos = None if relative else Positions(cfg)
        self.tgt_pos = None if relative else Positions(cfg)
        self.src_bias = RelativePositionBias(cfg, bidirectional=True) if relative else None
        self.tgt_bias = RelativePositionBias(cfg, bidirectional=False) if relative else None
        self.src_embed_norm = layer_norm(cfg) if cfg.embedding_norm else None
        self.tgt_embed_norm = layer_norm(cfg) if cfg.embedding_norm else None
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        # DecoderLayers, though nn.ModuleList types its items as Module: read through cast(DecoderLayer, ...)
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        self.encoder_norm = layer_norm(cfg) if cfg.final_norm else None
        self.decoder_norm = layer_norm(cfg) if cfg.final_norm else None
        self.lm_head = nn.Linear(d, cfg.tgt_vocab_size, bias=False)
        if cfg.tie_output:
            self.lm_head.weight = self.tgt_embed.weight
        self.output_bias = nn.Parameter(torch.zeros(cfg.tgt_vocab_size)) if cfg.output_bias else None
        self.embed_scale = d ** 0.5 if cfg.scale_embedding else 1.0
        self.output_scale = d ** -0.5 if cfg.scale_output else None  # T5's tied output
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for name, p in self.named_parameters():
            if name.split(".")[0] in ("src_embed", "tgt_embed"):
                nn.init.normal_(p, std=self.cfg.d_model ** -0.5)
            elif p.dim() > 1 and name.split(".")[0] not in ("src_bias", "tgt_bias"):
                nn.init.xavier_uniform_(p)
        self.eval()

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype of the layers' weights and the K/V."""
        return cast(DecoderLayer, self.decoder_layers[0]).ffn.fc1.weight.dtype

    @property
    def residual_dtype(self) -> torch.dtype:
        """The dtype of the residual stream: the feed-forward output projection's (fp32 in an fp16
        model with `fp32_ffn_output`, the compute dtype otherwise)."""
        return cast(DecoderLayer, self.decoder_layers[0]).ffn.fc2.weight.dtype

    def embed(self, table: nn.Embedding, pos: Positions | None, ids: Tensor, offset: Tensor | int,
              norm: nn.Module | None) -> Tensor:
        dt = self.residual_dtype  # a table kept in fp32 for the output projection is cast here
        x = table(ids).to(dt) * self.embed_scale  # (B, T, D)
        if pos is not None:
            x = x + pos(offset, ids.shape[1]).to(dt)
        if norm is not None:
            x = norm(x)
        if self.training and self.cfg.dropout:
            x = nn.functional.dropout(x, self.cfg.dropout)
        return x

    def encode(self, src_ids: Tensor, src_lengths: Tensor) -> EncoderOutput:
        """src_ids (B, S) int64 right-padded; src_lengths (B,) int64."""
        S = src_ids.shape[1]
        valid = torch.arange(S, device=src_ids.device).unsqueeze(0) < src_lengths.unsqueeze(1)  # (B, S)
        src_mask = torch.where(valid, 0.0, MASK_VALUE).to(torch.float32)  # (B, S)
        attn_mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        if self.src_bias is not None:
            at = torch.arange(S, device=src_ids.device)
            attn_mask = attn_mask + self.src_bias(at, at).unsqueeze(0)  # (B, H, S, S)
        x = self.embed(self.src_embed, self.src_pos, src_ids, 0, self.src_embed_norm)
        for layer in self.encoder_layers:
            x = layer(x, attn_mask)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        cross_kv = [cast(DecoderLayer, layer).cross_attn.project_kv(x) for layer in self.decoder_layers]
        return EncoderOutput(cross_kv, src_mask)

    def decode(self, tokens: Tensor, enc: EncoderOutput, past: list[LayerKV] | None = None,
               beam_idx: Tensor | None = None) -> tuple[Tensor, list[LayerKV]]:
        """tokens (B, T) at positions [P, P + T) where P is the past length.

        beam_idx (B,) int64, when given: row b continues the past of row beam_idx[b] (beam search
        reorders the cache here, on the device, in the same graph).
        Returns logits (B, T, V) in fp32 and the present K/V, each (B, H, P + T, Dh).
        """
        if past is not None and beam_idx is not None:
            past = reorder_cache(past, beam_idx)
        T = tokens.shape[1]
        past_len = past[0][0].shape[2] if past is not None else 0
        x = self.embed(self.tgt_embed, self.tgt_pos, tokens, past_len, self.tgt_embed_norm)
        self_mask: Tensor | None = None
        queries = torch.arange(T, device=tokens.device) + past_len
        keys = torch.arange(past_len + T, device=tokens.device)
        if T > 1:  # causal within the new tokens; a single new token sees the whole past
            self_mask = torch.where(keys[None] <= queries[:, None], 0.0, MASK_VALUE).to(torch.float32)  # (T, P + T)
        if self.tgt_bias is not None:
            bias = self.tgt_bias(queries, keys).unsqueeze(0)  # (1, H, T, P + T)
            self_mask = bias if self_mask is None else bias + self_mask
        cross_mask = enc.src_mask[:, None, None, :]  # (B, 1, 1, S), fp32: added to fp32 scores
        present: list[LayerKV] = []
        for i, layer in enumerate(self.decoder_layers):
            x, kv = layer(x, None if past is None else past[i], enc.cross_kv[i], self_mask, cross_mask)
            present.append(kv)
        return self.project(x), present

    def decode_step(self, tokens: Tensor, enc: EncoderOutput, cache: list[LayerKV], positions: Tensor
                    ) -> tuple[Tensor, list[LayerKV]]:
        """One token a row against a fixed-capacity cache: the decoder graph.

        tokens (R, 1), row r at position positions[r]; positions (R,) int64; cache per layer: keys
        and values (R, H, C, Dh) whose first positions[r] positions of row r hold its past (the
        rest is masked, whatever it holds); `enc` holds one row per source (Bs of them, R = Bs x g:
        the rows of source i are rows i*g .. i*g+g-1, its beams or samples). Returns logits (R, V)
        in fp32 and per layer the new token's keys and values (R, H, 1, Dh), which the caller
        stores at each row's position. The same numbers as `decode` with the past as a list and
        the encoding repeated g times, row by row (tests/models/test_transformer.py).
        """
        x, new = self.step_hidden(tokens, enc, cache, positions)
        return self.project(x)[:, 0], new

    def step_hidden(self, tokens: Tensor, enc: EncoderOutput, cache: list[LayerKV], positions: Tensor
                    ) -> tuple[Tensor, list[LayerKV]]:
        """decode_step's decoder layers: the last layer's output (R, 1, D), before the final norm
        and the output projection, and the new keys / values."""
        dt = self.residual_dtype
        x = self.tgt_embed(tokens).to(dt) * self.embed_scale
        if self.tgt_pos is not None:
            x = x + self.tgt_pos.weight.index_select(0, positions).unsqueeze(1).to(dt)  # (R, 1, D): a Gather
        if self.tgt_embed_norm is not None:
            x = self.tgt_embed_norm(x)
        C = cache[0][0].shape[2]
        at = torch.arange(C, device=tokens.device)
        valid = at.unsqueeze(0) < positions.unsqueeze(1)  # (R, C)
        cache_mask = torch.where(valid, 0.0, MASK_VALUE).to(torch.float32)[:, None, None, :]  # (R, 1, 1, C)
        new_bias = None
        if self.tgt_bias is not None:  # each row's bias from its own position
            query = positions.unsqueeze(1)  # (R, 1)
            cache_mask = cache_mask + self.tgt_bias(query, at.unsqueeze(0))  # (R, H, 1, C)
            new_bias = self.tgt_bias(query, query)  # (R, H, 1, 1)
        cross_mask = enc.src_mask[:, None, None, :]
        new: list[LayerKV] = []
        for i, layer in enumerate(self.decoder_layers):
            x, kv = cast(DecoderLayer, layer).step(x, cache[i], cache_mask, enc.cross_kv[i], cross_mask, new_bias)
            new.append(kv)
        return x, new

    def decode_step_restricted(self, tokens: Tensor, enc: EncoderOutput, cache: list[LayerKV], positions: Tensor,
                               out_weight: Tensor, out_bias: Tensor) -> tuple[Tensor, list[LayerKV]]:
        """`decode_step` with the output projection over given rows of the table only: logits
        (R, V') = final norm (hidden) @ out_weight (V', D)^T + out_bias (V',), in fp32 (the
        restricted decoder graph, vocabulary restriction)."""
        x, new = self.step_hidden(tokens, enc, cache, positions)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        if self.output_scale is not None:
            x = x * self.output_scale
        return nn.functional.linear(x[:, 0].float(), out_weight, out_bias), new

    def output_table(self) -> tuple[Tensor, Tensor]:
        """The output projection's weight (V, D) and bias (V,), fp32 (zeros without a bias)."""
        w = self.lm_head.weight.detach().float()
        bias = self.output_bias if self.output_bias is not None else w.new_zeros(w.shape[0])
        return w, bias.detach().float()

    def project(self, x: Tensor) -> Tensor:
        """The final decoder norm and the output projection: (B, T, D) -> logits (B, T, V) in fp32."""
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        if self.output_scale is not None:  # T5 scales the output of its tied projection
            x = x * self.output_scale
        # 2-D so the export is Gemm(transB=1) reading the embedding table itself: a tied table is
        # stored once in the graph (a 3-D matmul makes constant folding store a transposed copy).
        # The output projection is in fp32 at every precision: logits accumulate in fp32.
        # Without a bias of its own a zero one keeps it Gemm: a bias-less linear exports as MatMul
        # over a transposed copy of the table (1 GB more for NLLB-200's 256k x 1024).
        B, T, D = x.shape
        w = self.lm_head.weight
        bias = self.output_bias if self.output_bias is not None else w.new_zeros(w.shape[0], dtype=torch.float32)
        logits = nn.functional.linear(x.reshape(B * T, D).to(w.dtype), w, bias.to(w.dtype))
        return logits.view(B, T, -1).float()

    def forward(self, src_ids: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> Tensor:
        """Training forward, teacher-forced: logits (B, T, V) for every target position."""
        return self.decode(tgt_in, self.encode(src_ids, src_lengths))[0]

    def suppress(self, logits: Tensor, n_generated: Tensor | int, min_new_tokens: Tensor | int) -> Tensor:
        """The logits greedy picks from: the pad id and banned ids never, end-of-sentence not before
        min_new_tokens."""
        return logits.masked_fill(self.blocked_ids(n_generated, min_new_tokens, logits.device), float("-inf"))

    def blocked_ids(self, n_generated: Tensor | int, min_new_tokens: Tensor | int, device=None) -> Tensor:
        """(V,) bool: the ids `suppress` removes at this step; (R, V) when n_generated and
        min_new_tokens are per row (R,) (the graphs, whose rows have their own positions)."""
        ids = torch.arange(self.cfg.tgt_vocab_size, device=device)
        never = self.cfg.never_generated  # the pad id at least
        blocked = ids == never[0]
        for v in never[1:]:
            blocked = blocked | (ids == v)
        early = torch.as_tensor(n_generated) < torch.as_tensor(min_new_tokens)
        return blocked | ((ids == self.cfg.eos_id) & early[..., None])


def reorder_cache(past: list[LayerKV], beam_idx: Tensor) -> list[LayerKV]:
    """Row b of the result is row beam_idx[b] of `past`: a Gather on the batch axis."""
    return [(k.index_select(0, beam_idx), v.index_select(0, beam_idx)) for k, v in past]  # (B, H, P, Dh)


def to_fp16(model: Seq2SeqTransformer) -> Seq2SeqTransformer:
    """A copy for the fp16 graphs (docs/quality.md "Tolerances"): weights and matmuls in fp16; LayerNorm and
    softmax run in fp32 (the modules cast); the output projection (and so a tied embedding
    table, stored once) and the output bias stay fp32, so logits accumulate in fp32. With the
    config's `fp32_ffn_output` (T5) the feed-forward output projections stay fp32 too, and with them
    the residual stream (docs/design.md, "T5 in fp16"); a relative position bias table stays fp32."""
    import copy

    half = copy.deepcopy(model).half()
    half.lm_head.weight.data = model.lm_head.weight.detach().clone().float()
    if model.output_bias is not None:
        assert half.output_bias is not None  # a copy of `model`
        half.output_bias.data = model.output_bias.detach().clone().float()
    for module in half.modules():  # norm and position bias parameters are tiny: keep them exact
        if isinstance(module, (*NORMS, RelativePositionBias)):
            module.float()
    if model.cfg.fp32_ffn_output:  # from the fp32 weights: a value past fp16's range must not become inf
        for layer, source in zip((*half.encoder_layers, *half.decoder_layers),
                                 (*model.encoder_layers, *model.decoder_layers)):
            cast(EncoderLayer, layer).ffn.fc2.float().load_state_dict(cast(EncoderLayer, source).ffn.fc2.state_dict())
    return half.eval()


@torch.no_grad()
def greedy_decode(model: Seq2SeqTransformer, src_ids: Tensor, src_lengths: Tensor,
                  max_new_tokens: int, min_new_tokens: int = 0) -> Tensor:
    """The uncached oracle: (B, n) generated ids, pad after each row's end-of-sentence."""
    cfg = model.cfg
    enc = model.encode(src_ids, src_lengths)
    ys = torch.full((src_ids.shape[0], 1), cfg.start_id, dtype=torch.long)
    done = torch.zeros(src_ids.shape[0], dtype=torch.bool)
    for step in range(max_new_tokens):
        logits = model.decode(ys, enc)[0][:, -1]  # whole prefix again, no past
        nxt = model.suppress(logits, step, min_new_tokens).argmax(-1)
        nxt = torch.where(done, cfg.pad_id, nxt)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done |= nxt == cfg.eos_id
        if done.all():
            break
    return ys[:, 1:]


@torch.no_grad()
@contextlib.contextmanager
def recording(model: Seq2SeqTransformer, layer: int | None):
    """Within it, decoder layer `layer`'s cross-attention probabilities averaged over heads are
    appended to the yielded list, one tensor a call (the decoder graph's `attention` output, and
    the eager reference of it); nothing when `layer` is None."""
    if layer is None:
        yield []
        return
    attn = cast(DecoderLayer, model.decoder_layers[layer]).cross_attn
    attn.record = []
    try:
        yield attn.record
    finally:
        attn.record = None
