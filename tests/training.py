"""A few hundred steps of training on a task whose outputs depend on the input, for parity tests.

Task: the target is the source reversed, each id mapped into the target vocabulary, then eos.
Batches have one length each (no padding, so every tutorial's own masks are the same).
"""
import numpy as np
import torch
import torch.nn.functional as F


def task_pair(src_row, tgt_vocab, special, eos):
    allowed = [i for i in range(tgt_vocab) if i not in special]
    return [allowed[(3 * s) % len(allowed)] for s in reversed(src_row)] + [eos]


def train(model, forward, src_vocab, tgt_vocab, bos, eos, pad, steps=300, seed=0, lr=3e-3, src_ids=None):
    """forward(src (B, S), tgt_in (B, T)) -> logits (B, T, V). Returns the model in eval mode.
    `src_ids`: the ids sources are drawn from (default: every non-special id); a subset makes
    random sources over the whole vocabulary out of distribution, as real text is for a real model."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    special = {pad, bos, eos}
    allowed = np.array([i for i in (range(src_vocab) if src_ids is None else src_ids) if i not in special])
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        n = int(rng.integers(2, 8))
        src = allowed[rng.integers(0, len(allowed), (24, n))]
        tgt = np.array([task_pair(list(r), tgt_vocab, special, eos) for r in src])
        tgt_in = np.concatenate([np.full((24, 1), bos), tgt[:, :-1]], 1)
        logits = forward(torch.from_numpy(src), torch.from_numpy(tgt_in))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(tgt).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()
