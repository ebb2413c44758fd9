"""PyTorch's "Language Translation with nn.Transformer" tutorial model, as users write it.

`Seq2SeqTransformer` holds an `nn.Transformer`, a `TokenEmbedding` per side scaled by
sqrt(emb_size), a sinusoidal `PositionalEncoding` buffer and a `generator` Linear, exactly as the
tutorial; `norm_first`, `activation` and `batch_first` are passed through to nn.Transformer. With
batch_first the position buffer is laid out (1, maxlen, emb) and sliced on axis 1, as a
batch-first user writes it; the tutorial's own layout is (maxlen, 1, emb).
`tutorial_greedy` is the tutorial's greedy_decode (the whole prefix re-run every step), plus
xform's rule that the pad id is never generated, returning the logits it chose from.
"""
import math

import torch
from torch import Tensor, nn


class PositionalEncoding(nn.Module):
    def __init__(self, emb_size: int, dropout: float, maxlen: int = 5000, batch_first: bool = False):
        super().__init__()
        den = torch.exp(- torch.arange(0, emb_size, 2) * math.log(10000) / emb_size)
        pos = torch.arange(0, maxlen).reshape(maxlen, 1)
        pos_embedding = torch.zeros((maxlen, emb_size))
        pos_embedding[:, 0::2] = torch.sin(pos * den)
        pos_embedding[:, 1::2] = torch.cos(pos * den)
        self.batch_first = batch_first
        pos_embedding = pos_embedding.unsqueeze(0 if batch_first else -2)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pos_embedding", pos_embedding)

    def forward(self, token_embedding: Tensor):
        if self.batch_first:
            return self.dropout(token_embedding + self.pos_embedding[:, :token_embedding.size(1)])
        return self.dropout(token_embedding + self.pos_embedding[:token_embedding.size(0), :])


class TokenEmbedding(nn.Module):
    def __init__(self, vocab_size: int, emb_size):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_size)
        self.emb_size = emb_size

    def forward(self, tokens: Tensor):
        return self.embedding(tokens.long()) * math.sqrt(self.emb_size)


class Seq2SeqTransformer(nn.Module):
    def __init__(self, num_encoder_layers, num_decoder_layers, emb_size, nhead, src_vocab_size, tgt_vocab_size,
                 dim_feedforward=512, dropout=0.1, norm_first=False, activation="relu", batch_first=False):
        super().__init__()
        self.transformer = nn.Transformer(d_model=emb_size, nhead=nhead, num_encoder_layers=num_encoder_layers,
                                          num_decoder_layers=num_decoder_layers, dim_feedforward=dim_feedforward,
                                          dropout=dropout, activation=activation, norm_first=norm_first,
                                          batch_first=batch_first)
        self.generator = nn.Linear(emb_size, tgt_vocab_size)
        self.src_tok_emb = TokenEmbedding(src_vocab_size, emb_size)
        self.tgt_tok_emb = TokenEmbedding(tgt_vocab_size, emb_size)
        self.positional_encoding = PositionalEncoding(emb_size, dropout=dropout, batch_first=batch_first)
        self.batch_first = batch_first

    def encode(self, src: Tensor, src_mask: Tensor):
        return self.transformer.encoder(self.positional_encoding(self.src_tok_emb(src)), src_mask)

    def decode(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor):
        return self.transformer.decoder(self.positional_encoding(self.tgt_tok_emb(tgt)), memory, tgt_mask)

    def seq2seq(self, src, tgt):
        """Teacher-forced logits (B, T, V) from batch-major ids, for training."""
        if not self.batch_first:
            src, tgt = src.T, tgt.T
        T = tgt.shape[1] if self.batch_first else tgt.shape[0]
        mask = nn.Transformer.generate_square_subsequent_mask(T)
        S = src.shape[1] if self.batch_first else src.shape[0]
        out = self.generator(self.decode(tgt, self.encode(src, torch.zeros(S, S)), mask))
        return out if self.batch_first else out.transpose(0, 1)


@torch.no_grad()
def tutorial_greedy(model: Seq2SeqTransformer, src_row, bos, eos, pad, max_new):
    src = torch.tensor([src_row]) if model.batch_first else torch.tensor([src_row]).T
    num_tokens = len(src_row)
    memory = model.encode(src, torch.zeros(num_tokens, num_tokens).type(torch.bool))
    ys = torch.ones(1, 1).fill_(bos).type(torch.long)
    out_ids, logits = [], []
    for _ in range(max_new):
        n = ys.size(1) if model.batch_first else ys.size(0)
        tgt_mask = nn.Transformer.generate_square_subsequent_mask(n).type(torch.bool)
        out = model.decode(ys, memory, tgt_mask)
        out = out if model.batch_first else out.transpose(0, 1)
        prob = model.generator(out[:, -1])[0]
        logits.append(prob)
        prob = prob.clone()
        prob[pad] = float("-inf")
        nxt = int(prob.argmax())
        out_ids.append(nxt)
        step = torch.ones(1, 1).type_as(src).fill_(nxt)
        ys = torch.cat([ys, step], dim=1 if model.batch_first else 0)
        if nxt == eos:
            break
    return out_ids, torch.stack(logits)
