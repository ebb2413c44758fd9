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


def never_bias(model: Seq2SeqTransformer, logits: Tensor) -> Tensor:
    """(V,): -inf at the ids never generated (pad, banned), 0 elsewhere: suppression as one Add."""
    blocked = model.blocked_ids(0, 0, logits.device)
    return torch.zeros(blocked.shape, device=logits.device).masked_fill(blocked, float("-inf"))


def allowed_top(model: Seq2SeqTransformer, scores: Tensor, k: int | Tensor, early: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's k + n best of `scores` (R, V), n the never-generated ids (TopK's order: by
    value, ties to the lower id), those ids and end-of-sentence in the `early` rows (R, 1) set to
    -inf: the k best allowed are the k best left, in order. The suppression on (R, k + n) values,
    not an Add over (R, V) (a full pass and an (R, V) copy for one to a few ids: 1.4 of 6 ms at
    256 rows, docs/benchmarks.md); more than FEW_NEVER ids: a (V,) -inf bias Add first, n = 0."""
    cfg = model.cfg
    never = list(cfg.never_generated)
    if len(never) > FEW_NEVER:
        scores, never = scores + never_bias(model, scores), []
    want = (min(k + len(never), cfg.tgt_vocab_size) if isinstance(k, int)
            else torch.clamp(k + len(never), max=cfg.tgt_vocab_size))
    vals, ids = torch.topk(scores, want, dim=-1)  # type: ignore[arg-type]  # a 0-d k stays a graph input
    out = (ids == cfg.eos_id) & early
    for v in never:
        out = out | (ids == v)
    return vals.masked_fill(out, float("-inf")), ids


def greedy_choice(model: Seq2SeqTransformer, logits: Tensor, positions: Tensor, min_new_tokens: Tensor) -> Tensor:
    """Each row's best id after Seq2SeqTransformer.suppress (pad and banned ids never,
    end-of-sentence not before min_new_tokens), in one pass over the (R, V) logits: the first of
    its 2 allowed best (allowed_top), which is ArgMax's choice after suppression. A Where and an
    ArgMax over (R, V) were 11% of Marian-base's greedy graph at 256 rows (docs/benchmarks.md)."""
    vals, ids = allowed_top(model, logits, 2, (positions < min_new_tokens).unsqueeze(1))
    return ids.gather(1, torch.argmax(vals, dim=-1, keepdim=True)).squeeze(1)


def rank_candidates(model: Seq2SeqTransformer, logits: Tensor, num_candidates: Tensor, min_new_tokens: Tensor,
                    positions: Tensor) -> tuple[Tensor, Tensor]:
    """The candidates graph's computation, also the tail of the fused beam step (beam_graph.py):
    each row's num_candidates best log-probs after Seq2SeqTransformer.suppress, and their ids."""
    # one more candidate than asked, so that end-of-sentence struck from the rows still short of
    # their min_new_tokens leaves K (a Where over (R, V) cost 3x the log-softmax and TopK together)
    # k is a 0-d tensor, so the trace keeps K a graph input; topk takes one (torch annotates k as an int)
    k = num_candidates[0]
    vals, ids = allowed_top(model, torch.log_softmax(logits, dim=-1), k + 1,
                            (positions < min_new_tokens).unsqueeze(1))
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
