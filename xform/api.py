"""The Python API: `xform.load` makes a Session on a backend; `xform.check` compares it with eager.

Backends are imported when asked for: `ort` needs onnxruntime only, `torch` needs torch and the
model (the reference), `trt` needs TensorRT and a GPU.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from xform.errors import XformError
from xform.runtime.bench import random_sources
from xform.runtime.bundle import Bundle
from xform.runtime.compare import (DECODE_SOURCES, CheckReport, compare_beams, compare_decodes, compare_steps,
                                   tolerance_for)
from xform.runtime.decoding import GenerationConfig
from xform.runtime.session import Session
from xform.runtime.tokenizer import load_tokenizer

BACKENDS = ("torch", "ort", "trt")
DEVICES = ("cpu", "cuda")


def default_device(backend: str) -> str:
    return "cuda" if backend == "trt" else "cpu"


def make_backend(bundle: Bundle, backend: str, device: str | None, threads: int | None):
    device = device or default_device(backend)
    if device not in DEVICES:
        raise XformError(f"unknown device {device!r}; choose from {DEVICES}")
    if backend == "ort":
        from xform.runtime.ort_backend import OrtBackend
        return OrtBackend(bundle, device, threads)
    if backend == "trt":
        from xform.runtime.trt_backend import TrtBackend
        return TrtBackend(bundle, device)
    if backend == "torch":
        from xform.models.backend import TorchBackend
        from xform.models.checkpoint import load_checkpoint
        return TorchBackend(load_checkpoint(bundle.file(bundle.manifest["reference"]["dir"])), device, threads,
                            bundle.manifest.get("attention_layer"))
    raise XformError(f"unknown backend {backend!r}; choose from {BACKENDS}")


def session_for(bundle: Bundle, backend: str, device: str | None = None, threads: int | None = None) -> Session:
    """A Session over an opened (already verified) bundle."""
    tok = bundle.tokenizer_file
    tokenizer = load_tokenizer(tok, bundle.config) if tok else None
    return Session(make_backend(bundle, backend, device, threads), bundle.config, tokenizer, bundle)


def load(bundle_dir: str | Path, backend: str = "ort", device: str | None = None, threads: int | None = None) -> Session:
    """device: cpu or cuda; by default cpu for torch and ort, cuda for trt."""
    return session_for(Bundle.open(bundle_dir), backend, device, threads)


def check_sources(config: dict, batch: int, src_len: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random right-padded sources (no special ids inside) for --check when no text is given."""
    ids = random_sources(config, batch, src_len, seed)
    rng = np.random.default_rng(seed + 1)
    lengths = rng.integers(max(1, src_len // 2), src_len + 1, batch).astype(np.int64)
    lengths[0] = src_len
    for r, n in enumerate(lengths):
        ids[r, n - 1] = config["eos_id"]
        ids[r, n:] = config["pad_id"]
    return ids, lengths


def check(bundle_dir: str | Path, backend: str = "ort", device: str | None = None, *, src_ids=None, src_lengths=None,
          texts: list[str] | None = None, max_new_tokens: int = 32, atol: float | None = None,
          rtol: float | None = None, batch: int = 4, src_len: int = 12, seed: int = 0,
          session: Session | None = None, generation: GenerationConfig | None = None,
          src_lang: str | None = None) -> CheckReport:
    """Decode with `backend` (greedy unless `generation` says otherwise), then teacher-force its own
    best hypothesis through it and through eager PyTorch step by step, and compare logits and
    greedy choices at every active position. With beams, also compare the hypotheses and their
    scores with eager PyTorch's own beam search."""
    session = session or load(bundle_dir, backend, device)
    # the session's bundle is already verified: hash its files once, not again for the reference
    bundle = session.bundle if session.bundle is not None else Bundle.open(bundle_dir)
    reference = session_for(bundle, "torch", "cpu")
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
