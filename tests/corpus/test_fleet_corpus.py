"""`xform corpus DIR` over a directory of bundles (tests/fleet_fixtures.py: numbers, en-de, m2m):
--src-lang / --tgt-lang pick the bundle once for the job (cli/fleet.py, routes.one_hop), and
the outputs equal the corpus of that bundle given itself; a pair that needs a pivot, or a bundle
asked by a prefix on each line, is refused naming why; without the languages, it says to give them."""
import json
import shutil

import pytest
from click.testing import CliRunner

from tests.fleet_fixtures import export_bundles
from xform.cli import main

pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e '.[dev]')")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    return export_bundles(tmp_path_factory.mktemp("fleet-corpus"), ("numbers", "en-de", "m2m"))


def corpus(*args):
    return CliRunner().invoke(main, ["corpus", *map(str, args), "--max-new-tokens", "6"])


@pytest.mark.parametrize("src, tgt, name, own", [("num", "en", "numbers", []),
                                                 ("en", "de", "en-de", []),
                                                 ("FR", "es", "m2m", ["--src-lang", "fr", "--tgt-lang", "es"])])
def test_a_directory_runs_the_bundle_its_route_picks(bundles, tmp_path, src, tgt, name, own):
    source = tmp_path / "in.txt"
    source.write_text({"num": "7\n40512\n\n12\n", "en": "the red cat\na blue dog\n", "FR": "le chat\nun chien\n"}[src])
    r = corpus(bundles, source, "--output-dir", tmp_path / "fleet", "--src-lang", src, "--tgt-lang", tgt)
    assert r.exit_code == 0, r.output
    assert f"route: {src}>{tgt} {name} ({bundles / name}), chosen for the whole corpus" in r.output
    r = corpus(bundles / name, source, "--output-dir", tmp_path / "alone", *own)
    assert r.exit_code == 0, r.output
    got = (tmp_path / "fleet" / "in.txt").read_text()
    assert got == (tmp_path / "alone" / "in.txt").read_text() and len(got.splitlines()) == len(source.read_text()
                                                                                              .splitlines())
    record = json.loads((tmp_path / "fleet" / "xform-corpus.json").read_text())
    assert str(bundles / name) in json.dumps(record)  # the record names the bundle that ran


def test_a_pivot_a_prefix_or_no_languages_is_refused(bundles, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("7\n")
    r = corpus(bundles, source, "--output-dir", tmp_path / "o", "--src-lang", "num", "--tgt-lang", "de")
    assert r.exit_code == 1 and "no bundle translates --src-lang 'num' to --tgt-lang 'de' in one hop" in r.output
    assert "the route is num>en numbers; en>de en-de, and a corpus runs one bundle: translate to 'en' first " \
           "(numbers), then that output to 'de' (en-de)" in r.output, r.output
    r = corpus(bundles, source, "--output-dir", tmp_path / "o")
    assert r.exit_code == 1 and "a directory of bundles picks one by --src-lang and --tgt-lang" in r.output, r.output
    multi = tmp_path / "multi"
    shutil.copytree(bundles / "en-de", multi / "en-multi")
    vocab = json.loads((multi / "en-multi" / "tokenizer" / "vocab.json").read_text())
    vocab.update({">>de<<": len(vocab), ">>fr<<": len(vocab) + 1})
    (multi / "en-multi" / "tokenizer" / "vocab.json").write_text(json.dumps(vocab))  # the catalog reads it
    r = corpus(multi, source, "--output-dir", tmp_path / "o", "--src-lang", "en", "--tgt-lang", "fr")
    assert r.exit_code == 1 and "en-multi is asked by a '>>fr<<' prefix on each source" in r.output, r.output
    assert not (tmp_path / "o").exists()
