"""A corpus worker: one xform Session translating lists of lines with one fixed decoding.

`LineTranslator` is what both doors share, the corpus's workers and `xform.ray.Translate`: the
session's `translate_lines` over a list of lines, each line's translations or its error (too long
without truncation, not UTF-8, ...), never an exception for one bad line. `ShardWorker` holds one
session for its process (a Ray actor, or the driver itself without Ray) and translates shards,
returning with each what the record and the figures need: its time, tokens, failed lines and
warnings, the process, its node and its peak memory. It imports no Ray: a Ray actor says where it
runs by overriding `where`.
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping

from xform.corpus.shards import Shard, ShardTask
from xform.errors import message, render
from xform.runtime.decoding.generation import GenerationConfig
from xform.runtime.decoding.request import LineResult, TextOptions
from xform.runtime.documents.memory import TranslationMemory
from xform.runtime.documents.translate import DocumentOptions, DocumentResult, DocumentTranslator
from xform.runtime.scheduling.batching import Batching
from xform.runtime.text.translator import Translator
from xform.runtime.text.vocab_map import VocabMap


@dataclass(frozen=True)
class Job:
    """Everything a worker needs to translate a corpus's lines as its driver checked them: the
    bundle (a path every worker can read) and the sha256 of the manifest the driver read there
    (a worker whose bundle's differs refuses to start; None: not checked), the backend, the
    decoding, the text policy, the batching and the vocabulary map, read by the driver; `names`:
    how the door that made the job names a setting in a line's error or a warning (the CLI: its
    flags), None: by the setting's own name; `documents`: each line (a record) is a document
    (runtime/documents/), None: a sentence."""
    bundle: str
    gen: GenerationConfig
    text: TextOptions = TextOptions()
    batching: Batching = Batching()
    backend: str = "ort"
    device: str | None = None
    threads: int | None = None
    vocab_map: VocabMap | None = None
    manifest_sha256: str | None = None
    names: Mapping[str, str] | None = field(default=None, compare=False)
    documents: DocumentOptions | None = None

    def said(self, message: str | None) -> str | None:
        """A line's error or a warning (errors.Message) in the words of the job's door."""
        names = self.names or {}
        return None if message is None else render(message, lambda s: names.get(s, s))


@dataclass
class Translated:
    """A list of lines translated: per line (translations or None, error or None), the target
    tokens generated, and the warnings (line index, message: truncated, mostly unknown)."""
    lines: list[tuple[list | None, str | None]]
    tokens: int = 0
    warnings: list[tuple[int, str]] = field(default_factory=list)


class LineTranslator:
    """One translator's translation of lists of lines with a fixed decoding (the translator its
    door opened: a shard worker's, xform.ray's)."""

    def __init__(self, text: Translator, job: Job):
        self.session, self.job = text.session, job
        self.text = text
        self.documents: DocumentTranslator | None = None

    def document_translator(self, on_batch: Callable[[int, int], None] | None) -> DocumentTranslator:
        """The job's document translator (its memory opened once a worker; the driver has checked it)."""
        if self.documents is None:
            options = self.job.documents
            assert options is not None
            memory = TranslationMemory(options.memory) if options.memory is not None else None
            self.documents = DocumentTranslator(self.text, self.job.gen, self.job.batching,
                                                replace(self.job.text, vocab_map=self.job.vocab_map),
                                                markup=options.markup, memory=memory,
                                                skip_target_language=options.skip_target_language)
        self.documents.on_batch = on_batch
        return self.documents

    def translate_documents(self, records: list[str | bytes],
                            on_batch: Callable[[int, int], None] | None = None) -> Translated:
        """Each record translated as a document (its one translation) or its error, in order."""
        done = Translated([])
        texts: dict[int, str] = {}
        failed: dict[int, str] = {}
        for i, record in enumerate(records):
            try:
                texts[i] = record.decode("utf-8") if isinstance(record, bytes) else record
            except UnicodeDecodeError as e:
                failed[i] = f"not UTF-8 ({e})"
        translator = self.document_translator(on_batch)
        decoded = translator.tally.decoded
        results = dict(zip(texts, translator.translate_each([("", t) for t in texts.values()])))
        done.tokens = translator.tally.decoded - decoded  # sentences decoded: a document's "tokens" are its sentences
        for i in range(len(records)):
            result = results.get(i)
            if isinstance(result, DocumentResult):
                done.lines.append(([result.text], None))
            else:
                done.lines.append((None, failed[i] if result is None else self.job.said(message(result))))
        return done

    def translate(self, lines: list[str | bytes], on_batch: Callable[[int, int], None] | None = None) -> Translated:
        """Each line's translations (n of them: texts, or with scores [text, score], with token
        scores [text, score, [log-probs]]; with qe the confidence after: as_json) or its error, in
        order; a glossary term a translation lacks is a warning of its line."""
        job, text, batching = self.job, self.job.text, self.job.batching
        if job.documents is not None:
            return self.translate_documents(lines, on_batch)
        done = Translated([])

        def counted(lines_done: int, tokens: int) -> None:
            done.tokens += tokens
            if on_batch is not None:
                on_batch(lines_done, tokens)

        results = self.text.translate_lines(lines, job.gen, batching, replace(text, vocab_map=job.vocab_map),
                                               on_batch=counted,
                                               on_warning=lambda i, m: done.warnings.append((i, job.said(m) or "")))
        for i, line in enumerate(results):
            for k, missed in enumerate(line.unmet):  # a glossary's term the search found no room for: said
                if missed:
                    done.warnings.append((i, f"translation {k + 1} lacks {', '.join(map(repr, missed))} (no room "
                                             "within the length cap, or not in the target vocabulary)"))
            done.lines.append((None if line.error is not None else as_json(line, text.scores, text.qe),
                               job.said(line.error)))
        return done


def as_json(line: LineResult, scores: bool | str, qe: bool = False) -> list:
    """A line's translations as a shard's file holds them: texts, or with scores or qe a list
    each, [text(, score(, [log-probs]))(, confidence)] (formats.parts reads it back; a
    confidence the line has none of, a blank line's, is None)."""
    if not scores and not qe:
        return list(line.hypotheses)
    out = []
    for k, h in enumerate(line.hypotheses):
        row: list = [h]
        if scores:
            row.append(line.scores[k])
        if scores == "tokens":
            row.append(line.token_scores[k])
        if qe:
            row.append(line.confidence[k] if k < len(line.confidence) else None)
        out.append(row)
    return out


@dataclass
class ShardResult:
    """A shard translated: per line (translations or None, error or None), its warnings, and the
    figures: target tokens, seconds, which worker (its rank, process, node; `restarted` when Ray
    had restarted it) and the process's peak resident memory."""
    shard: Shard
    lines: list[tuple[list | None, str | None]]
    warnings: list[tuple[int, str]]
    tokens: int
    seconds: float
    worker: int
    pid: int
    node: str
    restarted: bool
    peak_rss_mib: float


class ShardWorker:
    """One session translating shards: the unit the corpus's pools run, in this process or as a Ray actor."""

    def __init__(self, job: Job, worker: int = 0, translator: Translator | None = None):
        from xform.runtime.open import open_session

        self.worker = worker
        self.check_bundle(job)
        if translator is None:  # this worker's door, opened once
            translator = Translator(open_session(job.bundle, job.backend, job.device, job.threads))
        self.session = translator.session
        self.translator = LineTranslator(translator, job)

    def where(self) -> tuple[str, bool]:
        """(the node this worker runs on, whether it was restarted); here, this machine, never restarted."""
        return "local", False

    def check_bundle(self, job: Job) -> None:
        """Refuse to start where the bundle at job.bundle is not the driver's: its manifest (which
        holds every file's sha256) hashes otherwise, or cannot be read."""
        from xform.errors import BundleError
        from xform.files import sha256_file

        if job.manifest_sha256 is None:
            return
        path = Path(job.bundle) / "manifest.json"
        try:
            digest = sha256_file(path)
            found = f"sha256 {digest[:12]}"
        except OSError as e:
            digest, found = None, f"unreadable ({e.strerror or e})"
        if digest != job.manifest_sha256:
            raise BundleError(f"worker {self.worker} on {socket.gethostname()} (node {self.where()[0]}): {path}: "
                              f"{found}, expected the driver's bundle's (sha256 {job.manifest_sha256[:12]}): every "
                              "node needs the driver's bundle at the same path (copy it there, or put it on a file "
                              "system they share)")

    def translate(self, task: ShardTask, on_batch: Callable[[int, int], None] | None = None) -> ShardResult:
        from xform.runtime.bench import peak_rss_mib

        start = time.perf_counter()
        lines = ["" if i in task.failed else line for i, line in enumerate(task.lines)]
        done = self.translator.translate(lines, on_batch)
        for i, said in task.failed.items():  # lines the reader could not use fail as they are
            done.lines[i] = (None, said)
        node, restarted = self.where()
        return ShardResult(task.shard, done.lines, done.warnings, done.tokens, time.perf_counter() - start,
                           self.worker, os.getpid(), node, restarted, peak_rss_mib())
