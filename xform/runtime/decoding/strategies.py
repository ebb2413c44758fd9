"""Decoding strategies: greedy, sampling and beam search, as small state machines over numpy.

The loop that drives a backend is written once (loop.py); a strategy only says how many rows
the backend decodes, what to feed it next, and which cached row each new row continues:

    strategy.rows                     # rows the backend decodes (batch x beams, or x samples)
    strategy.group                    # rows a source: its beams, its samples, or 1
    strategy.needs_logits             # whether the loop must copy logits to the host each step
    tokens, beam_idx = strategy.advance(step, next_ids, logits)   # tokens None: finished
    ids, scores = strategy.result()

`beam_idx` (or None: every row continues itself) says which of this step's rows each next row
continues: beam search's reorder, and, shorter than the rows, finished rows leaving the batch. A
source's rows leave together, when none of them can change the result any more (greedy and
sampled rows at end-of-sentence; a source's beams when its finished hypotheses are final), so
the backend never runs a row whose tokens are already decided.

Beam search follows transformers' vectorized `_beam_search` (4.57) step for step, in float32:
log-softmax, then the logits processors (pad and banned ids, end-of-sentence before
min_new_tokens, end-of-sentence forced at the length limit), top 2k continuations per source,
the running beams, the finished hypotheses scored with `length_penalty`, and `early_stopping`
True / False / "never" with its heuristic. Candidates are taken per row first (the top 2k of a
row's logits; the union over rows holds the top 2k of the batch item exactly), so the host never
sorts a whole vocabulary. Ties are broken by the lower flat index, as a stable sort does.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

import numpy as np

from xform.runtime.decoding.generation import GenerationConfig
from xform.runtime.decoding.processors import NEG, Processors, Special, log_softmax


class Strategy(Protocol):
    """What the loop (loop.py) asks of a strategy: its rows, what to feed next, its result."""

    gen: GenerationConfig
    group: int  # rows a source
    prefix: np.ndarray  # the target prefix table, -1 after a row's prefix

    @property
    def rows(self) -> int: ...

    @property
    def steps_needed(self) -> int: ...

    @property
    def needs_logits(self) -> bool: ...

    @property
    def graph_min_new_tokens(self) -> int | None: ...

    @property
    def candidates_wanted(self) -> int: ...

    @property
    def out(self) -> np.ndarray | None:
        """The ids each row took so far (streaming), or None where they are decided at the end (beams)."""

    def advance(self, step: int, next_ids: np.ndarray, logits: Any,
                attention: np.ndarray | None = None) -> tuple[np.ndarray | None, np.ndarray | None]: ...

    def result(self) -> tuple[np.ndarray, np.ndarray | None]: ...

    def per_token(self) -> np.ndarray: ...

    def attentions(self) -> np.ndarray: ...


def graph_min_new_tokens(min_new_tokens: int, offset: np.ndarray) -> int | None:
    """min_new_tokens as the graphs count it (from position 0, the prefix included), or None
    when the rows' prefixes (`offset`: their lengths) differ and it must be applied on the host."""
    if min_new_tokens == 0:
        return 0
    if len(offset) == 0 or (offset == offset[0]).all():
        return min_new_tokens + (int(offset[0]) if len(offset) else 0)
    return None


def prefix_at(table: np.ndarray, rows: np.ndarray, step: int) -> np.ndarray:
    """Each of `rows`' prefix token at `step`, -1 where its prefix has ended (prefix_table's padding)."""
    return table[rows, step] if step < table.shape[1] else np.full(len(rows), -1, np.int64)


def prefix_table(prefix, batch: int, group: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row (batch x group): its source's prefix ids, padded with -1, and their count."""
    prefix = prefix if prefix is not None else [[]] * batch
    width = max((len(p) for p in prefix), default=0)
    table = np.full((batch, width), -1, np.int64)
    for i, p in enumerate(prefix):
        table[i, :len(p)] = p
    lengths = np.array([len(p) for p in prefix], np.int64)
    return np.repeat(table, group, 0), np.repeat(lengths, group)


class Greedy:
    """The graph's own ArgMax (next_ids), unless a processor the graph lacks is set (then the
    host's argmax of processed logits); logits also when scores are asked for. A row leaves the
    batch when it ends (with samples or alternatives, when every row of its source has ended).
    Rows with a target prefix take its tokens first; their new tokens count from its end."""

    group = 1  # rows a source
    candidates_wanted = 0  # beam search asks the backend for ranked candidates instead of logits
    # a step callback (CTranslate2's translate_batch callback): stop(strategy, step, rows, ended)
    # is told each step's tokens of `rows` (original rows; `ended`: those done before the step)
    # after they are chosen, and returns which of them end there
    stop: Callable[["Greedy", int, np.ndarray, np.ndarray], np.ndarray] | None = None

    def __init__(self, batch: int, gen: GenerationConfig, special: Special, want_scores: bool = False,
                 prefix=None, start_id: int = 0, attention_len: int = 0):
        self.rows, self.gen, self.special = batch * self.group, gen, special
        self.procs = Processors(gen, special)
        self.prefix, self.offset = prefix_table(prefix, batch, self.group)
        self.start_id = start_id
        self.host = self.procs.host or self.graph_min_new_tokens is None  # choose from host logits
        self.want_scores = want_scores
        self.active = np.arange(self.rows)  # the original row of each row the backend still runs
        self.done = np.zeros(self.rows, bool)
        self.width = self.prefix.shape[1] + gen.max_new_tokens
        self.out = np.full((self.rows, self.width), special.pad, np.int64)
        self.steps = 0
        self.token_scores = np.zeros((self.rows, self.width), np.float32) if want_scores else None
        # each step's attention (backend.attention()), when asked: (rows, steps, src_len)
        self.attention = np.zeros((self.rows, self.width, attention_len), np.float32)

    @property
    def steps_needed(self) -> int:
        return self.width

    @property
    def needs_logits(self) -> bool:
        return self.want_scores or self.host

    @property
    def graph_min_new_tokens(self) -> int | None:
        """min_new_tokens as the graphs count it (graph_min_new_tokens)."""
        return graph_min_new_tokens(self.gen.min_new_tokens, self.offset)

    def history(self, rows: np.ndarray, step: int) -> np.ndarray | None:
        """The decoder input of `rows` (original rows) so far: start id, prefix, generated ids."""
        if not self.procs.history_wanted:
            return None
        return np.concatenate([np.full((len(rows), 1), self.start_id, np.int64), self.out[rows, :step]], 1)

    def processed(self, step: int, rows: np.ndarray, logits: np.ndarray) -> np.ndarray:
        return self.procs(logits.astype(np.float32, copy=True), step - self.offset[rows], self.history(rows, step),
                          prefix_at(self.prefix, rows, step))

    def choose(self, step: int, next_ids: np.ndarray, scores: np.ndarray | None) -> np.ndarray:
        """This step's tokens of the active rows: the host's argmax of processed scores when a
        processor needs the host, else the graph's choice obeying the forced tokens."""
        if self.host:
            if scores is None:
                raise RuntimeError("choosing on the host needs this step's logits")
            return scores.argmax(1)
        forced = self.procs.forced_token(step - self.offset[self.active], prefix_at(self.prefix, self.active, step))
        return np.where(forced >= 0, forced, next_ids)

    def advance(self, step: int, next_ids: np.ndarray, logits: np.ndarray | None,
                attention: np.ndarray | None = None):
        act = self.active
        done = self.done[act]
        if attention is not None:
            self.attention[act, step] = np.where(done[:, None], 0.0, attention)
        scores = self.processed(step, act, logits) if logits is not None else None
        nxt = np.where(done, self.special.pad, self.choose(step, next_ids, scores))
        nxt = nxt.astype(np.int64)
        if self.token_scores is not None:
            if scores is None:
                raise RuntimeError("token scores need this step's logits")
            lp = log_softmax(scores)[np.arange(len(act)), nxt]  # transformers' normalized processed scores
            free = (step >= self.offset[act]) & ~done
            self.token_scores[act, step] = np.where(free, lp, 0.0)
        self.out[act, step] = nxt
        self.steps = step + 1
        t = step - self.offset[act]
        self.done[act] = done | ((nxt == self.special.eos) & (t >= 0)) | (t + 1 >= self.gen.max_new_tokens)
        if self.stop is not None:
            self.done[act] |= self.stop(self, step, act, done)
        if self.done.all():
            return None, None
        running = ~self.done[act].reshape(-1, self.group).all(axis=1)  # a source's rows leave together
        if running.all():
            return nxt, None
        keep = np.flatnonzero(np.repeat(running, self.group))
        self.active = act[keep]
        return nxt[keep], keep

    def result(self) -> tuple[np.ndarray, np.ndarray | None]:
        scores = self.token_scores.sum(1, dtype=np.float32) if self.token_scores is not None else None
        return self.out[:, :self.steps], scores

    def per_token(self) -> np.ndarray:
        if self.token_scores is None:
            raise RuntimeError("per-token scores were not asked for (want_scores)")
        return self.token_scores[:, :self.steps]

    def attentions(self) -> np.ndarray:
        return self.attention[:, :self.steps]


class Alternatives(Greedy):
    """CTranslate2's return_alternatives: after the target prefix, the num_return_sequences best
    tokens at the first free position (processed scores, ties to the lower id), row j of a source
    taking the j-th, each then continued greedily."""

    def __init__(self, batch: int, gen: GenerationConfig, special: Special, want_scores: bool = False,
                 prefix=None, start_id: int = 0, attention_len: int = 0):
        self.group = gen.num_return_sequences
        super().__init__(batch, gen, special, want_scores, prefix, start_id, attention_len)

    @property
    def needs_logits(self) -> bool:
        return self.want_scores or self.host or bool((self.steps - self.offset[self.active] == 0).any())

    def choose(self, step: int, next_ids: np.ndarray, scores: np.ndarray | None) -> np.ndarray:
        out = super().choose(step, next_ids, scores)
        first = step - self.offset[self.active] == 0
        if first.any():
            assert scores is not None  # advance() refuses a first free position without its logits
            ranked = np.argsort(-scores[first].astype(np.float64), axis=1, kind="stable")
            j = self.active[first] % self.group
            pick = ranked[np.arange(len(j)), j]
            # fewer possible tokens than alternatives (a forced token, a tiny vocabulary): the
            # rest are empty, ended at once
            possible = np.isfinite(scores[first][np.arange(len(j)), pick])
            out[first] = np.where(possible, pick, self.special.eos)
        return out

    def advance(self, step: int, next_ids: np.ndarray, logits: np.ndarray | None,
                attention: np.ndarray | None = None):
        if logits is None and (step - self.offset[self.active] == 0).any():
            raise RuntimeError("alternatives need the logits of their first free position")
        return super().advance(step, next_ids, logits, attention)


class Sample(Greedy):
    """Multinomial sampling after temperature, top-k and top-p (transformers' warpers, in that
    order, after its processors), from a seeded numpy generator: the same seed gives the same
    tokens on one backend."""

    def __init__(self, batch: int, gen: GenerationConfig, special: Special, want_scores: bool = False,
                 prefix=None, start_id: int = 0, attention_len: int = 0):
        self.group = gen.num_return_sequences
        super().__init__(batch, gen, special, want_scores, prefix, start_id, attention_len)
        self.host = True
        self.rng = np.random.default_rng(gen.seed)

    def choose(self, step: int, next_ids: np.ndarray, scores: np.ndarray | None) -> np.ndarray:
        if scores is None:
            raise RuntimeError("sampling needs this step's logits")
        scores = scores.astype(np.float64) / self.gen.temperature
        V = scores.shape[1]
        if 0 < self.gen.top_k < V:
            kth = np.partition(scores, V - self.gen.top_k, axis=1)[:, V - self.gen.top_k, None]
            scores[scores < kth] = -np.inf
        probs = np.exp(scores - scores.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        if self.gen.top_p < 1.0:  # keep the smallest set whose mass reaches top_p (at least one token)
            order = np.argsort(probs, axis=1, kind="stable")  # ascending, as transformers' TopPLogitsWarper
            sorted_p = np.take_along_axis(probs, order, axis=1)
            drop = np.cumsum(sorted_p, axis=1) <= (1 - self.gen.top_p)
            drop[:, -1] = False
            removed = np.zeros_like(drop)
            np.put_along_axis(removed, order, drop, axis=1)
            probs[removed] = 0.0
            probs /= probs.sum(axis=1, keepdims=True)
        cdf = np.cumsum(probs, axis=1)
        u = self.rng.random(self.rows)[self.active, None] * cdf[:, -1:]  # one draw a row, ended rows too
        return np.minimum((cdf <= u).sum(axis=1), V - 1).astype(np.int64)


class BeamSearch:
    """transformers' vectorized beam search (generation/utils.py `_beam_search`), in numpy. With a
    target prefix, a source's beams take its tokens first, all copies of beam 0 (so the search
    starts after it as transformers' does from decoder_input_ids = start + prefix: beam 0 at 0,
    the others at -1e9); its lengths, length penalty and limits count from the prefix's end."""

    def __init__(self, batch: int, gen: GenerationConfig, special: Special, want_scores: bool = False,
                 prefix=None, start_id: int = 0, attention_len: int = 0):
        self.B, self.k, self.gen, self.special = batch, gen.num_beams, gen, special
        self.group = self.k
        self.K = 2 * self.k  # beams_to_keep: max(2, 1 + one end-of-sentence id) * num_beams
        self.rows = batch * self.k
        self.procs = Processors(gen, special)
        self.start_id = start_id
        table, offset = prefix_table(prefix, batch, 1)
        self.prefix, self.offset = table, offset  # by source
        self.graph_min_new_tokens = graph_min_new_tokens(gen.min_new_tokens, offset)
        self.host = self.procs.host or self.graph_min_new_tokens is None
        self.needs_logits = True
        n = self.steps_needed = table.shape[1] + gen.max_new_tokens
        B, k = batch, self.k
        self.running = np.full((B, k, n), special.pad, np.int64)  # generated ids, without the start id
        self.running_scores = np.zeros((B, k), np.float32)
        self.running_scores[:, 1:] = NEG  # all beams start equal: only the first may be extended
        self.seqs = np.full((B, k, n), special.pad, np.int64)  # finished hypotheses
        self.scores = np.full((B, k), NEG, np.float32)
        self.lengths = np.zeros((B, k), np.int64)
        self.finished = np.zeros((B, k), bool)
        self.improvable = np.ones((B, 1), bool)  # is_early_stop_heuristic_unsatisfied
        self.want_scores = want_scores  # each token's processed log-prob, carried with its hypothesis
        self.running_tok = np.zeros((B, k, n), np.float32)
        self.seqs_tok = np.zeros((B, k, n), np.float32)
        # each token's attention (backend.attention()), carried with its hypothesis; src_len 0 unless asked
        self.running_attn = np.zeros((B, k, n, attention_len), np.float32)
        self.seqs_attn = np.zeros((B, k, n, attention_len), np.float32)
        self.top_mask = np.arange(self.K) < k
        self.out = None  # the tokens of beams are decided at the end: nothing to stream
        self.sources = np.arange(B)  # the original source of each one still searched
        self.vocab = special.vocab
        self.final: tuple[np.ndarray, ...] = (self.seqs.copy(), self.scores.copy(), self.lengths.copy(),
                                              self.seqs_tok.copy(), self.seqs_attn.copy())

    @property
    def candidates_wanted(self) -> int:
        return 0 if self.host else self.K

    def candidates(self, step: int, logits) -> tuple[np.ndarray, np.ndarray]:
        """Per row, the top-K processed log-probs and their ids: (rows, K) each. `logits` is either
        the (rows, V) logits, processed and ranked here, or the backend's candidates graph's
        (log-probs, ids), which applied every processor but the forced tokens."""
        t = np.repeat(step - self.offset[self.sources], self.k)
        prefix = np.repeat(prefix_at(self.prefix, self.sources, step), self.k)
        if isinstance(logits, tuple):
            lp, ids = logits
            forced = self.procs.forced_token(t, prefix)
            rows = np.flatnonzero(forced >= 0)
            if len(rows):  # that token, nothing else
                lp, ids = lp.copy(), ids.copy()
                lp[rows] = -np.inf
                lp[rows, 0], ids[rows, 0] = 0.0, forced[rows]
            return lp, ids
        V = logits.shape[1]
        history = None
        if self.procs.history_wanted:
            history = np.concatenate([np.full((self.rows_now, 1), self.start_id, np.int64),
                                      self.running[:, :, :step].reshape(self.rows_now, step)], 1)
        lp = self.procs(log_softmax(logits), t, history, prefix)
        K = min(self.K, V)
        ids = np.argpartition(-lp, K - 1, axis=1)[:, :K] if K < V else np.tile(np.arange(V), (len(lp), 1))
        return np.take_along_axis(lp, ids, axis=1).astype(np.float32), ids

    @property
    def rows_now(self) -> int:
        return len(self.sources) * self.k

    @staticmethod
    def top(values: np.ndarray, flat_index: np.ndarray, n: int) -> np.ndarray:
        """Positions of the n largest values per row, ties to the lower flat index."""
        order = np.lexsort((flat_index, -values.astype(np.float64)), axis=1)
        return order[:, :n]

    def advance(self, step: int, next_ids: np.ndarray, logits: np.ndarray, attention: np.ndarray | None = None):
        B, k, K, gen = len(self.sources), self.k, self.K, self.gen
        V = self.vocab
        t = (step - self.offset[self.sources])[:, None]  # (B, 1) tokens generated after the prefix
        free = t >= 0
        lp, ids = self.candidates(step, logits)  # (B*k, K')
        Kc = lp.shape[1]
        acc = (lp.reshape(B, k, Kc) + self.running_scores[:, :, None]).reshape(B, k * Kc)
        beam = np.repeat(np.arange(k), Kc)[None, :].repeat(B, 0)
        tok = ids.reshape(B, k * Kc)
        pick = self.top(acc, beam * V + tok, K)  # (B, K): topk over the batch item's k x V scores
        top_lp = np.take_along_axis(acc, pick, 1)
        top_beam = np.take_along_axis(beam, pick, 1)
        top_tok = np.take_along_axis(tok, pick, 1)
        top_seq = np.take_along_axis(self.running, top_beam[:, :, None], 1)
        top_seq[:, :, step] = top_tok
        if self.want_scores:
            top_seq_tok = np.take_along_axis(self.running_tok, top_beam[:, :, None], 1)
            top_seq_tok[:, :, step] = np.where(free, np.take_along_axis(lp.reshape(B, k * Kc), pick, 1), 0.0)
        if attention is not None:  # the step's attention is its parent row's
            top_seq_attn = np.take_along_axis(self.running_attn, top_beam[:, :, None, None], 1)
            top_seq_attn[:, :, step] = attention.reshape(B, k, -1)[np.arange(B)[:, None], top_beam]
        last = t + 1 == gen.max_new_tokens  # (B, 1)
        hits = ((top_tok == self.special.eos) & free) | last
        # the running beams of the next step: the best k that did not stop
        run_lp = (top_lp + hits.astype(np.float32) * NEG).astype(np.float32)
        nxt = self.top(run_lp, np.arange(K)[None, :].repeat(B, 0), k)
        self.running = np.take_along_axis(top_seq, nxt[:, :, None], 1)
        self.running_scores = np.take_along_axis(run_lp, nxt, 1)
        if self.want_scores:
            self.running_tok = np.take_along_axis(top_seq_tok, nxt[:, :, None], 1)
        if attention is not None:
            self.running_attn = np.take_along_axis(top_seq_attn, nxt[:, :, None, None], 1)
        parent = np.take_along_axis(top_beam, nxt, 1)
        # the finished hypotheses: merge the new ones (of the top k) by length-penalized score
        length = np.maximum(t + 1, 1)
        self.merge_finished(top_lp, top_seq, top_seq_tok if self.want_scores else None,
                            top_seq_attn if attention is not None else None, hits, length)
        return self.next_rows(step, length, t, last, hits, parent)

    def next_rows(self, step: int, length: np.ndarray, t: np.ndarray, last: np.ndarray, hits: np.ndarray,
                  parent: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The next step's tokens and the row each continues (`parent`: each running beam's), once
        the sources whose finished hypotheses can no longer change have left the batch, their beams
        with them: no running beam can beat its worst hypothesis, or (early_stopping True) it has k
        of them, or it reached its length limit. (None, None): every source is done."""
        B, k = len(self.sources), self.k
        self.improvable &= self.can_improve(length, t) | ~(t >= 0)
        frozen = (~self.improvable[:, 0] | (self.finished.all(axis=1) & (self.gen.early_stopping is True))
                  | last[:, 0])
        if frozen.all() or hits.all():
            return None, None
        beam_idx = np.arange(B)[:, None] * k + parent  # (B, k): the row each next row continues
        tokens = self.running[:, :, step]
        if frozen.any():
            self.retire(frozen)
            beam_idx, tokens = beam_idx[~frozen], tokens[~frozen]
        return tokens.reshape(-1), beam_idx.reshape(-1)

    def merge_finished(self, top_lp: np.ndarray, top_seq: np.ndarray, top_seq_tok: np.ndarray | None,
                       top_seq_attn: np.ndarray | None, hits: np.ndarray, length: np.ndarray) -> None:
        """The hypotheses that ended this step (of the top k candidates) merged into the finished
        ones by length-penalized score; none while a source's search may not take more."""
        B, k, K, gen = len(self.sources), self.k, self.K, self.gen
        just = hits & self.top_mask[None, :]
        fin_lp = (top_lp / (length ** gen.length_penalty).astype(np.float32)).astype(np.float32)
        full = self.finished.all(axis=1, keepdims=True) & (gen.early_stopping is True)
        fin_lp = fin_lp + full.astype(np.float32) * NEG
        fin_lp = fin_lp + (~self.improvable).astype(np.float32) * NEG
        fin_lp = (fin_lp + (~just).astype(np.float32) * NEG).astype(np.float32)
        m_scores = np.concatenate([self.scores, fin_lp], 1)
        m_seqs = np.concatenate([self.seqs, top_seq], 1)
        m_len = np.concatenate([self.lengths, np.broadcast_to(length, (B, K))], 1)
        m_fin = np.concatenate([self.finished, just], 1)
        keep = self.top(m_scores, np.arange(k + K)[None, :].repeat(B, 0), k)
        self.seqs = np.take_along_axis(m_seqs, keep[:, :, None], 1)
        self.scores = np.take_along_axis(m_scores, keep, 1)
        self.lengths = np.take_along_axis(m_len, keep, 1)
        self.finished = np.take_along_axis(m_fin, keep, 1)
        if top_seq_tok is not None:
            self.seqs_tok = np.take_along_axis(np.concatenate([self.seqs_tok, top_seq_tok], 1), keep[:, :, None], 1)
        if top_seq_attn is not None:
            self.seqs_attn = np.take_along_axis(np.concatenate([self.seqs_attn, top_seq_attn], 1),
                                                keep[:, :, None, None], 1)

    def can_improve(self, length: np.ndarray, t: np.ndarray) -> np.ndarray:
        """(B, 1): whether a running beam can still beat the worst finished hypothesis
        (transformers' is_early_stop_heuristic_unsatisfied)."""
        gen = self.gen
        if gen.early_stopping == "never" and gen.length_penalty > 0.0:
            best_len = np.full_like(t, gen.max_new_tokens)
        else:
            best_len = length
        best_running = self.running_scores[:, :1] / (best_len ** gen.length_penalty).astype(np.float32)
        worst = np.where(self.finished, self.scores.min(axis=1, keepdims=True), NEG)
        return np.asarray((best_running > worst).any(axis=1, keepdims=True))

    def retire(self, which: np.ndarray) -> None:
        """Store the sources `which` (of those still searched) in the result; keep searching the others."""
        searched: tuple[np.ndarray, ...] = (self.seqs, self.scores, self.lengths, self.seqs_tok, self.seqs_attn)
        for final, now in zip(self.final, searched):
            final[self.sources[which]] = now[which]
        keep = ~which
        self.sources = self.sources[keep]
        for name in ("running", "running_scores", "seqs", "scores", "lengths", "finished", "improvable",
                     "running_tok", "seqs_tok", "running_attn", "seqs_attn"):
            setattr(self, name, getattr(self, name)[keep])

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        self.retire(np.ones(len(self.sources), bool))
        seqs, scores, lengths, _, _ = self.final
        n = self.gen.num_return_sequences
        seqs = seqs[:, :n].reshape(self.B * n, -1)
        ends = lengths[:, :n] + self.offset[:, None]
        width = int(ends.max()) if seqs.size else 0
        return seqs[:, :width], scores[:, :n].reshape(-1)

    def per_token(self) -> np.ndarray:
        """(B x num_return_sequences, n) each token's processed log-prob (0 in the prefix and after
        the end): transformers' compute_transition_scores with the beam indices."""
        return self.hypotheses(3)

    def attentions(self) -> np.ndarray:
        """(B x num_return_sequences, n, src_len): each token's attention, 0 after the end."""
        return self.hypotheses(4)

    def hypotheses(self, which: int) -> np.ndarray:
        """A per-token array of the final hypotheses (self.final[which]), as wide as the ids."""
        seqs, _, lengths = self.final[:3]
        n = self.gen.num_return_sequences
        ends = lengths[:, :n] + self.offset[:, None]
        width = int(ends.max()) if seqs.size else 0
        arr = self.final[which][:, :n]
        out = arr.reshape(self.B * n, *arr.shape[2:])[:, :width]
        after = np.arange(width)[None, :] >= ends.reshape(-1)[:, None]  # past a hypothesis' end
        out[after] = 0
        return out
