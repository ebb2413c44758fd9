"""The many-bundle server's rescan without Triton (serving/rescan.py): a repository written by
write_fleet over copies of the demo bundle, the router's pool over a recording loader. Added
bundles get their models and routes, removed ones leave (at once when idle, after their last
request when one holds them), changed ones are reloaded (a --preload one at once), unreadable
or unservable ones are refused while the rest goes on, catalog.json says what the last rescan
found, and a request routed to a bundle that a rescan then removes is unavailable (503). Triton's
side: tests/serving/test_fleet_server.py and tests/serving/test_fleet_door.py."""
import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from xform.cli import main
from xform.errors import InputError
from xform.runtime.fleet.catalog import Catalog
from xform.runtime.fleet.pool import Pool
from xform.serving.fleet_repository import write_fleet
from xform.serving.repository import ModelOptions
from xform.serving.rescan import Rescanner
from xform.serving.router import CATALOG, ROUTER, Router, Settings, read_catalog


class Loads:
    def __init__(self):
        self.events = []

    def load(self, name):
        self.events.append(("load", name))
        return f"{name}-stream", 1

    def unload(self, name, engine):
        self.events.append(("unload", name))


def bundle(demo_bundle, where, name, pair=("num", "en")):
    """A copy of the demo named `name`, declaring `pair`."""
    shutil.copytree(demo_bundle, where / name)
    manifest = json.loads((where / name / "manifest.json").read_text())
    manifest["languages"] = [list(pair)]
    (where / name / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture
def served(demo_bundle, tmp_path):
    """(bundles dir, repo, router, pool, loader, rescanner): bundles a (num>en), b (en>de, preloaded)
    and c (en>fr), written as `xform serve --models` writes them."""
    where = tmp_path / "bundles"
    where.mkdir()
    for name, pair in (("a", ("num", "en")), ("b", ("en", "de")), ("c", ("en", "fr"))):
        bundle(demo_bundle, where, name, pair)
    repo = tmp_path / "repo"
    write_fleet(Catalog.scan(where), repo, ModelOptions(), Settings(preload=("b",)), where)
    path = repo / ROUTER / "1" / CATALOG
    catalog, engines, _ = read_catalog(path)
    loads = Loads()
    pool = Pool(loads, None, None, ("b",), 5.0)
    pool.preload()
    router = Router(catalog, pool, lambda engine, t: {"translation": t["text"]})
    router.rescan = Rescanner(path, router, pool, engines)
    return where, repo, router, pool, loads


def rescan(router):
    return json.loads(router.handle({"rescan": np.array([[True]])})["status"][0, 0])


def ask(router, src, tgt):
    return router.handle({"text": np.array([[b"7"]], dtype=object), "src_lang": np.array([[src.encode()]], dtype=object),
                          "tgt_lang": np.array([[tgt.encode()]], dtype=object)})["route"][0, 0].decode()


def test_an_added_bundle_is_written_and_routed_a_removed_one_leaves(served, demo_bundle):
    where, repo, router, pool, loads = served
    assert rescan(router) == {"added": [], "removed": [], "changed": [], "refused": {}, "reload_failed": {},
                              "bundles": ["a", "b", "c"]}
    with pytest.raises(InputError, match="no bundle translates src_lang 'de' to tgt_lang 'en'"):
        ask(router, "de", "en")
    ask(router, "num", "en")
    bundle(demo_bundle, where, "d", ("de", "en"))
    shutil.rmtree(where / "a")
    got = rescan(router)
    assert got == {"added": ["d"], "removed": ["a"], "changed": [], "refused": {}, "reload_failed": {},
                   "bundles": ["b", "c", "d"]}
    assert ask(router, "de", "en") == "de>en d"
    assert sorted(p.name for p in repo.iterdir()) == ["b", "b-stream", "c", "c-stream", "d", "d-stream", ROUTER]
    assert ("unload", "a") in loads.events and "a" not in pool.stats().loaded
    catalog, engines, _ = read_catalog(repo / ROUTER / "1" / CATALOG)
    assert [e.name for e in catalog] == ["b", "c", "d"] and engines["d"] == "d-stream" and "a" not in engines
    with pytest.raises(InputError, match=r"no bundle translates src_lang 'num' .* b: en>de \| c: en>fr \| d: de>en$"):
        ask(router, "num", "en")


def test_a_removed_bundle_in_use_leaves_after_its_last_request(served):
    where, repo, router, pool, loads = served
    held = pool.acquire("c")
    shutil.rmtree(where / "c")
    assert rescan(router)["removed"] == ["c"]
    assert (repo / "c-stream").is_dir() and pool.stats().loaded == ["b", "c"]  # a request holds it
    pool.release("c")
    for _ in range(200):
        if "c" not in pool.stats().loaded:
            break
        __import__("time").sleep(0.02)
    assert loads.events[-1] == ("unload", "c") and held == "c-stream"
    assert rescan(router)["removed"] == [] and not (repo / "c-stream").exists()  # cleared at the next rescan


def test_a_changed_bundle_is_reloaded_and_a_preloaded_one_at_once(served):
    where, repo, router, pool, loads = served
    ask(router, "en", "fr")
    for name, pair in (("b", ["en", "es"]), ("c", ["en", "it"])):  # re-exported: another manifest
        manifest = json.loads((where / name / "manifest.json").read_text())
        manifest["languages"] = [pair]
        (where / name / "manifest.json").write_text(json.dumps(manifest))
    before = len(loads.events)
    assert rescan(router)["changed"] == ["b", "c"]
    assert sorted(loads.events[before:]) == [("load", "b"), ("unload", "b"), ("unload", "c")]
    assert pool.stats().loaded == ["b"] and "b" in pool.pinned  # still preloaded
    assert ask(router, "en", "it") == "en>it c" and ask(router, "en", "es") == "en>es b"
    assert pool.stats().requests.get("b") == 1  # the reload is no request


def test_unreadable_and_unservable_bundles_are_refused_the_rest_goes_on(served, demo_bundle):
    where, repo, router, pool, loads = served
    bundle(demo_bundle, where, ROUTER, ("fr", "en"))  # the router's name
    bundle(demo_bundle, where, "e", ("es", "en"))
    (where / "e" / "manifest.json").write_text("{ damaged")
    bundle(demo_bundle, where, "f", ("it", "en"))
    (where / "f" / "decoder.onnx").write_bytes(b"not the graph")  # its files' hashes fail
    (where / "a" / "manifest.json").write_text("[]")  # a known one damaged: kept as it was read
    bundle(demo_bundle, where, "bad name", ("it", "en"))
    bundle(demo_bundle, where, ".g.xform-77-x.tmp", ("it", "en"))  # an export's temporary: not a bundle
    got = rescan(router)
    assert got["added"] == [] and got["bundles"] == ["a", "b", "c"]
    assert sorted(got["refused"]) == ["a", "bad name", "e", "f", ROUTER]
    assert "is not a model name" in got["refused"]["bad name"]
    assert "'translate' is the router's model" in got["refused"][ROUTER]
    assert "decoder.onnx" in got["refused"]["f"] and not (repo / "f").exists()
    assert ask(router, "num", "en") == "num>en a"


def test_rescan_url_refuses_what_it_cannot_ask(tmp_path):
    r = CliRunner().invoke(main, ["serve", "--rescan", "http://127.0.0.1:9", "--status", "http://127.0.0.1:9"])
    assert r.exit_code == 2 and "--status URL asks a running server" in r.output
    r = CliRunner().invoke(main, ["serve", "--rescan", "http://127.0.0.1:9"])
    assert r.exit_code == 1 and "--rescan http://127.0.0.1:9: no server answers at http://127.0.0.1:9" in r.output


def test_a_linked_bundle_is_one_bundle_and_a_removed_preload_leaves_the_catalog(served, tmp_path):
    """A bundle reached through a link keeps its link's name and is no change at each rescan; a
    removed --preload bundle is no longer preloaded in catalog.json (a router Triton reloads
    would otherwise try to preload it)."""
    where, repo, router, pool, loads = served
    shutil.copytree(where / "c", tmp_path / "exports-d")
    (where / "d").symlink_to(tmp_path / "exports-d")
    assert rescan(router)["added"] == ["d"]
    assert read_catalog(repo / ROUTER / "1" / CATALOG)[0]["d"].path == where / "d"  # the link, as given
    assert rescan(router)["changed"] == [] and rescan(router)["bundles"] == ["a", "b", "c", "d"]
    shutil.rmtree(where / "b")
    assert rescan(router)["removed"] == ["b"]
    assert read_catalog(repo / ROUTER / "1" / CATALOG)[2].preload == ()


@pytest.mark.parametrize("during", ["the first hop", "the second hop's load"])
def test_a_request_routed_to_a_bundle_a_rescan_then_removes_is_unavailable(demo_bundle, tmp_path, during):
    """A pivot routed num>en a; en>de b, b removed by a rescan while its first hop runs (or while b
    loads for the second): the second hop is 503 (Removed, retryable: the client did nothing
    wrong), not a failed load; sent again, it is routed over what is served now (no route: 400).
    The loader is Triton's (StubLoader: engines, and the catalog checked before a load) over fakes."""
    from xform.serving.router import Removed, StubLoader, failure
    where = tmp_path / "bundles"
    where.mkdir()
    for name, pair in (("a", ("num", "en")), ("b", ("en", "de"))):
        bundle(demo_bundle, where, name, pair)
    repo = tmp_path / "repo"
    write_fleet(Catalog.scan(where), repo, ModelOptions(), Settings(), where)
    path = repo / ROUTER / "1" / CATALOG
    catalog, engines, _ = read_catalog(path)

    def remove_b():
        shutil.rmtree(where / "b")
        assert router.rescan() == {"added": [], "removed": ["b"], "changed": [], "refused": {},
                                   "reload_failed": {}, "bundles": ["a"]}

    def check(name):
        if name == "b" and during == "the second hop's load":
            remove_b()
        return router.catalog[name]

    def call(engine, given):
        if engine == "a-stream" and during == "the first hop":
            remove_b()
        return {"translation": given["text"]}
    loader = StubLoader(engines, lambda m: None, lambda m: None, lambda e: [], lambda p: 0, lambda pids, t: [],
                        check=check)
    router = Router(catalog, Pool(loader, None, None, (), 5.0), call)
    router.rescan = Rescanner(path, router, router.pool, engines)
    with pytest.raises(Removed) as e:
        ask(router, "num", "de")
    assert failure(e.value) == ("unavailable", "bundle 'b' was removed by a rescan after this request was routed "
                                               "to it; send the request again: it is routed over the bundles served "
                                               "now (a)")
    with pytest.raises(InputError, match="no bundle translates src_lang 'num' to tgt_lang 'de'"):
        ask(router, "num", "de")
