"""Hostile requests to the real tritonserver (issue 29): each is the client's fault, answered HTTP
400 (gRPC INVALID_ARGUMENT) with a message naming the request input, never a CLI flag; the next
request is served, and a client decoding meanwhile is not disturbed. In flight (plain requests
relayed to the engine, and the engine's own stream) and with dynamic scheduling."""
import json
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

import xform
from tests.conftest import requires_triton
from tests.serving.test_server import start
from xform.runtime.text.translator import Translator
from xform.serving.repository import ModelOptions

pytestmark = [pytest.mark.serve, requires_triton]


def body(*inputs) -> bytes:
    return json.dumps({"inputs": [{"name": n, "shape": s, "datatype": d, "data": v} for n, s, d, v in inputs]}).encode()


def text(value, rows=1):
    return ("text", [rows, 1], "BYTES", [value] * rows)


def i32(name, value):
    return (name, [1, 1], "INT32", [value])


# (what, the request body, the input the message must name, a fragment of the message)
HOSTILE = [
    ("1 MB of text", body(text("9" * (1 << 20))), "text", "more than the model's max_len"),
    ("10,000 rows", body(text("12", 10_000)), None, "batch"),
    ("max_new_tokens 0", body(text("12"), i32("max_new_tokens", 0)), "max_new_tokens", "at least 1"),
    ("max_new_tokens negative", body(text("12"), i32("max_new_tokens", -5)), "max_new_tokens", "at least 1"),
    ("max_new_tokens 10^9", body(text("12"), i32("max_new_tokens", 10**9)), "max_new_tokens", "max_len"),
    ("num_beams 0", body(text("12"), i32("num_beams", 0)), "num_beams", "at least 1"),
    ("num_beams 1,000", body(text("12"), i32("num_beams", 1000)), "num_beams", "max_rows"),
    ("an unknown language", body(text("12"), ("tgt_lang", [1, 1], "BYTES", ["xx"])), "tgt_lang", "no languages"),
    ("a prefix longer than max_len", body(text("12"), ("target_prefix", [1, 1], "BYTES", ["one " * 200])),
     "target_prefix", "max_len"),
    ("a bad word longer than max_len", body(text("12"), ("bad_words", [1, 1], "BYTES", ["one " * 200])),
     "bad_words", "max_len"),
    ("num_return_sequences 3 of a greedy decode", body(text("12"), i32("num_return_sequences", 3)),
     "num_return_sequences", "needs beams"),
    ("a negative repetition_penalty", body(text("12"), ("repetition_penalty", [1, 1], "FP32", [-1.0])),
     "repetition_penalty", "must be a number > 0"),
    ("a suppressed id outside the vocabulary", body(text("12"), ("suppress_tokens", [1, 1], "INT32", [9999])),
     "suppress_tokens", "outside the target vocabulary"),
    ("a wrong dtype", body(("src_ids", [1, 3], "INT32", [5, 6, 2])), "src_ids", ""),
    ("a wrong shape", body(("max_new_tokens", [1, 2], "INT32", [1, 2]), text("12")), "max_new_tokens", ""),
    # refused by Triton's HTTP front end before any model sees it: 2.51 answers 500 for it (its
    # TRITONSERVER_ERROR_INTERNAL), which xform cannot change; the server serves on all the same
    ("a body that is not JSON", b"{\"inputs\": [", None, "failed to parse the request JSON"),
]
TRITONS_OWN = {"a body that is not JSON": 500}


def post(url: str, data: bytes, timeout: float = 60) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, data, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture(scope="module")
def session(demo_bundle):
    return xform.load(demo_bundle, backend="ort")


@pytest.mark.parametrize("scheduling", ["inflight", "dynamic"])
def test_hostile_requests_are_400_naming_the_input_and_the_server_serves_on(demo_bundle, tmp_path, session,
                                                                             scheduling):
    server, name = start(demo_bundle, tmp_path, ModelOptions(scheduling=scheduling, max_rows=16))
    want = Translator(session).translate(["40512"])[0]
    url = f"{server.http_url}/v2/models/{name}/infer"
    good = body(text("40512"))
    stop, disturbed = threading.Event(), []

    def bystander():  # a client decoding throughout: always its right answer
        while not stop.is_set():
            code, reply = post(url, good)
            if code != 200 or json.loads(reply)["outputs"][-1]["data"] != [want]:
                disturbed.append((code, reply[:200]))
    thread = threading.Thread(target=bystander)
    thread.start()
    try:
        for what, data, named, fragment in HOSTILE:
            code, reply = post(url, data)
            assert code == TRITONS_OWN.get(what, 400), (what, code, reply[:300])
            message = json.loads(reply)["error"] if reply.startswith("{") else reply
            if named is not None:
                assert f"'{named}'" in message or f"input {named}" in message or named in message, (what, message)
            assert fragment in message, (what, message)
            assert "--" not in message.replace("--with-attention", ""), (what, message)  # no CLI flag
            assert "[xform:" not in message, (what, message)  # the engine's tag for the front stays inside
            code, reply = post(url, good)  # and the next request is served
            assert code == 200 and json.loads(reply)["outputs"][-1]["data"] == [want], (what, code, reply[:300])
        if scheduling == "inflight":  # the engine's own stream: the same refusals
            stream_url = f"{server.http_url}/v2/models/{name}-stream/generate"
            code, reply = post(stream_url, json.dumps({"text": "12", "num_beams": 1000}).encode())
            assert code == 400 and "num_beams" in reply, (code, reply)
    finally:
        stop.set()
        thread.join(60)
        server.stop()
    assert not disturbed, disturbed[:3]


def test_not_utf8_and_a_vanishing_grpc_stream(demo_bundle, tmp_path, session):
    """Bytes that are not UTF-8 over gRPC: INVALID_ARGUMENT naming 'text'. A gRPC stream that sends
    a request then vanishes (its channel closed, no cancel): the server serves the next client."""
    import tritonclient.grpc as tg
    from tritonclient.utils import InferenceServerException

    from tests.serving.test_inflight_server import stream_inputs
    server, name = start(demo_bundle, tmp_path, ModelOptions(max_rows=16))
    try:
        client = tg.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        t = tg.InferInput("text", [1, 1], "BYTES")
        t.set_data_from_numpy(np.array([[b"\xff\xfe 12"]], dtype=object))
        with pytest.raises(InferenceServerException) as e:
            client.infer(name, [t])
        assert "INVALID_ARG" in str(e.value.status()) and "input 'text': not UTF-8" in e.value.message()
        gone = tg.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        gone.start_stream(callback=lambda result, error: None)
        gone.async_stream_infer(name + "-stream", stream_inputs(["999999 999999 999999"]))
        gone.close()  # the channel closes under the stream: no stop_stream, no cancel
        t.set_data_from_numpy(np.array([[b"40512"]], dtype=object))
        r = client.infer(name, [t])
        assert r.as_numpy("translation")[0, 0].decode() == Translator(session).translate(["40512"])[0]
        client.close()
    finally:
        server.stop()


# (a generate body's keys beside its text, the key refused, the input it suggests)
UNKNOWN = [
    ({"beam_size": 2}, "beam_size", "num_beams"),  # CTranslate2's name
    ({"max_new_token": 5}, "max_new_token", "max_new_tokens"),  # misspelt
    ({"parameters": {"num_beam": 2}}, "num_beam", "num_beams"),  # generate's nested parameters: the same keys
]
# what Triton 2.51's HTTP parser refuses before any model sees it (its http_server.cc: a JSON error
# is its TRITONSERVER_ERROR_INTERNAL, 500), as docs/serving.md's table says: a body that is no
# JSON object, a value of the wrong type for an input (the request's input as a key, or under
# "parameters"), a key that is no input given what no parameter can be (null, a list), a
# non-string id; and an integer beyond INT32, which wraps on its way to xform
TRITONS_OWN_BODIES = [
    (b'{"inputs": [', 500, "failed to parse the request JSON buffer: Invalid value. at 12"),
    (b"", 500, "failed to parse the request JSON buffer: The document is empty. at 0"),
    (b"[]", 500, "attempt to get members for non-object"),
    (b'"text"', 500, "attempt to get members for non-object"),
    (b"{}", 400, "[request id: <id_unknown>] out of bounds index 0: request has 0 inputs"),
    (b'{"text": "12", "num_beams": null}', 500,
     "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    (b'{"text": "12", "num_beams": "2"}', 500,
     "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    (b'{"text": "12", "num_beams": 2.0}', 500,
     "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    (b'{"text": "12", "return_scores": 1}', 500, "Unable to parse 'data': attempt to access JSON non-boolean as boolean"),
    (b'{"text": null}', 500, "Unable to parse JSON bytes array: attempt to access JSON non-string as string"),
    (b'{"text": "12", "tgt_lang": 5}', 500,
     "Unable to parse JSON bytes array: attempt to access JSON non-string as string"),
    (b'{"text": "12", "parameters": {"num_beams": "2"}}', 500, "Converting keyword: 'parameters': Unable to parse "
     "'data': attempt to access JSON non-signed-integer as signed-integer"),
    (b'{"text": "12", "beam_size": null}', 400,
     "parameter 'beam_size' has invalid type. It should be either 'int', 'bool', or 'string'."),
    (b'{"text": "12", "beam_size": [2]}', 400,
     "parameter 'beam_size' has invalid type. It should be either 'int', 'bool', or 'string'."),
    (b'{"text": "12", "id": 5}', 500, "Unable to parse 'id': attempt to access JSON non-string as string"),
    (b'{"text": "12", "num_beams": 1000000000000}', 400, "input 'num_beams': must be at least 1, found -727379968"),
]


@pytest.mark.parametrize("scheduling", ["inflight", "dynamic"])
def test_unknown_keys_are_400_naming_the_key_and_the_input_meant(demo_bundle, tmp_path, scheduling):
    """Over HTTP's generate door a key that is no input reaches the model as a request parameter
    (Triton 2.51): the model refuses it, 400 naming it, the input it likely means and the model's
    inputs (each door: NAME's relay and batch models, NAME-stream's engine); an input sent as an
    infer body's parameter is 400 naming the input, the tensor expected and what came; gRPC's
    parameters the same. The generate body's `id` is taken (the request's id)."""
    import tritonclient.grpc as tg
    from tritonclient.utils import InferenceServerException
    server, name = start(demo_bundle, tmp_path, ModelOptions(scheduling=scheduling, max_rows=16))
    try:
        for model in [name, f"{name}-stream"] if scheduling == "inflight" else [name]:
            url = f"{server.http_url}/v2/models/{model}/generate"
            for extra, key, meant in UNKNOWN:
                code, reply = post(url, json.dumps({"text": "12", **extra}).encode())
                message = json.loads(reply)["error"] if reply.startswith("{") else reply
                assert code == 400 and f"unknown key '{key}' (did you mean '{meant}'?): no input of this model" in \
                    message, (model, extra, code, reply[:300])
                assert "its inputs: bad_words, " in message and "--" not in message, message
            for data, status, said in TRITONS_OWN_BODIES:
                code, reply = post(url, data)
                assert (code, json.loads(reply)["error"]) == (status, said), (model, data, code, reply[:300])
            code, reply = post(url, json.dumps({"text": "12", "id": "r1", "num_beams": 2}).encode())
            assert code == 200 and json.loads(reply)["id"] == "r1", reply[:300]
        data = json.dumps({"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["12"]}],
                           "parameters": {"num_beams": "2"}}).encode()
        code, reply = post(f"{server.http_url}/v2/models/{name}/infer", data)
        assert code == 400 and json.loads(reply)["error"] == (
            "input 'num_beams': expected a TYPE_INT32 tensor (an entry of the body's 'inputs', or a key of a generate "
            "body), found a request parameter 'num_beams' = '2' (str); send it as the tensor"), (code, reply[:300])
        client = tg.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        t = tg.InferInput("text", [1, 1], "BYTES")
        t.set_data_from_numpy(np.array([[b"12"]], dtype=object))
        with pytest.raises(InferenceServerException) as e:
            client.infer(name, [t], parameters={"beam_size": 2})
        assert "INVALID_ARG" in str(e.value.status()) and "unknown key 'beam_size' (did you mean 'num_beams'?)" in \
            e.value.message(), e.value.message()
        assert client.infer(name, [t]).as_numpy("translation")[0, 0] == b"twelve"
        client.close()
    finally:
        server.stop()
