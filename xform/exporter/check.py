"""The eager-PyTorch check of a bundle: what `xform run --check`, `xform.check` and export's
verification run.

Decode with a backend, then teacher-force its own best hypothesis through it and through eager
PyTorch (the bundle's reference checkpoint) step by step, and compare with the bundle's
tolerances (xform.runtime.compare holds the policy: the tolerances and the comparisons). It lives
in the exporter's layer because it needs both the runtime and the model; the exporter verifies
through it and xform.api re-exports it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from xform.errors import XformError
from xform.models.backend import TorchBackend
from xform.runtime.bench import padded_sources
from xform.runtime.bundle import Bundle
from xform.runtime.compare import (
    DECODE_SOURCES,
    CheckReport,
    compare_beams,
    compare_decodes,
    compare_steps,
    tolerance_for,
)
from xform.runtime.decoding import GenerationConfig
from xform.runtime.open import open_backend, open_session, session_over
from xform.runtime.session import Session


def check_sources(config: dict, batch: int, src_len: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random right-padded sources (no special ids inside) for --check when no text is given."""
    rng = np.random.default_rng(seed + 1)
    lengths = rng.integers(max(1, src_len // 2), src_len + 1, batch).astype(np.int64)
    lengths[0] = src_len
    return padded_sources(config, lengths, seed)


def check(bundle_dir: str | Path, backend: str = "ort", device: str | None = None, *, src_ids=None, src_lengths=None,
          texts: list[str] | None = None, max_new_tokens: int = 32, atol: float | None = None,
          rtol: float | None = None, batch: int = 4, src_len: int = 12, seed: int = 0,
          session: Session | None = None, generation: GenerationConfig | None = None,
          src_lang: str | None = None) -> CheckReport:
    """Decode with `backend` (greedy unless `generation` says otherwise), then teacher-force its own
    best hypothesis through it and through eager PyTorch step by step, and compare logits and
    greedy choices at every active position. With beams, also compare the hypotheses and their
    scores with eager PyTorch's own beam search."""
    session = session or open_session(bundle_dir, backend, device, torch_factory=TorchBackend.for_bundle)
    # the session's bundle is already verified: hash its files once, not again for the reference
    bundle = session.bundle if session.bundle is not None else Bundle.open(bundle_dir)
    reference = session_over(bundle, open_backend(bundle, "torch", "cpu", torch_factory=TorchBackend.for_bundle))
    cfg = session.config
    if texts:
        src_ids = session.encode_texts(texts, src_lang)
    tol = tolerance_for(session.bundle.precision)
    if src_ids is None:
        batch = max(batch, DECODE_SOURCES) if tol.by_decodes else batch  # judging translations needs many
        src_ids, src_lengths = check_sources(cfg, batch, min(src_len, cfg["max_len"]), seed)
    src_ids, src_lengths = session.prepare(src_ids, src_lengths)
    gen = generation or GenerationConfig(max_new_tokens=min(max_new_tokens, cfg["max_len"]))
    beams = None
    if gen.strategy == "beam":  # one search gives the best hypotheses and the scores compared below
        beams = session.decode(src_ids, src_lengths, gen, return_scores=True)
        tokens = beams[0][::gen.num_return_sequences]
        tokens = tokens[:, : int((tokens != cfg["pad_id"]).any(axis=0).nonzero()[0].max(initial=-1)) + 1]
    else:
        tokens = session.decode(src_ids, src_lengths, gen.updated(num_return_sequences=1))
    if tokens.shape[1] == 0:
        raise XformError("--check generated no tokens; raise --new-tokens")
    got_choice, got_logits = session.teacher_forced(src_ids, src_lengths, tokens)
    ref_choice, ref_logits = reference.teacher_forced(src_ids, src_lengths, tokens)
    # active: every step up to and including the row's end-of-sentence
    ended = np.cumsum(tokens == cfg["eos_id"], axis=1)
    active = (ended == 0) | ((ended == 1) & (tokens == cfg["eos_id"]))
    report = compare_steps(session.backend_name, session.bundle.precision, got_logits, ref_logits,
                           got_choice, ref_choice, active,
                           tol.atol if atol is None else atol, tol.rtol if rtol is None else rtol,
                           tol.min_token_agreement)
    report.strategy = gen.strategy
    ref = None
    if beams is not None:
        ref = reference.decode(src_ids, src_lengths, gen, return_scores=True)
        compare_beams(report, beams, ref, tol.score_atol, tol.score_rtol)
    if tol.by_decodes:  # eager's own translations, teacher-forced through both sides
        ref_tokens = ref[0][::gen.num_return_sequences] if ref is not None else reference.decode(
            src_ids, src_lengths, gen.updated(num_return_sequences=1))
        ref_tokens = ref_tokens[:, :max(1, int((ref_tokens != cfg["pad_id"]).any(axis=0).sum()))]
        _, got_tf = session.teacher_forced(src_ids, src_lengths, ref_tokens)
        _, ref_tf = reference.teacher_forced(src_ids, src_lengths, ref_tokens)
        compare_decodes(report, tokens, ref_tokens, got_tf, ref_tf, cfg["eos_id"], cfg["pad_id"], tol)
    return report
