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


# -- seed 003: the d2l-style notebook --------------------------------------------------------------
# Its names and structure: W_q / W_k / W_v / W_o of width query_size * num_heads (bias=False),
# AddNorm (dropout(Y) + X, then LayerNorm), PositionWiseFFN dense1 / ReLU / dense2, blocks in an
# nn.Sequential named block0, block1, ..., embeddings scaled by sqrt(embedding_size), the float32
# position table P (an attribute, not saved). Where the notebook cannot run as written, d2l's book
# code it follows is taken: MultiHeadAttention.forward(queries, keys, values, valid_lens) with a
# masked softmax over the keys (the notebook's softmax has no dim, which PyTorch applies over the
# batch*heads axis, and it never applies valid_lens); the decoder stack with its output `dense`.
# Its DecoderBlock keeps earlier steps' inputs as keys / values (state[2]); a whole prefix at once is
# masked causally with valid lengths 1..T, as in d2l's training.
def transpose_qkv(X, num_heads):
    X = X.reshape(X.shape[0], X.shape[1], num_heads, -1).permute(0, 2, 1, 3)
    return X.reshape(-1, X.shape[2], X.shape[3])


def transpose_output(X, num_heads):
    X = X.reshape(-1, num_heads, X.shape[1], X.shape[2]).permute(0, 2, 1, 3)
    return X.reshape(X.shape[0], X.shape[1], -1)


def masked_softmax(X, valid_lens):
    """d2l: keys at or beyond each valid length get -1e6 before the softmax over the last axis."""
    if valid_lens is None:
        return F.softmax(X, dim=-1)
    shape = X.shape
    valid_lens = torch.repeat_interleave(valid_lens, shape[1]) if valid_lens.dim() == 1 else valid_lens.reshape(-1)
    X = X.reshape(-1, shape[-1])
    X = X.masked_fill(torch.arange(shape[-1])[None, :] >= valid_lens[:, None], -1e6)
    return F.softmax(X.reshape(shape), dim=-1)


class MultiHeadAttention003(nn.Module):
    def __init__(self, embedding_size, query_size, key_size, value_size, output_size, num_heads, bias=False):
        super().__init__()
        self.key_size, self.num_heads = key_size, num_heads
        self.W_q = nn.Linear(embedding_size, query_size * num_heads, bias=bias)
        self.W_k = nn.Linear(embedding_size, key_size * num_heads, bias=bias)
        self.W_v = nn.Linear(embedding_size, value_size * num_heads, bias=bias)
        self.W_o = nn.Linear(value_size * num_heads, output_size, bias=bias)

    def forward(self, queries, keys, values, valid_lens):
        q, k, v = (transpose_qkv(w(x), self.num_heads) for w, x in ((self.W_q, queries), (self.W_k, keys), (self.W_v, values)))
        if valid_lens is not None:
            valid_lens = torch.repeat_interleave(valid_lens, repeats=self.num_heads, dim=0)
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(self.key_size)
        return self.W_o(transpose_output(torch.bmm(masked_softmax(scores, valid_lens), v), self.num_heads))


class AddNorm(nn.Module):
    def __init__(self, normalized_shape, dropout=0.0):
        super().__init__()
        self.dropout, self.ln = nn.Dropout(dropout), nn.LayerNorm(normalized_shape)

    def forward(self, X, Y):
        return self.ln(self.dropout(Y) + X)


class PositionWiseFFN(nn.Module):
    def __init__(self, ffn_num_input, ffn_num_hiddens, ffn_num_outputs):
        super().__init__()
        self.dense1, self.relu, self.dense2 = nn.Linear(ffn_num_input, ffn_num_hiddens), nn.ReLU(), nn.Linear(ffn_num_hiddens, ffn_num_outputs)

    def forward(self, X):
        return self.dense2(self.relu(self.dense1(X)))


class PositionalEncoding003(nn.Module):
    def __init__(self, embedding_size, dropout=0.0, max_len=1000):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.P = torch.zeros((1, max_len, embedding_size))  # an attribute: not in the state dict
        numerator = torch.arange(max_len, dtype=torch.float32).reshape(-1, 1)
        denominator = torch.pow(10000, torch.arange(0, embedding_size, 2, dtype=torch.float32) / embedding_size)
        self.P[:, :, 0::2] = torch.sin(numerator / denominator)
        self.P[:, :, 1::2] = torch.cos(numerator / denominator)

    def forward(self, X, offset=0):
        return self.dropout(X + self.P[:, offset:offset + X.shape[1], :])


class EncoderBlock(nn.Module):
    def __init__(self, d, query_size, num_heads, ffn_num_hiddens, use_bias=False):
        super().__init__()
        self.attention = MultiHeadAttention003(d, query_size, query_size, query_size, d, num_heads, use_bias)
        self.addnorm1, self.ffn, self.addnorm2 = AddNorm([d]), PositionWiseFFN(d, ffn_num_hiddens, d), AddNorm([d])

    def forward(self, X, valid_lens):
        Y = self.addnorm1(X, self.attention(X, X, X, valid_lens))
        return self.addnorm2(Y, self.ffn(Y))


class DecoderBlock(nn.Module):
    def __init__(self, d, query_size, num_heads, ffn_num_hiddens, i):
        super().__init__()
        self.i = i
        self.attention1 = MultiHeadAttention003(d, query_size, query_size, query_size, d, num_heads)
        self.addnorm1 = AddNorm([d])
        self.attention2 = MultiHeadAttention003(d, query_size, query_size, query_size, d, num_heads)
        self.addnorm2, self.ffn, self.addnorm3 = AddNorm([d]), PositionWiseFFN(d, ffn_num_hiddens, d), AddNorm([d])

    def forward(self, X, state):
        enc_outputs, enc_valid_lens = state[0], state[1]
        whole_prefix = state[2][self.i] is None
        key_values = X if whole_prefix else torch.cat((state[2][self.i], X), dim=1)
        state[2][self.i] = key_values
        B, T, _ = X.shape
        dec_valid_lens = torch.arange(1, T + 1).repeat(B, 1) if whole_prefix else None
        Y = self.addnorm1(X, self.attention1(X, key_values, key_values, dec_valid_lens))
        Z = self.addnorm2(Y, self.attention2(Y, enc_outputs, enc_outputs, enc_valid_lens))
        return self.addnorm3(Z, self.ffn(Z)), state


class Coder003(nn.Module):
    def __init__(self, vocab, d, query_size, heads, ffn_hiddens, n, block):
        super().__init__()
        self.embedding_size = d
        self.embedding, self.pos_encoding = nn.Embedding(vocab, d), PositionalEncoding003(d)
        self.blks = nn.Sequential()
        for i in range(n):
            self.blks.add_module("block" + str(i), block(d, query_size, heads, ffn_hiddens, *([i] if block is DecoderBlock else [])))

    def embed(self, X, offset=0):
        return self.pos_encoding(self.embedding(X) * math.sqrt(self.embedding_size), offset)


class Transformer003(nn.Module):
    """d2l's EncoderDecoder of the notebook's TransformerEncoder and a decoder of its DecoderBlocks."""

    def __init__(self, src_vocab, tgt_vocab, d, query_size, heads, ffn_hiddens, n_enc, n_dec):
        super().__init__()
        self.encoder = Coder003(src_vocab, d, query_size, heads, ffn_hiddens, n_enc, EncoderBlock)
        self.decoder = Coder003(tgt_vocab, d, query_size, heads, ffn_hiddens, n_dec, DecoderBlock)
        self.decoder.dense = nn.Linear(d, tgt_vocab)

    def forward(self, src, tgt, src_valid_lens=None):
        X = self.encoder.embed(src)
        for blk in self.encoder.blks:
            X = blk(X, src_valid_lens)
        state = [X, src_valid_lens, [None] * len(self.decoder.blks)]
        Y = self.decoder.embed(tgt)
        for blk in self.decoder.blks:
            Y, state = blk(Y, state)
        return self.decoder.dense(Y)


# -- seed 004: the nanoGPT-style article ---------------------------------------------------------
# Its classes as written (LayerNorm with optional bias, MultiHeadAttention with c_attns / c_proj
# and scaled_dot_product_attention, MLP, EncoderLayer, DecoderLayer, PositionalEncoding, the
# Transformer's ModuleDict and N(0, 0.02) init), plus the Decoder it uses but does not print,
# written as its Encoder (layers, then a final norm). Two changes so that it translates:
# key / value heads are split with their own length (it reshapes them with the query's, which only
# works when source and target lengths are equal), and `seq2seq(src, tgt)` feeds the target tokens
# to the decoder (its forward feeds the source embeddings).
class Config004:
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout=0.0, bias=True):
        self.vocab_size, self.block_size, self.n_layer, self.n_head = vocab_size, block_size, n_layer, n_head
        self.n_embd, self.dropout, self.bias = n_embd, dropout, bias


class LayerNorm004(nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class MultiHeadAttention004(nn.Module):
    def __init__(self, config, is_causal=False):
        super().__init__()
        self.c_attns = nn.ModuleList([nn.Linear(config.n_embd, config.n_embd, bias=config.bias) for _ in range(3)])
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head, self.n_embd, self.is_causal = config.n_head, config.n_embd, is_causal

    def forward(self, query, key, value):
        B, T, C = query.size()
        q, k, v = [self.c_attns[i](x) for i, x in zip(range(3), (query, key, value))]
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, key.shape[1], self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, value.shape[1], self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0, is_causal=self.is_causal)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP004(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.relu = nn.ReLU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.c_proj(self.relu(self.c_fc(x)))


class EncoderLayer004(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1, self.attn = LayerNorm004(config.n_embd, config.bias), MultiHeadAttention004(config, is_causal=False)
        self.ln_2, self.mlp = LayerNorm004(config.n_embd, config.bias), MLP004(config)

    def forward(self, x):
        x = self.ln_1(x)
        x = x + self.attn(x, x, x)
        x = x + self.mlp(self.ln_2(x))
        return x


class DecoderLayer004(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1, self.m_attn = LayerNorm004(config.n_embd, config.bias), MultiHeadAttention004(config, is_causal=True)
        self.ln_2, self.attn = LayerNorm004(config.n_embd, config.bias), MultiHeadAttention004(config, is_causal=False)
        self.ln_3, self.mlp = LayerNorm004(config.n_embd, config.bias), MLP004(config)

    def forward(self, x, enc_out):
        x = self.ln_1(x)
        x = x + self.m_attn(x, x, x)
        x = self.ln_2(x)
        x = x + self.attn(x, enc_out, enc_out)
        x = self.ln_3(x)
        x = x + self.mlp(x)
        return x


class Encoder004(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList([EncoderLayer004(config) for _ in range(config.n_layer)])
        self.norm = LayerNorm004(config.n_embd, bias=config.bias)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class Decoder004(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList([DecoderLayer004(config) for _ in range(config.n_layer)])
        self.norm = LayerNorm004(config.n_embd, bias=config.bias)

    def forward(self, x, enc_out):
        for layer in self.layers:
            x = layer(x, enc_out)
        return self.norm(x)


class PositionalEncoding004(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dropout = nn.Dropout(p=config.dropout)
        pe = torch.zeros(config.block_size, config.n_embd)
        position = torch.arange(0, config.block_size).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, config.n_embd, 2) * -(math.log(10000.0) / config.n_embd))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x):
        return self.dropout(x + self.pe[:, : x.size(1)].requires_grad_(False))


class Transformer004(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd), wpe=PositionalEncoding004(config),
            drop=nn.Dropout(config.dropout), encoder=Encoder004(config), decoder=Decoder004(config)))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, src, tgt):
        t = self.transformer
        enc_out = t.encoder(t.drop(t.wpe(t.wte(src))))
        return self.lm_head(t.decoder(t.drop(t.wpe(t.wte(tgt))), enc_out))
