"""Lexically constrained beam search: dynamic beam allocation over xform's beam search, in numpy.

Post & Vilar 2018 ("Fast Lexically Constrained Decoding with Dynamic Beam Allocation"), as
fairseq's `--constraints` runs it (search.py `LexicallyConstrainedBeamSearch`, with unordered
constraints: constraints.py). Each step, per source:

1. each hypothesis that has not met all its phrases may not end: end-of-sentence is masked in its
   log-probs (after the logits processors, as fairseq masks it after its own);
2. the candidates are the source's top 2k continuations (plain beam search's), each hypothesis'
   best next token, and each hypothesis' next constraint tokens (those that start a phrase or
   continue the one it is inside), without repeats;
3. each candidate's constraint state is advanced, and its bank is its count of constraint tokens;
4. the candidates are dealt bank by bank, best first (the best of the highest bank, the best of
   the next, ..., then each bank's second best, ...), and the first 2k kept.

From there it is plain beam search (strategies.BeamSearch) taken in that order: of the first k,
those that ended join the finished hypotheses; the first k that did not end run on. A hypothesis
is finished only with every phrase met; at the length limit the others are kept apart, the best
k of a source by phrases met, then score, and a source that finished fewer than
num_return_sequences hypotheses returns them after its finished ones: the best found, with the
phrases they miss reported (`unmet`), never dropped silently.

A source without constraints has one bank, so the deal is plain beam search's ranking: its
hypotheses and scores are BeamSearch's. Constrained search needs each row's whole log-probs (the
constraint tokens' scores), so it asks the backend for logits, never for ranked candidates (the
fused beam graph).
"""
from __future__ import annotations

import numpy as np

from xform.runtime.decoding.constraints import Constraints
from xform.runtime.decoding.generation import GenerationConfig
from xform.runtime.decoding.processors import NEG, Special, log_softmax
from xform.runtime.decoding.strategies import BeamSearch, prefix_at

DEAD = NEG / 2  # a candidate scored below it continues a beam that is not one (the start's copies)


class ConstrainedBeamSearch(BeamSearch):
    """BeamSearch whose candidates are chosen by dynamic beam allocation (the module's docstring).
    `constraints`: per source, its phrases (tuples of target ids); a source may have none."""

    def __init__(self, batch: int, gen: GenerationConfig, special: Special, want_scores: bool = False,
                 prefix=None, start_id: int = 0, attention_len: int = 0, constraints=None):
        super().__init__(batch, gen, special, want_scores, prefix, start_id, attention_len)
        self.cons = Constraints(constraints if constraints is not None else [()] * batch)
        self.progress = self.cons.start(self.rows)  # each running beam's constraint state
        B, k, n = batch, self.k, self.steps_needed
        P = self.cons.ends.shape[1]
        # hypotheses that reached the length limit without meeting every phrase: the best k a source
        self.pool_seqs = np.full((B, k, n), special.pad, np.int64)
        self.pool_scores = np.full((B, k), NEG, np.float32)
        self.pool_lengths = np.zeros((B, k), np.int64)
        self.pool_tok = np.zeros((B, k, n), np.float32)
        self.pool_attn = np.zeros((B, k, n, attention_len), np.float32)
        self.pool_met = np.zeros((B, k, P), bool)
        self.pooled = np.zeros((B, k), bool)
        self.final_met = np.ones((B, k, P), bool)  # the returned hypotheses' phrases met

    @property
    def candidates_wanted(self) -> int:
        return 0  # the whole log-probs: constraint tokens are scored wherever they rank

    def scored(self, step: int, logits: np.ndarray, t: np.ndarray, last: np.ndarray) -> np.ndarray:
        """(rows, V) the processed log-probs (BeamSearch.candidates' processors), end-of-sentence
        masked in the rows whose phrases are not all met (after their prefix; not where the
        processors force it at the last step, forced_eos)."""
        k = self.k
        rows_t = np.repeat(t[:, 0], k)
        prefix = np.repeat(prefix_at(self.prefix, self.sources, step), k)
        history = None
        if self.procs.history_wanted:
            history = np.concatenate([np.full((self.rows_now, 1), self.start_id, np.int64),
                                      self.running[:, :, :step].reshape(self.rows_now, step)], 1)
        lp = self.procs(log_softmax(logits), rows_t, history, prefix)
        pending = ~self.cons.finished(self.progress, self.beam_sources) & (rows_t >= 0)
        if self.gen.forced_eos:
            pending &= ~np.repeat(last[:, 0], k)
        lp[pending, self.special.eos] = -np.inf
        return lp

    @property
    def beam_sources(self) -> np.ndarray:
        """(rows now,) each running beam's source (the constraint tables' row)."""
        return np.repeat(self.sources, self.k)

    def gathered(self, lp: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per source (B, C): each candidate's beam and token (-1: none, a repeat) and its
        accumulated score: the top 2k continuations, each beam's best token, each beam's next
        constraint tokens."""
        B, k, K = len(self.sources), self.k, self.K
        V = lp.shape[1]
        Kc = min(K, V)
        ids = np.argpartition(-lp, Kc - 1, axis=1)[:, :Kc] if Kc < V else np.tile(np.arange(V), (len(lp), 1))
        acc = (np.take_along_axis(lp, ids, 1).reshape(B, k, Kc) + self.running_scores[:, :, None]).reshape(B, -1)
        beam = np.repeat(np.arange(k), Kc)[None, :].repeat(B, 0)
        tok = ids.reshape(B, k * Kc)
        pick = self.top(acc, beam * V + tok, K)  # plain beam search's candidates
        nxt = self.cons.next_tokens(self.progress, self.beam_sources).reshape(B, -1)
        M = nxt.shape[1] // k
        beam = np.concatenate([np.take_along_axis(beam, pick, 1), np.arange(k)[None, :].repeat(B, 0),
                               np.repeat(np.arange(k), M)[None, :].repeat(B, 0)], 1)
        tok = np.concatenate([np.take_along_axis(tok, pick, 1), lp.argmax(1).reshape(B, k), nxt], 1)
        tok = self.without_repeats(beam, tok, V)
        row = np.arange(B)[:, None] * k + beam
        score = np.where(tok >= 0, lp[row, np.maximum(tok, 0)], -np.inf).astype(np.float32)
        return beam, tok, score

    @staticmethod
    def without_repeats(beam: np.ndarray, tok: np.ndarray, V: int) -> np.ndarray:
        """`tok` with -1 for each repeat of a (beam, token) candidate after its first."""
        key = np.where(tok >= 0, beam * V + tok, -1)
        order = np.argsort(key, axis=1, kind="stable")
        sorted_key = np.take_along_axis(key, order, 1)
        again = np.zeros_like(key, dtype=bool)
        np.put_along_axis(again, order[:, 1:], (sorted_key[:, 1:] == sorted_key[:, :-1]) & (sorted_key[:, 1:] >= 0), 1)
        return np.where(again, -1, tok)

    def allocate(self, acc: np.ndarray, flat: np.ndarray, bank: np.ndarray, present: np.ndarray) -> np.ndarray:
        """(B, K) the candidates kept, in the order of the deal: live candidates (a real beam's
        continuation) by their place in their bank (best first), then by bank (highest first);
        after them the others by score. Ties by the lower flat index (beam x V + token)."""
        live = present & (acc > DEAD)
        score = -acc.astype(np.float64)
        order = np.lexsort((flat, score, -bank, ~live), axis=1)
        sorted_bank = np.take_along_axis(bank, order, 1)
        sorted_live = np.take_along_axis(live, order, 1)
        C = acc.shape[1]
        pos = np.arange(C)[None, :]
        new = np.ones_like(sorted_live)
        new[:, 1:] = (sorted_bank[:, 1:] != sorted_bank[:, :-1]) | (sorted_live[:, 1:] != sorted_live[:, :-1])
        place = pos - np.maximum.accumulate(np.where(new, pos, 0), axis=1)
        stripe = np.empty_like(place)
        np.put_along_axis(stripe, order, place, 1)
        kind = np.where(live, 0, np.where(present, 1, 2))
        dealt = np.lexsort((flat, score, np.where(live, -bank, 0), np.where(live, stripe, 0), kind), axis=1)
        return dealt[:, :self.K]

    def advance(self, step: int, next_ids: np.ndarray, logits: np.ndarray, attention: np.ndarray | None = None):
        if logits is None or isinstance(logits, tuple):
            raise RuntimeError("constrained beam search needs each step's logits (candidates_wanted 0)")
        B, k, K, gen = len(self.sources), self.k, self.K, self.gen
        t = (step - self.offset[self.sources])[:, None]  # (B, 1) tokens generated after the prefix
        free = t >= 0
        last = t + 1 == gen.max_new_tokens  # (B, 1)
        lp = self.scored(step, logits, t, last)
        beam, tok, acc_lp = self.gathered(lp)
        C = tok.shape[1]
        parents = (np.arange(B)[:, None] * k + beam).reshape(-1)
        states = self.cons.advance(self.progress.take(parents), np.repeat(self.sources, C), tok.reshape(-1))
        acc = (acc_lp + np.take_along_axis(self.running_scores, beam, 1)).astype(np.float32)
        pick = self.allocate(acc, beam * lp.shape[1] + np.maximum(tok, 0), states.bank.reshape(B, C), tok >= 0)
        top_lp = np.take_along_axis(acc, pick, 1)
        top_beam = np.take_along_axis(beam, pick, 1)
        top_tok = np.maximum(np.take_along_axis(tok, pick, 1), 0)  # an absent one is never kept live
        top_state = states.take((np.arange(B)[:, None] * C + pick).reshape(-1))
        top_src = np.repeat(self.sources, K)
        complete = self.cons.finished(top_state, top_src).reshape(B, K)
        top_seq = np.take_along_axis(self.running, top_beam[:, :, None], 1)
        top_seq[:, :, step] = top_tok
        top_seq_tok = None
        if self.want_scores:
            top_seq_tok = np.take_along_axis(self.running_tok, top_beam[:, :, None], 1)
            top_seq_tok[:, :, step] = np.where(free, np.take_along_axis(acc_lp, pick, 1), 0.0)
        top_seq_attn = None
        if attention is not None:  # the step's attention is its parent row's
            top_seq_attn = np.take_along_axis(self.running_attn, top_beam[:, :, None, None], 1)
            top_seq_attn[:, :, step] = attention.reshape(B, k, -1)[np.arange(B)[:, None], top_beam]
        hits = ((top_tok == self.special.eos) & free) | last
        # the running beams of the next step: the first k of the deal that did not stop
        run_lp = (top_lp + hits.astype(np.float32) * NEG).astype(np.float32)
        nxt = np.argsort(hits, axis=1, kind="stable")[:, :k]
        self.running = np.take_along_axis(top_seq, nxt[:, :, None], 1)
        self.running_scores = np.take_along_axis(run_lp, nxt, 1)
        self.progress = top_state.take((np.arange(B)[:, None] * K + nxt).reshape(-1))
        if top_seq_tok is not None:
            self.running_tok = np.take_along_axis(top_seq_tok, nxt[:, :, None], 1)
        if top_seq_attn is not None:
            self.running_attn = np.take_along_axis(top_seq_attn, nxt[:, :, None, None], 1)
        parent = np.take_along_axis(top_beam, nxt, 1)
        length = np.maximum(t + 1, 1)
        self.merge_finished(top_lp, top_seq, top_seq_tok, top_seq_attn, hits & complete, length)
        incomplete = hits & ~complete & self.top_mask[None, :]
        if incomplete.any():
            met = self.cons.met(top_state, top_src).reshape(B, K, -1)
            self.merge_pool(top_lp, top_seq, top_seq_tok, top_seq_attn, incomplete, length, met)
        return self.next_rows(step, length, t, last, hits, parent)

    def merge_pool(self, top_lp: np.ndarray, top_seq: np.ndarray, top_seq_tok: np.ndarray | None,
                   top_seq_attn: np.ndarray | None, new: np.ndarray, length: np.ndarray, met: np.ndarray) -> None:
        """The hypotheses `new` (ended unmet: at the length limit) merged into each source's best k
        of them: most phrases met first, then the length-penalized score."""
        B, k, K = len(self.sources), self.k, self.K
        scores = (top_lp / (length ** self.gen.length_penalty).astype(np.float32)).astype(np.float32)
        m_in = np.concatenate([self.pooled, new], 1)
        m_met = np.concatenate([self.pool_met, met], 1)
        m_scores = np.concatenate([self.pool_scores, scores], 1)
        keep = np.lexsort((np.arange(k + K)[None, :].repeat(B, 0), -m_scores.astype(np.float64),
                           -m_met.sum(2), ~m_in), axis=1)[:, :k]

        def merged(old: np.ndarray, now: np.ndarray) -> np.ndarray:
            both = np.concatenate([old, now], 1)
            return np.take_along_axis(both, keep.reshape(B, k, *[1] * (both.ndim - 2)), 1)
        self.pool_seqs = merged(self.pool_seqs, top_seq)
        self.pool_scores = np.take_along_axis(m_scores, keep, 1)
        self.pool_lengths = merged(self.pool_lengths, np.broadcast_to(length, (B, K)))
        self.pool_met = merged(self.pool_met, met)
        self.pooled = np.take_along_axis(m_in, keep, 1)
        if top_seq_tok is not None:
            self.pool_tok = merged(self.pool_tok, top_seq_tok)
        if top_seq_attn is not None:
            self.pool_attn = merged(self.pool_attn, top_seq_attn)

    def can_improve(self, length: np.ndarray, t: np.ndarray) -> np.ndarray:
        """BeamSearch.can_improve from the best running beam wherever the deal put it."""
        gen = self.gen
        never = gen.early_stopping == "never" and gen.length_penalty > 0.0
        best_len = np.full_like(t, gen.max_new_tokens) if never else length
        best = self.running_scores.max(axis=1, keepdims=True)
        best_running = best / (best_len ** gen.length_penalty).astype(np.float32)
        worst = np.where(self.finished, self.scores.min(axis=1, keepdims=True), NEG)
        return np.asarray((best_running > worst).any(axis=1, keepdims=True))

    def retire(self, which: np.ndarray) -> None:
        """BeamSearch.retire, each source's free places after its finished hypotheses taken by its
        best unmet ones (merge_pool), and which phrases each returned hypothesis met recorded."""
        B, k = len(self.sources), self.k
        kind = np.concatenate([np.where(self.finished, 0, 2), np.where(self.pooled, 1, 2)], 1)
        take = np.argsort(kind, axis=1, kind="stable")[:, :k]

        def filled(done: np.ndarray, pool: np.ndarray) -> np.ndarray:
            both = np.concatenate([done, pool], 1)
            return np.take_along_axis(both, take.reshape(B, k, *[1] * (both.ndim - 2)), 1)[which]
        met = np.concatenate([np.ones_like(self.pool_met), self.pool_met], 1)
        met = np.take_along_axis(met, take[:, :, None], 1)
        met[np.take_along_axis(kind, take, 1) == 2] = False  # neither: nothing is known met
        self.final_met[self.sources[which]] = met[which]
        for name, pool in (("seqs", self.pool_seqs), ("scores", self.pool_scores), ("lengths", self.pool_lengths),
                           ("seqs_tok", self.pool_tok), ("seqs_attn", self.pool_attn)):
            now = getattr(self, name).copy()
            now[which] = filled(now, pool)
            setattr(self, name, now)
        keep = ~which
        super().retire(which)
        self.progress = self.progress.take(np.flatnonzero(np.repeat(keep, k)))
        for name in ("pool_seqs", "pool_scores", "pool_lengths", "pool_tok", "pool_attn", "pool_met", "pooled"):
            setattr(self, name, getattr(self, name)[keep])

    def unmet(self) -> list[list[int]]:
        """Per returned hypothesis (B x num_return_sequences, as the ids), the indices of its
        source's phrases it does not contain: empty for every finished one."""
        n = self.gen.num_return_sequences
        return [self.cons.unmet(self.final_met[b, j], b) for b in range(self.B) for j in range(n)]
