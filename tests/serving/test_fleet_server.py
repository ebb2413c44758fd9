"""Many bundles on one real tritonserver (loopback), routed by language through the model
`translate` (serving/router.py, triton_router.py, fleet_repository.py): six tiny bundles of
distinct pairs (the demo, `export --languages num:en`; four random Marians, en>de, en>fr, de>en
and fr>de by their tokenizer_config.json; an M2M100, any of its codes to another),
`--max-loaded 2` (tests/fleet_fixtures.py).

Every answer equals its bundle translating alone (xform.Translator), the READY models of
Triton's repository index follow the least recently used rule, a pivot equals two translations
by hand, an unknown pair is a 400 naming the pairs, 32 clients over the six pairs get no error
and the answers each bundle gives alone, a bundle corrupted after the scan is a 500 for its pair
only; `xform serve --models DIR` in a process of its own survives evictions, keeps within
--memory-budget with a --preload bundle (and refuses one that does not fit), `--status` prints
its state, and
SIGTERM (during a load) leaves nothing behind, a loaded bundle's stub killed stops it (exit 1),
and it rescans its directory; docs/serving.md's block runs here. Every server
is stopped by its fixture or a `finally`; every wait is bounded."""
import json
import os
import shlex
import shutil
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, OrderedDict
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import requires_triton
from tests.fleet_fixtures import PAIRS as SIX
from tests.fleet_fixtures import WORDS, export_bundles
from tests.fleet_fixtures import alone as translators_alone
from tests.serving.test_lifecycle import Served
from tests.test_docs import marked
from xform.cli import main
from xform.runtime.fleet.catalog import Catalog
from xform.serving import residency
from xform.serving.fleet_repository import bls_threads, write_fleet
from xform.serving.fleet_status import fetch
from xform.serving.inflight import stream_model
from xform.serving.repository import ModelOptions
from xform.serving.router import ROUTER, Settings
from xform.serving.server import TritonServer, free_ports

pytestmark = [pytest.mark.serve, requires_triton]
pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e '.[dev]')")
ROOT = Path(__file__).resolve().parents[2]
SHORT = 6  # max_new_tokens of every request: tiny models, short answers
PAIRS = SIX[:4]  # numbers, en-de, en-fr, m2m: the pairs most tests ask
CLIENTS = 32  # the load test's
SECONDS = float(os.environ.get("XFORM_FLEET_LOAD_SECONDS", "20"))


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """A directory of six bundles: numbers, en-de, en-fr, m2m, de-en, fr-de."""
    return export_bundles(tmp_path_factory.mktemp("fleet"), tuple(p[3] for p in SIX))


@pytest.fixture(scope="module")
def alone(bundles):
    """name -> the bundle's own xform.Translator."""
    return translators_alone(bundles)


@pytest.fixture(scope="module")
def fleet(bundles, tmp_path_factory):
    """The six bundles (a copy, which a later test corrupts) served with --max-loaded 2."""
    root = tmp_path_factory.mktemp("served")
    shutil.copytree(bundles, root / "bundles")
    options, settings = ModelOptions(max_batch=8), Settings(max_loaded=2, load_timeout=60.0)
    write_fleet(Catalog.scan(root / "bundles"), root / "repo", options, settings)
    server = TritonServer(root / "repo", [ROUTER], "127.0.0.1", *free_ports(3),
                          bls_threads=bls_threads(options, settings), explicit=True)
    try:
        server.start(prepare=lambda m: None)
        yield server, root / "bundles"
    finally:
        server.stop()


def test_the_repository_holds_every_bundle_and_the_router(bundles, tmp_path):
    from xform.errors import InputError
    from xform.serving.router import read_catalog
    four = [bundles / name for name in ("en-de", "en-fr", "m2m", "numbers")]
    written = write_fleet(Catalog.scan(four), tmp_path / "repo", ModelOptions(), Settings(max_loaded=2))
    assert written == ["en-de", "en-de-stream", "en-fr", "en-fr-stream", "m2m", "m2m-stream", "numbers",
                       "numbers-stream", ROUTER]
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == sorted(written)
    assert sorted(p.name for p in (tmp_path / "repo" / ROUTER / "1").iterdir()) == ["catalog.json", "model.py"]
    catalog, engines, settings = read_catalog(tmp_path / "repo" / ROUTER / "1" / "catalog.json")
    assert engines["m2m"] == "m2m-stream" and settings.max_loaded == 2 and len(catalog) == 4
    assert "bundle" not in [p.name for p in (tmp_path / "repo" / "m2m-stream" / "1").iterdir()]  # referenced
    dynamic = write_fleet(Catalog.scan([bundles / "numbers"]), tmp_path / "dyn", ModelOptions(scheduling="dynamic"))
    assert dynamic == ["numbers", ROUTER]
    assert read_catalog(tmp_path / "dyn" / ROUTER / "1" / "catalog.json")[1] == {"numbers": "numbers"}
    shutil.copytree(bundles / "numbers", tmp_path / "named" / ROUTER)
    with pytest.raises(InputError, match="'translate' is the router's model; rename its directory"):
        write_fleet(Catalog.scan(tmp_path / "named"), tmp_path / "r2")


def post(url: str, body: dict, timeout: float = 120) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def translate(server, texts, src=None, tgt=None, **more) -> tuple[int, dict]:
    """POST /v2/models/translate/infer: (HTTP status, {output: data} or {"error": message})."""
    def tensor(name, values, datatype="BYTES"):
        return {"name": name, "shape": [len(values), 1], "datatype": datatype, "data": values}
    inputs = [tensor("text", texts), tensor("max_new_tokens", [SHORT] * len(texts), "INT32")]
    inputs += [tensor(k, [v] * len(texts)) for k, v in (("src_lang", src), ("tgt_lang", tgt), *more.items())
               if v is not None]
    status, answer = post(f"{server.http_url}/v2/models/{ROUTER}/infer", {"inputs": inputs})
    return status, ({o["name"]: o["data"] for o in answer["outputs"]} if status == 200 else answer)


def ready(server) -> set[str]:
    return server.ready_models() - {ROUTER}


def test_every_pair_equals_its_bundle_alone_and_loads_follow_lru(fleet, alone):
    """Two rounds over four pairs, max_loaded 2: after each request, the READY engine models
    in Triton's index are the two least recently used, as the pool's rule says."""
    server, _ = fleet
    lru: OrderedDict[str, None] = OrderedDict()
    for src, tgt, texts, name, languages in PAIRS * 2:
        status, got = translate(server, texts, src, tgt)
        assert status == 200, got
        assert got["translation"] == alone[name].translate(texts, SHORT, **languages), name
        assert got["route"] == [f"{src}>{tgt} {name}"] * len(texts)
        lru[name] = None
        lru.move_to_end(name)
        while len(lru) > 2:
            lru.popitem(last=False)
        assert ready(server) == {stream_model(n) for n in lru}, (name, server.index())
    unloaded = {m["name"]: m.get("reason", "") for m in server.index() if m.get("state") == "UNAVAILABLE"}
    assert {stream_model("numbers"), stream_model("en-de")} <= set(unloaded), unloaded
    assert "numbers" not in ready(server)  # a front model (NAME) is never loaded: the router asks the engine


def test_a_pivot_equals_two_translations_by_hand(fleet, alone):
    server, _ = fleet
    status, got = translate(server, ["40512", "7"], "num", "de")
    assert status == 200, got
    english = alone["numbers"].translate(["40512", "7"], SHORT)
    assert got["translation"] == alone["en-de"].translate(english, SHORT)
    assert got["route"] == ["num>en numbers; en>de en-de"] * 2


def test_an_unknown_pair_is_a_400_naming_the_pairs(fleet):
    server, _ = fleet
    status, got = translate(server, ["x"], "ja", "num")
    assert status == 400, got
    assert "no bundle translates input 'src_lang' 'ja' to input 'tgt_lang' 'num'" in got["error"]
    assert "numbers: num>en" in got["error"] and "en-de: en>de" in got["error"] and "m2m: any of" in got["error"]
    status, got = translate(server, ["x"], "en", "de", model="numbers")
    assert status == 400 and "input 'model' 'numbers' does not translate en>de" in got["error"], got


def test_the_generate_endpoint_takes_json(fleet, alone):
    server, _ = fleet
    status, got = post(f"{server.http_url}/v2/models/{ROUTER}/generate",
                       {"text": "7", "src_lang": "num", "tgt_lang": "en", "max_new_tokens": SHORT})
    assert status == 200, got
    assert got["translation"] == alone["numbers"].translate(["7"], SHORT)[0] and got["route"] == "num>en numbers"


def bundle_stubs(server) -> int:
    """The bundles' stubs running now (tritonserver's children but the router's)."""
    return sum(1 for m in residency.stub_models(server.stubs()).values() if m != ROUTER)


def test_many_clients_over_six_pairs_get_what_each_bundle_says_alone(fleet, alone):
    """The load test of issue 45: 32 clients for a bounded time (20 s; XFORM_FLEET_LOAD_SECONDS
    sets it, 60 in the issue), each cycling over the six pairs from a starting point of its own,
    so that every loaded bundle is in use while requests for the others wait for room. No
    request fails, every answer equals its bundle translating the same texts alone, bundles were
    loaded and evicted over and over (the router's counts agree with the clients'), and never
    more than two bundles' stubs ran at once (sampled from the server's processes)."""
    server, _ = fleet
    expected = {(s, t): alone[name].translate(texts, SHORT, **languages) for s, t, texts, name, languages in SIX}
    before = {b["name"]: b for b in fetch(server.http_url)["bundles"]}
    stop, errors, answered, most = time.monotonic() + SECONDS, [], Counter(), [0]
    lock, done = threading.Lock(), threading.Event()

    def client(i: int) -> None:
        k = i
        while time.monotonic() < stop and len(errors) < 5:
            src, tgt, texts, name, _ = SIX[k % len(SIX)]
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
    assert set(answered) == {p[3] for p in SIX}, answered
    assert 1 <= most[0] <= 2, most
    assert len(ready(server)) <= 2
    unloaded = [m for m in server.index() if m.get("reason") == "unloaded"]
    assert len(unloaded) >= 4, server.index()  # six bundles through two places: evictions happened
    state = {b["name"]: b for b in fetch(server.http_url)["bundles"]}
    delta = {n: {k: b[k] - before[n][k] for k in ("requests", "loads", "evictions", "failures")}
             for n, b in state.items()}
    assert {n: d["requests"] for n, d in delta.items()} == dict(answered), (delta, answered)
    assert sum(d["evictions"] for d in delta.values()) >= 4 and not any(d["failures"] for d in delta.values())
    print(f"{sum(answered.values())} answers in {SECONDS:.0f} s, {sum(d['loads'] for d in delta.values())} loads; "
          f"at most {most[0]} bundle stubs at once")


def test_a_bundle_corrupted_after_the_scan_fails_its_pair_only(fleet, alone):
    """en-fr's decoder overwritten once the server runs (and en-fr not loaded): its pair answers
    500 naming the reason, every time; the other pairs keep serving, the server stays ready."""
    server, where = fleet
    for src, tgt, texts, name, _ in (PAIRS[0], PAIRS[1]):  # en-fr is not among the two loaded
        assert translate(server, texts, src, tgt)[0] == 200
    assert stream_model("en-fr") not in ready(server)
    graph = max((where / "en-fr").glob("*.onnx"), key=lambda p: p.stat().st_size)
    graph.write_bytes(b"\0" * 64)
    for _ in range(2):
        status, got = translate(server, WORDS, "en", "fr")
        assert status == 500, got
        assert "en-fr" in got["error"] and "sha256" in got["error"], got
    for src, tgt, texts, name, languages in PAIRS:
        if name != "en-fr":
            status, got = translate(server, texts, src, tgt)
            assert status == 200 and got["translation"] == alone[name].translate(texts, SHORT, **languages), got
    with urllib.request.urlopen(f"{server.http_url}/v2/health/ready", timeout=5) as r:
        assert r.status == 200


class ServedFleet(Served):
    """`xform serve --models DIR ...` in a process of its own (python -m xform from this checkout's
    root, so that it and Triton's stubs, which start in its directory, import this checkout's xform)."""
    ready = f"through model {ROUTER}"

    def __init__(self, tmp: Path, *args: str):
        self.start([sys.executable, "-m", "xform", "serve", *args], tmp, cwd=ROOT)
        self.url = f"http://127.0.0.1:{self.ports[0]}"


def test_serve_models_survives_evictions_and_sigterm_during_a_load_leaves_nothing(bundles, tmp_path):
    served = ServedFleet(tmp_path, "--models", str(bundles), "--max-loaded", "1", "--grace", "10")
    try:
        lines = served.wait_ready()
        assert any("bundle  numbers: num>en" in x for x in lines) and any("/generate -d" in x for x in lines)
        server = TritonServer(tmp_path, [], "127.0.0.1", *served.ports)
        for src, tgt, texts, name, _ in (PAIRS[0], PAIRS[1], PAIRS[0]):  # two evictions: en-de's stub, numbers'
            status, got = translate(server, texts, src, tgt)
            assert status == 200, got
        assert served.proc.poll() is None  # an unloaded bundle's stub leaving is no death
        loading = threading.Thread(target=translate, args=(server, WORDS, "en", "fr"), daemon=True)
        loading.start()  # en-fr loads (numbers unloaded first) while the signal comes
        time.sleep(2.0)  # numbers' stub has exited (about 1.2 s), en-fr's is starting
        served.proc.send_signal(signal.SIGTERM)
        code, rest = served.finish()
        assert code == 0, rest
        loading.join(30)
    finally:
        if served.proc.poll() is None:
            served.proc.kill()
    served.assert_nothing_left()


def bundle_memory(served: ServedFleet) -> int:
    """The Pss of the bundles' stubs of `served` (all its stubs but the router's), now."""
    from xform.serving import residency
    return sum(residency.memory_bytes(p) for p in served.stubs() if residency.stub_model(p) not in (ROUTER, None))


def test_an_idle_bundle_is_unloaded_and_loads_again(bundles, tmp_path, alone):
    """--idle-unload 1: a bundle no request used for a second is unloaded (Triton's index, the
    status); the server lives on (its stub leaving is no death) and the next request loads it again."""
    served = ServedFleet(tmp_path, "--models", str(bundles), "--idle-unload", "1", "--grace", "10")
    try:
        served.wait_ready()
        server = TritonServer(tmp_path, [], "127.0.0.1", *served.ports)
        src, tgt, texts, name, languages = PAIRS[0]
        assert translate(server, texts, src, tgt)[0] == 200
        deadline = time.monotonic() + 30
        while stream_model(name) in ready(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert stream_model(name) not in ready(server)
        data = fetch(served.url)
        b = {x["name"]: x for x in data["bundles"]}
        assert b[name]["idle_unloads"] == 1 and not b[name]["loaded"] and data["settings"]["idle_unload"] == 1
        status, got = translate(server, texts, src, tgt)
        assert status == 200 and got["translation"] == alone[name].translate(texts, SHORT, **languages), got
        assert served.proc.poll() is None
    finally:
        served.proc.send_signal(signal.SIGTERM)
        served.finish()
    served.assert_nothing_left()


def test_serve_models_keeps_within_its_memory_budget_and_its_preloaded_bundle(bundles, tmp_path, alone):
    """--memory-budget 150MB --preload numbers: numbers loads at start and is never evicted; the
    others (about 40-60 MiB each, measured at their loads) come and go; after every request the
    bundles' stubs hold less than the budget (measured from the processes); every answer equals
    its bundle alone; `xform serve --status` says it all. Then a budget that the preloaded bundle
    alone exceeds is refused at start, naming it (exit 1)."""
    served = ServedFleet(tmp_path / "a", "--models", str(bundles), "--memory-budget", "150MB", "--preload", "numbers",
                         "--grace", "10")
    try:
        lines = served.wait_ready()
        assert any("within 143 MiB, numbers preloaded" in x for x in lines), lines
        server = TritonServer(tmp_path, [], "127.0.0.1", *served.ports)
        for src, tgt, texts, name, languages in PAIRS[1:] * 2 + PAIRS[:1]:
            status, got = translate(server, texts, src, tgt)
            assert status == 200 and got["translation"] == alone[name].translate(texts, SHORT, **languages), got
            assert stream_model("numbers") in ready(server) and 0 < bundle_memory(served) <= 150_000_000
        r = CliRunner().invoke(main, ["serve", "--status", served.url])
        assert r.exit_code == 0, r.output
        data = fetch(served.url)
        b = {x["name"]: x for x in data["bundles"]}
        assert b["numbers"]["preloaded"] and b["numbers"]["evictions"] == 0 and b["numbers"]["loads"] == 1, r.output
        assert b["numbers"]["requests"] == 1 and b["en-de"]["requests"] == 2 and b["en-de"]["loads"] >= 1, r.output
        # three bundles of 40 MiB or more beside numbers' do not fit 143 MiB: the budget evicted some
        assert sum(x["evictions"] for x in b.values()) >= 1 and data["resident_bytes"] <= 150_000_000, r.output
        assert data["preload"] == {"state": "done", "error": None}
        row = next(x for x in r.output.splitlines() if x.split()[:2] == ["numbers", "preloaded"])
        assert "MiB" in row and r.output.count("unloaded") >= 1
    finally:
        served.proc.send_signal(signal.SIGTERM)
        served.finish()
    served.assert_nothing_left()
    refused = ServedFleet(tmp_path / "b", "--models", str(bundles), "--memory-budget", "30MB", "--preload", "numbers")
    code, rest = refused.finish(120)
    assert code == 1 and "--preload 'numbers': 'numbers' took" in rest, rest
    assert "more than the --memory-budget 30000000 bytes: it cannot be loaded within it" in rest, rest
    refused.assert_nothing_left()


def test_serve_rescans_on_sigusr1_and_on_request_and_says_its_loads_in_metrics(bundles, tmp_path, alone):
    """A bundle copied into --models DIR is served after SIGUSR1; one removed is routed to no more
    after `xform serve --rescan URL` (a 400 naming what is left), its models gone from Triton's
    index; Triton's /metrics counts each bundle's loads and their seconds."""
    where = tmp_path / "dir"
    for name in ("numbers", "en-de"):
        shutil.copytree(bundles / name, where / name)
    served = ServedFleet(tmp_path, "--models", str(where), "--max-loaded", "2")
    try:
        served.wait_ready()
        server = TritonServer(tmp_path, [], "127.0.0.1", *served.ports)
        assert translate(server, WORDS, "en", "fr")[0] == 400
        shutil.copytree(bundles / "en-fr", where / "en-fr")
        served.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 60
        while "en-fr" not in [b["name"] for b in fetch(served.url)["bundles"]] and time.monotonic() < deadline:
            time.sleep(0.25)
        status, got = translate(server, WORDS, "en", "fr")
        assert status == 200 and got["translation"] == alone["en-fr"].translate(WORDS, SHORT), got
        assert translate(server, ["7"], "num", "en")[0] == 200
        shutil.rmtree(where / "numbers")
        r = CliRunner().invoke(main, ["serve", "--rescan", served.url])
        assert r.exit_code == 0 and "removed numbers; 2 bundles: en-de, en-fr" in r.output, r.output
        status, got = translate(server, ["7"], "num", "en")
        assert status == 400 and "en>de | en-fr: en>fr" in got["error"], got
        assert stream_model("numbers") not in {m["name"] for m in server.index()}
        with urllib.request.urlopen(f"http://127.0.0.1:{served.ports[2]}/metrics", timeout=10) as m:
            metrics = m.read().decode()
        for line in ('xform_model_loads_total{model="en-fr"} 1', 'xform_model_unloads_total{model="numbers"} 1'):
            assert line in metrics, metrics[-3000:]
        seconds = {x.split("{")[0]: float(x.split()[-1]) for x in metrics.splitlines()
                   if x.startswith("xform_model_load_seconds") and 'model="en-fr"' in x and 'le="+Inf"' not in x}
        assert seconds["xform_model_load_seconds_count"] == 1 and seconds["xform_model_load_seconds_sum"] > 0, seconds
        assert 'xform_model_load_seconds_bucket{model="en-fr",le="300"} 1' in metrics, metrics[-3000:]
    finally:
        served.proc.send_signal(signal.SIGTERM)
        code, rest = served.finish()
    assert code == 0 and "rescan (SIGUSR1): added en-fr; 3 bundles: en-de, en-fr, numbers" in rest, rest
    served.assert_nothing_left()


def test_a_loaded_bundles_stub_killed_still_stops_serve_with_exit_1(bundles, tmp_path):
    """An unloaded bundle's stub leaving is no death, but one killed while its model is READY is:
    Triton would answer every request to it with an error."""
    served = ServedFleet(tmp_path, "--models", str(bundles), "--max-loaded", "1", "--grace", "5")
    try:
        served.wait_ready()
        server = TritonServer(tmp_path, [], "127.0.0.1", *served.ports)
        assert translate(server, ["7"], "num", "en")[0] == 200
        engine = [p for p in served.stubs() if f"/{stream_model('numbers')}/1/model.py" in
                  Path(f"/proc/{p}/cmdline").read_text().replace("\0", " ")]
        assert engine
        os.kill(engine[-1], signal.SIGKILL)
        code, rest = served.finish(60)
        assert code == 1 and "a Triton Python-backend stub" in rest and " died" in rest, rest
    finally:
        if served.proc.poll() is None:
            served.proc.kill()
    served.assert_nothing_left()


def test_the_guides_block_runs(bundles, tmp_path, alone):
    """docs/serving.md's "Many bundles, one server": its serve line over the four bundles, its curl
    request as it is written (the ports aside)."""
    block = marked("fleet-serve-command", "docs/serving.md")
    lines = [line.strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]
    serve = next(line for line in lines if line.startswith("xform serve --models"))
    status_line = next(line for line in lines if line.startswith("xform serve --status"))
    curl = next(line for line in lines if line.startswith("curl"))
    args = shlex.split(serve.rstrip("&").strip())[2:]
    where = args.index("--models") + 1
    shutil.copytree(bundles, tmp_path / args[where])
    args[where] = str(tmp_path / args[where])  # as run from tmp_path
    served = ServedFleet(tmp_path, *args)
    try:
        served.wait_ready()
        args = shlex.split(curl)
        url = next(a for a in args if "/v2/models/" in a).replace("localhost:8000", f"127.0.0.1:{served.ports[0]}")
        body = json.loads(args[args.index("-d") + 1])
        status, got = post(url if url.startswith("http") else "http://" + url, body)
        assert status == 200, got
        english = alone["numbers"].translate([body["text"]])
        assert got["translation"] == alone["en-de"].translate(english)[0]
        assert got["route"] == "num>en numbers; en>de en-de"
        args = shlex.split(status_line)[1:]
        args[-1] = args[-1].replace("localhost:8000", f"127.0.0.1:{served.ports[0]}")
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.output
        assert "2 of 6 bundles loaded" in r.output and "memory budget 1024.0 MiB" in r.output, r.output
        assert [x.split()[:2] for x in r.output.splitlines()[3:5]] == [["numbers", "loaded"], ["en-de", "loaded"]]
    finally:
        served.proc.send_signal(signal.SIGTERM)
        served.finish()
    served.assert_nothing_left()
