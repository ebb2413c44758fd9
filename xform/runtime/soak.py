"""Soak a Session: many decodes in varied shapes, resident memory sampled as it goes.

Shapes vary call by call (batch 1..max_batch, source length 1..max_src_len, 1..max_new new tokens,
greedy, beam search and sampling), and text goes through `translate` when the bundle has a
tokenizer. The warm-up first runs the largest shapes, so that every allocator (ONNX Runtime's
arena, numpy's) has reached its high-water mark; after it, resident memory (VmRSS, not the peak)
must stay flat. Used by tests/test_soak.py (short) and scripts/soak.py (hours).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, TypedDict

import numpy as np

from xform.runtime.bench import random_sources, rss_mib
from xform.runtime.session import Session
from xform.runtime.text.translator import Translator


class Settings(TypedDict, total=False):
    """The generate() keywords a soak call varies."""
    num_beams: int
    do_sample: bool
    top_k: int
    seed: int


@dataclass
class SoakReport:
    steps: int = 0  # decoder steps run (one per generated position, whatever the batch)
    calls: int = 0
    warm_rss_mib: float = 0.0  # after the warm-up
    samples: list[tuple[int, float]] = field(default_factory=list)  # (steps so far, RSS MiB)

    @property
    def growth_mib(self) -> float:
        """Largest RSS after the warm-up minus RSS at its end."""
        return max((r for _, r in self.samples), default=self.warm_rss_mib) - self.warm_rss_mib


def soak(session: Session, steps: int, max_batch: int = 16, max_src_len: int = 24, max_new: int = 24,
         seed: int = 0, texts: list[str] | None = None, on_sample: Callable[[SoakReport], None] | None = None,
         sample_every: int = 500) -> SoakReport:
    rng = np.random.default_rng(seed)
    cfg = session.config
    max_src_len = min(max_src_len, cfg.max_len)
    max_new = min(max_new, cfg.max_len)
    report = SoakReport()
    translator = Translator(session) if texts and session.tokenizer is not None else None

    def one(batch: int, src_len: int, new: int, kind: str) -> int:
        src = random_sources(cfg, batch, src_len, int(rng.integers(1 << 30)))
        choices: dict[str, Settings] = {"greedy": {}, "beam": {"num_beams": 3},
                                        "sample": {"do_sample": True, "top_k": 10, "seed": int(rng.integers(1 << 30))}}
        settings = choices[kind]
        session.generate(src, max_new_tokens=new, min_new_tokens=new, **settings)
        if translator is not None and texts:
            picked = [texts[int(i)] for i in rng.integers(0, len(texts), batch)]
            translator.translate(picked, max_new_tokens=new, **settings)
        return new

    for kind in ("greedy", "beam", "sample"):  # warm-up: the largest shapes first
        one(max_batch, max_src_len, max_new, kind)
    for _ in range(20):
        one(int(rng.integers(1, max_batch + 1)), int(rng.integers(1, max_src_len + 1)), max_new, "greedy")
    report.warm_rss_mib = rss_mib()
    next_sample = sample_every
    while report.steps < steps:
        kind = rng.choice(["greedy", "greedy", "beam", "sample"])
        report.steps += one(int(rng.integers(1, max_batch + 1)), int(rng.integers(1, max_src_len + 1)),
                            int(rng.integers(1, max_new + 1)), str(kind))
        report.calls += 1
        if report.steps >= next_sample:
            report.samples.append((report.steps, rss_mib()))
            next_sample += sample_every
            if on_sample is not None:
                on_sample(report)
    report.samples.append((report.steps, rss_mib()))
    return report
