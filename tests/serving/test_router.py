"""The router model's logic without Triton (serving/router.py): a fake BLS call that answers
`<engine>:<text>` and records what each hop was sent, a fake loader of stubs. Routes, the
tensors a hop is sent (a Marian's >>xx<< prefix, a fairseq model's codes, a pivot's first hop
without what shapes the answer), the kinds of errors, the loader's cost and unload wait, and
catalog.json's round trip. Triton's side: tests/serving/test_fleet_server.py."""
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from xform.errors import InputError
from xform.runtime.fleet.catalog import Catalog, Entry
from xform.runtime.text.languages import FAIRSEQ, PREFIX, Ask, Languages
from xform.runtime.fleet.pool import Pool
from xform.serving import fleet_status
from xform.serving.router import (
    HopFailed,
    Preloading,
    Router,
    Settings,
    StubLoader,
    config_pbtxt,
    failure,
    inputs,
    read_catalog,
    write_catalog,
)

CATALOG = Catalog([
    Entry("numbers", Path("/b/numbers"), Languages(pairs=(("num", "en"),), origin="manifest")),
    Entry("en-multi", Path("/b/en-multi"), Languages(sources=("en",), targets=("de", "fr"), ask=Ask(PREFIX, ("de", "fr")))),
    Entry("m2m", Path("/b/m2m"), Languages(sources=("de", "es", "fr"), targets=("de", "es", "fr"),
                                          ask=Ask(FAIRSEQ, ("de", "es", "fr")))),
])
ENGINES = {e.name: f"{e.name}-stream" for e in CATALOG}


class Loads:
    """A Pool loader recording loads and unloads; `fail` names a bundle that fails to load."""

    def __init__(self, fail=()):
        self.events, self.fail = [], set(fail)

    def load(self, name):
        if name in self.fail:
            raise RuntimeError(f"Failed to load model: failed to load '{name}-stream', sha256 mismatch")
        self.events.append(("load", name))
        return ENGINES[name], 1

    def unload(self, name, engine):
        self.events.append(("unload", name))


def text(*rows):
    return np.array([[t.encode()] for t in rows], dtype=object)


def router(loader=None, max_loaded=None, answer=None, timeout=5.0):
    sent = []

    def call(engine, tensors):
        sent.append((engine, {k: v.tolist() for k, v in tensors.items()}))
        if answer is not None:
            return answer(engine, tensors)
        rows = [t.decode() for t in tensors["text"].reshape(-1)]
        return {"translation": text(*(f"{engine}:{r}" for r in rows)),
                "scores": np.zeros((len(rows), 1), np.float32)}
    pool = Pool(loader or Loads(), max_loaded, None, (), timeout)
    return Router(CATALOG, pool, call, "en"), sent


def ask(r, texts, src=None, tgt=None, model=None, **more):
    given = {"text": text(*texts), **more}
    for k, v in (("src_lang", src), ("tgt_lang", tgt), ("model", model)):
        if v is not None:
            given[k] = np.array([[v.encode()]] * len(texts), dtype=object)
    out = r.handle(given)
    return [t.decode() for t in out["translation"].reshape(-1)], out["route"][0, 0].decode(), out


def test_a_pair_bundle_is_sent_the_text_alone():
    r, sent = router()
    got, route, out = ask(r, ["7", "12"], "num", "en", num_beams=np.array([[4], [4]], np.int32))
    assert got == ["numbers-stream:7", "numbers-stream:12"] and route == "num>en numbers"
    assert sent == [("numbers-stream", {"text": [[b"7"], [b"12"]], "num_beams": [[4], [4]]})]
    assert out["route"].shape == (2, 1) and "scores" in out


def test_a_multilingual_bundle_gets_its_codes_or_a_prefix():
    r, sent = router()
    assert ask(r, ["hallo"], "DE", "es")[1] == "DE>es m2m"
    assert sent[-1] == ("m2m-stream", {"text": [[b"hallo"]], "src_lang": [[b"de"]], "tgt_lang": [[b"es"]]})
    got, route, _ = ask(r, ["a cat", " "], "en", "fr")
    assert route == "en>fr en-multi" and sent[-1][1]["text"] == [[b">>fr<< a cat"], [b" "]]
    assert got == ["en-multi-stream:>>fr<< a cat", "en-multi-stream: "]


def test_a_pivot_chains_two_hops_and_shapes_only_the_last():
    r, sent = router()
    shaping = {"num_return_sequences": np.array([[2]], np.int32), "return_scores": np.array([[True]]),
               "target_prefix": text("x"), "num_beams": np.array([[3]], np.int32)}
    got, route, _ = ask(r, ["7"], "num", "fr", **shaping)
    assert route == "num>en numbers; en>fr en-multi"
    assert sent[0] == ("numbers-stream", {"text": [[b"7"]], "num_beams": [[3]]})
    assert sent[1][1]["text"] == [[b">>fr<< numbers-stream:7"]]
    assert set(sent[1][1]) == {"text", "num_beams", "num_return_sequences", "return_scores", "target_prefix"}
    assert got == ["en-multi-stream:>>fr<< numbers-stream:7"]


def test_model_forces_a_bundle():
    r, sent = router()
    assert ask(r, ["x"], "fr", "de", model="m2m")[1] == "fr>de m2m"
    with pytest.raises(Exception) as e:
        ask(r, ["x"], "en", "de", model="numbers")
    assert failure(e.value)[0] == "request"
    assert "input 'model' 'numbers' does not translate en>de" in failure(e.value)[1]


def test_an_unknown_pair_is_the_requests_and_lists_the_pairs():
    r, _ = router()
    with pytest.raises(Exception) as e:
        ask(r, ["x"], "ja", "num")
    kind, message = failure(e.value)
    assert kind == "request"
    assert "no bundle translates input 'src_lang' 'ja' to input 'tgt_lang' 'num'" in message
    assert "numbers: num>en" in message and "m2m: any of de, es, fr to another" in message
    with pytest.raises(Exception) as e:
        r.handle({"text": None})
    assert failure(e.value) == ("request", "input 'text': missing; the texts to translate, one a row")


def test_a_failed_load_is_the_servers_for_its_pair_only():
    loads = Loads(fail={"m2m"})
    r, _ = router(loads)
    with pytest.raises(Exception) as e:
        ask(r, ["x"], "de", "es")
    kind, message = failure(e.value)
    assert kind == "server" and "'m2m' failed to load" in message and "sha256 mismatch" in message
    assert ask(r, ["7"], "num", "en")[0] == ["numbers-stream:7"]  # the others serve on


def test_a_hops_error_keeps_its_kind():
    def answer(engine, tensors):
        raise HopFailed("input 'num_beams': must be at least 1, found 0", "request")
    r, _ = router(answer=answer)
    with pytest.raises(HopFailed) as e:
        ask(r, ["7"], "num", "en")
    assert failure(e.value) == ("request", "input 'num_beams': must be at least 1, found 0")
    assert failure(RuntimeError("boom")) == ("server", "xform: RuntimeError: boom")


def test_least_recently_used_and_no_room_is_unavailable():
    loads = Loads()
    r, _ = router(loads, max_loaded=2, timeout=0.2)
    for src, tgt in [("num", "en"), ("en", "de"), ("num", "en"), ("de", "fr")]:
        ask(r, ["x"], src, tgt)
    assert loads.events == [("load", "numbers"), ("load", "en-multi"), ("unload", "en-multi"), ("load", "m2m")]
    assert r.pool.stats().loaded == ["numbers", "m2m"]
    held = threading.Event()
    release = threading.Event()

    def answer(engine, tensors):  # hold both loaded bundles with a request in flight
        held.set()
        release.wait(5)
        return {"translation": tensors["text"]}
    busy = Router(CATALOG, r.pool, answer, "en")
    threads = [threading.Thread(target=ask, args=(busy, ["x"], s, t)) for s, t in (("num", "en"), ("de", "fr"))]
    for t in threads:
        t.start()
    held.wait(5)
    while sum(r.pool.stats().leases.values()) < 2:
        threading.Event().wait(0.01)
    with pytest.raises(Exception) as e:
        ask(r, ["x"], "en", "de")
    release.set()
    for t in threads:
        t.join(5)
    kind, message = failure(e.value)
    assert kind == "unavailable" and "no room to load it within the server's --load-timeout 0.2 s" in message


def test_the_stub_loader_measures_its_stubs_and_waits_for_them_to_exit():
    calls, events = [], []
    loader = StubLoader(ENGINES, lambda m: calls.append(("load", m)), lambda m: calls.append(("unload", m)),
                        stubs=lambda m: [11, 12], memory=lambda pid: pid << 20,
                        wait_gone=lambda pids, timeout: calls.append(("wait", pids, timeout)) or [],
                        unload_timeout=7, observe=lambda *a: events.append(a[:2] + a[3:]))
    assert loader.load("m2m") == ("m2m-stream", 23 << 20)
    loader.unload("m2m", "m2m-stream")
    assert calls == [("load", "m2m-stream"), ("unload", "m2m-stream"), ("wait", [11, 12], 7)]
    assert events == [("load", "m2m", 23 << 20), ("unload", "m2m", 0)]
    stuck = StubLoader(ENGINES, print, lambda m: None, lambda m: [5], lambda p: 0, lambda pids, t: pids, 1)
    with pytest.raises(Exception, match=r"m2m-stream: its stubs \[5\] were still running 1 s after its unload"):
        stuck.unload("m2m", "m2m-stream")


def test_the_catalog_round_trips_and_the_config_lists_the_inputs(tmp_path):
    settings = Settings(max_loaded=2, memory_budget=3 << 30, preload=("m2m",), load_timeout=9.0, pivot=None,
                        threads=8)
    write_catalog(tmp_path / "catalog.json", CATALOG, ENGINES, settings)
    catalog, engines, back = read_catalog(tmp_path / "catalog.json")
    assert engines == ENGINES and back == settings
    assert [(e.name, e.languages) for e in catalog] == [(e.name, e.languages) for e in CATALOG]
    config = config_pbtxt(8, 8)
    assert 'name: "translate"' in config and "max_batch_size: 8" in config and "decoupled" not in config
    assert 'name: "text" data_type: TYPE_STRING dims: [ 1 ] optional: true' in config  # not with status
    assert 'name: "status" data_type: TYPE_BOOL' in config and 'name: "status" data_type: TYPE_STRING' in config
    names = [t.name for t in inputs()]
    assert names[:4] == ["text", "src_lang", "tgt_lang", "model"] and "num_beams" in names
    assert not {"src_ids", "stream", "return_attention"} & set(names)


def test_serve_refuses_before_starting_anything(tmp_path):
    from click.testing import CliRunner

    from xform.cli import main
    r = CliRunner().invoke(main, ["serve"])
    assert r.exit_code == 2 and "missing BUNDLE (or --models DIR, or --prepare)" in r.output
    r = CliRunner().invoke(main, ["serve", str(tmp_path), "--models", str(tmp_path)])
    assert r.exit_code == 2 and "give bundles or --models DIR, not both" in r.output
    r = CliRunner().invoke(main, ["serve", "--models", str(tmp_path / "none"), "--max-loaded", "1"])
    assert r.exit_code == 1 and "no such directory of bundles" in r.output


def test_a_load_that_never_returns_fails_once_its_stub_is_gone():
    """Triton 2.51's BLS load_model was seen hanging after the engine's initialize failed: the
    loader fails the load when the engine's stub came and went and the model is not ready."""
    hang = threading.Event()
    looks = iter([[], [7], [7], []] + [[]] * 100)
    loader = StubLoader(ENGINES, lambda m: hang.wait(10), print, lambda m: next(looks), lambda p: 0,
                        lambda pids, t: [], ready=lambda m: False)
    with pytest.raises(Exception, match="failed to load 'm2m-stream': its stub exited before it was ready"):
        loader.load("m2m")
    hang.set()
    checked = StubLoader(ENGINES, print, print, lambda m: [], lambda p: 0, lambda pids, t: [],
                         check=lambda name: (_ for _ in ()).throw(RuntimeError(f"{name}: sha256 mismatch")))
    with pytest.raises(RuntimeError, match="m2m: sha256 mismatch"):
        checked.load("m2m")


def test_a_status_request_answers_the_routers_state():
    """`status` true: no translation, the pool's state as JSON (fleet_status.state), which
    `xform serve --status` prints as a table."""
    ticks = iter(range(1000))
    loads = Loads()
    pool = Pool(loads, 2, 100, ("numbers",), 5.0, clock=lambda: float(next(ticks)))
    settings = Settings(max_loaded=2, memory_budget=100, preload=("numbers",))
    r = Router(CATALOG, pool, lambda e, t: {"translation": t["text"]}, "en",
               status=lambda: fleet_status.state(CATALOG, pool, settings, lambda name: 7 << 20))
    pool.preload()
    for src, tgt in [("num", "en"), ("en", "de"), ("de", "fr"), ("en", "fr")]:
        ask(r, ["x"], src, tgt)
    out = r.handle({"status": np.array([[True]]), "text": None})
    assert list(out) == ["status"]
    data = json.loads(out["status"][0, 0])
    assert data["settings"] == {"max_loaded": 2, "memory_budget": 100, "preload": ["numbers"], "load_timeout": 60.0,
                                "pivot": "en", "idle_unload": None}
    assert data["loaded"] == ["numbers", "en-multi"] and data["resident_bytes"] == 2 and data["loading"] is None
    b = {x["name"]: x for x in data["bundles"]}
    assert b["numbers"] == {"name": "numbers", "languages": "num>en", "loaded": True, "preloaded": True,
                            "loading": False, "bytes": 7 << 20, "bytes_at_load": 1, "in_flight": 0, "requests": 1,
                            "loads": 1, "evictions": 0, "failures": 0, "idle_unloads": 0, "mean_load_seconds": 1.0,
                            "last_load_seconds": 1.0}
    assert b["en-multi"]["loads"] == 2 and b["en-multi"]["evictions"] == 1 and b["en-multi"]["requests"] == 2
    assert b["m2m"]["loaded"] is False and b["m2m"]["bytes"] is None and b["m2m"]["bytes_at_load"] == 1
    lines = fleet_status.table(data)
    assert lines[0] == ("2 of 3 bundles loaded, 0.0 MiB measured at load (at most 2 loaded, memory budget 0.0 MiB; "
                        "preloaded: numbers; loading: none)")
    assert lines[1].split() == ["bundle", "state", "memory", "at", "load", "in", "flight", "requests", "loads", "mean",
                                "load", "last", "load", "evictions", "failures"]
    assert [x.split()[:2] for x in lines[2:]] == [["numbers", "preloaded"], ["en-multi", "loaded"],
                                                  ["m2m", "unloaded"]]
    assert lines[2].split()[2:] == ["7.0", "MiB", "0.0", "MiB", "0", "1", "1", "1.00", "s", "1.00", "s", "0", "0"]


def test_preloading_waits_for_the_server_and_says_why_it_failed():
    ready = iter([False, False, True])
    pool = Pool(Loads(), None, None, ("numbers",), 5.0)
    p = Preloading(pool, lambda: next(ready), poll=0.001)
    assert p.said() == {"state": "loading", "error": None}
    p.run()
    assert p.said() == {"state": "done", "error": None} and pool.stats().loaded == ["numbers"]
    assert Preloading(Pool(Loads()), lambda: False).said()["state"] == "done"  # nothing to preload
    loads = Loads()
    p = Preloading(Pool(loads, None, None, ("numbers",), 5.0), lambda: True)
    for _ in range(3):
        p.start()  # each request calls it: one thread, one load
    deadline = time.monotonic() + 10
    while p.state == "loading" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert p.state == "done" and loads.events == [("load", "numbers")]

    class Big(Loads):
        def load(self, name):
            return super().load(name)[0], 500
    p = Preloading(Pool(Big(), None, 100, ("m2m", "numbers"), 5.0), lambda: True)
    p.run()
    assert p.state == "failed" and p.error == ("--preload 'm2m': 'm2m' took 500 bytes at its load, more than the "
                                               "--memory-budget 100 bytes: it cannot be loaded within it")
    p = Preloading(Pool(Loads(), None, None, ("m2m",), 5.0), lambda: False, timeout=0.01, poll=0.001)
    p.run()
    assert p.said() == {"state": "failed", "error": "the server was not ready 0 s after the start"}


def test_serve_checks_the_fleet_flags_before_starting_anything(tmp_path):
    from click.testing import CliRunner

    from xform.cli import main
    from xform.cli.serving import router_settings
    catalog = CATALOG
    s = router_settings({"memory_budget": "2GiB", "preload": ["m2m", "numbers"], "max_loaded": 3}, catalog)
    assert s.memory_budget == 2 << 30 and s.preload == ("m2m", "numbers") and s.max_loaded == 3 and s.pivot == "en"
    with pytest.raises(Exception, match="--preload nope: no such bundle; the bundles: en-multi, m2m, numbers"):
        router_settings({"preload": ["nope"]}, catalog)
    with pytest.raises(Exception, match="--preload m2m, numbers: 2 bundles, more than --max-loaded 1"):
        router_settings({"preload": ["m2m", "numbers"], "max_loaded": 1}, catalog)
    r = CliRunner().invoke(main, ["serve", "--models", str(tmp_path), "--memory-budget", "lots"])
    assert r.exit_code == 1 and "--memory-budget 'lots': a size such as 500MB, 2GiB" in r.output, r.output
    r = CliRunner().invoke(main, ["serve", "--status", "127.0.0.1:9", "--models", str(tmp_path)])
    assert r.exit_code == 2 and "--status URL asks a running server" in r.output
    r = CliRunner().invoke(main, ["serve", "--status", "127.0.0.1:9"])
    assert r.exit_code == 1 and "--status 127.0.0.1:9: no server answers at http://127.0.0.1:9" in r.output, r.output


def test_a_document_goes_to_its_bundle_whole():
    """document_format is passed on: the bundle splits and rejoins the document; a route that asks
    by a >>xx<< prefix and src_lang auto are refused, naming the input."""
    r, sent = router()
    fmt = np.array([[b"markdown"]], dtype=object)
    got, route, _ = ask(r, ["# Hallo\n\nEin Satz. Noch einer."], "de", "fr", document_format=fmt)
    assert route == "de>fr m2m" and sent[-1][1]["document_format"] == [[b"markdown"]]
    assert sent[-1][1]["text"] == [[b"# Hallo\n\nEin Satz. Noch einer."]]
    with pytest.raises(InputError, match="input 'document_format': en>fr en-multi asks its bundle for the target by "
                                         "a prefix"):
        ask(r, ["a cat. a dog."], "en", "fr", document_format=fmt)
    with pytest.raises(InputError, match="input 'src_lang': auto identifies"):
        ask(r, ["a cat."], "auto", "fr", document_format=fmt)
