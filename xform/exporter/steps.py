"""The computations the decoder graphs trace, shared by the plain decoder, the candidates graph
and the fused beam step (beam_graph.py): one cached decoder step, the suppression bias, the greedy
choice and the ranking of candidates. Each is torch code on the model; graphs.py wraps them in
the modules it exports."""
from __future__ import annotations

import torch
from torch import Tensor

from xform.models.transformer import EncoderOutput, Seq2SeqTransformer, recording

# up to this many never-generated ids (pad, banned) are struck from a TopK's few candidates; more
# are a (V,) -inf bias added to the (R, V) scores before it
FEW_NEVER = 16


def never_ids(model: Seq2SeqTransformer) -> list[int]:
    """The ids never generated (Seq2SeqTransformer.blocked_ids at any step): pad and banned."""
    return sorted({model.cfg.pad_id, *model.cfg.banned_ids})


def never_bias(model: Seq2SeqTransformer, logits: Tensor) -> Tensor:
    """(V,): -inf at the ids never generated (pad, banned), 0 elsewhere: suppression as one Add."""
    blocked = model.blocked_ids(0, 0, logits.device)
    return torch.zeros(blocked.shape, device=logits.device).masked_fill(blocked, float("-inf"))


def struck(ids: Tensor, never: list[int]) -> Tensor:
    """ids (R, K) -> bool (R, K): which are never generated."""
    out = ids == never[0]
    for v in never[1:]:
        out = out | (ids == v)
    return out


def greedy_choice(model: Seq2SeqTransformer, logits: Tensor, positions: Tensor, min_new_tokens: Tensor) -> Tensor:
    """Each row's best id after Seq2SeqTransformer.suppress (pad and banned ids never,
    end-of-sentence not before min_new_tokens), in one pass over the (R, V) logits: of each row's
    2 + n best (n the never-generated ids) the first that is neither never generated nor an
    end-of-sentence the row may not end with yet, which is the best after suppression. A Where
    and an ArgMax over (R, V) were 11% of Marian-base's greedy graph at 256 rows, and the (V,)
    -inf bias Add that replaced them still wrote a suppressed (R, V) copy, 20 MiB of the arena at a
    file's 157 rows (docs/benchmarks.md); many never-generated ids keep that bias."""
    cfg = model.cfg
    never = never_ids(model)
    early = (positions < min_new_tokens).unsqueeze(1)  # (R, 1)
    if len(never) > FEW_NEVER:
        vals, ids = torch.topk(logits + never_bias(model, logits), min(2, cfg.tgt_vocab_size), dim=-1)
        out = (ids == cfg.eos_id) & early
    else:
        vals, ids = torch.topk(logits, min(2 + len(never), cfg.tgt_vocab_size), dim=-1)  # (R, 2 + n)
        out = struck(ids, never) | ((ids == cfg.eos_id) & early)
    # TopK's order is by value, ties to the lower id: the first left is ArgMax's choice
    pick = torch.argmax(vals.masked_fill(out, float("-inf")), dim=-1, keepdim=True)
    return ids.gather(1, pick).squeeze(1)


def rank_candidates(model: Seq2SeqTransformer, logits: Tensor, num_candidates: Tensor, min_new_tokens: Tensor,
                    positions: Tensor) -> tuple[Tensor, Tensor]:
    """The candidates graph's computation, also the tail of the fused beam step (beam_graph.py):
    each row's num_candidates best log-probs after Seq2SeqTransformer.suppress, and their ids."""
    # after the log-softmax, K + 1 + n candidates (n the never-generated ids), then those ids and
    # end-of-sentence in the rows still short of their min_new_tokens struck and the K best
    # kept: the suppression on (R, K + 1 + n) values, not an Add over (R, V) (a Where over (R, V)
    # cost 3x the log-softmax and TopK together on Marian-base; the Add, 1.4 of 6 ms at 256 rows
    # and an (R, V) tensor in the arena). Many never-generated ids: a (V,) -inf bias Add first
    cfg = model.cfg
    never = never_ids(model)
    scores = torch.log_softmax(logits, dim=-1)  # (R, V)
    extra = len(never)
    if extra > FEW_NEVER:
        scores, extra = scores + never_bias(model, logits), 0
    # k is a 0-d tensor, so the trace keeps K a graph input; topk takes one (torch annotates k as an int)
    k = num_candidates[0]
    vals, ids = torch.topk(scores, torch.clamp(k + 1 + extra, max=cfg.tgt_vocab_size), dim=-1)  # type: ignore[arg-type]
    out = (ids == cfg.eos_id) & (positions < min_new_tokens).unsqueeze(1)
    if extra:
        out = out | struck(ids, never)
    vals = vals.masked_fill(out, float("-inf"))
    top, order = torch.topk(vals, k, dim=-1)  # type: ignore[arg-type]  # (R, K) each; K stays a graph input
    return top, ids.gather(1, order)


def cached_step(model: Seq2SeqTransformer, n: int, attention_layer: int | None, input_ids: Tensor, positions: Tensor,
                flat: tuple[Tensor, ...]) -> tuple[Tensor, list, list]:
    """One cached decoder step of the decoder graphs (plain and fused beam): `flat` holds the n
    layers' self-attention K/V, then their cross K/V, then the source mask, as the contract
    orders them. Returns the logits, the new self-attention K/V and the recorded attention."""
    cache = [(flat[2 * i], flat[2 * i + 1]) for i in range(n)]
    cross = [(flat[2 * n + 2 * i], flat[2 * n + 2 * i + 1]) for i in range(n)]
    with recording(model, attention_layer) as attention:
        logits, new = model.decode_step(input_ids, EncoderOutput(cross, flat[4 * n]), cache, positions)
    return logits, new, attention
