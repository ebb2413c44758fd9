"""`xform eval`: sacreBLEU's BLEU and chrF of a bundle's translations, against references and
against a second system (eager PyTorch, another bundle); refusals by name."""
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import xform
from xform.cli import main
from xform.files import current_umask

sacrebleu = pytest.importorskip("sacrebleu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from train_demo import to_words  # noqa: E402

NUMBERS = [7919 * n % 1000003 for n in range(1, 31)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Sources, and references with every fourth one wrong (so BLEU is below 100)."""
    d = tmp_path_factory.mktemp("eval")
    (d / "src.txt").write_text("".join(f"{n}\n" for n in NUMBERS))
    refs = [to_words(n) if i % 4 else to_words(n + 1) for i, n in enumerate(NUMBERS)]
    (d / "ref.txt").write_text("".join(r + "\n" for r in refs))
    return d


def run(*args):
    r = CliRunner().invoke(main, ["eval", *map(str, args)])
    return r.exit_code, r.output


def test_scores_equal_sacrebleu_on_the_same_translations(demo_bundle, files, tmp_path):
    code, output = run(demo_bundle, "--source", files / "src.txt", "--reference", files / "ref.txt",
                       "--json", tmp_path / "e.json")
    assert code == 0, output
    hyps = xform.Translator(demo_bundle).translate([str(n) for n in NUMBERS])
    refs = (files / "ref.txt").read_text().splitlines()
    data = json.loads((tmp_path / "e.json").read_text())
    assert data["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)
    assert data["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score, abs=1e-9)
    assert 0 < data["bleu"] < 100 and data["lines"] == len(NUMBERS) and data["lines_per_s"] > 0
    assert data["signature"]["bleu"].startswith("nrefs:1|") and "BLEU nrefs:1" in output


def test_against_eager_is_identical_on_fp32(demo_bundle, files, tmp_path):
    code, output = run(demo_bundle, "--source", files / "src.txt", "--reference", files / "ref.txt",
                       "--against", "eager", "--json", tmp_path / "e.json")
    assert code == 0, output
    data = json.loads((tmp_path / "e.json").read_text())
    ours, eager = data["systems"]
    assert data["identical"] == 1.0 and ours["bleu"] == eager["bleu"] and ours["chrf"] == eager["chrf"]
    assert set(data["sentence_chrf_delta"]) == {0.0} and data["worst"] == []


@pytest.fixture(scope="module")
def demo8(tmp_path_factory):
    from xform.exporter.export import export_bundle
    return export_bundle("demo", tmp_path_factory.mktemp("eval8") / "demo8", precision="int8").path


def test_int8_against_fp32_equals_the_same_figures_by_hand(demo_bundle, demo8, files, tmp_path):
    int8 = demo8
    code, output = run(int8, "--source", files / "src.txt", "--against", demo_bundle, "--num-beams", "2",
                       "--json", tmp_path / "e.json")
    assert code == 0, output
    texts = [str(n) for n in NUMBERS]
    a = xform.Translator(int8).translate(texts, num_beams=2)
    b = xform.Translator(demo_bundle).translate(texts, num_beams=2)
    data = json.loads((tmp_path / "e.json").read_text())
    assert data["bleu"] == pytest.approx(sacrebleu.corpus_bleu(a, [b]).score, abs=1e-9)  # fp32's as the reference
    assert data["identical"] == pytest.approx(sum(x == y for x, y in zip(a, b)) / len(a))
    assert data["generation"]["num_beams"] == 2
    assert len(data["sentence_chrf_delta"]) == len(NUMBERS)


def test_refusals_name_the_file(demo_bundle, files, tmp_path):
    (tmp_path / "short.txt").write_text("one\n")
    (tmp_path / "empty.txt").write_text("\n\n")
    code, output = run(demo_bundle, "--source", files / "src.txt", "--reference", tmp_path / "short.txt")
    assert code == 1 and "--reference" in output and "1 lines for the 30 of --source" in output, output
    code, output = run(demo_bundle, "--source", tmp_path / "empty.txt", "--reference", files / "ref.txt")
    assert code == 1 and "empty.txt: empty" in output, output
    code, output = run(demo_bundle, "--source", files / "src.txt")
    assert code == 2 and "give --reference, --against, or both" in output, output
    code, output = run(demo_bundle, "--source", files / "src.txt", "--against", tmp_path / "nope")
    assert code == 1 and "expected eager or a bundle directory" in output, output
    broken = tmp_path / "noref"
    shutil.copytree(demo_bundle, broken)
    shutil.rmtree(broken / "reference")
    code, output = run(broken, "--source", files / "src.txt", "--against", "eager")
    assert code == 1 and "reference" in output and "Traceback" not in output, output


def test_a_line_not_utf8_fails_alone_as_in_run(demo_bundle, files, tmp_path):
    """One line of --source that is not UTF-8: named by file and line on stderr, left out of the
    scores, the others translated and scored, exit 1 (the whole file was refused without its line
    number, where `run` fails that line alone, issue 55)."""
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    lines = (files / "src.txt").read_bytes().splitlines()
    src.write_bytes(b"\n".join(lines[:3] + [b"\xff 12"] + lines[3:]) + b"\n")
    refs = (files / "ref.txt").read_text().splitlines()
    ref.write_text("\n".join(refs[:3] + ["twelve"] + refs[3:]) + "\n")
    r = CliRunner().invoke(main, ["eval", str(demo_bundle), "--source", str(src), "--reference", str(ref),
                                  "--against", "eager", "--json", str(tmp_path / "e.json")])
    assert r.exit_code == 1, r.output
    assert f"{src}:4: not UTF-8" in r.stderr and "1 of 31 lines could not be translated" in r.stderr, r.stderr
    data = json.loads((tmp_path / "e.json").read_text())
    assert data["failed"][0]["line"] == 4 and data["failed"][0]["error"].startswith("not UTF-8")
    hyps = xform.Translator(demo_bundle).translate([str(n) for n in NUMBERS])
    assert data["lines"] == len(NUMBERS)  # the 30 good lines, scored as they are alone
    assert data["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)
    bad_ref = tmp_path / "bad_ref.txt"
    bad_ref.write_bytes(ref.read_bytes().replace(b"twelve", b"\xfftwelve"))
    code, output = run(demo_bundle, "--source", src, "--reference", bad_ref)
    assert code == 1 and f"--reference {bad_ref}:4: not UTF-8" in output, output


def test_a_line_over_max_len_fails_alone_and_truncate_cuts_it(demo_bundle, files, tmp_path):
    """A source line longer than the model's max_len fails alone, its message naming eval's own
    --truncate; with --truncate it is cut and scored, as run --truncate does (issue 55: the
    advice named a flag eval lacked)."""
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text((files / "src.txt").read_text() + "9" * 400 + "\n")
    ref.write_text((files / "ref.txt").read_text() + "nine\n")
    code, output = run(demo_bundle, "--source", src, "--reference", ref)
    assert code == 1 and f"{src}:31:" in output and "--truncate" in output, output
    code, output = run(demo_bundle, "--source", src, "--reference", ref, "--truncate", "--json", tmp_path / "e.json")
    assert code == 0, output
    assert json.loads((tmp_path / "e.json").read_text())["lines"] == len(NUMBERS) + 1


def test_int8_against_eager_equals_eager_decodes_by_hand(demo8, files, tmp_path):
    """--against eager on an int8 bundle: eager is PyTorch on the bundle's fp32 reference weights,
    so the figures are those of the int8 graphs' translations against torch's, computed here."""
    code, output = run(demo8, "--source", files / "src.txt", "--reference", files / "ref.txt", "--against", "eager",
                       "--json", tmp_path / "e.json")
    assert code == 0, output
    texts = [str(n) for n in NUMBERS]
    ours = xform.Translator(demo8).translate(texts)
    eager = xform.Translator(demo8, backend="torch").translate(texts)
    refs = (files / "ref.txt").read_text().splitlines()
    data = json.loads((tmp_path / "e.json").read_text())
    (a, b) = data["systems"]
    assert b["name"] == "eager"
    assert a["bleu"] == pytest.approx(sacrebleu.corpus_bleu(ours, [refs]).score, abs=1e-9)
    assert b["bleu"] == pytest.approx(sacrebleu.corpus_bleu(eager, [refs]).score, abs=1e-9)
    assert b["chrf"] == pytest.approx(sacrebleu.corpus_chrf(eager, [refs]).score, abs=1e-9)
    assert data["identical"] == pytest.approx(sum(x == y for x, y in zip(ours, eager)) / len(ours))
    deltas = [sacrebleu.sentence_chrf(x, [r]).score - sacrebleu.sentence_chrf(y, [r]).score
              for x, y, r in zip(ours, eager, refs)]
    assert data["sentence_chrf_delta"] == pytest.approx(deltas, abs=1e-3)


def test_the_eval_extra_installs_what_eval_and_its_plot_need():
    import tomllib
    extras = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    names = {re.split(r"[<>=\[]", d)[0] for d in extras["project"]["optional-dependencies"]["eval"]}
    assert {"sacrebleu", "matplotlib"} <= names


def test_plot_draws_the_differences_as_a_png(demo_bundle, demo8, files, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "d.png"
    code, output = run(demo8, "--source", files / "src.txt", "--against", demo_bundle, "--plot", png)
    assert code == 0, output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert [p.name for p in tmp_path.iterdir()] == ["d.png"]  # no temporary left beside it
    assert png.stat().st_mode & 0o777 == 0o666 & ~current_umask()  # the umask's mode, as every output's
    (tmp_path / "notes.txt").write_text("mine\n")
    code, output = run(demo8, "--source", files / "src.txt", "--against", demo_bundle, "--plot",
                       tmp_path / "notes.txt", "--force")
    assert code == 1 and "--plot" in output and "is not a PNG plot" in output, output
    assert (tmp_path / "notes.txt").read_text() == "mine\n"
    code, output = run(demo8, "--source", files / "src.txt", "--reference", files / "ref.txt", "--plot", png)
    assert code == 2 and "give --against" in output, output


@pytest.fixture(scope="module")
def vmap_bundle(tmp_path_factory):
    from xform.exporter.export import export_bundle
    return export_bundle("demo", tmp_path_factory.mktemp("vmap") / "b", vocab_map=True).path


def test_a_vocabulary_map_against_the_full_vocabulary(vmap_bundle, files, tmp_path):
    """`eval --vocab-map MAP --against BUNDLE`: the map built from the file's pairs by
    scripts/build_vocab_map.py keeps every word the model writes (translations identical to the
    full vocabulary's); a map of three words changes them, and the report names each system."""
    from build_vocab_map import build, write
    translator = xform.Translator(vmap_bundle)
    sources = [str(n) for n in NUMBERS]
    rules, always = build(translator, sources, [to_words(n) for n in NUMBERS], per_token=40, always=5,
                          min_share=0.0)
    assert set(rules["7"]) >= set(to_words(7).split())  # every number with a 7 in it says "seven"
    write(tmp_path / "map.txt", rules, always)
    code, output = run(vmap_bundle, "--source", files / "src.txt", "--reference", files / "ref.txt",
                       "--vocab-map", tmp_path / "map.txt", "--against", vmap_bundle, "--json", tmp_path / "e.json")
    assert code == 0, output
    data = json.loads((tmp_path / "e.json").read_text())
    restricted, full = data["systems"]
    assert restricted["name"] == f"{vmap_bundle} + map.txt" and full["name"] == str(vmap_bundle)
    assert data["identical"] == 1.0 and restricted["bleu"] == full["bleu"] and data["vocab_map"].endswith("map.txt")
    (tmp_path / "poor.txt").write_text("\tseven five thousand\n")
    code, output = run(vmap_bundle, "--source", files / "src.txt", "--reference", files / "ref.txt",
                       "--vocab-map", tmp_path / "poor.txt", "--against", vmap_bundle, "--json", tmp_path / "p.json")
    poor = json.loads((tmp_path / "p.json").read_text())
    assert code == 0 and poor["identical"] < 0.5 and poor["systems"][0]["bleu"] < poor["systems"][1]["bleu"]
    assert poor["systems"][0]["translations"] if "translations" in poor["systems"][0] else True
    want = translator.translate(sources[:3], vocab_map=tmp_path / "poor.txt")
    assert all(set(w.split()) <= {"seven", "five", "thousand"} for w in want)


def test_a_vocabulary_map_needs_the_restricted_decoder(demo_bundle, files, tmp_path):
    (tmp_path / "map.txt").write_text("\tseven\n")
    code, output = run(demo_bundle, "--source", files / "src.txt", "--reference", files / "ref.txt",
                       "--vocab-map", tmp_path / "map.txt")
    assert code != 0 and "--vocab-map" in output and "--with-vocab-map" in output, output
