"""In-flight serving on the real tritonserver: NAME (plain requests, relayed) and NAME-stream
(decoupled, the running batch, streaming) over one engine; faults and load. Every test stops
its server."""
import json
import os
import queue
import re
import shlex
import signal
import subprocess
import threading
import time
import urllib.request

import numpy as np
import pytest

import xform
from tests.conftest import requires_triton
from tests.serving.test_server import grpc, http, infer, start
from xform.runtime.documents.door import translate_document
from xform.runtime.text.translator import Translator
from xform.serving.repository import ModelOptions

pytestmark = [pytest.mark.serve, requires_triton]


@pytest.fixture(scope="module")
def served(demo_bundle, tmp_path_factory):
    server, name = start(demo_bundle, tmp_path_factory.mktemp("inflight"), ModelOptions(max_rows=16))
    yield server, name
    server.stop()


@pytest.fixture(scope="module")
def session(demo_bundle):
    return xform.load(demo_bundle, backend="ort")


def stream_inputs(texts, stream=True, max_new_tokens=None):
    import tritonclient.grpc as tg
    t = tg.InferInput("text", [len(texts), 1], "BYTES")
    t.set_data_from_numpy(np.array([[x.encode()] for x in texts], dtype=object))
    s = tg.InferInput("stream", [len(texts), 1], "BOOL")  # Triton: every input has the request's batch size
    s.set_data_from_numpy(np.array([[stream]] * len(texts)))
    inputs = [t, s]
    if max_new_tokens is not None:
        m = tg.InferInput("max_new_tokens", [len(texts), 1], "INT32")
        m.set_data_from_numpy(np.array([[max_new_tokens]] * len(texts), np.int32))
        inputs.append(m)
    return inputs


class Stream:
    """One gRPC stream of a client: requests sent on it, responses collected per request id."""

    def __init__(self, server):
        self.client = grpc(server)
        self.got = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.got.put((result, error)))

    def ask(self, model, texts, request_id, **kw) -> list[tuple]:
        """Send one request; return its responses: ("part"|"final", ids, text) or ("error", message)."""
        self.client.async_stream_infer(model, stream_inputs(texts, **kw), request_id=request_id,
                                       enable_empty_final_response=True)
        out = []
        while True:
            result, error = self.got.get(timeout=60)
            if error is not None:
                out.append(("error", str(error)))
                return out
            r = result.get_response()
            assert r.id == request_id, (r.id, request_id)  # one request at a time on this stream
            final = r.parameters["triton_final_response"].bool_param
            ids, text = result.as_numpy("output_ids"), result.as_numpy("translation")
            if ids is not None:
                out.append(("final" if final else "part", ids, [t.decode() for t in text.reshape(-1)]))
            if final:
                return out

    def close(self, cancel=False):
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def check_stream(responses, want_text, want_ids):
    """Parts (one id and the text it adds, a row) then one final with the whole answer; the
    parts spell the final, in order."""
    *parts, final = responses
    assert final[0] == "final" and all(p[0] == "part" for p in parts), [r[0] for r in responses]
    np.testing.assert_array_equal(final[1], want_ids)
    assert final[2] == want_text
    steps = np.concatenate([p[1] for p in parts], 1)  # (rows, steps)
    np.testing.assert_array_equal(steps[:, :want_ids.shape[1]], want_ids)
    for r, text in enumerate(want_text):
        assert "".join(p[2][r] for p in parts) == text


def test_plain_and_streaming_requests_share_the_engine(served, session):
    """Plain requests over HTTP /infer and gRPC (relayed to the engine) and streaming requests
    over gRPC equal the session's translations; the engine model counts every request (one engine)."""
    import tritonclient.grpc as tg
    import tritonclient.http as th
    server, name = served
    texts = ["40512", "7", "999999"]
    want = Translator(session).translate(texts)
    ids = session.generate(Translator(session).policy.encode_texts(texts))
    h, g = http(server), grpc(server)  # closed at the end: an open connection holds Triton's exit 30 s
    assert infer(h, th, name, texts=texts)[1] == want
    assert infer(g, tg, name, texts=texts)[1] == want
    before = int(h.get_inference_statistics(name + "-stream")["model_stats"][0]["inference_count"])
    s = Stream(server)
    try:
        for i, text in enumerate(texts):
            one = session.generate(Translator(session).policy.encode_texts([text]))
            check_stream(s.ask(name + "-stream", [text], f"r{i}"), [want[i]], one)
        # stream false on the decoupled model: one final response
        (kind, got_ids, got_text), = s.ask(name + "-stream", texts, "plain", stream=False)
        assert kind == "final" and got_text == want
        np.testing.assert_array_equal(got_ids, ids)
        after = int(h.get_inference_statistics(name + "-stream")["model_stats"][0]["inference_count"])
    finally:
        s.close()
        h.close()
        g.close()
    assert after - before >= len(texts) + 1


def test_the_readme_streaming_line(served, session):
    """README "Serving": its generate_stream curl line answers with one event a token, then the
    whole translation."""
    from tests.test_readme import README
    server, name = served
    curl = next(line for line in README.read_text().splitlines() if line.startswith("curl") and "generate_stream" in line)
    args = shlex.split(curl)
    body = args[args.index("-d") + 1]
    url = next(a for a in args if "/generate_stream" in a).replace("localhost:8000", f"127.0.0.1:{server.http_port}")
    url = url.replace("/demo-bundle-stream/", f"/{name}-stream/")
    with urllib.request.urlopen("http://" + url.split("://")[-1], body.encode(), timeout=30) as r:
        events = [json.loads(line[len("data: "):]) for line in r.read().decode().splitlines() if line.startswith("data: ")]
    text = json.loads(body)["text"]
    want = Translator(session).translate([text])[0]
    assert events[-1]["translation"] == want
    assert "".join(e["translation"] for e in events[:-1]) == want
    assert len(events) - 1 == len(events[-1]["output_ids"])  # one event a generated token, end-of-sentence too


def test_32_streaming_clients_lose_nothing(served, session):
    """32 clients, each streaming 4 requests one after another, at once: every request answered
    exactly once (parts, then one final, in order) with its translation alone; none lost."""
    server, name = served
    rng = np.random.default_rng(3)
    numbers = [[str(n) for n in rng.integers(0, 10**int(rng.integers(1, 7)), 4)] for _ in range(32)]
    want = {n: Translator(session).translate([n])[0] for row in numbers for n in row}
    results, errors = {}, []

    def client(c):
        s = Stream(server)
        try:
            for i, n in enumerate(numbers[c]):
                results[c, i] = s.ask(name + "-stream", [n], f"{c}-{i}")
        except Exception as e:  # noqa: BLE001 - reported below with the client
            errors.append((c, repr(e)))
        finally:
            s.close()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(32)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(results) == 32 * 4 and time.monotonic() - t0 < 120
    for (c, i), responses in results.items():
        n = numbers[c][i]
        check_stream(responses, [want[n]], session.generate(Translator(session).policy.encode_texts([n])))


def test_overload_and_a_bad_request_fail_alone(demo_bundle, tmp_path, session):
    """One row and one waiting request at most: a burst of 24 requests written at once on one
    gRPC stream gets 'overloaded' (UNAVAILABLE) for what does not fit and the right answer for
    the rest, each exactly once; a malformed request sent meanwhile through the plain model fails
    alone with its reason; then the server serves again."""
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException
    server, name = start(demo_bundle, tmp_path, ModelOptions(max_rows=1, max_queue=1))
    s = Stream(server)
    try:
        texts = [str(987000 + 7 * i) for i in range(24)]  # eleven words each
        want = dict(zip(texts, Translator(session).translate(texts)))
        for i, t in enumerate(texts):  # written without waiting: the engine's execute gets them together
            s.client.async_stream_infer(name + "-stream", stream_inputs([t], stream=False), request_id=t,
                                        enable_empty_final_response=True)
        client = http(server)
        with pytest.raises(InferenceServerException, match="outside the source vocabulary"):
            infer(client, th, name, ids=np.array([[5, 999, 2]], np.int64))
        answers, errors = {}, []
        while len(answers) + len(errors) < len(texts):
            result, error = s.got.get(timeout=60)
            if error is not None:
                errors.append(str(error))
                continue
            r = result.get_response()
            assert r.id not in answers  # answered once
            answers[r.id] = result.as_numpy("translation")[0, 0].decode()
        assert errors and all("overloaded" in e for e in errors), errors
        assert answers and all(answers[t] == want[t] for t in answers)
        assert infer(client, th, name, texts=["12"])[1] == ["twelve"]  # and then it serves again
        client.close()  # an HTTP connection left open holds Triton's exit for its 30 s timeout
    finally:
        s.close()
        server.stop()


def test_cancelled_streams_leave_and_the_others_go_on(served, session):
    """Clients that cancel their stream after its first token, beside clients that do not: the
    others' answers are whole and right, and the server serves on."""
    server, name = served
    long_text = "999999 999999 999999 999999"
    want = Translator(session).translate([long_text])[0]
    done, errors = {}, []

    def quitter(c):
        s = Stream(server)
        s.client.async_stream_infer(name + "-stream", stream_inputs([long_text]), request_id=f"q{c}")
        s.got.get(timeout=60)
        s.close(cancel=True)

    def stayer(c):
        s = Stream(server)
        try:
            done[c] = s.ask(name + "-stream", [long_text], f"s{c}")
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
        finally:
            s.close()
    threads = [threading.Thread(target=f, args=(c,)) for c in range(8) for f in (quitter, stayer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(done) == 8
    for responses in done.values():
        check_stream(responses, [want], session.generate(Translator(session).policy.encode_texts([long_text])))
    assert http(server).is_server_live()


def test_a_killed_engine_is_reported_and_the_front_answers_with_the_reason(demo_bundle, tmp_path):
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException
    server, name = start(demo_bundle, tmp_path)
    try:
        client = http(server)
        assert infer(client, th, name, texts=["12"])[1] == ["twelve"]
        stubs = subprocess.run(["pgrep", "-f", f"triton_python_backend_stub {tmp_path}/repo/{name}-stream/"],
                               capture_output=True, text=True).stdout.split()
        assert len(stubs) == 1, stubs
        os.kill(int(stubs[0]), signal.SIGKILL)
        time.sleep(1)
        with pytest.raises(InferenceServerException, match=re.escape(f"{name}-stream")) as e:
            infer(client, th, name, texts=["12"])
        assert e.value.status() == "500", e.value.status()  # the server's fault, not the request's 400
        assert client.is_server_live()
    finally:
        # Triton's own exit waits its 30 s for the killed instance; the SIGKILL after 5 s ends it the same way
        assert server.stop(timeout=5) is not None


def test_the_readme_grpc_stream_snippet(served, session, capsys):
    """docs/serving.md "Streaming": the tritonclient streaming snippet prints each token's text, then
    the whole translation."""
    from tests.test_readme import README
    server, name = served
    code = re.search(r"<!-- grpc-stream-snippet -->\s*```python\n(.*?)\n```\s*<!-- /grpc-stream-snippet -->",
                     (README.parent / "docs" / "serving.md").read_text(), re.S).group(1)
    code = code.replace("localhost:8001", f"127.0.0.1:{server.grpc_port}").replace("demo-bundle-stream",
                                                                                  f"{name}-stream")
    exec(compile(code, "docs/serving.md grpc-stream-snippet", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    want = Translator(session).translate(["40512"])[0]
    assert lines[-1] == want and "".join(lines[:-1]).strip() == want.strip() and len(lines) > 2


def test_a_document_request_joins_the_engine(served, session):
    """`document_format`: each text row a document, its sentences through the running batch
    (serving/documents.py), beside a plain request; tests/documents/test_serving.py has the rest."""
    pytest.importorskip("sentencex")
    import tritonclient.http as th
    server, name = served
    docs = ["40512 7\n\n- 999999\n- 12\n", "  123456\r\n\r\n3"]
    text = th.InferInput("text", [2, 1], "BYTES")
    text.set_data_from_numpy(np.array([[d.encode()] for d in docs], dtype=object))
    fmt = th.InferInput("document_format", [2, 1], "BYTES")
    fmt.set_data_from_numpy(np.array([[b"text"], [b"text"]], dtype=object))
    r = http(server).infer(name, [text, fmt])
    assert [t.decode() for t in r.as_numpy("translation").reshape(-1)] == [
        translate_document(Translator(session), d) for d in docs]
    assert infer(http(server), th, name, texts=["7"])[1] == ["seven"]
