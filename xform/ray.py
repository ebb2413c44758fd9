"""Ray Data's building block: an xform bundle translating a text column inside a Ray Data pipeline.

    import ray, xform.ray
    ds = ray.data.read_parquet("s3://bucket/sentences/")
    ds = ds.map_batches(xform.ray.Translate, fn_constructor_kwargs={"bundle": "/models/en-de", "num_beams": 4},
                        concurrency=4, num_cpus=2, batch_size=512)

`Translate` is a callable class: Ray Data makes one per actor (`concurrency` of them), each
opening the bundle once (one session, `threads` intra-op threads) and translating the batches it
is given: the `column` of texts in, a `translation` column out (and `score` with return_scores),
the other columns kept. A line that cannot be translated (too long without truncate, not UTF-8)
gets an empty translation and its reason in the `error` column (None for the others); with
error_column=None it raises instead. Decoding settings are the generation config's names or
CTranslate2's (`beam_size`, `max_decoding_length`, ...), as `Translator.translate_batch` takes
them. This module imports no Ray: Ray imports it in its workers.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from xform.corpus.worker import Job, LineTranslator, TextOptions
from xform.errors import InputError
from xform.runtime.open import open_session
from xform.runtime.scheduling.batching import Batching
from xform.runtime.text.call_words import reworded
from xform.runtime.text.terminology import terminology
from xform.runtime.text.translator import Translator

__all__ = ["Translate"]


class Translate:
    """For `Dataset.map_batches(Translate, fn_constructor_kwargs={"bundle": ...}, concurrency=N)`.
    `prefix_column`: a column of target prefixes (a text or None a row) each translation continues;
    `glossary` / `keep` / `qe` as translate_batch's (docs/terminology.md): a `confidence` column."""

    def __init__(self, bundle: str | Path, column: str = "text", output_column: str = "translation",
                 error_column: str | None = "error", *, backend: str = "ort", device: str | None = None,
                 threads: int | None = None, src_lang: str | None = None, tgt_lang: str | None = None,
                 truncate: bool = False, return_scores: bool = False, batch_size: int | None = None,
                 max_batch_tokens: int | None = None, prefix_column: str | None = None, glossary: Any = None,
                 keep: str | tuple[str, ...] = (), qe: bool = False, **options: Any):
        self.column, self.output_column, self.error_column = column, output_column, error_column
        self.prefix_column = prefix_column
        session = open_session(bundle, backend, device, threads)
        text_layer = Translator(session)
        text_layer.policy.check_languages(src_lang, tgt_lang)  # an unknown language is refused here, not per batch
        with reworded(options):  # an error names a setting as the caller did (beam_size, ...)
            gen = text_layer.generation(tgt_lang, dict(options))
        batching = Batching("tokens" if max_batch_tokens else "examples", batch_size, max_batch_tokens)
        text = TextOptions(scores=return_scores, src_lang=src_lang, tgt_lang=tgt_lang, truncate=truncate,
                           terminology=terminology(glossary, keep, src_lang, tgt_lang), qe=qe)
        self.translator = LineTranslator(text_layer, Job(str(bundle), gen, text, batching, backend, device, threads))
        self.n = gen.num_return_sequences

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A batch (Ray Data's numpy format: column -> array) with the translation columns added."""
        if self.column not in batch:
            raise InputError(f"xform.ray.Translate: the batch has no column {self.column!r} (columns: "
                             f"{', '.join(batch)}); give column=")
        texts: list = [t if isinstance(t, (str, bytes)) else "" for t in batch[self.column]]  # None: blank
        if self.prefix_column is not None:
            if self.prefix_column not in batch:
                raise InputError(f"xform.ray.Translate: the batch has no prefix column {self.prefix_column!r} "
                                 f"(columns: {', '.join(batch)})")
            texts = [(t, p if isinstance(p, str) else "") for t, p in zip(texts, batch[self.prefix_column])]
        done = self.translator.translate(texts)
        failed = [(i, e) for i, (_, e) in enumerate(done.lines) if e is not None]
        if failed and self.error_column is None:
            i, error = failed[0]
            raise InputError(f"line {i} of the batch: {error} ({len(failed)} such lines in the batch)")
        out = dict(batch)
        best = [t if t is not None else [""] * self.n for t, _ in done.lines]
        texts_out = [[x if isinstance(x, str) else x[0] for x in t] for t in best]
        out[self.output_column] = column([t[0] if self.n == 1 else t for t in texts_out])
        if self.translator.job.text.scores:
            scores = [[None if isinstance(x, str) else x[1] for x in t] for t in best]
            out["score"] = column([s[0] if self.n == 1 else s for s in scores])
        if self.translator.job.text.qe:  # the confidence is each translation's last part
            sure = [[None if isinstance(x, str) else x[-1] for x in t] for t in best]
            out["confidence"] = column([c[0] if self.n == 1 else c for c in sure])
        if self.error_column is not None:
            out[self.error_column] = column([e for _, e in done.lines])
        return out


def column(values: list) -> np.ndarray:
    """An object array of one value a row (lists stay lists)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out
