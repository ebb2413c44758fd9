"""Lexical constraints: phrases of target ids every hypothesis must contain, tracked per hypothesis.

A request's `constraints` give, per source, phrases (tuples of target ids) that must each appear,
contiguously, in every hypothesis it returns: a glossary's terms, a span kept as written. Which of
them a hypothesis has met is tracked as fairseq tracks its unordered constraints
(token_generation_constraints.py `UnorderedConstraintState`, the representation of Hu et al.
2019): the phrases of a source form a trie; a hypothesis stands at one of its nodes (the phrase
it is inside, how far) and counts, per node, the phrase tokens it has `generated` there (met or
in progress) and the phrases it has `completed` there. A token that continues no phrase falls
off the trie: the longest phrase the hypothesis was inside that is complete is counted met, the
tokens of the rest given back. A phrase given twice must appear twice. The order of the phrases
is free (fairseq's "unordered").

Here that state is arrays, one row a hypothesis (`Progress`), and the trie is tables (`Constraints`),
so that one step advances every candidate of every source at once: the search
(constrained.py) extends thousands of candidates a step, where fairseq walks Python objects.

What the search reads of a hypothesis' state: its `bank` (constraint tokens generated: the beam
is shared between banks, Post & Vilar 2018), whether it is `finished` (every phrase met: only
then may it end), and which phrases it `met` (a result reports the others).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from xform.errors import SettingError
from xform.runtime.decoding.generation import GenerationConfig, int_id
from xform.runtime.decoding.request import one_a_source

# per source, its phrases: each a tuple of target ids (Request.constraints)
Phrases = tuple[tuple[tuple[int, ...], ...], ...]


@dataclass(frozen=True)
class Progress:
    """Hypotheses' constraint states, one row each: the trie `node` each stands at (0: the root),
    and per node the phrase tokens `generated` there and the phrases `completed` there."""

    node: np.ndarray  # (R,) int64
    generated: np.ndarray  # (R, N) int32
    completed: np.ndarray  # (R, N) int32

    def take(self, rows: np.ndarray) -> "Progress":
        """The states of `rows` (a reorder, a selection, copies)."""
        return Progress(self.node[rows], self.generated[rows], self.completed[rows])

    @property
    def bank(self) -> np.ndarray:
        """(R,) constraint tokens generated (fairseq's bank): of the phrases met and of the one in progress."""
        return self.generated.sum(1)


class Constraints:
    """The tries of a batch's sources as tables (source, node): node 0 is a source's root; the
    other nodes are phrase tokens, a phrase the path from the root to its last token's node."""

    def __init__(self, phrases: Sequence[Sequence[Sequence[int]]]):
        self.phrases = [[tuple(int(i) for i in p) for p in ps] for ps in phrases]
        tries = [self.trie(ps) for ps in self.phrases]
        B = len(tries)
        N = max(len(t[0]) for t in tries)
        D = max((len(p) for ps in self.phrases for p in ps), default=1)
        P = max((len(ps) for ps in self.phrases), default=0)
        self.token = np.full((B, N), -1, np.int64)
        self.terminal = np.zeros((B, N), np.int32)  # phrases ending at the node
        self.count = np.zeros((B, N), np.int32)  # phrases through the node (fairseq's num_constraints)
        self.path = np.full((B, N, D), -1, np.int64)  # the nodes from depth 1 down to the node
        self.ends = np.full((B, max(P, 1)), -1, np.int64)  # each phrase's last node
        self.rank = np.zeros((B, max(P, 1)), np.int32)  # its place among the phrases ending there
        for s, (parent, token, ends) in enumerate(tries):
            self.fill(s, parent, token, ends)
        self.children = self.child_table(tries, N)
        self.keys, self.values, self.width = self.edges(tries, N)

    @staticmethod
    def trie(phrases: list[tuple[int, ...]]) -> tuple[list[int], list[int], list[int]]:
        """One source's trie: each node's parent and token (the root: -1, -1), each phrase's last node."""
        parent, token, ends = [-1], [-1], []
        child: dict[tuple[int, int], int] = {}
        for phrase in phrases:
            node = 0
            for tok in phrase:
                if (node, tok) not in child:
                    child[node, tok] = len(parent)
                    parent.append(node)
                    token.append(tok)
                node = child[node, tok]
            ends.append(node)
        return parent, token, ends

    def fill(self, s: int, parent: list[int], token: list[int], ends: list[int]) -> None:
        """Source `s`'s rows of the node tables."""
        self.token[s, :len(token)] = token
        for n in range(1, len(parent)):
            up = [n]
            while parent[up[-1]] > 0:
                up.append(parent[up[-1]])
            self.path[s, n, :len(up)] = up[::-1]
        for i, end in enumerate(ends):
            self.ends[s, i] = end
            self.rank[s, i] = self.terminal[s, end]
            self.terminal[s, end] += 1
            node = end
            while node >= 0:
                self.count[s, node] += 1
                node = parent[node]

    @staticmethod
    def child_table(tries, N: int) -> np.ndarray:
        """(B, N, F): each node's children's tokens, -1 after them."""
        kids: list[list[list[int]]] = [[[] for _ in range(N)] for _ in tries]
        for s, (parent, token, _) in enumerate(tries):
            for n in range(1, len(parent)):
                kids[s][parent[n]].append(token[n])
        F = max((len(k) for ks in kids for k in ks), default=0)
        table = np.full((len(tries), N, max(F, 1)), -1, np.int64)
        for s, ks in enumerate(kids):
            for n, k in enumerate(ks):
                table[s, n, :len(k)] = k
        return table

    @staticmethod
    def edges(tries, N: int) -> tuple[np.ndarray, np.ndarray, int]:
        """The edges (source, node, token) -> child as sorted int64 keys and their children."""
        width = 1 + max((t for _, token, _ in tries for t in token), default=0)
        pairs = sorted(((s * N + parent[n]) * width + token[n], n)
                       for s, (parent, token, _) in enumerate(tries) for n in range(1, len(parent)))
        keys = np.array([k for k, _ in pairs], np.int64)
        return keys, np.array([n for _, n in pairs], np.int64), width

    @property
    def nodes(self) -> int:
        return self.token.shape[1]

    def start(self, rows: int) -> Progress:
        """`rows` hypotheses at their roots, nothing generated."""
        N = self.nodes
        return Progress(np.zeros(rows, np.int64), np.zeros((rows, N), np.int32), np.zeros((rows, N), np.int32))

    def child(self, src: np.ndarray, node: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """(R,) the child of each `node` (of source `src`) by its token, -1 where none."""
        if not len(self.keys):
            return np.full(len(tokens), -1, np.int64)
        inside = (tokens >= 0) & (tokens < self.width)
        key = (src * self.nodes + node) * self.width + np.where(inside, tokens, 0)
        at = np.minimum(np.searchsorted(self.keys, key), len(self.keys) - 1)
        return np.where(inside & (self.keys[at] == key), self.values[at], -1)

    def next_tokens(self, state: Progress, src: np.ndarray) -> np.ndarray:
        """(R, 2F) the tokens that would advance each hypothesis (fairseq's next_tokens: those that
        start a phrase, and those that continue the one it is inside), -1 for none; repeats possible."""
        inside = np.where(state.node[:, None] > 0, self.children[src, state.node], -1)
        return np.concatenate([self.children[src, 0], inside], 1)

    def open(self, generated: np.ndarray, src: np.ndarray, node: np.ndarray) -> np.ndarray:
        """(R,) whether each `node` (-1: none) has a phrase through it not yet generated there."""
        at = np.maximum(node, 0)
        return (node >= 0) & (generated[np.arange(len(node)), at] < self.count[src, at])

    def advance(self, state: Progress, src: np.ndarray, tokens: np.ndarray) -> Progress:
        """Each hypothesis (`state`, of source `src`) after one more token (fairseq's advance): the
        child by that token if its phrases are not all generated yet; else, after falling off
        (`rewind`), the phrase that token starts, or the root. Unlike fairseq, a phrase may start
        again at the token that broke it off (`1 2 1 2 3` meets `1 2 3`): whether it can is read
        after the rewind gave the broken phrase's tokens back, where fairseq reads it before."""
        rows = np.arange(len(tokens))
        generated, completed = state.generated.copy(), state.completed.copy()
        child = self.child(src, state.node, tokens)
        ok = self.open(generated, src, child)
        fell = ~ok & (state.node > 0)
        if fell.any():
            self.rewind(generated, completed, state.completed, rows[fell], src[fell], state.node[fell])
        first = self.child(src, np.zeros_like(state.node), tokens)
        node = np.where(ok, child, np.where(self.open(generated, src, first), first, 0))
        moved = node > 0
        generated[rows[moved], node[moved]] += 1
        return Progress(node, generated, completed)

    def rewind(self, generated: np.ndarray, completed: np.ndarray, before: np.ndarray, rows: np.ndarray,
               src: np.ndarray, node: np.ndarray) -> None:
        """Hypotheses `rows` fell off the trie at `node`: up its path, the deepest node that ends a
        phrase not yet completed there is counted completed (the phrase was met), and the tokens of
        the nodes below it are given back (fairseq's rewind). In place; `before`: the completed
        counts before this step."""
        path = self.path[src, node]  # (F, D)
        on = path >= 0
        p = np.maximum(path, 0)
        ends = self.terminal[src[:, None], p]
        done = on & (ends > 0) & (before[rows[:, None], p] < ends)
        depth = np.arange(path.shape[1])[None, :]
        deepest = np.where(done, depth, -1).max(1)
        back = on & (depth > deepest[:, None])
        r, d = np.nonzero(back)
        generated[rows[r], p[r, d]] -= 1
        met = deepest >= 0
        completed[rows[met], p[met, deepest[met]]] += 1

    def in_final(self, state: Progress, src: np.ndarray) -> np.ndarray:
        """(R,) whether the node a hypothesis stands at ends a phrase it has not completed there
        yet: that phrase is met (the path to it is the last tokens)."""
        rows = np.arange(len(src))
        ends = self.terminal[src, state.node]
        return (ends > 0) & (state.completed[rows, state.node] < ends)

    def num_completed(self, state: Progress, src: np.ndarray) -> np.ndarray:
        """(R,) phrases met (fairseq's num_completed)."""
        return state.completed.sum(1) + self.in_final(state, src)

    def finished(self, state: Progress, src: np.ndarray) -> np.ndarray:
        """(R,) whether every phrase of each hypothesis' source is met: only then may it end."""
        return self.num_completed(state, src) == self.count[src, 0]

    def met(self, state: Progress, src: np.ndarray) -> np.ndarray:
        """(R, P) whether each phrase is met (False past a source's phrases): of the phrases that
        end at one node (a phrase given twice), as many as were completed there."""
        rows = np.arange(len(src))[:, None]
        ends = self.ends[src]
        e = np.maximum(ends, 0)
        here = (state.node[:, None] == ends) & self.in_final(state, src)[:, None]
        return (ends >= 0) & (self.rank[src] < state.completed[rows, e] + here)

    def unmet(self, met: np.ndarray, src: int) -> list[int]:
        """The indices of source `src`'s phrases not met, from a hypothesis' `met` row."""
        return [i for i in range(len(self.phrases[src])) if not met[i]]


def smallest_beam(constraints: Phrases) -> int:
    """The beam a greedy request with constraints is searched with: one more than the most phrases
    of a source, at least 2. Post & Vilar's banks need a beam of at least C + 1 to keep a
    hypothesis in each bank (C constraints met, down to none), fairseq's --constraints the same;
    xform counts phrases, not their tokens, so that a long term does not multiply the cost."""
    return max(2, 1 + max((len(c) for c in constraints), default=0))


def check_constraints(constraints: Any, batch: int, vocab: int, never: set[int],
                      gen: GenerationConfig) -> Phrases | None:
    """The constraints as tuples, checked: one entry a source (an empty one for none), each a list
    of phrases, each a non-empty list of target ids within the vocabulary, none an id that is
    never generated (`never`: end-of-sentence, pad, banned, suppressed), none longer than
    max_new_tokens. None, or no phrase at all: none."""
    if constraints is None:
        return None
    one_a_source(constraints, batch, "{constraints}", "phrase lists", "constraints")
    out = tuple(tuple(check_phrase(p, i, j, vocab, never, gen.max_new_tokens) for j, p in enumerate(phrases_of(c, i)))
                for i, c in enumerate(constraints))
    return out if any(out) else None


def phrases_of(entry: Any, i: int) -> list:
    """Source `i`'s entry as a list of phrases."""
    if isinstance(entry, (str, bytes)) or not hasattr(entry, "__iter__"):
        raise SettingError(f"{{constraints}}[{i}]: expected a list of phrases (id lists), got {entry!r}",
                           "constraints")
    return list(entry)


def check_phrase(phrase: Any, i: int, j: int, vocab: int, never: set[int], cap: int) -> tuple[int, ...]:
    """Phrase j of source i as a tuple of ids, checked."""
    where = f"{{constraints}}[{i}][{j}]"
    try:
        if isinstance(phrase, (str, bytes)):
            raise TypeError("text, not ids")
        ids = tuple(int_id(x) for x in phrase)
    except (TypeError, ValueError) as e:
        raise SettingError(f"{where}: expected a list of token ids, got {phrase!r} ({e})", "constraints") from None
    if not ids:
        raise SettingError(f"{where} is empty: a phrase needs at least one id", "constraints")
    outside = [x for x in ids if x >= vocab]
    if outside:
        raise SettingError(f"{where}: id {outside[0]} is outside the target vocabulary of {vocab}", "constraints")
    banned = [x for x in ids if x in never]
    if banned:
        raise SettingError(f"{where}: id {banned[0]} is never generated (end-of-sentence, pad, a banned or "
                           "suppressed id), so no hypothesis could contain it", "constraints")
    if len(ids) > cap:
        raise SettingError(f"{where} has {len(ids)} ids, more than {{max_new_tokens}} {cap}: no hypothesis could "
                           "contain it", "constraints", "max_new_tokens")
    return ids


def constrained_generation(gen: GenerationConfig, constraints: Phrases | None) -> tuple[GenerationConfig, int | None]:
    """The generation config a request with constraints decodes with, and the beam a greedy one
    was promoted to (None: not promoted). Constraints are a beam search's: sampling and
    alternatives refuse them."""
    if constraints is None or gen.strategy == "beam":
        return gen, None
    if gen.strategy != "greedy":
        said = "{do_sample}" if gen.strategy == "sample" else "{return_alternatives}"
        raise SettingError(f"{{constraints}} are met by beam search: not with {said}", "constraints",
                           "do_sample" if gen.strategy == "sample" else "return_alternatives")
    beams = smallest_beam(constraints)
    return replace(gen, num_beams=beams), beams
