"""serving/inflight.py without Triton: a request's tokens as they come, and cancellation."""
import numpy as np
import pytest

import xform
from xform.errors import InputError
from xform.runtime.scheduling.scheduler import Cancelled, Scheduler
from xform.runtime.text.translator import Translator
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
    job = parse(Translator(session), 0, text_request(texts))
    sent = []
    scheduler = Scheduler(session)
    future = submit(scheduler, session, job, TextStream(session, job, sent.append))
    scheduler.run_until_idle()
    outputs = job_outputs(Translator(session), job, future.result())
    want = Translator(session).translate(texts)
    assert [t.decode() for t in outputs["translation"].reshape(-1)] == want
    for r, text in enumerate(want):
        assert "".join(part["translation"][r, 0].decode() for part in sent) == text
    steps = np.concatenate([p["output_ids"] for p in sent], 1)
    np.testing.assert_array_equal(steps[:, :outputs["output_ids"].shape[1]], outputs["output_ids"])


def test_the_watcher_cancels_a_request_whose_client_went_away(session):
    """The Watcher asks each running request whether it was cancelled (Triton's is_cancelled),
    off the scheduler's thread: once one says yes, its rows leave at the next step, its Future
    raises Cancelled and the other request is whole; a failing question counts as gone."""
    import time

    from xform.serving.inflight import Watcher
    long_text = "999999 999999 999999"
    scheduler = Scheduler(session)
    watcher = Watcher(scheduler, every=0.01)
    stay = submit(scheduler, session, parse(Translator(session), 0, text_request([long_text])))
    go = submit(scheduler, session, parse(Translator(session), 1, text_request([long_text])))
    broken = submit(scheduler, session, parse(Translator(session), 2, text_request([long_text])))
    gone = []
    asked = []
    watcher.add(stay, lambda: asked.append(1) or False)
    watcher.add(go, lambda: bool(gone))
    watcher.add(broken, lambda: (1 / 0) if gone else False)
    rows = []
    for _ in range(3):
        scheduler.run_once()
        rows.append(scheduler.batch.rows)
    gone.append(True)
    time.sleep(0.1)  # the watcher's turn
    while scheduler.run_once():
        rows.append(scheduler.batch.rows)
    time.sleep(0.03)
    before = len(asked)
    time.sleep(0.05)  # five more turns: a finished request is never asked again (Triton has freed it)
    assert len(asked) == before and before > 0
    watcher.close()
    assert rows[:3] == [3, 3, 3] and rows[3] == 1, rows
    for f in (go, broken):
        with pytest.raises(Cancelled):
            f.result()
    np.testing.assert_array_equal(stay.result().ids, session.generate(Translator(session).policy.encode_texts([long_text])))


def test_streaming_refuses_several_sequences_a_row(session):
    job = parse(Translator(session), 0, text_request(["12"], num_return_sequences=np.array([[2]], np.int32),
                                         num_beams=np.array([[2]], np.int32)))
    with pytest.raises(InputError, match="input 'stream': one sequence a row"):
        submit(Scheduler(session), session, job, TextStream(session, job, print))
