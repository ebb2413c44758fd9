"""The seed tutorials' model classes, re-written with their parameter names and semantics.

Only what import depends on is kept: the names, the computation of forward and its masks, and each
tutorial's uncached greedy loop (with xform's rule that the pad id is never generated).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn


# -- seed 000: post-LN, bias-free linears, mask True where blocked (-1e9), positions not saved ------
class PE000(nn.Module):
    def __init__(self, d, max_len=512):
        super().__init__()
        pos = torch.arange(0, max_len).unsqueeze(1)
        item = 1 / 10000 ** (torch.arange(0, d, 2) / d)
        pe = torch.zeros(max_len, d)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * item), torch.cos(pos * item)
        self.register_buffer("pe", pe.unsqueeze(0), False)

    def forward(self, x):
        return x + self.pe[:, :x.shape[1], :]


def attention000(q, k, v, mask=None):
    att = torch.matmul(q, k.transpose(-2, -1)) / k.shape[-1] ** 0.5
    if mask is not None:
        att = att.masked_fill(mask, -1e9)
    return torch.matmul(torch.softmax(att, -1), v)


class MHA000(nn.Module):
    def __init__(self, heads, d):
        super().__init__()
        self.q_linear, self.k_linear, self.v_linear, self.linear = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.heads, self.d_k, self.d_model = heads, d // heads, d

    def forward(self, q, k, v, mask=None):
        q = self.q_linear(q).reshape(q.shape[0], -1, self.heads, self.d_k).transpose(1, 2)
        k = self.k_linear(k).reshape(k.shape[0], -1, self.heads, self.d_k).transpose(1, 2)
        v = self.v_linear(v).reshape(v.shape[0], -1, self.heads, self.d_k).transpose(1, 2)
        out = attention000(q, k, v, mask).transpose(1, 2).reshape(q.shape[0], -1, self.d_model)
        return self.linear(out)


class FFN000(nn.Module):
    def __init__(self, d, d_ff):
        super().__init__()
        self.ffn = nn.Sequential(nn.Linear(d, d_ff, bias=False), nn.ReLU(), nn.Linear(d_ff, d, bias=False))

    def forward(self, x):
        return self.ffn(x)


class EncLayer000(nn.Module):
    def __init__(self, heads, d, d_ff):
        super().__init__()
        self.self_multi_head_att, self.ffn = MHA000(heads, d), FFN000(d, d_ff)
        self.norms = nn.ModuleList([nn.LayerNorm(d) for _ in range(2)])

    def forward(self, x, mask=None):
        a = self.norms[0](x + self.self_multi_head_att(x, x, x, mask))
        return self.norms[1](a + self.ffn(a))


class DecLayer000(nn.Module):
    def __init__(self, heads, d, d_ff):
        super().__init__()
        self.masked_att, self.att, self.ffn = MHA000(heads, d), MHA000(heads, d), FFN000(d, d_ff)
        self.norms = nn.ModuleList([nn.LayerNorm(d) for _ in range(3)])

    def forward(self, x, kv, dst_mask=None, src_dst_mask=None):
        m = self.norms[0](x + self.masked_att(x, x, x, dst_mask))
        a = self.norms[1](m + self.att(m, kv, kv, src_dst_mask))
        return self.norms[2](a + self.ffn(a))


class Coder000(nn.Module):
    def __init__(self, vocab, pad, d, n, heads, d_ff, layer, name):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d, pad)
        self.position_encode = PE000(d)
        setattr(self, name, nn.ModuleList([layer(heads, d, d_ff) for _ in range(n)]))
        self.name = name

    def forward(self, x, *args):
        x = self.position_encode(self.embedding(x))
        for layer in getattr(self, self.name):
            x = layer(x, *args)
        return x


class Transformer000(nn.Module):
    def __init__(self, enc_vocab, dec_vocab, pad_idx, d, n, heads, d_ff):
        super().__init__()
        self.encoder = Coder000(enc_vocab, pad_idx, d, n, heads, d_ff, EncLayer000, "encode_layers")
        self.decoder = Coder000(dec_vocab, pad_idx, d, n, heads, d_ff, DecLayer000, "decoder_layes")
        self.linear = nn.Linear(d, dec_vocab)
        self.pad_idx = pad_idx

    def generate_mask(self, query, key, is_triu_mask=False):
        b, sq = query.shape
        mask = (key == self.pad_idx).unsqueeze(1).unsqueeze(2).expand(b, 1, sq, key.shape[1])
        if is_triu_mask:
            mask = mask | torch.triu(torch.ones(sq, key.shape[1], dtype=torch.bool), 1)[None, None]
        return mask

    def forward(self, src, dst):
        enc = self.encoder(src, self.generate_mask(src, src))
        dec = self.decoder(dst, enc, self.generate_mask(dst, dst, True), self.generate_mask(dst, src))
        return self.linear(dec)


# -- seed 001: pre-LN, GELU, hand-written LayerNorm eps 1e-10, mask==0 blocked (-inf) ------------------
class Embedding001(nn.Module):
    def __init__(self, vocab, d):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d)

    def forward(self, x):
        return self.embedding(x)


class PE001(nn.Module):
    def __init__(self, d, max_len=5000):
        super().__init__()
        pe = torch.zeros(max_len, d)
        position = torch.arange(0, max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d, 2).float() * (torch.log(torch.tensor(10000.0))) / d).unsqueeze(0)
        pe[:, ::2], pe[:, 1::2] = torch.sin(position * div_term), torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x):
        return x + self.pe[:, :x.size(1), :]


class MHA001(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.key, self.query, self.value, self.proj = (nn.Linear(d, d) for _ in range(4))
        self.d_model, self.num_heads, self.head_dim = d, heads, d // heads
        self.scale = torch.sqrt(torch.tensor(self.head_dim))

    def forward(self, query, key, value, mask=None):
        b, s, _ = query.shape
        t = value.shape[1]
        Q = self.query(query).view(b, s, self.num_heads, self.head_dim).permute(0, 2, 1, 3)
        K = self.key(key).view(b, t, self.num_heads, self.head_dim).permute(0, 2, 1, 3)
        V = self.value(value).view(b, t, self.num_heads, self.head_dim).permute(0, 2, 1, 3)
        scores = torch.matmul(Q, K.transpose(-2, -1)) / self.scale
        if mask is not None:
            scores = scores.masked_fill(mask == 0, float("-inf"))
        ctx = torch.matmul(torch.softmax(scores, dim=-1), V)
        return self.proj(ctx.permute(0, 2, 1, 3).contiguous().view(b, s, self.d_model))


class LayerNorm001(nn.Module):
    def __init__(self, d, eps=1e-10):
        super().__init__()
        self.gamma, self.beta, self.eps = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d)), eps

    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return self.gamma * (x - mean) / torch.sqrt(var + self.eps) + self.beta


class Residual001(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = LayerNorm001(d)

    def forward(self, x, sublayer):
        return x + sublayer(self.norm(x))


class FFN001(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class EncLayer001(nn.Module):
    def __init__(self, d, heads, hidden):
        super().__init__()
        self.self_attention, self.feed_forward = MHA001(d, heads), FFN001(d, hidden)
        self.residual1, self.residual2 = Residual001(d), Residual001(d)

    def forward(self, x, mask=None):
        x = self.residual1(x, lambda x: self.self_attention(x, x, x, mask))
        return self.residual2(x, self.feed_forward)


class DecLayer001(nn.Module):
    def __init__(self, d, heads, hidden):
        super().__init__()
        self.self_attention, self.cross_attention = MHA001(d, heads), MHA001(d, heads)
        self.feed_forward = FFN001(d, hidden)
        self.residual1, self.residual2, self.residual3 = Residual001(d), Residual001(d), Residual001(d)

    def forward(self, x, enc, src_mask=None, tgt_mask=None):
        x = self.residual1(x, lambda x: self.self_attention(x, x, x, tgt_mask))
        x = self.residual2(x, lambda x: self.cross_attention(x, enc, enc, src_mask))
        return self.residual3(x, self.feed_forward)


class Coder001(nn.Module):
    def __init__(self, vocab, d, heads, hidden, n, layer):
        super().__init__()
        self.embedding = Embedding001(vocab, d)
        self.positional_encoding = PE001(d)
        self.layers = nn.ModuleList([layer(d, heads, hidden) for _ in range(n)])
        self.norm = LayerNorm001(d)  # defined, never applied (as in the tutorial)

    def forward(self, x, *args):
        x = self.positional_encoding(self.embedding(x))
        for layer in self.layers:
            x = layer(x, *args)
        return x


class Transformer001(nn.Module):
    def __init__(self, src_vocab, tgt_vocab, d, heads, hidden, n):
        super().__init__()
        self.encoder = Coder001(src_vocab, d, heads, hidden, n, EncLayer001)
        self.decoder = Coder001(tgt_vocab, d, heads, hidden, n, DecLayer001)
        self.output_projection = nn.Linear(d, tgt_vocab)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        return self.output_projection(self.decoder(tgt, self.encoder(src, src_mask), src_mask, tgt_mask))


# -- seed 002: post-LN, ReLU, sqrt(d_model) scaling, mask==0 blocked (-1e9), pad 0 ------------------------
class PE002(nn.Module):
    def __init__(self, d, max_len=5000):
        super().__init__()
        pe = torch.zeros(max_len, d)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d, 2).float() * (-math.log(10000.0) / d))
        pe[:, 0::2], pe[:, 1::2] = torch.sin(position * div_term), torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x):
        return x + self.pe[:, :x.size(1), :]


class MHA002(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.d_model, self.num_heads, self.d_k = d, heads, d // heads
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d, d) for _ in range(4))

    def split(self, x):
        b, s, _ = x.size()
        return x.view(b, s, self.num_heads, self.d_k).transpose(1, 2)

    def forward(self, Q, K, V, mask=None):
        Q, K, V = self.split(self.W_q(Q)), self.split(self.W_k(K)), self.split(self.W_v(V))
        scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)
        out = torch.matmul(torch.softmax(scores, dim=-1), V)
        b, _, s, _ = out.size()
        return self.W_o(out.transpose(1, 2).contiguous().view(b, s, self.d_model))


class FFN002(nn.Module):
    def __init__(self, d, d_ff):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, d_ff), nn.Linear(d_ff, d)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class EncLayer002(nn.Module):
    def __init__(self, d, heads, d_ff):
        super().__init__()
        self.self_attn, self.feed_forward = MHA002(d, heads), FFN002(d, d_ff)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, x, mask=None):
        x = self.norm1(x + self.self_attn(x, x, x, mask))
        return self.norm2(x + self.feed_forward(x))


class DecLayer002(nn.Module):
    def __init__(self, d, heads, d_ff):
        super().__init__()
        self.self_attn, self.cross_attn, self.feed_forward = MHA002(d, heads), MHA002(d, heads), FFN002(d, d_ff)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, x, enc, src_mask=None, tgt_mask=None):
        x = self.norm1(x + self.self_attn(x, x, x, tgt_mask))
        x = self.norm2(x + self.cross_attn(x, enc, enc, src_mask))
        return self.norm3(x + self.feed_forward(x))


class Transformer002(nn.Module):
    def __init__(self, src_vocab, tgt_vocab, d, heads, n_enc, n_dec, d_ff, max_seq_len=5000):
        super().__init__()
        self.encoder_embedding, self.decoder_embedding = nn.Embedding(src_vocab, d), nn.Embedding(tgt_vocab, d)
        self.pos_encoding = PE002(d, max_seq_len)
        self.encoder_layers = nn.ModuleList([EncLayer002(d, heads, d_ff) for _ in range(n_enc)])
        self.decoder_layers = nn.ModuleList([DecLayer002(d, heads, d_ff) for _ in range(n_dec)])
        self.fc_out = nn.Linear(d, tgt_vocab)
        self.d_model = d

    def generate_mask(self, src, tgt):
        src_mask = (src != 0).unsqueeze(1).unsqueeze(2)
        tgt_mask = (tgt != 0).unsqueeze(1).unsqueeze(3)
        nopeak = (1 - torch.triu(torch.ones(1, tgt.size(1), tgt.size(1)), diagonal=1)).bool()
        return src_mask, tgt_mask & nopeak

    def forward(self, src, tgt):
        src_mask, tgt_mask = self.generate_mask(src, tgt)
        enc = self.pos_encoding(self.encoder_embedding(src) * math.sqrt(self.d_model))
        for layer in self.encoder_layers:
            enc = layer(enc, src_mask)
        dec = self.pos_encoding(self.decoder_embedding(tgt) * math.sqrt(self.d_model))
        for layer in self.decoder_layers:
            dec = layer(dec, enc, src_mask, tgt_mask)
        return self.fc_out(dec)


def forward_any(model, src, tgt):
    """One full (uncached) forward of any of the three on a single unpadded source row."""
    if isinstance(model, Transformer001):
        T = tgt.shape[1]
        return model(src, tgt, None, torch.tril(torch.ones(T, T))[None, None])
    return model(src, tgt)


@torch.no_grad()
def tutorial_greedy(model, src_row, bos, eos, pad, max_new):
    """The tutorials' greedy loop (seed 002's translate): re-run everything each step, argmax,
    stop at eos; plus xform's rule that the pad id is never generated. Returns ids and logits."""
    src = torch.tensor([src_row])
    tgt, logits = [bos], []
    for _ in range(max_new):
        out = forward_any(model, src, torch.tensor([tgt]))[0, -1]
        logits.append(out)
        out = out.clone()
        out[pad] = float("-inf")
        tgt.append(int(out.argmax()))
        if tgt[-1] == eos:
            break
    return tgt[1:], torch.stack(logits)
