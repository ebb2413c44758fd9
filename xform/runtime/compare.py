"""Numerical comparison of a backend with the eager reference (Polygraphy's comparator, in small).

Floats are cast up to float64 before diffing; NaN or inf in either side fails; an element passes
when |got - ref| <= atol + rtol * |ref| (numpy.allclose); tokens compare exactly. The report says
the smallest atol (at the given rtol) that would have passed.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


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

    @property
    def passed(self) -> bool:
        return (not self.nonfinite and self.min_passing_atol <= self.atol
                and self.token_agreement >= self.min_token_agreement)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["passed"] = self.passed
        return d


def compare_steps(backend: str, precision: str, got_logits: np.ndarray, ref_logits: np.ndarray,
                  got_choice: np.ndarray, ref_choice: np.ndarray, active: np.ndarray,
                  atol: float, rtol: float, min_token_agreement: float) -> CheckReport:
    """Logits (B, n, V) and greedy choices (B, n) of both sides, compared where `active` (B, n)."""
    if got_logits.shape != ref_logits.shape:
        raise ValueError(f"logits shapes differ: backend {got_logits.shape}, reference {ref_logits.shape}")
    g = got_logits[active].astype(np.float64)  # (N, V)
    r = ref_logits[active].astype(np.float64)
    nonfinite = bool(not np.isfinite(g).all() or not np.isfinite(r).all())
    diff = np.abs(g - r)
    max_abs = float(diff.max()) if diff.size else 0.0
    rel = diff / np.maximum(np.abs(r), np.finfo(np.float32).tiny)
    max_rel = float(rel.max()) if rel.size else 0.0
    min_atol = float(np.max(diff - rtol * np.abs(r), initial=0.0))
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


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    min_token_agreement: float
    reason: str


# DESIGN section 4. One table, read by export verification and by --check.
TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(1e-4, 0.0, 1.0, "fp32 graphs: same math as eager, only kernel order differs"),
}


def tolerance_for(precision: str) -> Tolerance:
    return TOLERANCES[precision]
