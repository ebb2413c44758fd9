# ruff: noqa: F811 - `demo` is test_handler's fixture, imported
"""Documents through the server's code, without Triton: a request with `document_format` answers
each `text` row as translate_document does, in the dynamic model's execute and through a running
Scheduler (the in-flight engine's: ScheduledSession), beside ordinary requests; line inputs and
bad formats are refused naming the input, the other requests of the call still answered.
tests/serving/test_inflight_server.py sends one through a real Triton."""
import threading

import numpy as np
import pytest

from tests.serving.test_handler import demo, text  # noqa: F401 - the demo session fixture, text rows
from xform.runtime.documents.door import translate_document
from xform.runtime.scheduling.scheduler import Scheduler
from xform.runtime.text.translator import Translator
from xform.serving.documents import ScheduledSession
from xform.serving.handler import document_outcome, execute, parse

pytest.importorskip("sentencex", reason="documents need the documents extra (pip install -e '.[dev]')")
DOCS = ["40512 7\n\n- 999999\n- 12\n", "  123456\r\n\r\n\r\n3"]


def string(value):
    return np.array([[value.encode()]], dtype=object)


def translations(outputs):
    return [t.decode() for t in outputs["translation"].reshape(-1)]


def test_execute_answers_documents_beside_lines(demo):
    expected = [translate_document(Translator(demo), d) for d in DOCS]
    out = execute(Translator(demo), [{"text": text(*DOCS), "document_format": string("text")}, {"text": text("40512")},
                         {"text": text(DOCS[0]), "document_format": string("text"),
                          "num_beams": np.array([[3]], np.int32)}])
    assert translations(out[0]) == expected
    assert translations(out[1]) == ["forty thousand five hundred twelve"]
    assert translations(out[2]) == [translate_document(Translator(demo), DOCS[0], beam_size=3)]
    assert "\n\n- " in translations(out[0])[0] and "\r\n\r\n\r\n" in translations(out[0])[1]


@pytest.mark.parametrize("inputs, named", [
    ({"src_ids": np.array([[5, 2]], np.int64)}, "input 'src_ids': goes with lines"),
    ({"return_scores": np.array([[True]])}, "input 'return_scores': goes with lines"),
    ({"document_format": string("rtf")}, "input 'document_format': expected one of text, markdown, html, got 'rtf'"),
    ({"src_lang": string("auto")}, "input 'src_lang' auto: this bundle takes no source language"),
    ({"skip_target_language": np.array([[True]])}, "input 'skip_target_language': name the target language"),
    ({"num_return_sequences": np.array([[2]], np.int32), "num_beams": np.array([[2]], np.int32)},
     "input 'num_return_sequences': a document's translation is one text"),
])
def test_refusals_name_the_input(demo, inputs, named):
    request = {"text": text(DOCS[0]), "document_format": string("text"), **inputs}
    if "src_ids" in inputs:
        del request["text"]
    out = execute(Translator(demo), [request, {"text": text("7")}])
    assert isinstance(out[0], str) and named in out[0], out[0]
    assert translations(out[1]) == ["seven"]


def test_documents_join_a_running_batch(demo):
    """The in-flight engine's way: each batch of a document's sentences is queued in the running
    Scheduler while other requests decode; the answers equal translate_document's."""
    scheduler = Scheduler(demo, max_rows=16, max_queue=64).start()
    try:
        jobs = [parse(Translator(demo), 0, {"text": text(d), "document_format": string("text")}) for d in DOCS * 3]
        answers: dict = {}
        threads = [threading.Thread(target=lambda i=i, j=j: answers.__setitem__(
            i, document_outcome(Translator(ScheduledSession(demo, scheduler, timeout=60)), j))) for i, j in enumerate(jobs)]
        for t in threads:
            t.start()
        lines = [scheduler.submit(Translator(demo).policy.encode_texts(["40512", "12"])) for _ in range(4)]
        for t in threads:
            t.join(120)
        assert [translations(answers[i])[0] for i in range(len(jobs))] == [
            translate_document(Translator(demo), d) for d in DOCS * 3]
        assert all(f.result(60) is not None for f in lines)
    finally:
        scheduler.close()
