"""Tiny configs with distinct sizes (a swapped axis fails), one per seed tutorial variant.

vocab 37 / 41, d_model 48, 3 heads (head_dim 16), d_ff 72, 2 encoder and 3 decoder layers.
"""
from xform.config import TransformerConfig

TINY = dict(src_vocab_size=37, tgt_vocab_size=41, d_model=48, n_heads=3, d_ff=72,
            n_encoder_layers=2, n_decoder_layers=3, max_len=40)

VARIANTS = {
    # 000: post-LN, bias-free attention and FFN linears, ReLU, output linear with bias, no scaling
    "seed-000": dict(norm_position="post", attn_bias=False, ffn_bias=False, activation="relu",
                     output_bias=True, tie_output=False, scale_embedding=False),
    # 001: pre-LN (its final LayerNorm is defined but never applied), GELU, eps 1e-10, pad id 1
    "seed-001": dict(norm_position="pre", final_norm=False, activation="gelu", layer_norm_eps=1e-10,
                     pad_id=1, bos_id=2, eos_id=3, tie_output=False),
    # 002: post-LN, ReLU, biases, embeddings scaled by sqrt(d_model)
    "seed-002": dict(norm_position="post", activation="relu", scale_embedding=True, tie_output=False),
    # 003: d2l: AddNorm (post-LN), bias-free attention 3 x 12 = 36 wide (not d_model), scaled
    # embeddings, output dense with bias
    "seed-003": dict(norm_position="post", attn_bias=False, scale_embedding=True, output_bias=True,
                     tie_output=False, attention_head_dim=12),
    # 004: nanoGPT style: encoder blocks `x = ln(x); x = x + attn(x); x = x + mlp(ln(x))`, decoder
    # blocks `x = ln(x); x = x + f(x)` throughout, final norms, LayerNorm without bias, bias-free
    # linears, shared source/target embedding, lm_head without bias
    "seed-004": dict(encoder_norm_positions=("pre_normed_residual", "pre"),
                     decoder_norm_positions=("pre_normed_residual",) * 3, final_norm=True, norm_bias=False,
                     attn_bias=False, ffn_bias=False, share_embeddings=True, tgt_vocab_size=37, tie_output=False),
    # PyTorch's nn.Transformer tutorial: post-LN layers and nn.Transformer's final norms, scaled embeddings
    "torch-nn": dict(norm_position="post", final_norm=True, scale_embedding=True, output_bias=True,
                     tie_output=False, pad_id=1, bos_id=2, eos_id=3),
    # Marian-like: SiLU, split sinusoids, shared + tied embeddings, final logits bias, start = pad,
    # a banned id
    "marian": dict(activation="silu", positions="sinusoidal_split", share_embeddings=True,
                   tgt_vocab_size=37, tie_output=True, output_bias=True, scale_embedding=True,
                   decoder_start_id=0, banned_ids=(5,)),
    # learned positions, GELU (tanh), pre-LN without a final norm
    "learned-pre": dict(positions="learned", activation="gelu_tanh", norm_position="pre", final_norm=False),
}


def variant_config(name: str, **overrides) -> TransformerConfig:
    return TransformerConfig(**{**TINY, **VARIANTS[name], **overrides})
