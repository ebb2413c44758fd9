"""Many clients over six pairs on one real tritonserver with --max-loaded 2 (issue 45's load
test): 32 clients for a bounded time (20 s; XFORM_FLEET_LOAD_SECONDS sets it, 60 in the issue),
each cycling over the six pairs from a starting point of its own, so that every loaded bundle is
in use while requests for the others wait for room. No request fails, every answer equals its
bundle translating the same texts alone, bundles were loaded and evicted over and over, and
never more than two bundles' stubs ran at once (sampled from the server's processes)."""
import os
import threading
import time
from collections import Counter

import pytest

from tests.conftest import requires_triton
from tests.fleet_fixtures import PAIRS, alone, export_bundles
from tests.serving.test_fleet_server import SHORT, ready, translate
from xform.runtime.fleet.catalog import Catalog
from xform.serving import residency
from xform.serving.fleet_repository import bls_threads, write_fleet
from xform.serving.fleet_status import fetch
from xform.serving.repository import ModelOptions
from xform.serving.router import ROUTER, Settings
from xform.serving.server import TritonServer, free_ports

pytestmark = [pytest.mark.serve, requires_triton]
pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e '.[dev]')")
CLIENTS = 32
SECONDS = float(os.environ.get("XFORM_FLEET_LOAD_SECONDS", "20"))


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """Six bundles, six pairs: numbers, en-de, en-fr, m2m (fr>es), de-en, fr-de."""
    return export_bundles(tmp_path_factory.mktemp("fleet6"), tuple(p[3] for p in PAIRS))


@pytest.fixture(scope="module")
def server(bundles, tmp_path_factory):
    root = tmp_path_factory.mktemp("served6")
    options, settings = ModelOptions(max_batch=8), Settings(max_loaded=2, load_timeout=120.0)
    write_fleet(Catalog.scan(bundles), root / "repo", options, settings)
    server = TritonServer(root / "repo", [ROUTER], "127.0.0.1", *free_ports(3),
                          bls_threads=bls_threads(options, settings), explicit=True)
    try:
        server.start(prepare=lambda m: None)
        yield server
    finally:
        server.stop()


def bundle_stubs(server) -> int:
    """The bundles' stubs running now (tritonserver's children but the router's)."""
    return sum(1 for m in residency.stub_models(server.stubs()).values() if m != ROUTER)


def test_many_clients_over_six_pairs_get_what_each_bundle_says_alone(server, bundles):
    mine = alone(bundles)
    expected = {(s, t): mine[name].translate(texts, SHORT, **languages) for s, t, texts, name, languages in PAIRS}
    stop, errors, answered, most = time.monotonic() + SECONDS, [], Counter(), [0]
    lock, done = threading.Lock(), threading.Event()

    def client(i: int) -> None:
        k = i
        while time.monotonic() < stop and len(errors) < 5:
            src, tgt, texts, name, _ = PAIRS[k % len(PAIRS)]
            k += 1
            status, got = translate(server, texts, src, tgt)
            with lock:
                if status != 200 or got.get("translation") != expected[(src, tgt)]:
                    errors.append((src, tgt, status, got))
                else:
                    answered[name] += 1

    def sample() -> None:
        while not done.wait(0.2):
            most[0] = max(most[0], bundle_stubs(server))

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    clients = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
    for t in clients:
        t.start()
    for t in clients:
        t.join(SECONDS + 300)  # a request in flight at the end may wait for a load or two, bounded
    done.set()
    watcher.join(5)
    assert not any(t.is_alive() for t in clients), "a client still waits 300 s after the end"
    assert not errors, errors[:3]
    assert set(answered) == {p[3] for p in PAIRS}, answered
    assert 1 <= most[0] <= 2, most
    assert len(ready(server)) <= 2
    unloaded = [m for m in server.index() if m.get("reason") == "unloaded"]
    assert len(unloaded) >= 4, server.index()  # six bundles through two places: evictions happened
    state = {b["name"]: b for b in fetch(server.http_url)["bundles"]}
    assert {n: b["requests"] for n, b in state.items()} == dict(answered), (state, answered)
    assert sum(b["evictions"] for b in state.values()) >= 4 and not any(b["failures"] for b in state.values())
    print(f"{sum(answered.values())} answers in {SECONDS:.0f} s, {sum(b['loads'] for b in state.values())} loads; "
          f"at most {most[0]} bundle stubs at once")
