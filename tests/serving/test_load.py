"""The same answer under load as alone (issue 29): 64 clients at once send a seeded mix of
requests (greedy, beams 2 to 5, target prefixes, repetition controls, max_new_tokens from 1 to the
cap, scores; plain over HTTP and gRPC, streaming over gRPC, some streams cancelled mid-way) to a
real tritonserver, in-flight and with dynamic scheduling. Every completed response equals the
same request decoded alone in-process: tokens, text and scores. scripts/soak_serve.py runs the
same mix for minutes and records latency and memory."""
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import xform
from tests.conftest import requires_triton
from tests.serving.test_server import start
from xform.serving.repository import ModelOptions

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from loadmix import LoadMix, reference_answer, send_grpc, send_http  # noqa: E402

pytestmark = [pytest.mark.serve, requires_triton]

CLIENTS, PER_CLIENT = 64, 4


@pytest.fixture(scope="module")
def session(demo_bundle):
    return xform.load(demo_bundle, backend="ort")


@pytest.mark.parametrize("scheduling", ["inflight", "dynamic"])
def test_64_clients_get_the_answers_each_request_gets_alone(demo_bundle, tmp_path, session, scheduling):
    import tritonclient.grpc as tg
    import tritonclient.http as th

    mix = LoadMix(session, seed=11, streaming=scheduling == "inflight")
    requests = [[mix.request() for _ in range(PER_CLIENT)] for _ in range(CLIENTS)]
    server, name = start(demo_bundle, tmp_path, ModelOptions(scheduling=scheduling, max_rows=32, max_batch=8))
    answers: dict[tuple[int, int], dict] = {}
    errors: list[str] = []

    def client(c: int) -> None:
        try:
            for i, req in enumerate(requests[c]):
                if req.transport == "http":
                    with th.InferenceServerClient(f"127.0.0.1:{server.http_port}") as h:
                        answers[c, i] = send_http(h, name, req)
                else:
                    answers[c, i] = send_grpc(tg, f"127.0.0.1:{server.grpc_port}", name, req)
        except Exception as e:  # noqa: BLE001 - reported below with the client
            errors.append(f"client {c}: {e!r}")

    try:
        threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(1.0, 240 - (time.monotonic() - t0)))
        assert not any(t.is_alive() for t in threads), "clients still waiting after 240 s"
        assert not errors, errors[:5]
        assert len(answers) == CLIENTS * PER_CLIENT
        completed = 0
        for (c, i), got in answers.items():
            req = requests[c][i]
            if got.get("cancelled"):
                continue
            completed += 1
            want = reference_answer(session, req)
            assert got["text"] == want["text"], (req, got, want)
            np.testing.assert_array_equal(got["ids"], want["ids"], err_msg=str(req))
            np.testing.assert_allclose(got["score"], want["score"], rtol=1e-5, atol=1e-5, err_msg=str(req))
        assert completed >= CLIENTS * PER_CLIENT * 0.8  # only the cancelled ones are left out
        mixes = {(r.num_beams > 1, r.prefix is not None, r.stream, r.cancel_after is not None)
                 for row in requests for r in row}
        assert len(mixes) >= (6 if scheduling == "inflight" else 4), mixes  # beams, prefixes, streams, cancels
    finally:
        server.stop()
