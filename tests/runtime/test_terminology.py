"""A glossary, kept spans and the confidence at the text doors (issue 56): the terms enforced in
the search on the suite's trained demo model (digits to English number words), on each backend
the suite runs; the one conversion (text_request.py) as the only builder of a text Request."""
import json
import pathlib
import re

import numpy as np
import pytest
from click.testing import CliRunner

import xform
from xform.cli import main
from xform.errors import InputError
from xform.runtime.decoding.request import TextOptions
from xform.runtime.text.confidence import ranks, sentence_chrf
from xform.runtime.text.translator import Translator

SOURCES = ["7", "40512", "123456", "7 7", "88 12"]


@pytest.fixture(scope="module", params=["ort", "torch"])
def demo(request, demo_bundle):
    if request.param == "torch":
        pytest.importorskip("torch")
    return Translator(xform.load(demo_bundle, backend=request.param))


def holds(text: str, term: str) -> bool:
    return f" {term} " in f" {text} "


def test_a_term_the_model_would_not_write_is_written(demo):
    plain = demo.translate_batch(SOURCES)
    assert plain[0].hypotheses == ["seven"] and not holds(plain[0].hypotheses[0], "eleven")
    forced = demo.translate_batch(SOURCES, glossary={"7": "eleven"})
    for source, result, alone in zip(SOURCES, forced, plain):
        if "7" in source.split():
            assert holds(result.hypotheses[0], "eleven"), (source, result)
            assert result.unmet == [[]]
        else:  # a sentence without the term decodes as it would (here: the same words)
            assert result.hypotheses == alone.hypotheses
    # greedy takes the smallest beam the terms need, and says so: 1 + the most terms a source has ("7 7")
    assert forced[0].promoted_beams == 3


def test_beams_several_terms_a_term_twice_and_a_multi_token_term(demo):
    glossary = {"7": "eleven", "12": "forty thousand"}  # a two-token term
    out = demo.translate_batch(["7 7", "88 12", "7 12"], glossary=glossary, beam_size=3, return_scores=True)
    assert len(re.findall(r"\beleven\b", out[0].hypotheses[0])) >= 2  # a term twice: twice
    assert holds(out[1].hypotheses[0], "forty thousand")
    assert holds(out[2].hypotheses[0], "eleven") and holds(out[2].hypotheses[0], "forty thousand")
    assert out[0].promoted_beams is None  # beams asked: kept
    assert all(r.unmet == [[]] for r in out)


def test_no_glossary_decodes_as_before(demo):
    plain = demo.translate_batch(SOURCES, beam_size=3, return_scores=True)
    empty = demo.translate_batch(SOURCES, beam_size=3, return_scores=True, glossary={"999": "nine"})  # no match
    assert [r.hypotheses for r in plain] == [r.hypotheses for r in empty]
    np.testing.assert_allclose([r.scores for r in plain], [r.scores for r in empty], rtol=1e-5)


def test_a_term_without_room_is_reported_never_dropped(demo):
    out = demo.translate_batch(["7"], glossary={"7": "nine eight seven six five four three"}, max_decoding_length=4)
    assert out[0].unmet == [["nine eight seven six five four three"]]
    kept = demo.translate_batch(["7"], keep=[r"\d"])  # the target vocabulary cannot write "7" as written
    assert kept[0].unmet == [["7"]]


def test_the_translators_glossary_and_a_calls_own(demo_bundle):
    translator = Translator(xform.load(demo_bundle), glossary={"7": "eleven"})
    assert holds(translator.translate_batch(["7"])[0].hypotheses[0], "eleven")
    assert not holds(translator.translate_batch(["7"], glossary={"5": "six"})[0].hypotheses[0], "eleven")


def test_glossary_files_and_refusals(demo, tmp_path):
    tsv = tmp_path / "terms.tsv"
    tsv.write_text("# the client's terms\n7\televen\n")
    assert holds(demo.translate_batch(["7"], glossary=tsv)[0].hypotheses[0], "eleven")
    tbx = tmp_path / "terms.tbx"
    tbx.write_text('<?xml version="1.0"?><tbx type="TBX-Basic" xml:lang="xx"><text><body>'  # source first
                   '<conceptEntry id="1"><langSec xml:lang="xx"><termSec><term>7</term></termSec></langSec>'
                   '<langSec xml:lang="en"><termSec><term>eleven</term></termSec></langSec></conceptEntry>'
                   '</body></text></tbx>')
    assert holds(demo.translate_batch(["7"], glossary=tbx)[0].hypotheses[0], "eleven")
    tsv.write_text("7\televen\n7\ttwelve\n")
    with pytest.raises(InputError, match=r"terms.tsv, lines 1 and 2: the source term '7' has two targets"):
        demo.translate_batch(["7"], glossary=tsv)
    with pytest.raises(InputError, match="token lists"):
        demo.translate_batch([["\u25817"]], glossary={"7": "eleven"})


def test_the_streams_take_the_terms_and_dnt_spans(demo):
    terms = demo.terminology({"5": "fifty"}, (), None, None)
    lines = list(demo.translate_lines(["7", "5 7", "<dnt>7 5", "40512"], demo.generation(None, {}),
                                      text=TextOptions(terminology=terms, qe=True)))
    assert holds(lines[1].hypotheses[0], "fifty") and lines[1].promoted_beams == 2
    assert lines[2].error is not None and "dnt" in lines[2].error  # a tag left open: that line fails alone
    assert lines[3].hypotheses == ["forty thousand five hundred twelve"]
    assert all(0.0 <= line.confidence[0] <= 1.0 for line in lines if line.error is None)


def test_confidence_orders_noise_below_the_training_distribution(demo_bundle):
    t = Translator(xform.load(demo_bundle))
    good = t.translate_batch(["40512", "7", "123456"], qe=True)
    noise = t.translate_batch(["0 0 0 0 0 0 0 0 0 0 0 0", "0000000000000000"], qe=True)  # numbers never seen
    assert min(r.confidence[0] for r in good) > max(r.confidence[0] for r in noise)


def test_eval_qe_is_the_spearman_of_confidence_and_sentence_chrf(demo_bundle, tmp_path):
    sources = ["7", "40512", "123456", "88", "1 2", "90"]
    references = ["seven", "forty thousand five hundred twelve", "one hundred", "eighty eight", "one", "nine"]
    (tmp_path / "src.txt").write_text("\n".join(sources) + "\n")
    (tmp_path / "ref.txt").write_text("\n".join(references) + "\n")
    r = CliRunner().invoke(main, ["eval", str(demo_bundle), "--source", str(tmp_path / "src.txt"), "--reference",
                                  str(tmp_path / "ref.txt"), "--qe", "--json", str(tmp_path / "e.json")])
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "e.json").read_text())
    results = Translator(xform.load(demo_bundle)).translate_batch(sources, qe=True)
    conf = [x.confidence[0] for x in results]
    chrf = [sentence_chrf(x.hypotheses[0], ref) for x, ref in zip(results, references)]
    rc, rf = ranks(conf), ranks(chrf)  # by hand: Pearson's r of the ranks
    mc, mf = sum(rc) / len(rc), sum(rf) / len(rf)
    cov = sum((a - mc) * (b - mf) for a, b in zip(rc, rf))
    want = cov / (sum((a - mc) ** 2 for a in rc) * sum((b - mf) ** 2 for b in rf)) ** 0.5
    assert report["qe_lines"] == len(sources) and report["qe_spearman"] == pytest.approx(want, abs=1e-4)
    assert "confidence (--qe): Spearman" in r.output


def test_run_prints_the_terms_the_confidence_and_what_it_could_not_hold(demo_bundle, tmp_path):
    (tmp_path / "g.tsv").write_text("7\televen\n")
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--text", "7", "--text", "12", "--glossary",
                                  str(tmp_path / "g.tsv"), "--keep", "12", "--qe"])
    assert r.exit_code == 0, r.output
    first, second = r.stdout.splitlines()
    source, target, confidence = first.split("\t")
    assert source == "7" and holds(target, "eleven") and 0.0 <= float(confidence) <= 1.0
    assert "greedy decoding searched with 2 beams" in r.stderr
    assert "--text 2: translation 1 lacks '12'" in r.stderr
    bad = CliRunner().invoke(main, ["run", str(demo_bundle), "--text", "7", "--glossary", str(tmp_path / "none")])
    assert bad.exit_code == 1 and "no such file" in bad.output


def test_one_conversion_builds_every_text_request():
    """text_request.convert is the only caller of Session.request in the text doors (the CLI,
    the Python door, the streams, documents, Triton, corpus, xform.ray): grep the sources."""
    root = pathlib.Path(xform.__file__).parent
    callers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                     if re.search(r"\bsession\.request\(", p.read_text()))
    # the benchmark decodes ids, not text (the exporter's check builds its Requests of ids itself)
    assert callers == ["runtime/bench.py", "runtime/text/text_request.py"]


def test_the_python_and_ray_doors_take_a_glossary_and_give_the_confidence(demo_bundle):
    translator = xform.Translator(demo_bundle, glossary={"7": "eleven"})
    assert holds(translator.translate_batch(["7"])[0].hypotheses[0], "eleven")
    with pytest.raises(xform.errors.XformError, match="glossary, keep: a translator's own terms"):
        xform.Translator([demo_bundle], glossary={"7": "eleven"})
    from xform.ray import Translate  # the class Ray Data maps batches through, called as Ray would
    out = Translate(demo_bundle, glossary={"7": "eleven"}, qe=True)({"text": np.array(["7", "40512", None],
                                                                                      dtype=object)})
    assert holds(out["translation"][0], "eleven") and out["translation"][2] == ""
    assert 0.0 <= out["confidence"][1] <= 1.0 and out["confidence"][2] is None


def test_qe_report_lists_the_translations_below_the_threshold(demo_bundle, tmp_path):
    (tmp_path / "in.txt").write_text("7\n0000000000000000\n40512\n")
    report = tmp_path / "low.tsv"
    args = ["run", str(demo_bundle), "--input-file", str(tmp_path / "in.txt"), "--qe-report", str(report)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    rows = [line.split("\t") for line in report.read_text().splitlines()]
    assert rows[0] == ["line", "sentence", "translation", "confidence"]
    assert [row[:2] for row in rows[1:]] == [[f"{tmp_path / 'in.txt'}:2", "0000000000000000"]]  # noise only
    assert float(rows[1][3]) < 0.5 and "1 translations with a confidence below 0.5" in r.stderr
    assert CliRunner().invoke(main, args).exit_code == 1  # its report is not replaced without --force
    assert CliRunner().invoke(main, [*args, "--force"]).exit_code == 0
    (tmp_path / "notes.txt").write_text("mine\n")
    kept = CliRunner().invoke(main, [*args[:-1], str(tmp_path / "notes.txt"), "--force"])
    assert kept.exit_code == 1 and "is not a confidence report xform wrote" in kept.output
    assert (tmp_path / "notes.txt").read_text() == "mine\n"
    (tmp_path / "doc.txt").write_text("0000000000000000.\n\n40512.\n")
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--input-file", str(tmp_path / "doc.txt"), "--documents",
                                  "--qe-report", str(tmp_path / "doc.tsv"), "--qe-below", "1"])
    assert r.exit_code == 0, r.output
    rows = [line.split("\t") for line in (tmp_path / "doc.tsv").read_text().splitlines()[1:]]
    assert [row[0].rsplit(":", 1)[1] for row in rows] == ["1", "3"]  # each sentence by its line
    assert float(rows[0][3]) < float(rows[1][3])
