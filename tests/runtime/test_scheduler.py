"""In-flight batching (runtime/scheduling/scheduler.py): requests join a running batch at step boundaries,
leave when they end, and decode exactly what they decode alone.

The trained demo model and the trained test Marians; joins are forced at chosen steps by driving
the scheduler by hand (`run_once`), so every test knows which rows ran beside which."""
import threading

import numpy as np
import pytest

import xform
from tests.marian_fixtures import sources
from xform.errors import InputError
from xform.runtime.backends.cache import HostCache, HostRows
from xform.runtime.scheduling.scheduler import Cancelled, OverloadedError, Scheduler
from xform.runtime.text.translator import Translator

TEXTS = ["7", "999999", "40", "123456", "5", "88 12", "31", "6000"]


def step_log(session):
    """Record the rows and each row's position the backend runs at every step."""
    log, step = [], session.backend.step

    def recording(input_ids, *args, **kw):
        out = step(input_ids, *args, **kw)
        log.append(session.backend.positions.copy() - 1)  # the positions this step ran at
        return out
    session.backend.step = recording
    return log


def alone(session, src, **settings):
    return session.generate(src, **settings)


def drive(scheduler, plan):
    """plan: {step number: [(src, settings)]}: submit those before that step; returns the futures
    in submission order."""
    futures, step = [], 0
    last = max(plan)
    while True:
        for src, settings in plan.get(step, []):
            futures.append(scheduler.submit(src, **settings))
        if not scheduler.run_once() and step >= last:
            return futures
        step += 1


@pytest.fixture(scope="module")
def demo(demo_bundle):
    return xform.load(demo_bundle, backend="ort")


def test_greedy_requests_joining_at_other_steps_decode_as_alone(demo):
    """Requests submitted at steps 0, 2, 3 and 7 join the running rows (which are at other
    positions then), and leave when they end: every request's ids equal its decoding alone, and
    the backend really ran rows at different positions in one step."""
    s = demo
    reqs = [Translator(s).policy.encode_texts([t]) for t in TEXTS[:4]] + [Translator(s).policy.encode_texts(TEXTS[4:6])]
    log = step_log(s)
    scheduler = Scheduler(s, max_rows=16)
    futures = drive(scheduler, {0: [(reqs[0], {"max_new_tokens": 20})], 2: [(reqs[1], {"max_new_tokens": 20})],
                                3: [(reqs[2], {"max_new_tokens": 5}), (reqs[3], {"max_new_tokens": 20})],
                                7: [(reqs[4], {"max_new_tokens": 20})]})
    mixed = [p for p in log if len(set(p.tolist())) > 1]
    assert mixed, "no step ran rows at different positions"
    assert max(len(p) for p in log) > 2
    s.backend.step = type(s.backend).step.__get__(s.backend)
    for src, f, n in zip(reqs, futures, (20, 20, 5, 20, 20)):
        np.testing.assert_array_equal(f.result(), alone(s, src, max_new_tokens=n))


def test_a_longer_source_joining_widens_the_others_and_changes_nothing(demo):
    """The joining source is longer than every running one: the cross K/V and masks of the
    running rows are widened with masked padding; their tokens stay those of decoding alone."""
    s = demo
    short, long_ = Translator(s).policy.encode_texts(["7"]), Translator(s).policy.encode_texts(["123456 7890 12 5555"])
    assert long_.shape[1] > short.shape[1] + 3
    scheduler = Scheduler(s)
    f1, f2 = drive(scheduler, {0: [(short, {"max_new_tokens": 12})], 1: [(long_, {"max_new_tokens": 12})]})
    np.testing.assert_array_equal(f1.result(), alone(s, short, max_new_tokens=12))
    np.testing.assert_array_equal(f2.result(), alone(s, long_, max_new_tokens=12))


def test_beam_requests_join_and_equal_their_search_alone(marians):
    """Beam search (4 beams, scores) with requests joining mid-search: each request's beams stay
    together and its hypotheses and scores are those of searching it alone."""
    _, model, bundle = marians["swish-scaled"]
    s = xform.load(bundle, backend="ort")
    src, _ = sources(model.config, [7, 3, 9, 5, 2], seed=4)
    src = src.numpy()
    rows = [src[r:r + 1, :int((src[r] != s.pad_id).sum())] for r in range(len(src))]
    settings = dict(max_new_tokens=14, num_beams=4, early_stopping=True, return_scores=True)
    scheduler = Scheduler(s, max_rows=64)
    futures = drive(scheduler, {0: [(rows[0], settings), (np.concatenate([rows[1][:, :2], rows[4][:, :2]]), settings)],
                                2: [(rows[2], settings)], 5: [(rows[3], settings)]})
    for src_, f in zip([rows[0], np.concatenate([rows[1][:, :2], rows[4][:, :2]]), rows[2], rows[3]], futures):
        ids, scores = f.result()
        want, want_scores = s.generate(src_, **settings)
        np.testing.assert_array_equal(ids, want)
        np.testing.assert_allclose(scores, want_scores, rtol=0, atol=1e-5)


def test_sampling_with_a_seed_is_the_same_in_flight(demo):
    s = demo
    a, b = Translator(s).policy.encode_texts(["999999", "31"]), Translator(s).policy.encode_texts(["123456"])
    settings = dict(max_new_tokens=16, do_sample=True, seed=3, temperature=2.0, num_return_sequences=2)
    scheduler = Scheduler(s)
    fa, fb = drive(scheduler, {0: [(a, settings)], 3: [(b, settings)]})
    np.testing.assert_array_equal(fa.result(), alone(s, a, **settings))
    np.testing.assert_array_equal(fb.result(), alone(s, b, **settings))


def test_rows_limit_holds_the_queue_and_results_come_as_requests_end(demo):
    """max_rows 2: never more than 2 rows run; a short request's result is ready before the long
    one beside it ends (delivered the step it ends, not with the batch)."""
    s = demo
    log = step_log(s)
    scheduler = Scheduler(s, max_rows=2)
    srcs = [Translator(s).policy.encode_texts([t]) for t in ["999999 123456", "7", "40", "5"]]
    futures = [scheduler.submit(x, max_new_tokens=24) for x in srcs]
    done_at = {}
    step = 0
    while scheduler.run_once():
        step += 1
        for i, f in enumerate(futures):
            if f.done() and i not in done_at:
                done_at[i] = step
    s.backend.step = type(s.backend).step.__get__(s.backend)
    assert max(len(p) for p in log) == 2
    assert done_at[1] < done_at[0]
    for x, f in zip(srcs, futures):
        np.testing.assert_array_equal(f.result(), alone(s, x, max_new_tokens=24))


def test_a_beam_request_waits_for_greedy_rows_to_drain(demo):
    s = demo
    g, b = Translator(s).policy.encode_texts(["999999"]), Translator(s).policy.encode_texts(["40"])
    scheduler = Scheduler(s)
    fg, fb = drive(scheduler, {0: [(g, {"max_new_tokens": 10})], 1: [(b, {"max_new_tokens": 10, "num_beams": 3})]})
    np.testing.assert_array_equal(fg.result(), alone(s, g, max_new_tokens=10))
    np.testing.assert_array_equal(fb.result(), alone(s, b, max_new_tokens=10, num_beams=3))


def test_overload_bad_requests_and_cancellation_fail_alone(demo):
    s = demo
    scheduler = Scheduler(s, max_queue=2)
    ok = scheduler.submit(Translator(s).policy.encode_texts(["999999"]), max_new_tokens=20)
    with pytest.raises(InputError, match="max_new_tokens"):
        scheduler.submit(Translator(s).policy.encode_texts(["7"]), max_new_tokens=-1)
    with pytest.raises(InputError, match="outside the source vocabulary"):
        scheduler.submit(np.array([[10**6]], np.int64))
    gone = scheduler.submit(Translator(s).policy.encode_texts(["123456"]), max_new_tokens=20)
    with pytest.raises(OverloadedError, match="overloaded: 2 requests already wait"):
        scheduler.submit(Translator(s).policy.encode_texts(["5"]))
    scheduler.run_once()
    scheduler.run_once()
    assert scheduler.batch.rows == 2
    scheduler.cancel(gone)
    scheduler.run_once()
    assert scheduler.batch.rows == 1  # the cancelled row left the batch
    scheduler.run_until_idle()
    with pytest.raises(Cancelled):
        gone.result()
    np.testing.assert_array_equal(ok.result(), alone(s, Translator(s).policy.encode_texts(["999999"]), max_new_tokens=20))


def test_stream_yields_each_step_then_the_result_from_a_running_thread(demo):
    """The scheduler in its thread, 12 client threads submitting at once and one streaming:
    every request answered once with its alone result; the stream's steps spell the result."""
    s = demo
    with Scheduler(s, max_rows=8) as scheduler:
        results = {}

        def client(i):
            results[i] = scheduler.submit(Translator(s).policy.encode_texts([TEXTS[i % len(TEXTS)]]), max_new_tokens=15).result(60)
        threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        parts = list(scheduler.stream(Translator(s).policy.encode_texts(["123456", "7"]), max_new_tokens=15))
        for t in threads:
            t.join()
    final = parts[-1]
    steps = np.stack(parts[:-1], 1)
    np.testing.assert_array_equal(steps, final)
    np.testing.assert_array_equal(final, alone(s, Translator(s).policy.encode_texts(["123456", "7"]), max_new_tokens=15))
    for i, got in results.items():
        np.testing.assert_array_equal(got, alone(s, Translator(s).policy.encode_texts([TEXTS[i % len(TEXTS)]]), max_new_tokens=15))


def test_host_rows_add_keeps_rows_and_widens(demo):
    rows = HostRows(2, (3, 2, 4, 5), np.float32)
    for a in rows.arrays:
        a[...] = np.random.default_rng(0).normal(size=a.shape)
    before = [a.copy() for a in rows.arrays]
    added = rows.add(2, 6)
    assert rows.shape == (5, 2, 6, 5) and added == slice(3, 5)
    for a, b in zip(rows.arrays, before):
        np.testing.assert_array_equal(a[:3, :, :4], b)
        assert not a[:3, :, 4:].any() and not a[3:].any()
    cache = HostCache(1, (4, 2, 8, 3), np.float32)
    cache.gather(np.array([1, 2]))  # compacted: the spare rows are reused by a join
    cache.arrays[0][...] = 1.0
    cache.add(1)
    assert cache.shape == (3, 2, 8, 3) and not cache.arrays[0][2].any() and (cache.arrays[0][:2] == 1).all()
    cache.new[0][...] = 7.0
    cache.write(np.array([0, 5, 2]))
    assert cache.arrays[0][1, :, 5].tolist() == [[7.0] * 3] * 2 and cache.arrays[0][2, :, 2].sum() == 42


def test_attention_of_requests_with_sources_of_other_widths(tmp_path):
    """return_attention in flight: a short source decoding beside a longer one that joined (the
    batch's cross width grows) gets each step's attention over its own source, equal to decoding
    it alone; greedy and beams."""
    from xform.exporter.export import export_bundle
    s = xform.load(export_bundle("demo", tmp_path / "aligned", attention_layer=-1).path, backend="ort")
    short, long_ = Translator(s).policy.encode_texts(["7 12"]), Translator(s).policy.encode_texts(["123456 7890 12 5555"])
    for settings in ({}, {"num_beams": 2}):
        scheduler = Scheduler(s)
        f_short, f_long = drive(scheduler, {0: [(short, dict(max_new_tokens=12, return_attention=True, **settings))],
                                            2: [(long_, dict(max_new_tokens=12, return_attention=True, **settings))]})
        for src, f in ((short, f_short), (long_, f_long)):
            ids, attention = f.result()
            want_ids, want = s.generate(src, max_new_tokens=12, return_attention=True, **settings)
            np.testing.assert_array_equal(ids, want_ids)
            np.testing.assert_allclose(attention, want, rtol=0, atol=1e-5)
