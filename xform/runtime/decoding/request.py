"""One request and one result: what every front door parses into and gets back.

The CLI's flags (cli), the Python keywords (`Session.request`, the translator's methods) and
Triton's tensors (serving/handler.py `parse`) each build a `Request` in one place; the decoding
loop (`Session.run`, the `Scheduler`) runs it and answers a `Result`, named fields instead of a
tuple whose length depends on what was asked. `Session.generate` keeps its documented tuple
(`Result.astuple`).

What the request holds is checked where it is built (`Session.request`): sources right-padded
int64 within the vocabulary, the generation config within the model, the prefixes one a source.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable

import numpy as np

from xform.errors import InputError, SettingError
from xform.runtime.decoding.generation import GenerationConfig

# a request's options that are not generation settings (Session.request)
REQUEST_OPTIONS = ("target_prefix", "return_scores", "return_token_scores", "return_attention", "vocabulary",
                   "constraints")


def refuse_unknown(given: Iterable[str], known: Iterable[str], what: str = "decoding option") -> None:
    """An InputError naming each unknown name `given`, with the nearest known one where one is near
    (a misspelt option), and the known ones: every Python door's refusal of a name it does not take."""
    known = sorted(set(known))
    unknown = sorted(set(given) - set(known))
    if unknown:
        said = [f"{u!r} (did you mean {near[0]!r}?)" if (near := difflib.get_close_matches(u, known, 1)) else repr(u)
                for u in unknown]
        raise InputError(f"unknown {what}{'s' if len(unknown) > 1 else ''} {', '.join(said)}; known: "
                         f"{', '.join(known)}")


def one_a_source(value: Any, batch: int, label: str, what: str, setting: str) -> None:
    """A request option given per source (target prefixes, constraints) checked as one: a list of
    `what`, one a source; else a SettingError naming `setting` (`label`: how the message names it)."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise SettingError(f"{label} must be a list of {what}, one a source, got {type(value).__name__}", setting)
    if len(value) != batch:
        raise SettingError(f"{label} has {len(value)} entries for {batch} sources: give one a source (an empty one "
                           "for none)", setting)


@dataclass(frozen=True, eq=False)
class Request:
    """One decode: its sources (ids; with their texts when they came as text), how to decode
    them, and what to return."""

    src_ids: np.ndarray  # (B, S) int64, right-padded with the pad id
    src_lengths: np.ndarray  # (B,) int64
    generation: GenerationConfig
    target_prefix: tuple[tuple[int, ...], ...] | None = None  # one id list a source (empty: none)
    return_scores: bool = False
    return_token_scores: bool = False
    return_attention: bool = False
    # the sources as text, when they came as text: unknown replacement copies source words from
    # them, a vocabulary map reads their n-grams
    texts: tuple[str, ...] | None = None
    replace_unknowns: bool = False  # unknown target tokens become source words (the translator's)
    vocabulary: np.ndarray | None = None  # target ids a restricted decode may generate (decodes alone)
    # per source, phrases (each a tuple of target ids) every hypothesis must contain, contiguously,
    # in any order (constraints.py); an empty tuple: none for that source
    constraints: tuple[tuple[tuple[int, ...], ...], ...] | None = None
    # the beam a greedy request with constraints is searched with (constraints.smallest_beam), None
    # where it was not promoted; `generation` holds it already
    promoted_beams: int | None = None

    @property
    def batch(self) -> int:
        return int(self.src_ids.shape[0])

    @property
    def rows(self) -> int:
        """Decoder rows the request asks for: sources x beams, or x sequences."""
        gen = self.generation
        return self.batch * (gen.num_beams if gen.strategy == "beam" else gen.num_return_sequences)

    @property
    def wants_scores(self) -> bool:
        return self.return_scores or self.return_token_scores

    @property
    def wants_attention(self) -> bool:
        return self.return_attention or self.replace_unknowns

    def sources(self) -> list[list[int]]:
        """Each source's ids without padding."""
        return [[int(i) for i in row[:n]] for row, n in zip(self.src_ids, self.src_lengths)]

    def prefixes(self) -> list[list[int]] | None:
        return None if self.target_prefix is None else [list(p) for p in self.target_prefix]


@dataclass(frozen=True, eq=False)
class Result:
    """What a decode returns, `n` hypotheses a source one after another (n: num_return_sequences):
    `ids` (B x n, length) int64, pad after each row's end-of-sentence; when asked, `scores`
    (B x n,) float32 (beam search's length-penalized sum of log-probs, else the sum),
    `token_scores` (B x n, length) float32 (each token's log-prob, 0 in a prefix and after the
    end) and `attention` (B x n, length, src_len) float32. With constraints: `unmet` (B x n lists)
    each hypothesis' phrases it does not contain, by their index in its source's constraints (empty
    when it has them all: a hypothesis that misses some comes only where none met them all within
    the length limit), and `promoted_beams` the beam a greedy request was searched with (None: not
    promoted)."""

    ids: np.ndarray
    scores: np.ndarray | None = None
    token_scores: np.ndarray | None = None
    attention: np.ndarray | None = None
    unmet: list[list[int]] | None = None
    promoted_beams: int | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def astuple(self) -> np.ndarray | tuple[np.ndarray, ...]:
        """What `Session.generate` returns: the ids alone, or the ids then what was asked
        (scores, token scores, attention), in that order."""
        out = tuple(a for a in (self.ids, self.scores, self.token_scores, self.attention) if a is not None)
        return out if len(out) > 1 else out[0]

    def rows(self, start: int, stop: int) -> "Result":
        """The hypotheses [start, stop)."""
        def part(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[start:stop]
        return Result(self.ids[start:stop], part(self.scores), part(self.token_scores), part(self.attention),
                      None if self.unmet is None else self.unmet[start:stop], self.promoted_beams)

    def every(self, n: int) -> "Result":
        """Each source's best of its n hypotheses."""
        def best(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[::n]
        return replace(self, ids=self.ids[::n], scores=best(self.scores), token_scores=best(self.token_scores),
                       attention=best(self.attention), unmet=None if self.unmet is None else self.unmet[::n])


@dataclass(frozen=True)
class TextOptions:
    """How texts become sources and translations become results, besides the generation config:
    what every text entry point takes (the CLI's text flags, the translator's keywords, `xform
    corpus` and `xform.ray` parse into it). `scores`: False, True (a score a translation) or
    "tokens" (and each token's log-prob); `prefix_column`: a line is `source<TAB>target prefix`;
    `vocab_map`: a VocabMap or its file (a bundle exported --with-vocab-map), not part of
    `to_dict` (a corpus records its own); `terminology`: a glossary and kept spans every
    translation must hold (text/glossary.py, enforced as constraints of the search); `qe`: each
    translation's confidence (text/confidence.py)."""
    scores: bool | str = False
    src_lang: str | None = None
    tgt_lang: str | None = None
    truncate: bool = False
    prefix_column: bool = False
    replace_unknowns: bool = False
    vocab_map: Any = None
    terminology: Any = None  # text/glossary.py's Terminology: terms and kept spans the translation must hold
    qe: bool = False  # a confidence for every translation (text/confidence.py)

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("vocab_map", "terminology")}
        if self.terminology:  # what a corpus records of it: its fingerprint (a changed glossary is another job)
            out["terminology"] = self.terminology.fingerprint()
        return out


@dataclass(frozen=True)
class LineResult:
    """One line of a stream translated (Translator.translate_lines): its text as read, its
    num_return_sequences `hypotheses` (a blank line: empty ones; a line that failed: none, and
    its `error`: a str in Python's words, an errors.Message where it names a setting, which a door
    renders in its own), their `scores` when asked (else empty) and each one's `token_scores`
    when asked ("tokens"; else empty); with a terminology, each hypothesis' `unmet` terms (what it
    could not hold within the length cap) and `promoted_beams` (the beam a greedy decode took to
    hold them); with qe, each hypothesis' `confidence` in [0, 1]."""
    text: str
    hypotheses: list[str]
    scores: list[float] = field(default_factory=list)
    token_scores: list[list[float]] = field(default_factory=list)
    error: str | None = None
    confidence: list[float] = field(default_factory=list)
    unmet: list[list[str]] = field(default_factory=list)
    promoted_beams: int | None = None


@dataclass(frozen=True)
class TranslationResult:
    """One source's translations, best first (CTranslate2's TranslationResult): `hypotheses` as
    text for a text, token lists (CTranslate2's) for a token list; `scores` when asked (else
    empty). xform's additions: with a glossary, each hypothesis' `unmet` terms and the beam a
    greedy decode was `promoted_beams` to; with qe, each hypothesis' `confidence`."""

    hypotheses: list[Any]
    scores: list[float] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    unmet: list[list[str]] = field(default_factory=list)
    promoted_beams: int | None = None


@dataclass(frozen=True)
class ScoringResult:
    """A target's log-likelihood (CTranslate2's ScoringResult): `tokens` its target ids for a text,
    its pieces and "</s>" for a token list (CTranslate2's), `log_probs` each one's log-probability."""

    tokens: list[Any]
    log_probs: list[float]


@dataclass(frozen=True)
class GenerationStepResult:
    """One token as it is generated (CTranslate2's GenerationStepResult): `log_prob` with
    return_log_prob (else None); one source and one hypothesis: `batch_id` and `hypothesis_id` 0.
    translate_batch's `callback` is given one a token of each decoded example: `batch_id` its
    index in the call, `hypothesis_id` its sample, `log_prob` with return_scores. `logits` is
    None (CTranslate2's return_logits_vocab is not offered)."""

    step: int
    token_id: int
    token: str
    is_last: bool
    log_prob: float | None = None
    batch_id: int = 0
    hypothesis_id: int = 0
    logits: Any = None
