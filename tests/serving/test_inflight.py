"""serving/inflight.py without Triton: a request's tokens as they come, and cancellation."""
import numpy as np
import pytest

import xform
from xform.errors import InputError
from xform.runtime.scheduler import Cancelled, Scheduler
from xform.serving.handler import job_outputs, parse
from xform.serving.inflight import TextStream, submit


def text_request(texts, **inputs):
    req = {name: None for name in ("text", "src_ids")}
    req["text"] = np.array([[t.encode()] for t in texts], dtype=object)
    req.update(inputs)
    return req


@pytest.fixture(scope="module")
def session(demo_bundle):
    return xform.load(demo_bundle, backend="ort")


def test_a_stream_spells_the_translation_and_the_result_is_the_handlers(session):
    """Each step: one id a row and the text it adds; the parts spell each row's translation, and
    the final outputs are what the dynamic model answers."""
    texts = ["123456", "7"]
    job = parse(session, 0, text_request(texts))
    sent = []
    scheduler = Scheduler(session)
    future = submit(scheduler, session, job, TextStream(session, job, sent.append))
    scheduler.run_until_idle()
    outputs = job_outputs(session, job, future.result())
    want = session.translate(texts)
    assert [t.decode() for t in outputs["translation"].reshape(-1)] == want
    for r, text in enumerate(want):
        assert "".join(part["translation"][r, 0].decode() for part in sent) == text
    steps = np.concatenate([p["output_ids"] for p in sent], 1)
    np.testing.assert_array_equal(steps[:, :outputs["output_ids"].shape[1]], outputs["output_ids"])


def test_a_cancelled_request_leaves_at_a_check(session):
    """`cancelled` true from step 2 on: the request's rows leave at the next check (every
    CHECK_EVERY steps), its Future raises Cancelled, the other request is whole."""
    from xform.serving.inflight import CHECK_EVERY
    scheduler = Scheduler(session)
    stay = parse(session, 0, text_request(["999999 999999 999999"]))
    go = parse(session, 1, text_request(["999999 999999 999999"]))
    steps = []
    f_stay = submit(scheduler, session, stay)
    f_go = submit(scheduler, session, go, cancelled=lambda: len(steps) >= 2)
    while scheduler.run_once():
        steps.append(scheduler.batch.rows)
    assert steps[CHECK_EVERY] == 1 and steps[CHECK_EVERY - 1] == 2, steps  # left at the first check after step 2
    with pytest.raises(Cancelled):
        f_go.result()
    np.testing.assert_array_equal(f_stay.result(), session.generate(session.encode_texts(["999999 999999 999999"])))


def test_streaming_refuses_several_sequences_a_row(session):
    job = parse(session, 0, text_request(["12"], num_return_sequences=np.array([[2]], np.int32),
                                         num_beams=np.array([[2]], np.int32)))
    with pytest.raises(InputError, match="input 'stream': one sequence a row"):
        submit(Scheduler(session), session, job, TextStream(session, job, print))
