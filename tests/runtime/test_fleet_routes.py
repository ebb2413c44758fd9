"""Catalogs of bundles and routes through them (runtime/fleet/catalog.py, routes.py): a pair bundle
before a multilingual one, a multilingual one before a pivot, `model=` forcing a bundle, the
pivot language, and the error that lists the pairs the catalog can do."""
import json
import shutil
from pathlib import Path

import pytest

from xform.cli.flags import said
from xform.errors import BundleError, InputError
from xform.runtime.fleet.catalog import Catalog, Entry
from xform.runtime.text.languages import FAIRSEQ, PREFIX, TARGET, Ask, Asked, Languages
from xform.runtime.fleet.routes import Hop, RouteError, plan

PAIR = Languages(pairs=(("en", "de"),), origin="manifest")
FR_EN = Languages(pairs=(("fr", "en"),), origin="manifest")
M2M = Languages(sources=("de", "en", "fr"), targets=("de", "en", "fr"), ask=Ask(FAIRSEQ, ("de", "en", "fr")))
MADLAD = Languages(sources=None, targets=("de", "pt"), ask=Ask(TARGET, ("de", "pt")))
MULTI = Languages(sources=("en",), targets=("es", "it"), ask=Ask(PREFIX, ("es", "it")))


def catalog(**languages):
    return Catalog([Entry(name, Path("/b") / name, langs) for name, langs in languages.items()])


def test_a_pair_bundle_comes_before_a_multilingual_one():
    c = catalog(a_m2m=M2M, z_en_de=PAIR)
    route = plan(c, "en", "de")
    assert route.hops == (Hop("z_en_de", "en", "de", Asked()),) and route.pivot is None
    assert str(route) == "en>de z_en_de"
    assert plan(c, "de", "fr").hops == (Hop("a_m2m", "de", "fr", Asked("de", "fr")),)  # only the m2m does it
    # one multilingual hop before two pair hops through the pivot
    assert [h.model for h in plan(catalog(fr_en=FR_EN, en_de=PAIR, m2m=M2M), "fr", "de").hops] == ["m2m"]


def test_among_equals_the_first_by_name():
    c = catalog(b_m2m=M2M, a_madlad=MADLAD)
    assert plan(c, "en", "de").hops[0].model == "a_madlad"
    assert plan(c, "en", "de").hops[0].asked == Asked(tgt_lang="de")
    assert plan(catalog(b=PAIR, a=PAIR), "en", "de").hops[0].model == "a"


def test_a_pivot_when_no_bundle_translates_the_pair():
    c = catalog(fr_en=FR_EN, en_de=PAIR, multi=MULTI)
    route = plan(c, "fr", "de")
    assert route.hops == (Hop("fr_en", "fr", "en", Asked()), Hop("en_de", "en", "de", Asked()))
    assert route.pivot == "en" and str(route) == "fr>en fr_en; en>de en_de"
    assert plan(c, "fr", "it").hops[1] == Hop("multi", "en", "it", Asked(prefix=">>it<< "))
    # each hop by the same order: the pair bundle over a multilingual one
    with_m2m = catalog(fr_en=FR_EN, en_de=PAIR, m2m=Languages(sources=("en",), targets=("de", "xx")))
    assert [h.model for h in plan(with_m2m, "fr", "de").hops] == ["fr_en", "en_de"]


def test_the_pivot_language_is_a_setting():
    c = catalog(fr_de=Languages(pairs=(("fr", "de"),)), de_es=Languages(pairs=(("de", "es"),)))
    with pytest.raises(RouteError, match="nor through pivot 'en'"):
        plan(c, "fr", "es")
    assert [h.model for h in plan(c, "fr", "es", pivot="de").hops] == ["fr_de", "de_es"]
    with pytest.raises(RouteError) as e:
        plan(c, "fr", "es", pivot=None)
    assert "pivot" not in str(e.value)


def test_an_unknown_pair_lists_what_the_catalog_can_do():
    c = catalog(en_de=PAIR, m2m=M2M, madlad=MADLAD, demo=Languages())
    with pytest.raises(RouteError) as e:
        plan(c, "ja", "ko")
    assert isinstance(e.value, InputError)  # the request's fault: a server's 400
    assert str(e.value) == (
        "no bundle translates src_lang 'ja' to tgt_lang 'ko', nor through pivot 'en'; the pairs these bundles "
        "translate: demo: no languages known (ask it by name) | en_de: en>de | m2m: any of de, en, fr to another | "
        "madlad: any source to de, pt")
    assert said(e.value).startswith("no bundle translates --src-lang 'ja' to --tgt-lang 'ko', nor through --pivot")


def test_a_model_forces_its_bundle():
    c = catalog(en_de=PAIR, m2m=M2M, demo=Languages())
    assert plan(c, "en", "de", model="m2m").hops == (Hop("m2m", "en", "de", Asked("en", "de")),)
    with pytest.raises(RouteError, match="model 'en_de' does not translate de>en; it does: en>de"):
        plan(c, "de", "en", model="en_de")
    with pytest.raises(RouteError, match="model 'nope': no such bundle; known: demo, en_de, m2m"):
        plan(c, "en", "de", model="nope")
    # a bundle whose languages are unknown is taken at its word, or with none
    assert plan(c, "num", "en", model="demo").hops == (Hop("demo", "num", "en", Asked()),)
    assert plan(c, None, None, model="demo").hops == (Hop("demo", "", "", Asked()),)
    assert str(plan(c, None, None, model="demo")) == "demo"
    assert plan(c, None, "de", model="m2m").hops[0].asked == Asked(tgt_lang="de")  # its tokenizer judges it
    with pytest.raises(RouteError, match="picks one by src_lang and tgt_lang"):
        plan(c, "en", None)


def test_the_catalog_of_a_directory(demo_bundle, tmp_path):
    for name in ("b-two", "a.one"):
        shutil.copytree(demo_bundle, tmp_path / "dir" / name)
    (tmp_path / "dir" / "notes").mkdir()  # no manifest: not a bundle, passed over
    c = Catalog.scan(tmp_path / "dir")
    assert [e.name for e in c] == ["a.one", "b-two"] and c["a.one"].path == tmp_path / "dir" / "a.one"
    assert c.summary() == ["a.one: no languages known (ask it by name)", "b-two: no languages known (ask it by name)"]
    listed = Catalog.scan([tmp_path / "dir" / "b-two", demo_bundle])
    assert [e.name for e in listed] == ["b-two", "demo"]


def test_catalog_errors(demo_bundle, tmp_path):
    with pytest.raises(InputError, match="no such directory of bundles"):
        Catalog.scan(tmp_path / "nothing")
    with pytest.raises(InputError, match="a bundle, not a directory of bundles"):
        Catalog.scan(demo_bundle)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no bundle"):
        Catalog.scan(tmp_path / "empty")
    with pytest.raises(BundleError, match="not a bundle"):
        Catalog.scan([tmp_path / "empty"])
    shutil.copytree(demo_bundle, tmp_path / "x" / "demo")
    with pytest.raises(InputError) as e:
        Catalog.scan([demo_bundle, tmp_path / "x" / "demo"])
    assert str(e.value) == (f"two bundles named 'demo': {demo_bundle} and {tmp_path / 'x' / 'demo'}; rename one "
                            "directory")
    shutil.copytree(demo_bundle, tmp_path / "y" / "-bad")
    with pytest.raises(InputError, match="the bundle name '-bad' is not a model name"):
        Catalog.scan(tmp_path / "y")
    broken = tmp_path / "z" / "broken"
    shutil.copytree(demo_bundle, broken)
    (broken / "manifest.json").write_text(json.dumps({"format": "xform-bundle"}))
    with pytest.raises(BundleError, match="manifest version"):
        Catalog.scan(tmp_path / "z")
