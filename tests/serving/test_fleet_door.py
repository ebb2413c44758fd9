"""The many-bundle server's HTTP door on a real tritonserver (the router `translate` over copies
of the demo bundle, each declaring a pair; serving/router.py, triton_router.py): a key that is no
input of the router is 400 naming it and the input it likely means; an input sent as a parameter
is 400 naming it, the tensor expected and what came; a request routed to a bundle that a rescan
removes before its hop reaches it is 503, and sent again it is routed over what is served now.
Every server is stopped in a `finally`; every wait is bounded."""
import json
import shutil
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.conftest import requires_triton
from tests.serving.test_hostile_requests import UNKNOWN
from tests.serving.test_rescan import bundle
from xform.runtime.fleet.catalog import Catalog
from xform.serving.fleet_repository import bls_threads, write_fleet
from xform.serving.repository import ModelOptions
from xform.serving.router import ROUTER, Settings
from xform.serving.server import TritonServer, free_ports

pytestmark = [pytest.mark.serve, requires_triton]


def serve(demo_bundle, root, pairs, settings=Settings()):
    """(the server, the bundles' directory): a copy of the demo for each name -> pair, served by the
    router as `xform serve --models DIR` serves them (rescans read DIR again)."""
    where = root / "bundles"
    where.mkdir()
    for name, pair in pairs.items():
        bundle(demo_bundle, where, name, pair)
    options = ModelOptions(max_batch=8)
    write_fleet(Catalog.scan(where), root / "repo", options, settings, where)
    server = TritonServer(root / "repo", [ROUTER], "127.0.0.1", *free_ports(3),
                          bls_threads=bls_threads(options, settings), explicit=True)
    server.start(prepare=lambda m: None)
    return server, where


def post(url: str, data: bytes, timeout: float = 120) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, {"Content-Type": "application/json"}),
                                    timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def generate(server, body: dict) -> tuple[int, dict]:
    return post(f"{server.http_url}/v2/models/{ROUTER}/generate", json.dumps(body).encode())


def test_the_routers_door_refuses_unknown_keys_naming_the_key_and_the_input_meant(demo_bundle, tmp_path):
    """The router's keys (its own: `status`, `model`; the bundles' controls) and the same refusals as
    a bundle's door. And the generate door's status: a bundle whose files changed after the scan
    fails its load, the server's fault: 500 over /infer, but 400 (the same message) over generate,
    Triton 2.51's for every error a model answers there (docs/serving.md)."""
    server, where = serve(demo_bundle, tmp_path, {"a": ("num", "en"), "d": ("en", "fr")})
    asked = {"text": "12", "src_lang": "num", "tgt_lang": "en"}
    try:
        for extra, key, meant in [*UNKNOWN, ({"stats": True}, "stats", "status")]:
            code, got = generate(server, {**asked, **extra})
            assert code == 400 and f"unknown key '{key}' (did you mean '{meant}'?): no input of this model" in \
                got.get("error", ""), (extra, code, got)
            assert "its inputs: bad_words, " in got["error"] and "model, " in got["error"], got
        data = json.dumps({"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["12"]}],
                           "parameters": {"tgt_lang": "en"}}).encode()
        code, got = post(f"{server.http_url}/v2/models/{ROUTER}/infer", data)
        assert code == 400 and got.get("error") == (
            "input 'tgt_lang': expected a TYPE_STRING tensor (an entry of the body's 'inputs', or a key of a generate "
            "body), found a request parameter 'tgt_lang' = 'en' (str); send it as the tensor"), (code, got)
        code, got = generate(server, {**asked, "id": "r1", "num_beams": 2})
        assert code == 200 and got["translation"] == "twelve" and got["id"] == "r1", got
        (where / "d" / "decoder.onnx").write_bytes(b"not the graph")  # its hashes fail at its load
        failed = [infer(server, text="one", src_lang="en", tgt_lang="fr"),
                  generate(server, {"text": "one", "src_lang": "en", "tgt_lang": "fr"})]
        assert [code for code, _ in failed] == [500, 400], failed
        assert failed[0][1]["error"] == failed[1][1]["error"] and "'d' failed to load" in failed[0][1]["error"], failed
    finally:
        server.stop()


def infer(server, **strings: str) -> tuple[int, dict]:
    """POST /v2/models/translate/infer with one row of each string input."""
    inputs = [{"name": k, "shape": [1, 1], "datatype": "BYTES", "data": [v]} for k, v in strings.items()]
    return post(f"{server.http_url}/v2/models/{ROUTER}/infer", json.dumps({"inputs": inputs}).encode())


def test_a_request_whose_bundle_a_rescan_removes_before_its_hop_is_503(demo_bundle, tmp_path):
    """num>de goes num>en a; en>de b. With --max-loaded 1 and c loaded, its first hop evicts c
    and loads a (seconds: a stub starts); meanwhile b leaves its directory and a rescan removes
    it. The second hop finds b gone: 503 naming it, to send again (the client did nothing wrong;
    it was a 500 failed load); sent again, it has no route: 400. Over the infer door: Triton
    2.51's generate door answers every model error 400 (docs/serving.md)."""
    server, where = serve(demo_bundle, tmp_path, {"a": ("num", "en"), "b": ("en", "de"), "c": ("num", "fr")},
                          Settings(max_loaded=1, load_timeout=60.0))
    pivot = {"text": "12", "src_lang": "num", "tgt_lang": "de"}
    answered: dict = {}
    try:
        assert infer(server, text="12", src_lang="num", tgt_lang="fr")[0] == 200  # c loaded

        def ask():
            answered["reply"], answered["at"] = infer(server, **pivot), time.monotonic()
        thread = threading.Thread(target=ask)
        thread.start()
        time.sleep(0.3)  # routed; its first hop waits for c's unload and a's load
        shutil.rmtree(where / "b")
        code, got = generate(server, {"rescan": True})
        rescanned = time.monotonic()
        thread.join(120)
        assert not thread.is_alive()
        assert code == 200 and json.loads(got["status"])["removed"] == ["b"], got
        (code, got), at = answered["reply"], answered["at"]
        assert at > rescanned, "the pivot was answered before the rescan: its first hop took less than 0.3 s"
        assert code == 503 and got.get("error") == (
            "bundle 'b' was removed by a rescan after this request was routed to it; send the request again: it is "
            "routed over the bundles served now (a, c)"), (code, got)
        code, got = infer(server, **pivot)
        assert code == 400 and "no bundle translates input 'src_lang' 'num' to input 'tgt_lang' 'de'" in \
            got["error"], got
    finally:
        server.stop()
