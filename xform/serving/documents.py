"""Documents on the server: a request with `document_format` (handler.document_job parses it)
takes each `text` row as a document
(runtime/documents/: sentences split and rejoined with the layout, Markdown's markup left alone,
paragraph languages detected with `src_lang` "auto") and answers each row's `translation`.

The dynamic model translates a document in its execute call, as it decodes any request. The
in-flight engine must not step its session from two threads, so a document's sentences go
through its running batch instead: the document is worked out on a thread of its own, over a
session whose `run` queues each batch of sentences in the engine's Scheduler and waits for it
(`ScheduledSession`), while the other requests keep decoding beside it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from xform.runtime.decoding.generation import GenerationConfig
from xform.runtime.decoding.request import Request, Result, TextOptions
from xform.runtime.documents.translate import DocumentTranslator
from xform.runtime.text.translator import Translator

# inputs that mean something for a line, not a document
NOT_WITH_DOCUMENTS = ("src_ids", "target_prefix", "return_scores", "return_attention", "replace_unknowns", "stream",
                      "qe")


@dataclass
class DocumentJob:
    """A parsed document request: its place in the call, its documents and how to translate them."""
    index: int
    texts: list[str]
    gen: GenerationConfig
    text: TextOptions
    markup: str
    skip_target_language: bool


def document_outputs(text: Translator, job: DocumentJob) -> dict[str, np.ndarray]:
    """The job's `translation` outputs (one a row), its documents' sentences decoded together."""
    translator = DocumentTranslator(text, job.gen, text=job.text, markup=job.markup,
                                    skip_target_language=job.skip_target_language)
    results = translator.translate([(f"text[{i}]", t) for i, t in enumerate(job.texts)])
    return {"translation": np.array([[r.text.encode("utf-8")] for r in results], dtype=object)}


class ScheduledSession:
    """A session whose `run` goes through a running Scheduler (the in-flight engine's): the request
    joins the running batch and this thread waits for its Result; the rest is the session's."""

    def __init__(self, session, scheduler, timeout: float | None = None):
        self.session, self.scheduler, self.timeout = session, scheduler, timeout

    def run(self, request: Request, on_step: Any = None) -> Result:
        return self.scheduler.enqueue(self.session.decode_item(request)).result(self.timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)
