"""The computations the decoder graphs trace, shared by the plain decoder, the candidates graph
and the fused beam step (beam_graph.py): one cached decoder step, the suppression bias, the greedy
choice and the ranking of candidates. Each is torch code on the model; graphs.py wraps them in
the modules it exports."""
from __future__ import annotations

import torch
from torch import Tensor

from xform.models.transformer import EncoderOutput, Seq2SeqTransformer, recording


def never_bias(model: Seq2SeqTransformer, logits: Tensor) -> Tensor:
    """(V,): -inf at the ids never generated (pad, banned), 0 elsewhere: suppression as one Add."""
    blocked = model.blocked_ids(0, 0, logits.device)
    return torch.zeros(blocked.shape, device=logits.device).masked_fill(blocked, float("-inf"))


def greedy_choice(model: Seq2SeqTransformer, logits: Tensor, positions: Tensor, min_new_tokens: Tensor) -> Tensor:
    """Each row's best id after Seq2SeqTransformer.suppress (pad and banned ids never,
    end-of-sentence not before min_new_tokens), in one pass over the (R, V) logits: the static
    suppression is a (V,) additive bias, and of each row's two best the first is taken unless it is
    an end-of-sentence the row may not end with yet (a Where and an ArgMax over (R, V) were 11% of
    Marian-base's greedy graph at 256 rows, docs/benchmarks.md)."""
    cfg = model.cfg
    _, ids = torch.topk(logits + never_bias(model, logits), 2, dim=-1)  # (R, 2)
    early = positions < min_new_tokens  # (R,)
    return torch.where((ids[:, 0] == cfg.eos_id) & early, ids[:, 1], ids[:, 0])


def rank_candidates(model: Seq2SeqTransformer, logits: Tensor, num_candidates: Tensor, min_new_tokens: Tensor,
                    positions: Tensor) -> tuple[Tensor, Tensor]:
    """The candidates graph's computation, also the tail of the fused beam step (beam_graph.py):
    each row's num_candidates best log-probs after Seq2SeqTransformer.suppress, and their ids."""
    # suppression as a (V,) additive bias, so the one (R, V) pass after the log-softmax is an Add
    # (a Where over (R, V) cost 3x the log-softmax and TopK together on Marian-base); the
    # per-row end-of-sentence limit touches the (R,) end-of-sentence column only
    cfg = model.cfg
    scores = torch.log_softmax(logits, dim=-1) + never_bias(model, logits)  # (R, V)
    # one more candidate than asked, then end-of-sentence struck from the rows still short of
    # their min_new_tokens and the K best kept: the per-row rule on (R, K + 1) values, not (R, V)
    # k is a 0-d tensor, so the trace keeps K a graph input; topk takes one (torch annotates k as an int)
    k = num_candidates[0]
    vals, ids = torch.topk(scores, torch.clamp(k + 1, max=cfg.tgt_vocab_size), dim=-1)  # type: ignore[arg-type]
    early = (positions < min_new_tokens).unsqueeze(1)  # (R, 1)
    vals = vals.masked_fill((ids == cfg.eos_id) & early, float("-inf"))
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
