"""Numerical comparison of a backend with the eager reference (Polygraphy's comparator, in small).

Floats are cast up to float64 before diffing; NaN or inf in either side fails. An element passes
when |got - ref| <= atol + rtol * scale, where scale is max |ref| along the last axis (for logits:
the largest logit magnitude at that step), so the relative error of a logit is measured against
the step's logit scale, not against its own value (an elementwise ratio explodes near zero).
Tokens compare exactly. The report says the smallest atol (at the given rtol) that would pass.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from xform.runtime.decoding.request import Result


@dataclass
class CheckReport:
    backend: str
    precision: str
    atol: float
    rtol: float
    min_token_agreement: float
    max_abs_err: float
    max_rel_err: float
    min_passing_atol: float
    token_agreement: float
    tokens_compared: int
    identical_tokens: bool
    first_divergence: tuple[int, int] | None  # (row, step) of the first differing greedy choice
    nonfinite: bool
    batch: int
    steps: int
    strategy: str = "greedy"
    # beam search: the backend's hypotheses and scores against eager PyTorch's own beam search
    beam_hypotheses: int = 0
    beam_hypotheses_identical: float | None = None  # fraction of hypotheses token-identical
    beam_score_max_abs_err: float | None = None  # over identical hypotheses
    beam_score_tolerance: str | None = None
    beam_scores_within: bool = True
    # reduced precisions judged by their translations (Tolerance.by_decodes): the backend's whole
    # decodes against eager PyTorch's, and eager's tokens' log-probs under both
    judged_by: str = "logits"
    decodes_compared: int = 0
    decode_agreement: float | None = None  # mean over sources of 1 - edit distance / length
    decodes_identical: float | None = None  # fraction of sources decoded to the same tokens
    logprob_drop: float | None = None  # mean nats a token eager's decodes lose under the backend
    min_decode_agreement: float = 0.0
    max_logprob_drop: float = float("inf")
    # what the sources were: "sentences" (given text or ids: a sample file, --text, --input-file) or
    # "random" token ids, out of distribution for a trained model, where a reduced precision's whole
    # decodes (and near-ties) are chaotic in any precision: only gross breakage is judged on them
    sources: str = "sentences"
    # BLEU and chrF of the backend's translations against eager PyTorch's (sacreBLEU, when installed)
    bleu_vs_eager: float | None = None
    chrf_vs_eager: float | None = None
    # fp32 matmuls ran in TF32 (--allow-tf32 on CUDA, engines built --tf32): judged by TF32_TOLERANCE
    tf32: bool = False

    @property
    def gross_only(self) -> bool:
        """Judged for gross breakage only: a reduced precision on random sources."""
        return self.sources == "random" and self.precision != "fp32"

    @property
    def passed(self) -> bool:
        by_decodes = self.judged_by == "decodes"  # then logit errors and beam scores are reported, not judged
        agreement = GROSS_TOKEN_AGREEMENT if self.gross_only else self.min_token_agreement
        beams_ok = self.beam_hypotheses_identical is None or self.gross_only or (
            (by_decodes or self.beam_scores_within) and self.beam_hypotheses_identical >= self.min_token_agreement)
        if by_decodes:
            judged = (self.logprob_drop is not None and self.logprob_drop <= self.max_logprob_drop
                      and (self.gross_only or (self.decode_agreement is not None
                                               and self.decode_agreement >= self.min_decode_agreement)))
        else:
            judged = self.min_passing_atol <= self.atol
        return not self.nonfinite and self.token_agreement >= agreement and beams_ok and judged

    def to_dict(self) -> dict:
        d = asdict(self)
        d["passed"] = self.passed
        return d


def excess(got: np.ndarray, ref: np.ndarray, rtol: float,
           scale: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """|got - ref|, the same relative to scale, and |got - ref| - rtol * scale, all in float64. The
    scale is the reference's largest |value| along the last axis unless given."""
    g, r = got.astype(np.float64), ref.astype(np.float64)
    diff = np.abs(g - r)
    if scale is None:
        scale = np.abs(r).max(axis=-1, keepdims=True) if r.ndim and r.shape[-1] else np.zeros_like(r)
    return diff, diff / np.maximum(scale, np.finfo(np.float32).tiny), diff - rtol * scale


def compare_steps(backend: str, precision: str, got_logits: np.ndarray, ref_logits: np.ndarray,
                  got_choice: np.ndarray, ref_choice: np.ndarray, active: np.ndarray,
                  atol: float, rtol: float, min_token_agreement: float) -> CheckReport:
    """Logits (B, n, V) and greedy choices (B, n) of both sides, compared where `active` (B, n)."""
    if got_logits.shape != ref_logits.shape:
        raise ValueError(f"logits shapes differ: backend {got_logits.shape}, reference {ref_logits.shape}")
    g, r = got_logits[active], ref_logits[active]  # (N, V)
    nonfinite = bool(not np.isfinite(g).all() or not np.isfinite(r).all())
    diff, rel, over = excess(g, r, rtol)
    max_abs = float(diff.max(initial=0.0))
    max_rel = float(rel.max(initial=0.0))
    min_atol = float(over.max(initial=0.0))
    agree = (got_choice == ref_choice) & active
    n = int(active.sum())
    differ = np.argwhere((got_choice != ref_choice) & active)
    first = None
    if len(differ):
        step = differ[:, 1].min()
        row = differ[differ[:, 1] == step][0, 0]
        first = (int(row), int(step))
    return CheckReport(
        backend=backend, precision=precision, atol=atol, rtol=rtol,
        min_token_agreement=min_token_agreement, max_abs_err=max_abs, max_rel_err=max_rel,
        min_passing_atol=min_atol, token_agreement=(float(agree.sum()) / n if n else 1.0),
        tokens_compared=n, identical_tokens=first is None, first_divergence=first,
        nonfinite=nonfinite, batch=int(active.shape[0]), steps=int(active.shape[1]))


def compare_beams(report: CheckReport, got: Result, ref: Result,
                  score_atol: float, score_rtol: float) -> None:
    """Beam hypotheses (ids, scores) of the backend and of eager PyTorch: the fraction that are
    token-identical, and |score - eager score| <= score_atol + score_rtol * |eager score| on those."""
    (g_ids, g_scores), (r_ids, r_scores) = (got.ids, got.scores), (ref.ids, ref.scores)
    assert g_scores is not None and r_scores is not None  # both decodes asked for scores
    width = max(g_ids.shape[1], r_ids.shape[1])
    pad = lambda a: np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=-1)  # noqa: E731
    same = (pad(g_ids) == pad(r_ids)).all(axis=1)
    g, r = g_scores.astype(np.float64)[same], r_scores.astype(np.float64)[same]
    diff = np.abs(g - r)
    report.beam_hypotheses = int(len(same))
    report.beam_hypotheses_identical = float(same.mean()) if len(same) else 1.0
    report.beam_score_max_abs_err = float(diff.max(initial=0.0))
    report.beam_score_tolerance = f"atol {score_atol:g} + rtol {score_rtol:g} x |score|"
    within = (diff <= score_atol + score_rtol * np.abs(r)).all()
    report.beam_scores_within = bool(np.isfinite(g_scores).all() and within)


def edit_distance(a: list[int], b: list[int]) -> int:
    """Levenshtein distance between two token sequences."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def decoded(row: np.ndarray, eos: int, pad: int) -> list[int]:
    """A generated row's tokens up to and including its end-of-sentence, without padding."""
    out = []
    for t in row.tolist():
        if t == pad:
            break
        out.append(t)
        if t == eos:
            break
    return out


def merge_steps(parts: list[tuple[int, CheckReport]]) -> CheckReport:
    """One report from compare_steps' reports on consecutive row chunks (each with its first row):
    the worst errors, the token agreement over every compared token, the earliest divergence (the
    first row among those at the earliest step), as one call over every row gives."""
    if not parts:
        raise ValueError("merge_steps: no reports to merge")
    head = parts[0][1]
    reports = [r for _, r in parts]
    n = sum(r.tokens_compared for r in reports)
    agreeing = sum(round(r.token_agreement * r.tokens_compared) for r in reports)  # counts, as compare_steps
    divergences = [(r.first_divergence[1], start + r.first_divergence[0]) for start, r in parts
                   if r.first_divergence is not None]
    first = min(divergences) if divergences else None
    return CheckReport(
        backend=head.backend, precision=head.precision, atol=head.atol, rtol=head.rtol,
        min_token_agreement=head.min_token_agreement, max_abs_err=max(r.max_abs_err for r in reports),
        max_rel_err=max(r.max_rel_err for r in reports), min_passing_atol=max(r.min_passing_atol for r in reports),
        token_agreement=agreeing / n if n else 1.0,
        tokens_compared=n, identical_tokens=first is None,
        first_divergence=None if first is None else (first[1], first[0]),
        nonfinite=any(r.nonfinite for r in reports), batch=sum(r.batch for r in reports),
        steps=max(r.steps for r in reports))


def compare_decodes(report: CheckReport, got: np.ndarray, ref: np.ndarray, drops: np.ndarray, eos: int, pad: int,
                    tol: "Tolerance") -> None:
    """Whole decodes (B, n) of the backend and of eager PyTorch, and the nats each token of
    eager's decodes loses under the backend (`drops`, logprob_drops' over every row): how alike
    the translations are, and how much less likely eager's own translations are."""
    pairs = [(decoded(g, eos, pad), decoded(r, eos, pad)) for g, r in zip(got, ref)]
    report.judged_by = "decodes"
    report.decodes_compared = len(pairs)
    report.decodes_identical = float(np.mean([g == r for g, r in pairs]))
    report.decode_agreement = float(np.mean([1 - edit_distance(g, r) / max(len(g), len(r), 1) for g, r in pairs]))
    report.logprob_drop = float(drops.mean()) if drops.size else 0.0
    report.min_decode_agreement, report.max_logprob_drop = tol.min_decode_agreement, tol.max_logprob_drop


def logprob_drops(ref: np.ndarray, got_logits: np.ndarray, ref_logits: np.ndarray, eos: int, pad: int) -> np.ndarray:
    """Eager's decodes `ref` (rows, n) teacher-forced through both sides (logits (rows, m, V)):
    the log-prob each of their tokens loses under the backend, row by row (float64, as the whole
    vocabulary's log-sum-exp is taken one row at a time to bound memory)."""
    out = []
    for row, got_row, ref_row in zip(ref, got_logits, ref_logits):
        ids = decoded(row, eos, pad)[:ref_row.shape[0]]
        if ids:
            pick = (np.arange(len(ids)), np.asarray(ids))
            out.append(token_logprobs(ref_row[:len(ids)], pick) - token_logprobs(got_row[:len(ids)], pick))
    return np.concatenate(out) if out else np.zeros(0)


def token_logprobs(logits: np.ndarray, pick: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """log_softmax(logits)[pick] in float64, without the (n, V) log_softmax array."""
    x = logits.astype(np.float64)
    top = x.max(axis=-1)
    return x[pick] - top - np.log(np.exp(x - top[:, None]).sum(axis=-1))


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    min_token_agreement: float
    reason: str
    score_atol: float = 0.0  # beam hypotheses' scores (length-penalized sums of log-probs)
    score_rtol: float = 0.0
    # judged by translations instead of logits: whole decodes against eager's, over at least
    # DECODE_SOURCES sources, and the log-prob eager's tokens lose; logit errors only reported
    by_decodes: bool = False
    min_decode_agreement: float = 0.0
    max_logprob_drop: float = float("inf")


DECODE_SOURCES = 64  # sources a check decodes when judging by decodes and no text is given
# Random token ids are no trained model's input: its decodes of them are chaotic in any precision
# (a faithful int8 Marian decodes its own task's sentences exactly like eager, random ids only 85%
# alike). On them a reduced precision is judged for what no working quantization does: NaNs, eager's
# tokens losing more than max_logprob_drop nats (a weight scale off by a factor), teacher-forced
# greedy choices agreeing less often than this.
GROSS_TOKEN_AGREEMENT = 0.75


# docs/quality.md "Tolerances". One table, read by export verification and by --check. A beam score sums up to
# max_new_tokens log-probs; each moves by at most twice its logits' error (the logit and the
# log-sum-exp), so a score's tolerance is looser than a logit's.
TOLERANCES: dict[str, Tolerance] = {
    # rtol: 1e-6 of the step's largest logit, about 8 float32 ulps of it: a logit bias of -1e4 (a
    # user's way to ban a token) puts rounding of 1e-3 into every logit of its step
    "fp32": Tolerance(1e-4, 1e-6, 1.0, "fp32 graphs: same math as eager, only kernel order differs", 1e-3, 0.0),
    "fp16": Tolerance(0.0, 1e-2, 0.99, "fp16 weights and K/V: logits within 1% of the step's logit scale",
                      0.0, 2e-2),
    "int8": Tolerance(0.0, 1e-1, 0.90, "int8 weights, dynamically quantized activations: judged by translations "
                                      "(whole decodes alike, the reference's tokens barely less likely); logit "
                                      "errors reported, not judged", 0.0, 0.2,
                      by_decodes=True, min_decode_agreement=0.90, max_logprob_drop=0.10),
}


# fp32 graphs whose matmuls ran in TF32 (ONNX Runtime on CUDA with --allow-tf32, or engines built
# --tf32): their inputs keep fp16's 10 mantissa bits, so fp16's tolerance, not fp32's
TF32_TOLERANCE = Tolerance(0.0, 1e-2, 0.99, "fp32 with TF32 matmuls (inputs rounded to 10 mantissa bits, as fp16's): "
                           "fp16's tolerance; fp32 alone holds atol 1e-4", 0.0, 2e-2)


# export --weights (exporter/weights.py): MatMul weights blockwise int8 / int4, activations in the bundle's
# precision. Judged by translations, as int8 is: int4's rounding (1/16 of a block's range) moves logits
# far more than fp16 does, and a faithful model's translations barely
WEIGHT_TOLERANCES: dict[str, Tolerance] = {
    "int8": Tolerance(0.0, 1e-1, 0.90, "int8 weights (weight-only, blockwise), activations unquantized: judged by "
                                      "translations; logit errors reported, not judged", 0.0, 0.2,
                      by_decodes=True, min_decode_agreement=0.90, max_logprob_drop=0.10),
    "int4": Tolerance(0.0, 2e-1, 0.85, "int4 weights (weight-only, blockwise), activations unquantized: judged by "
                                      "translations; logit errors reported, not judged", 0.0, 0.4,
                      by_decodes=True, min_decode_agreement=0.80, max_logprob_drop=0.20),
}


def tolerance_for(precision: str, tf32: bool = False, weights: str | None = None) -> Tolerance:
    """The bundle precision's tolerance; an fp32 bundle run with TF32 matmuls gets TF32_TOLERANCE,
    a weight-only quantized one (`weights` int8 / int4) its weights' tolerance."""
    if weights is not None:
        return WEIGHT_TOLERANCES[weights]
    return TF32_TOLERANCE if tf32 and precision == "fp32" else TOLERANCES[precision]
