"""Decoding strategies: greedy, sampling and beam search, as small state machines over numpy.

The loop that drives a backend is written once (session.py); a strategy only says how many rows
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

from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from xform.errors import InputError

NEG = np.float32(-1.0e9)  # transformers' "finished / impossible" offset, added in float32
FLAGS = {"max_new_tokens": "--max-new-tokens", "min_new_tokens": "--min-new-tokens", "num_beams": "--num-beams",
         "length_penalty": "--length-penalty", "early_stopping": "--early-stopping",
         "num_return_sequences": "--num-return-sequences", "do_sample": "--sample", "temperature": "--temperature",
         "top_k": "--top-k", "top_p": "--top-p", "seed": "--seed", "forced_bos_token_id": "--forced-bos-id"}


# The longest decode unless the bundle or the caller says otherwise: CTranslate2's
# max_decoding_length. Not the position table's size: a tutorial model's table holds 5,000
# positions, and one source that never yields end-of-sentence would decode all of them. A fixed
# cap rather than fairseq's a * source length + b: it cannot cut a legitimate translation of a
# short source into a wordier language, beams and samples of one source keep one length limit (as
# transformers' max_length), and a runaway row costs only its own steps once the other rows have
# left the batch. docs/design.md "A decode cap that does not come from a table size".
DEFAULT_MAX_NEW_TOKENS = 256


def decode_cap(generation: dict[str, Any], max_len: int) -> tuple[int, str]:
    """The default max_new_tokens of a bundle and where it comes from: the bundle's own
    `max_new_tokens` (set at export), else the model's `max_length` less its start token
    (transformers counts it), else DEFAULT_MAX_NEW_TOKENS; never beyond the position table."""
    if generation.get("max_new_tokens") is not None:
        n, why = int(generation["max_new_tokens"]), "set at export with --max-new-tokens"
    elif generation.get("max_length") is not None:
        n = int(generation["max_length"]) - 1
        why = f"the model's max_length {generation['max_length']} less the start token"
    else:
        n, why = DEFAULT_MAX_NEW_TOKENS, f"xform's default {DEFAULT_MAX_NEW_TOKENS}, CTranslate2's max_decoding_length"
    if n > max_len:
        n, why = max_len, f"{why}, cut to the model's max_len {max_len}"
    return max(1, n), why


def named(param: str) -> str:
    return f"{param} ({FLAGS[param]})" if param in FLAGS else param


@dataclass(frozen=True)
class GenerationConfig:
    """How to decode. Defaults are greedy; a bundle may record others (a Marian import does)."""
    max_new_tokens: int = 64
    min_new_tokens: int = 0
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False  # True, False or "never", as in transformers
    num_return_sequences: int = 1
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    seed: int | None = None
    forced_eos: bool = False  # end-of-sentence forced at the last step (transformers' forced_eos_token_id)
    # the first generated token, whatever the logits say (transformers' forced_bos_token_id: a
    # multilingual model's target language); it scores 0, as transformers' processor gives it
    forced_bos_token_id: int | None = None

    def __post_init__(self):
        problems = []

        def whole(name, low):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                problems.append(f"{named(name)} must be an integer >= {low}, got {v!r}")

        whole("max_new_tokens", 0)
        whole("min_new_tokens", 0)
        whole("num_beams", 1)
        whole("num_return_sequences", 1)
        whole("top_k", 0)
        if not problems and self.min_new_tokens > self.max_new_tokens:
            problems.append(f"{named('min_new_tokens')} {self.min_new_tokens} exceeds "
                            f"{named('max_new_tokens')} {self.max_new_tokens}")
        if self.early_stopping not in (True, False, "never"):
            problems.append(f"{named('early_stopping')} must be true, false or never, got {self.early_stopping!r}")
        if not isinstance(self.length_penalty, (int, float)) or not np.isfinite(self.length_penalty):
            problems.append(f"{named('length_penalty')} must be a finite number, got {self.length_penalty!r}")
        if not isinstance(self.temperature, (int, float)) or not self.temperature > 0 or not np.isfinite(self.temperature):
            problems.append(f"{named('temperature')} must be > 0, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            problems.append(f"{named('top_p')} must be in (0, 1], got {self.top_p!r}")
        if self.forced_bos_token_id is not None and (isinstance(self.forced_bos_token_id, bool) or not isinstance(
                self.forced_bos_token_id, (int, np.integer)) or self.forced_bos_token_id < 0):
            problems.append(f"{named('forced_bos_token_id')} must be a token id (an integer >= 0), got "
                            f"{self.forced_bos_token_id!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))
                                      or self.seed < 0):
            problems.append(f"{named('seed')} must be a non-negative integer, got {self.seed!r}")
        if not problems:
            if self.do_sample and self.num_beams > 1:
                problems.append(f"{named('do_sample')} with {named('num_beams')} {self.num_beams}: beam sampling is "
                                "not supported; sample with num_beams 1, or search beams without sampling")
            elif self.num_beams > 1 and self.num_return_sequences > self.num_beams:
                problems.append(f"{named('num_return_sequences')} {self.num_return_sequences} exceeds "
                                f"{named('num_beams')} {self.num_beams}: beam search returns at most its beams")
            elif self.num_beams == 1 and not self.do_sample and self.num_return_sequences > 1:
                problems.append(f"{named('num_return_sequences')} {self.num_return_sequences} needs beams "
                                f"({named('num_beams')} >= it) or sampling ({FLAGS['do_sample']}); greedy "
                                "decoding has one answer")
        if problems:
            raise InputError("invalid generation settings:\n  - " + "\n  - ".join(problems))

    @property
    def strategy(self) -> str:
        return "beam" if self.num_beams > 1 else "sample" if self.do_sample else "greedy"

    def updated(self, **changes: Any) -> "GenerationConfig":
        """A copy with the given fields changed (None means: keep)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Special:
    pad: int
    eos: int
    blocked: tuple[int, ...]  # never generated: the pad id and the model's banned ids
    vocab: int = 0  # the target vocabulary's size (beam search orders candidates by beam x vocab + id)

    @classmethod
    def from_config(cls, config: dict) -> "Special":
        blocked = sorted({config["pad_id"], *config.get("banned_ids", ())})
        return cls(config["pad_id"], config["eos_id"], tuple(blocked), config["tgt_vocab_size"])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float32, as torch computes it: (x - max) - log(sum(exp(x - max)))."""
    x = logits.astype(np.float32, copy=False)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True, dtype=np.float32))


def process(scores: np.ndarray, step: int, gen: GenerationConfig, special: Special) -> np.ndarray:
    """transformers' logits processors, in place, on (rows, V) scores, in its order: blocked ids
    never, end-of-sentence not before min_new_tokens, the forced first token, and end-of-sentence
    forced at the last step when asked."""
    scores[:, list(special.blocked)] = -np.inf
    if step < gen.min_new_tokens:
        scores[:, special.eos] = -np.inf
    if gen.forced_bos_token_id is not None and step == 0:
        scores[:] = -np.inf
        scores[:, gen.forced_bos_token_id] = 0.0
    if gen.forced_eos and step == gen.max_new_tokens - 1:
        scores[:] = -np.inf
        scores[:, special.eos] = 0.0
    return scores


class Greedy:
    """The graph's own ArgMax (next_ids); logits only when scores are asked for. A row leaves the
    batch when it ends (with samples, when every sample of its source has ended)."""

    group = 1  # rows a source
    candidates_wanted = 0  # beam search asks the backend for ranked candidates instead of logits

    def __init__(self, batch: int, gen: GenerationConfig, special: Special, want_scores: bool = False):
        self.rows, self.gen, self.special = batch * self.group, gen, special
        self.needs_logits = want_scores
        self.active = np.arange(self.rows)  # the original row of each row the backend still runs
        self.done = np.zeros(self.rows, bool)
        self.out = np.full((self.rows, gen.max_new_tokens), special.pad, np.int64)
        self.steps = 0
        self.scores = np.zeros(self.rows, np.float32) if want_scores else None

    def choose(self, step: int, next_ids: np.ndarray, logits: np.ndarray | None) -> np.ndarray:
        if self.gen.forced_eos and step == self.gen.max_new_tokens - 1:
            return np.full_like(next_ids, self.special.eos)
        if self.gen.forced_bos_token_id is not None and step == 0:
            return np.full_like(next_ids, self.gen.forced_bos_token_id)
        return next_ids

    def advance(self, step: int, next_ids: np.ndarray, logits: np.ndarray | None):
        act = self.active
        done = self.done[act]
        nxt = np.where(done, self.special.pad, self.choose(step, next_ids, logits)).astype(np.int64)
        if self.scores is not None:
            lp = process(log_softmax(logits), step, self.gen, self.special)
            self.scores[act] += np.where(done, 0.0, lp[np.arange(len(act)), nxt]).astype(np.float32)
        self.out[act, step] = nxt
        self.steps = step + 1
        self.done[act] = done | (nxt == self.special.eos)
        if self.done.all():
            return None, None
        running = ~self.done[act].reshape(-1, self.group).all(axis=1)  # a source's rows leave together
        if running.all():
            return nxt, None
        keep = np.flatnonzero(np.repeat(running, self.group))
        self.active = act[keep]
        return nxt[keep], keep

    def result(self) -> tuple[np.ndarray, np.ndarray | None]:
        return self.out[:, :self.steps], self.scores


class Sample(Greedy):
    """Multinomial sampling after temperature, top-k and top-p (transformers' warpers, in that
    order), from a seeded numpy generator: the same seed gives the same tokens on one backend."""

    def __init__(self, batch: int, gen: GenerationConfig, special: Special, want_scores: bool = False):
        self.group = gen.num_return_sequences
        super().__init__(batch, gen, special, want_scores)
        self.needs_logits = True
        self.rng = np.random.default_rng(gen.seed)

    def choose(self, step: int, next_ids: np.ndarray, logits: np.ndarray | None) -> np.ndarray:
        scores = process(logits.astype(np.float64), step, self.gen, self.special) / self.gen.temperature
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
    """transformers' vectorized beam search (generation/utils.py `_beam_search`), in numpy."""

    def __init__(self, batch: int, gen: GenerationConfig, special: Special, want_scores: bool = False):
        self.B, self.k, self.gen, self.special = batch, gen.num_beams, gen, special
        self.group = self.k
        self.K = 2 * self.k  # beams_to_keep: max(2, 1 + one end-of-sentence id) * num_beams
        self.rows = batch * self.k
        self.needs_logits = True
        n = gen.max_new_tokens
        B, k = batch, self.k
        self.running = np.full((B, k, n), special.pad, np.int64)  # generated ids, without the start id
        self.running_scores = np.zeros((B, k), np.float32)
        self.running_scores[:, 1:] = NEG  # all beams start equal: only the first may be extended
        self.seqs = np.full((B, k, n), special.pad, np.int64)  # finished hypotheses
        self.scores = np.full((B, k), NEG, np.float32)
        self.lengths = np.zeros((B, k), np.int64)
        self.finished = np.zeros((B, k), bool)
        self.improvable = np.ones((B, 1), bool)  # is_early_stop_heuristic_unsatisfied
        self.top_mask = np.arange(self.K) < k
        self.sources = np.arange(B)  # the original source of each one still searched
        self.vocab = special.vocab
        self.final = (self.seqs.copy(), self.scores.copy(), self.lengths.copy())  # by original source

    @property
    def candidates_wanted(self) -> int:
        return self.K

    def candidates(self, step: int, logits) -> tuple[np.ndarray, np.ndarray]:
        """Per row, the top-K processed log-probs and their ids: (rows, K) each. `logits` is either
        the (rows, V) logits, ranked here, or the backend's candidates graph's (log-probs, ids),
        which applied every processor but the forced tokens."""
        forced = self.forced(step)
        if isinstance(logits, tuple):
            lp, ids = logits
            if forced is not None:  # that token, nothing else
                lp, ids = np.full_like(lp, -np.inf), ids.copy()
                lp[:, 0], ids[:, 0] = 0.0, forced
            return lp, ids
        V = logits.shape[1]
        logits = logits.astype(np.float32, copy=False)
        m = logits.max(axis=1, keepdims=True)
        lse = np.log(np.exp(logits - m).sum(axis=1, keepdims=True, dtype=np.float32))
        masked = process(logits.copy(), step, self.gen, self.special)
        K = min(self.K, V)
        ids = np.argpartition(-masked, K - 1, axis=1)[:, :K] if K < V else np.tile(np.arange(V), (len(logits), 1))
        raw = np.take_along_axis(logits, ids, axis=1)
        lp = (raw - m) - lse  # log_softmax of the candidates only, in float32
        keep = np.take_along_axis(masked, ids, axis=1)
        lp = np.where(np.isfinite(keep), lp, keep).astype(np.float32)  # processors: -inf (or a forced 0)
        if forced is not None:
            lp = np.where(ids == forced, np.float32(0.0), lp).astype(np.float32)
        return lp, ids

    def forced(self, step: int) -> int | None:
        """The token a processor forces at this step (scored 0), else None."""
        if self.gen.forced_eos and step == self.gen.max_new_tokens - 1:
            return self.special.eos
        if self.gen.forced_bos_token_id is not None and step == 0:
            return self.gen.forced_bos_token_id
        return None

    @staticmethod
    def top(values: np.ndarray, flat_index: np.ndarray, n: int) -> np.ndarray:
        """Positions of the n largest values per row, ties to the lower flat index."""
        order = np.lexsort((flat_index, -values.astype(np.float64)), axis=1)
        return order[:, :n]

    def advance(self, step: int, next_ids: np.ndarray, logits: np.ndarray):
        B, k, K, gen = len(self.sources), self.k, self.K, self.gen
        V = self.vocab
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
        last = step + 1 == gen.max_new_tokens
        hits = (top_tok == self.special.eos) | last
        # the running beams of the next step: the best k that did not stop
        run_lp = (top_lp + hits.astype(np.float32) * NEG).astype(np.float32)
        nxt = self.top(run_lp, np.arange(K)[None, :].repeat(B, 0), k)
        self.running = np.take_along_axis(top_seq, nxt[:, :, None], 1)
        self.running_scores = np.take_along_axis(run_lp, nxt, 1)
        parent = np.take_along_axis(top_beam, nxt, 1)
        # the finished hypotheses: merge the new ones (of the top k) by length-penalized score
        just = hits & self.top_mask[None, :]
        fin_lp = (top_lp / np.float32((step + 1) ** gen.length_penalty)).astype(np.float32)
        full = self.finished.all(axis=1, keepdims=True) & (gen.early_stopping is True)
        fin_lp = fin_lp + full.astype(np.float32) * NEG
        fin_lp = fin_lp + (~self.improvable).astype(np.float32) * NEG
        fin_lp = (fin_lp + (~just).astype(np.float32) * NEG).astype(np.float32)
        m_scores = np.concatenate([self.scores, fin_lp], 1)
        m_seqs = np.concatenate([self.seqs, top_seq], 1)
        m_len = np.concatenate([self.lengths, np.full((B, K), step + 1)], 1)
        m_fin = np.concatenate([self.finished, just], 1)
        keep = self.top(m_scores, np.arange(k + K)[None, :].repeat(B, 0), k)
        self.seqs = np.take_along_axis(m_seqs, keep[:, :, None], 1)
        self.scores = np.take_along_axis(m_scores, keep, 1)
        self.lengths = np.take_along_axis(m_len, keep, 1)
        self.finished = np.take_along_axis(m_fin, keep, 1)
        # can a running beam still beat the worst finished one?
        if gen.early_stopping == "never" and gen.length_penalty > 0.0:
            best_len = gen.max_new_tokens
        else:
            best_len = step + 1
        best_running = self.running_scores[:, :1] / np.float32(best_len ** gen.length_penalty)
        worst = np.where(self.finished, self.scores.min(axis=1, keepdims=True), NEG)
        self.improvable &= (best_running > worst).any(axis=1, keepdims=True)
        go_on = (self.improvable.any() and not (self.finished.all() and gen.early_stopping is True)
                 and not hits.all())
        if not go_on or last:
            return None, None
        beam_idx = np.arange(B)[:, None] * k + parent  # (B, k): the row each next row continues
        tokens = self.running[:, :, step]
        # a source whose finished hypotheses can no longer change leaves the batch, its beams with it:
        # no running beam can beat its worst hypothesis, or (early_stopping True) it has k of them
        frozen = ~self.improvable[:, 0] | (self.finished.all(axis=1) & (gen.early_stopping is True))
        if frozen.any():
            self.retire(frozen)
            beam_idx, tokens = beam_idx[~frozen], tokens[~frozen]
        return tokens.reshape(-1), beam_idx.reshape(-1)

    def retire(self, which: np.ndarray) -> None:
        """Store the sources `which` (of those still searched) in the result; keep searching the others."""
        for final, now in zip(self.final, (self.seqs, self.scores, self.lengths)):
            final[self.sources[which]] = now[which]
        keep = ~which
        self.sources = self.sources[keep]
        for name in ("running", "running_scores", "seqs", "scores", "lengths", "finished", "improvable"):
            setattr(self, name, getattr(self, name)[keep])

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        self.retire(np.ones(len(self.sources), bool))
        seqs, scores, lengths = self.final
        n = self.gen.num_return_sequences
        seqs = seqs[:, :n].reshape(self.B * n, -1)
        width = int(lengths[:, :n].max()) if seqs.size else 0
        return seqs[:, :width], scores[:, :n].reshape(-1)


def make_strategy(batch: int, gen: GenerationConfig, special: Special, want_scores: bool = False):
    kind = {"greedy": Greedy, "sample": Sample, "beam": BeamSearch}[gen.strategy]
    return kind(batch, gen, special, want_scores)
