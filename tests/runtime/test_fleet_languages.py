"""What a bundle translates (runtime/text/languages.py), read from its files: the manifest's
`languages` first, then the tokenizer's codes (fairseq: any to any; MADLAD: targets), a Marian's
tokenizer_config.json widened by >>xx<< tokens, the OPUS-MT name, else nothing; and how a request
asks each family. The bundles here are their files only (the demo's manifest, a tokenizer.json and
tokenizer/), which is all the reading opens; tests/runtime/test_fleet_translator.py reads real ones."""
import json

import pytest
from click.testing import CliRunner

from xform.cli import main
from xform.errors import BundleError, XformError
from xform.manifest import Manifest
from xform.runtime.text.languages import Ask, Asked, Languages, bundle_languages

FAIRSEQ = {"kind": "fairseq-spm", "model": "sp.model", "special": {"<unk>": 3, "__fr__": 5, "__de__": 6, "__es__": 7},
           "languages": ["__fr__", "__de__", "__es__"]}
NLLB = {**FAIRSEQ, "special": {"<unk>": 3, "fra_Latn": 5, "deu_Latn": 6}, "languages": ["fra_Latn", "deu_Latn"]}
MADLAD = {"kind": "t5", "model": "spiece.model", "languages": ["<2de>", "<2pt>"]}
MARIAN = {"kind": "marian-spm", "files": ["source.spm", "target.spm", "vocab.json"]}


def marian_files(source_lang=None, target_lang=None, targets=()):
    """A Marian's tokenizer/ files: tokenizer_config.json (when a language is given) and vocab.json
    with `>>xx<<` tokens for `targets`."""
    vocab = {"</s>": 0, "<unk>": 1, **{f">>{t}<<": 2 + i for i, t in enumerate(targets)}, "▁the": 9, "<pad>": 10}
    files = {"tokenizer/vocab.json": vocab}
    if source_lang or target_lang:
        files["tokenizer/tokenizer_config.json"] = {"source_lang": source_lang, "target_lang": target_lang}
    return files


@pytest.fixture
def bundle(demo_bundle, tmp_path):
    """fake(name, spec=None, languages=None, files={}, source=None): a directory with the demo's
    manifest, its tokenizer made `spec`, its declared `languages` and model.source.path `source`."""
    def fake(name, spec=None, languages=None, files=None, source=None):
        d = tmp_path / name
        d.mkdir()
        manifest = json.loads((demo_bundle / "manifest.json").read_text())
        if spec is not None:
            (d / "tokenizer.json").write_text(json.dumps(spec))
        else:
            manifest["tokenizer"] = None
        if languages is not None:
            manifest["languages"] = languages
        manifest["model"]["source"]["path"] = source or f"/models/{name}"
        (d / "manifest.json").write_text(json.dumps(manifest))
        for rel, content in (files or {}).items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_text(json.dumps(content))
        return d
    return fake


def test_fairseq_codes_translate_any_into_any_other(bundle):
    langs = bundle_languages(bundle("m2m", FAIRSEQ))
    assert (langs.sources, langs.targets, langs.origin) == (("fr", "de", "es"), ("fr", "de", "es"), "tokenizer")
    assert langs.covers("fr", "de") and langs.covers("es", "fr") and langs.covers("FR", "De")
    assert not langs.covers("fr", "fr") and not langs.covers("fr", "en") and not langs.covers("en", "fr")
    assert not langs.one_pair
    assert langs.asked("FR", "de") == Asked(src_lang="fr", tgt_lang="de")  # in the bundle's own codes
    nllb = bundle_languages(bundle("nllb", NLLB))
    assert nllb.targets == ("fra_Latn", "deu_Latn") and not nllb.covers("fr", "de")  # codes as written
    assert nllb.asked("fra_latn", "deu_Latn") == Asked(src_lang="fra_Latn", tgt_lang="deu_Latn")
    assert nllb.summary() == ["any of fra_Latn, deu_Latn to another"]


def test_madlad_translates_any_source_into_its_targets(bundle):
    langs = bundle_languages(bundle("madlad", MADLAD))
    assert (langs.sources, langs.targets) == (None, ("de", "pt"))
    assert langs.covers("xx", "pt") and langs.covers("en", "DE") and not langs.covers("pt", "en")
    assert langs.asked("en", "pt") == Asked(tgt_lang="pt")  # the target only: MADLAD refuses a source language
    assert langs.summary() == ["any source to de, pt"]


def test_a_marian_pair_from_its_tokenizer_config(bundle):
    langs = bundle_languages(bundle("m", MARIAN, files=marian_files("en", "de"), source="/m/opus-mt-fr-es"))
    assert (langs.pairs, langs.origin) == ((("en", "de"),), "Marian tokenizer_config.json")  # before the name
    assert langs.one_pair and langs.covers("en", "de") and not langs.covers("de", "en")
    assert langs.asked("en", "de") == Asked() and langs.summary() == ["en>de"]


def test_a_multi_target_marian_is_asked_by_a_prefix(bundle):
    langs = bundle_languages(bundle("mt", MARIAN, files=marian_files("en", "ROMANCE", ["fr", "es", "it"])))
    assert (langs.sources, langs.targets) == (("en",), ("fr", "es", "it"))  # the group widened to its tokens
    assert langs.covers("en", "es") and not langs.covers("fr", "es") and not langs.one_pair
    assert langs.asked("en", "ES") == Asked(prefix=">>es<< ")
    assert langs.origin == "Marian tokenizer_config.json and >>xx<< tokens"
    assert langs.summary() == ["en to fr, es, it"]
    both = bundle_languages(bundle("mt2", MARIAN, files=marian_files("en+de", "fr", ["fr", "es"])))
    assert (both.sources, both.targets) == (("en", "de"), ("fr", "es"))  # `+` expanded; named target first


@pytest.mark.parametrize("source_lang, target_lang", [("roa", "en"), ("en", "gem"), ("en", "SCANDINAVIA"), (None, "de")])
def test_a_marian_group_names_no_language(bundle, source_lang, target_lang):
    langs = bundle_languages(bundle("g", MARIAN, files=marian_files(source_lang, target_lang)))
    assert not langs.known and langs.summary() == [] and langs.origin == "none"


@pytest.mark.parametrize("name, pair", [("opus-mt-en-de", ("en", "de")), ("opus-mt-tc-big-en-fr", ("en", "fr")),
                                        ("opus-mt-roa-en", None), ("opus-mt-en-ROMANCE", None), ("en-de", None)])
def test_the_opus_name(bundle, name, pair):
    langs = bundle_languages(bundle("o", MARIAN, files=marian_files(), source=f"/hub/{name}"))
    assert langs.pairs == ((pair,) if pair else ())
    assert langs.origin == ("OPUS-MT name" if pair else "none")


def test_the_manifest_comes_first(bundle):
    langs = bundle_languages(bundle("declared", FAIRSEQ, languages=[["fr", "de"], ["de", "fr"]]))
    assert (langs.pairs, langs.targets, langs.origin) == ((("fr", "de"), ("de", "fr")), (), "manifest")
    assert langs.covers("de", "fr") and not langs.covers("fr", "es")
    assert langs.ask == Ask("fairseq", ("fr", "de", "es"))  # asked as its tokenizer takes them, wherever they came from
    assert langs.asked("fr", "de") == Asked(src_lang="fr", tgt_lang="de")
    pair = bundle_languages(bundle("numbers", None, languages=[["num", "en"]], source="/x/opus-mt-de-fr"))
    assert pair.one_pair and pair.pairs == (("num", "en"),) and pair.asked("num", "en") == Asked()


def test_a_bundle_without_languages_is_reached_by_name_only(bundle):
    langs = bundle_languages(bundle("demo"))
    assert langs == Languages() and not langs.known and not langs.covers("num", "en")


def test_malformed_declarations_are_refused(bundle):
    with pytest.raises(BundleError, match=r"manifest.languages must be a non-empty list of \[source, target\]"):
        bundle_languages(bundle("bad", languages=[["en", "en"]]))
    with pytest.raises(BundleError, match="manifest.languages"):
        bundle_languages(bundle("bad2", languages=[["en"]]))
    with pytest.raises(BundleError, match="tokenizer_config.json: expected a JSON object"):
        bundle_languages(bundle("bad3", MARIAN, files={"tokenizer/tokenizer_config.json": ["en"]}))


def test_export_records_languages(tmp_path):
    """`xform export --languages`: the pairs in the manifest, read back typed; a malformed flag is
    refused naming it before any work."""
    r = CliRunner().invoke(main, ["export", "demo", "-o", str(tmp_path / "b"), "--languages", "en-de"])
    assert r.exit_code == 2 and "Invalid value for '--languages': 'en-de' is not SRC:TGT" in r.output
    r = CliRunner().invoke(main, ["export", "demo", "-o", str(tmp_path / "b"), "--languages", "en:de,fr:fr"])
    assert r.exit_code == 2 and "'fr:fr' is not SRC:TGT (two different language codes" in r.output
    assert not (tmp_path / "b").exists()
    from xform.exporter.export import export_bundle
    with pytest.raises(XformError, match=r"--languages \[\('en', 'en'\)\]: expected \(source, target\) pairs"):
        export_bundle("demo", tmp_path / "b", languages=[("en", "en")])
    assert not (tmp_path / "b").exists()


def test_a_manifest_keeps_its_languages(demo_bundle):
    data = json.loads((demo_bundle / "manifest.json").read_text())
    assert "languages" not in data and Manifest.from_json(data, "m").languages is None
    m = Manifest.from_json({**data, "languages": [["num", "en"], ["num", "en"]]}, "m")
    assert m.languages == (("num", "en"),) and m.to_json()["languages"] == [["num", "en"]]


def test_a_rescan_says_what_was_added_removed_changed_and_refused(bundle, tmp_path):
    import shutil

    from xform.runtime.fleet.catalog import Catalog
    for name in ("opus-mt-en-de", "opus-mt-en-fr", "opus-mt-de-en"):
        bundle(name)
    before = Catalog.scan(tmp_path)
    same, nothing = before.rescan(tmp_path)
    assert nothing.said() == "no change" and [e for e in same] == [e for e in before]
    bundle("opus-mt-fr-de")
    shutil.rmtree(tmp_path / "opus-mt-en-fr")
    manifest = json.loads((tmp_path / "opus-mt-en-de" / "manifest.json").read_text())
    manifest["languages"] = [["en", "es"]]  # re-exported: other languages, another manifest
    (tmp_path / "opus-mt-en-de" / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "opus-mt-de-en" / "manifest.json").write_text("{ damaged")
    after, changes = before.rescan(tmp_path)
    assert changes.added == ["opus-mt-fr-de"] and changes.removed == ["opus-mt-en-fr"]
    assert changes.changed == ["opus-mt-en-de"] and list(changes.refused) == ["opus-mt-de-en"]
    assert after["opus-mt-en-de"].languages.pairs == (("en", "es"),)
    assert after["opus-mt-de-en"] == before["opus-mt-de-en"]  # kept as it was read: its loads will say why
    assert changes.said().startswith("added opus-mt-fr-de; removed opus-mt-en-fr; changed opus-mt-en-de; "
                                     "refused opus-mt-de-en (")
    bundle("late")
    (tmp_path / "late" / "manifest.json").write_text("[]")
    newest, more = after.rescan(tmp_path)
    assert "late" not in newest and list(more.refused) == ["late", "opus-mt-de-en"] and not more.added
    listed = Catalog.scan([tmp_path / "opus-mt-en-de", tmp_path / "opus-mt-fr-de"])
    shutil.rmtree(tmp_path / "opus-mt-fr-de")  # a bundle given by path, gone: removed, not an error
    assert listed.rescan([tmp_path / "opus-mt-en-de", tmp_path / "opus-mt-fr-de"])[1].removed == ["opus-mt-fr-de"]


def test_a_rescan_names_each_directory_that_is_no_bundle(bundle, tmp_path, caplog):
    """A directory in the directory of bundles that is none is skipped with a warning naming it and
    why (a rescan passed over it without a word, issue 55); dot-directories (xform's temporaries)
    are passed over."""
    import logging

    from xform.runtime.fleet.catalog import Catalog
    bundle("opus-mt-en-de")
    before = Catalog.scan(tmp_path)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("mine\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "manifest.json").mkdir()
    (tmp_path / ".en-de.xform-1-x.tmp").mkdir()
    with caplog.at_level(logging.WARNING, logger="xform.runtime.fleet.catalog"):
        after, changes = before.rescan(tmp_path)
    assert changes.said() == "no change" and list(after.entries) == ["opus-mt-en-de"]
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said == [f"{tmp_path / 'empty'}: skipped, not a bundle: no manifest.json (an empty directory)",
                    f"{tmp_path / 'notes'}: skipped, not a bundle: no manifest.json; a bundle is a directory xform "
                    "export wrote (xform export MODEL -o DIR)",
                    f"{tmp_path / 'odd'}: skipped, not a bundle: its manifest.json is not a file"], said

