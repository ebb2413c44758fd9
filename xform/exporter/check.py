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

from xform.config import TransformerConfig
from xform.errors import InputError, XformError, message
from xform.models.backend import TorchBackend
from xform.runtime.bench import padded_sources
from xform.runtime.bundle import Bundle
from xform.runtime.compare import (
    DECODE_SOURCES,
    CheckReport,
    compare_beams,
    compare_decodes,
    compare_steps,
    decoded,
    logprob_drops,
    merge_steps,
    tolerance_for,
)
from xform.runtime.decoding.generation import GenerationConfig
from xform.runtime.decoding.request import Request, Result
from xform.runtime.open import open_backend, open_session, session_over
from xform.runtime.session import Session
from xform.runtime.text.text_policy import TextPolicy

SAMPLE_LINES = 256  # export --sample-file: the sources it judges on, at most


def check_sources(config: TransformerConfig, batch: int, src_len: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
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
        src_ids = TextPolicy(session).encode_texts(texts, src_lang)
    # fp32 matmuls in TF32 (--allow-tf32, engines built --tf32): judged as TF32 (compare.py)
    tf32 = bool(getattr(session.backend, "tf32", False)) and session.bundle.precision == "fp32"
    tol = tolerance_for(session.bundle.precision, tf32, session.bundle.weights)
    sources = "sentences" if src_ids is not None else "random"
    if src_ids is None:
        batch = max(batch, DECODE_SOURCES) if tol.by_decodes else batch  # judging translations needs many
        src_ids, src_lengths = check_sources(cfg, batch, min(src_len, cfg.max_len), seed)
    src_ids, src_lengths = session.prepare(src_ids, src_lengths)
    gen = generation or GenerationConfig(max_new_tokens=min(max_new_tokens, cfg.max_len))
    beams = None
    if gen.strategy == "beam":  # one search gives the best hypotheses and the scores compared below
        beams = session.run(Request(src_ids, src_lengths, gen, return_scores=True))
        tokens = beams.ids[::gen.num_return_sequences]
        tokens = tokens[:, : int((tokens != cfg.pad_id).any(axis=0).nonzero()[0].max(initial=-1)) + 1]
    else:
        tokens = session.run(Request(src_ids, src_lengths, gen.updated(num_return_sequences=1))).ids
    if tokens.shape[1] == 0:
        raise XformError("--check generated no tokens; raise --new-tokens")
    report = compare_forced(session, reference, src_ids, src_lengths, tokens, tol.atol if atol is None else atol,
                            tol.rtol if rtol is None else rtol, tol.min_token_agreement)
    report.strategy, report.sources, report.tf32 = gen.strategy, sources, tf32
    ref = None
    if beams is not None:
        ref = reference.run(Request(src_ids, src_lengths, gen, return_scores=True))
        compare_beams(report, beams, ref, tol.score_atol, tol.score_rtol)
    if tol.by_decodes or (sources == "sentences" and session.bundle.precision != "fp32"):
        ref_tokens = eager_decodes(reference, ref, src_ids, src_lengths, gen, cfg.pad_id)
        if tol.by_decodes:  # eager's own translations, teacher-forced through both sides
            drops = [logprob_drops(ref_tokens[rows], *forced_both(session, reference, src_ids, src_lengths,
                                                                  ref_tokens, rows)[1::2], cfg.eos_id, cfg.pad_id)
                     for rows in row_chunks(ref_tokens.shape, cfg.tgt_vocab_size)]
            compare_decodes(report, tokens, ref_tokens, np.concatenate(drops) if drops else np.zeros(0), cfg.eos_id,
                            cfg.pad_id, tol)
        # on sentences every reduced precision reports BLEU / chrF against eager (fp16: beside its logits)
        report.bleu_vs_eager, report.chrf_vs_eager = text_scores(session, tokens, ref_tokens)
    return report


# one side's teacher-forced logits held at once: 64 sources x 33 steps of a 256,000-id vocabulary
# (MADLAD-400's) were 2.2 GB a side, and the comparison's float64 temporaries several times that
LOGIT_BYTES = 256 << 20


def row_chunks(shape: tuple[int, ...], vocab: int) -> list[slice]:
    """Consecutive row slices of a (rows, steps) token array whose logits fit LOGIT_BYTES."""
    rows, steps = shape[0], shape[1]
    n = max(1, LOGIT_BYTES // max(1, steps * vocab * 4))
    return [slice(a, min(a + n, rows)) for a in range(0, rows, n)]


def forced_both(session: Session, reference: Session, src_ids: np.ndarray, src_lengths: np.ndarray,
                tokens: np.ndarray, rows: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`tokens[rows]` teacher-forced through the backend and through eager PyTorch: (choices,
    logits) of each, in that order."""
    got = session.teacher_forced(src_ids[rows], src_lengths[rows], tokens[rows])
    ref = reference.teacher_forced(src_ids[rows], src_lengths[rows], tokens[rows])
    return got[0], got[1], ref[0], ref[1]


def compare_forced(session: Session, reference: Session, src_ids: np.ndarray, src_lengths: np.ndarray,
                   tokens: np.ndarray, atol: float, rtol: float, min_agreement: float) -> CheckReport:
    """The backend's own decodes teacher-forced through both sides, logits and greedy choices
    compared at every step up to and including each row's end-of-sentence, a chunk of rows at a
    time (row_chunks) so that a large vocabulary's logits never all sit in memory."""
    eos = session.config.eos_id
    ended = np.cumsum(tokens == eos, axis=1)
    active = (ended == 0) | ((ended == 1) & (tokens == eos))
    parts = []
    for rows in row_chunks(tokens.shape, session.config.tgt_vocab_size):
        got_choice, got_logits, ref_choice, ref_logits = forced_both(session, reference, src_ids, src_lengths,
                                                                     tokens, rows)
        parts.append((rows.start, compare_steps(session.backend_name, session.bundle.precision_label, got_logits,
                                                ref_logits, got_choice, ref_choice, active[rows], atol, rtol,
                                                min_agreement)))
    return merge_steps(parts)


def eager_decodes(reference: Session, beams: Result | None, src_ids: np.ndarray, src_lengths: np.ndarray,
                  gen: GenerationConfig, pad_id: int) -> np.ndarray:
    """Eager PyTorch's best translation of each source (its beam search's, when one ran), trimmed."""
    ref_tokens = beams.ids[::gen.num_return_sequences] if beams is not None else reference.run(
        Request(src_ids, src_lengths, gen.updated(num_return_sequences=1))).ids
    return ref_tokens[:, :max(1, int((ref_tokens != pad_id).any(axis=0).sum()))]


def text_scores(session: Session, got: np.ndarray, ref: np.ndarray) -> tuple[float | None, float | None]:
    """Corpus BLEU and chrF (sacreBLEU) of the backend's translations against eager's: detokenized
    text where the bundle has a tokenizer, else the ids as words. None without sacrebleu."""
    try:
        import sacrebleu
    except ImportError:
        return None, None
    cfg = session.config

    def text(row: np.ndarray) -> str:
        ids = [t for t in decoded(row, cfg.eos_id, cfg.pad_id) if t != cfg.eos_id]
        return session.tokenizer.decode(ids) if session.tokenizer is not None else " ".join(map(str, ids))

    hyps, refs = [text(r) for r in got], [text(r) for r in ref]
    return (float(sacrebleu.corpus_bleu(hyps, [refs]).score), float(sacrebleu.corpus_chrf(hyps, [refs]).score))


def sample_lines(path: Path) -> list[tuple[int, str]]:
    """A sample file's sources: (line number, text) of each non-blank line; unreadable: refused."""
    try:
        return [(n, line.strip()) for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1)
                if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise XformError(f"--sample-file {path}: unreadable ({e})") from None


def sample_used(path: Path, used: int) -> str:
    """How many of a sample file's sources were judged on: `256 sources`, or `the first 256 of its
    1,500 sources` where it holds more than SAMPLE_LINES."""
    total = len(sample_lines(path))
    return f"the first {used:,} of its {total:,} sources" if total > used else f"{used:,} sources"


def read_sample(path: Path, session: Session) -> tuple[np.ndarray, np.ndarray]:
    """A sample file's sources (export --sample-file): text through the bundle's tokenizer, or, for a
    bundle without one, token ids separated by spaces, one source a line; blank lines skipped, at
    most SAMPLE_LINES. Refused naming the file and line: no sources, ids outside the vocabulary, a
    source longer than max_len."""
    cfg = session.config
    lines = sample_lines(path)[:SAMPLE_LINES]
    if not lines:
        raise XformError(f"--sample-file {path}: no sentences (the file is empty or blank)")
    rows: list[list[int]] = []
    policy = TextPolicy(session)  # the text rules: the sample's lines as the model reads them
    for n, line in lines:
        if session.tokenizer is not None:
            try:
                rows.append(policy.encode_text(line))
            except InputError as e:  # a multilingual model's source language, say (named as the door words it)
                said = message(e).after(f"--sample-file {path} line {n}: ")
                raise XformError(said.template).naming(*said.settings) from None
            continue
        try:
            row = [int(t) for t in line.split()]
        except ValueError:
            raise XformError(f"--sample-file {path} line {n}: this bundle has no tokenizer, so a line is token "
                             f"ids separated by spaces; found {line[:40]!r}") from None
        bad = [i for i in row if not 0 <= i < cfg.src_vocab_size]
        if bad:
            raise XformError(f"--sample-file {path} line {n}: ids {bad[:3]} outside the source vocabulary of "
                             f"{cfg.src_vocab_size}")
        rows.append(row)
    long = [n for (n, _), r in zip(lines, rows) if len(r) > cfg.max_len]
    if long:
        raise XformError(f"--sample-file {path} line {long[0]}: longer than the model's max_len {cfg.max_len} "
                         f"({len(long)} such lines)")
    lengths = np.array([len(r) for r in rows], np.int64)
    src = np.full((len(rows), int(lengths.max())), cfg.pad_id, np.int64)
    for i, r in enumerate(rows):
        src[i, :len(r)] = r
    return src, lengths
