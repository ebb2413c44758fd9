"""`xform.Translator(DIR)` over bundles of three families, one at a time (max_loaded 1): the demo
(numbers to English words, `export --languages num:en`), a Marian (en>de by its
tokenizer_config.json) and an M2M100 (any of its codes to another). Each answer equals its bundle
translating alone, a pivot equals the two translations by hand, and loads and evictions follow the
least recently used rule. The plumbing of a hop (a Marian's >>xx<< prefix, the options of a
pivot's first hop) is checked with recording translators; docs/python.md's block runs here."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import xform
from tests.fleet_fixtures import WORDS, export_bundles
from tests.fleet_fixtures import alone as translators_alone
from tests.test_docs import marked
from xform.errors import XformError
from xform.runtime.decoding.request import TranslationResult
from xform.runtime.fleet.catalog import Catalog
from xform.runtime.fleet.local import FleetTranslator, RoutedResult, resident_bytes
from xform.runtime.fleet.routes import RouteError

pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e '.[dev]')")
SHORT = {"max_decoding_length": 6, "beam_size": 2}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """A directory of three bundles: numbers (demo, num:en), en-de (Marian), m2m (M2M100)."""
    return export_bundles(tmp_path_factory.mktemp("fleet"), ("numbers", "en-de", "m2m"))


@pytest.fixture(scope="module")
def alone(bundles):
    """name -> that bundle's own xform.Translator."""
    return translators_alone(bundles)


def hypotheses(results):
    return [r.hypotheses for r in results]


def test_the_catalog_reads_each_family(bundles):
    c = Catalog.scan(bundles)
    assert {e.name: e.languages.origin for e in c} == {
        "en-de": "Marian tokenizer_config.json", "m2m": "tokenizer", "numbers": "manifest"}
    assert c["en-de"].languages.pairs == (("en", "de"),) and c["numbers"].languages.pairs == (("num", "en"),)
    m2m = c["m2m"].languages
    assert {"de", "en", "es", "fr"} <= set(m2m.targets) and m2m.sources == m2m.targets and m2m.ask.kind == "fairseq"
    assert c.summary()[1].startswith("m2m: any of af, am, ar,") and c.summary()[1].endswith("codes) to another")


def test_each_answer_equals_its_bundle_alone(bundles, alone):
    fleet = xform.Translator(bundles, max_loaded=1)
    assert isinstance(fleet, FleetTranslator) and not isinstance(fleet, xform.Translator)
    asked = [("num", "en", ["40512", "7"], "numbers", {}), ("en", "de", WORDS, "en-de", {}),
             ("fr", "es", ["Élodie a mangé", "le chat"], "m2m", {"src_lang": "fr", "tgt_lang": "es"})]
    for src, tgt, texts, name, languages in asked:
        got = fleet.translate_batch(texts, src_lang=src, tgt_lang=tgt, **SHORT)
        assert hypotheses(got) == hypotheses(alone[name].translate_batch(texts, **languages, **SHORT)), name
        assert all(isinstance(r, RoutedResult) and str(r.route) == f"{src}>{tgt} {name}" for r in got)
        assert fleet.stats().loaded == [name]
    s = fleet.stats()
    assert s.loads == {"numbers": 1, "en-de": 1, "m2m": 1} and s.evictions == {"numbers": 1, "en-de": 1}
    assert hypotheses(fleet.translate_batch(["7"], src_lang="num", tgt_lang="en")) == [["seven"]]
    assert fleet.stats().loads["numbers"] == 2 and fleet.stats().evictions["m2m"] == 1


def test_a_pivot_equals_two_translations_by_hand(bundles, alone):
    fleet = xform.Translator(bundles, max_loaded=1)
    got = fleet.translate_batch(["40512", "7"], src_lang="num", tgt_lang="de", **SHORT)
    english = [r.hypotheses[0] for r in alone["numbers"].translate_batch(["40512", "7"], **SHORT)]
    assert english == ["forty thousand five hundred twelve", "seven"]
    assert hypotheses(got) == hypotheses(alone["en-de"].translate_batch(english, **SHORT))
    assert str(got[0].route) == "num>en numbers; en>de en-de" and got[0].route.pivot == "en"
    s = fleet.stats()
    assert s.loaded == ["en-de"] and s.evictions == {"numbers": 1}


def test_loads_and_evictions_follow_least_recently_used(bundles):
    fleet = xform.Translator([bundles / "numbers", bundles / "en-de", bundles / "m2m"], max_loaded=2)
    for src, tgt in [("num", "en"), ("en", "de"), ("num", "en"), ("fr", "es")]:
        fleet.translate_batch(["7"], src_lang=src, tgt_lang=tgt, max_decoding_length=2)
    s = fleet.stats()
    assert s.loaded == ["numbers", "m2m"] and s.evictions == {"en-de": 1}  # en-de was the least recently used
    assert s.loads == {"numbers": 1, "en-de": 1, "m2m": 1}
    assert all(isinstance(c, int) and c >= 0 for c in s.costs.values())  # measured at each load (below)
    fleet.close()
    assert fleet.stats().loaded == []


def test_an_idle_bundle_is_closed_after_idle_unload_seconds(bundles):
    fleet = xform.Translator(bundles, idle_unload=0.3)
    try:
        fleet.translate_batch(["7"], src_lang="num", tgt_lang="en", max_decoding_length=2)
        deadline = time.monotonic() + 20
        while fleet.stats().loaded and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fleet.stats().loaded == [] and fleet.stats().idle_unloads == {"numbers": 1}
        assert fleet.translate_batch(["7"], src_lang="num", tgt_lang="en", max_decoding_length=2)  # loaded again
    finally:
        fleet.close()
    with pytest.raises(XformError, match="idle_unload: for a directory of bundles"):
        xform.Translator(bundles / "numbers", idle_unload=5)


def test_rescan_routes_new_bundles_and_closes_removed_and_changed_ones(bundles, alone, tmp_path):
    """A copy of two bundles: en-de added to it and numbers removed after the first use; then
    en-de re-exported (its manifest changed): closed, and opened anew at its next use."""
    where = tmp_path / "dir"
    for name in ("numbers", "m2m"):
        shutil.copytree(bundles / name, where / name)
    fleet = xform.Translator(where)
    try:
        fleet.translate_batch(["7"], src_lang="num", tgt_lang="en", max_decoding_length=2)
        assert fleet.route("en", "de").hops[0].model == "m2m"  # until a pair bundle comes
        shutil.copytree(bundles / "en-de", where / "en-de")
        shutil.rmtree(where / "numbers")
        changes = fleet.rescan()
        assert (changes.added, changes.removed, changes.changed) == (["en-de"], ["numbers"], [])
        assert fleet.stats().loaded == [] and fleet.stats().loads == {"numbers": 1}  # closed: unused
        got = fleet.translate_batch(WORDS, src_lang="en", tgt_lang="de", **SHORT)
        assert hypotheses(got) == hypotheses(alone["en-de"].translate_batch(WORDS, **SHORT))
        assert [str(r.route) for r in got] == ["en>de en-de"] * 2
        with pytest.raises(RouteError, match="no bundle translates src_lang 'num'"):
            fleet.route("num", "en")
        manifest = json.loads((where / "en-de" / "manifest.json").read_text())
        (where / "en-de" / "manifest.json").write_text(json.dumps({**manifest, "languages": [["en", "nl"]]}))
        assert fleet.rescan().changed == ["en-de"] and fleet.stats().loaded == []
        assert fleet.route("en", "nl").hops[0].model == "en-de" and fleet.rescan().said() == "no change"
    finally:
        fleet.close()


def test_model_and_errors(bundles, alone):
    fleet = xform.Translator(bundles, max_loaded=1)
    got = fleet.translate_batch(WORDS, src_lang="en", tgt_lang="de", model="m2m", **SHORT)  # not the pair bundle
    assert hypotheses(got) == hypotheses(alone["m2m"].translate_batch(WORDS, src_lang="en", tgt_lang="de", **SHORT))
    assert hypotheses(got) != hypotheses(alone["en-de"].translate_batch(WORDS, **SHORT))  # the bundles differ
    with pytest.raises(RouteError, match="no bundle translates src_lang 'ja' to tgt_lang 'num'.*numbers: num>en"):
        fleet.translate_batch(["x"], src_lang="ja", tgt_lang="num")
    with pytest.raises(RouteError, match="picks one by src_lang and tgt_lang"):
        fleet.translate_batch(["x"])
    with pytest.raises(XformError, match="max_loaded: for a directory of bundles"):
        xform.Translator(bundles / "numbers", max_loaded=1)
    with pytest.raises(XformError, match="compute_type float16: a directory's bundles each keep"):
        xform.Translator(bundles, compute_type="float16")
    assert type(xform.Translator(bundles / "numbers")) is xform.Translator  # one bundle: as before


def test_a_cost_is_the_resident_growth_across_the_load(bundles):
    """SessionLoader's cost: what this process's resident memory grew by while the bundle opened
    (here an opener that writes 64 MiB); pinned bundles open with the translator."""
    if resident_bytes() is None:
        pytest.skip("no /proc: resident memory unknown")
    held = []
    fleet = FleetTranslator(bundles, lambda path: held.append(b"x" * (64 << 20)) or Recording(path.name, []),
                            pinned=["m2m"])
    assert fleet.stats().loaded == ["m2m"] and 60 << 20 <= fleet.stats().costs["m2m"] < 200 << 20
    with pytest.raises(XformError, match=r"pinned \['nope'\]: no such bundle"):
        FleetTranslator(bundles, lambda path: Recording(path.name, []), pinned=["nope"])
    held.clear()
    with pytest.raises(XformError, match=r"preload 'm2m': 'm2m' took \d+ bytes at its load, more than the "
                                         "memory_budget 50000000 bytes: it cannot be loaded within it"):
        FleetTranslator(bundles, lambda path: held.append(b"x" * (64 << 20)) or Recording(path.name, []),
                        memory_budget="50MB", pinned=["m2m"])
    held.clear()
    fleet = xform.Translator(bundles, memory_budget="1GiB", pinned=["numbers"])  # a size, as the server's flag
    assert fleet.pool.budget == 1 << 30 and fleet.stats().loaded == ["numbers"]
    with pytest.raises(XformError, match="memory_budget '2 parsecs': a size such as 500MB, 2GiB"):
        xform.Translator(bundles, memory_budget="2 parsecs")


def test_a_directory_of_no_bundles_is_still_one_bundles_error(tmp_path):
    with pytest.raises(XformError, match="manifest.json: missing; .* is not an xform bundle"):
        xform.Translator(tmp_path)


class Recording:
    """A text Translator's stand-in: answers `<tgt_lang or model>:<text>` and records each call."""

    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def translate_batch(self, texts, target_prefix=None, *, src_lang=None, tgt_lang=None, **options):
        self.calls.append((self.name, list(texts), target_prefix, src_lang, tgt_lang, options))
        return [TranslationResult([f"{self.name}:{t}"] * options.get("num_hypotheses", 1)) for t in texts]


def test_a_hop_asks_as_its_bundle_takes_it(bundles, tmp_path):
    """A multi-target Marian gets >>tgt<< on each text (not on a blank one); a pivot's first hop
    makes one translation and takes no target prefix; the last gets what shapes the answer."""
    shutil.copytree(bundles / "numbers", tmp_path / "numbers")
    multi = tmp_path / "en-multi"
    shutil.copytree(bundles / "en-de", multi)
    vocab = json.loads((multi / "tokenizer" / "vocab.json").read_text())
    vocab.update({">>de<<": len(vocab), ">>fr<<": len(vocab) + 1})
    (multi / "tokenizer" / "vocab.json").write_text(json.dumps(vocab))  # read by the catalog, no session opened
    calls = []
    fleet = FleetTranslator(tmp_path, lambda path: Recording(path.name, calls), max_loaded=1)
    got = fleet.translate_batch(["7", " "], ["pre", None], src_lang="num", tgt_lang="fr", num_hypotheses=2,
                                beam_size=3)
    assert calls == [("numbers", ["7", " "], None, None, None, {"beam_size": 3}),
                     ("en-multi", [">>fr<< numbers:7", ">>fr<< numbers: "], ["pre", None], None, None,
                      {"num_hypotheses": 2, "beam_size": 3})]
    assert hypotheses(got) == [["en-multi:>>fr<< numbers:7"] * 2, ["en-multi:>>fr<< numbers: "] * 2]
    calls.clear()
    fleet.translate_batch(["a", ""], src_lang="en", tgt_lang="de")
    assert calls == [("en-multi", [">>de<< a", ""], None, None, None, {})]
    shutil.copytree(bundles / "m2m", tmp_path / "m2m")
    calls.clear()
    fleet = FleetTranslator(tmp_path, lambda path: Recording(path.name, calls))
    fleet.translate_batch(["a"], src_lang="FR", tgt_lang="es", model="m2m")
    fleet.translate_batch(["b"], src_lang="es", tgt_lang="de")  # not en-multi: it translates from English only
    assert calls == [("m2m", ["a"], None, "fr", "es", {}), ("m2m", ["b"], None, "es", "de", {})]


def test_the_python_guide_block(bundles, tmp_path):
    """docs/python.md's "Many bundles in one process" block, in a directory holding its bundles."""
    for name in ("numbers", "en-de"):
        shutil.copytree(bundles / name, tmp_path / "bundles" / name)
    env = {**os.environ, "PYTHONPATH": str(Path(xform.__file__).parents[1])}  # this checkout's xform, whatever is installed
    r = subprocess.run([sys.executable, "-c", marked("fleet-python", "docs/python.md", "python")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "['forty thousand five hundred twelve', 'seven'] num>en numbers"
    assert lines[1].endswith(" num>en numbers; en>de en-de") and lines[2] == "['en-de'] {'numbers': 1}"
