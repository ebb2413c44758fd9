"""Terminology in documents (issue 56), with the demo bundle (digits to number words): a glossary
applies to each sentence; `<dnt>...</dnt>` in plain text and Markdown keeps its span as written
and its tags go; an HTML element with translate="no" is kept byte for byte; the memory's key holds
the terminology's fingerprint (a changed glossary never serves an old translation; qe is no part
of it); `xform run --documents --glossary` and `xform corpus --documents --glossary`."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

import xform
from xform.cli import main
from xform.runtime.decoding.request import TextOptions
from xform.runtime.documents.door import translate_document
from xform.runtime.documents.html import html_document
from xform.runtime.documents.markdown import markdown
from xform.runtime.documents.memory import TranslationMemory
from xform.runtime.documents.segmenter import clauses, sentences
from xform.runtime.documents.translate import DocumentTranslator
from xform.runtime.text.terminology import terminology
from xform.runtime.text.translator import Translator

pytest.importorskip("sentencex", reason="documents need the documents extra (pip install -e '.[dev]')")
SEVEN = {"7": "seven eleven"}


@pytest.fixture(scope="module")
def demo(demo_bundle):
    return Translator(xform.load(demo_bundle))


def test_the_glossary_applies_to_each_sentence(demo):
    doc = "7\n\n12 7\n"
    assert "eleven" not in translate_document(demo, doc)
    out = translate_document(demo, doc, glossary=SEVEN)
    assert out.count("seven eleven") == 2 and out.endswith("\n") and "\n\n" in out
    held = Translator(demo.session, glossary=SEVEN)  # the translator's own glossary, when a call gives none
    assert translate_document(held, doc) == out
    options = TextOptions(terminology=terminology(SEVEN))
    documents = DocumentTranslator(demo, demo.generation(None, {}), text=options)
    assert documents.translate([("d", doc)])[0].text == out


@pytest.mark.parametrize("markup", ["text", "markdown"])
def test_a_dnt_span_is_kept_as_written_and_its_tags_go(demo, markup):
    doc = "7 <dnt>eleven</dnt>\n\n12\n"
    out = translate_document(demo, doc, format=markup)
    assert "<dnt>" not in out and "</dnt>" not in out
    first, second = out.split("\n\n")
    assert "eleven" in first.split() and second == translate_document(demo, "12\n", format=markup)
    assert "eleven" not in translate_document(demo, "7\n", format=markup)
    with_glossary = translate_document(demo, doc, format=markup, glossary=SEVEN)
    assert "eleven" in with_glossary and "<dnt>" not in with_glossary


def test_markdown_leaves_the_dnt_tags_in_the_sentence_not_as_markup():
    document = markdown("Say *12* and <dnt>Foo Bar</dnt> now.\n")
    (segment,) = document.segments
    assert segment.source == "Say 12 and <dnt>Foo Bar</dnt> now."
    assert [m.open for m in segment.marks] == ["*"]  # the emphasis is a mark; the dnt tags are not


def test_no_sentence_boundary_or_clause_cut_falls_inside_a_dnt_span():
    text = "He met <dnt>Dr. No. Then, Mr. Big</dnt> there. Then he left."
    spans = [text[a:b] for a, b in sentences(text, "en")]
    assert spans[0] == "He met <dnt>Dr. No. Then, Mr. Big</dnt> there." and spans[-1] == "Then he left."
    assert clauses("one, <dnt>two, three</dnt>, four", lambda piece: len(piece) < 24) == [
        "one,", "<dnt>two, three</dnt>,", "four"]
    assert clauses("one, <dnt>two, three</dnt>, four", lambda piece: len(piece) < 15) is None  # not inside it


PAGE = ('<!doctype html><p>7 <span translate="no">12 <b>7</b> &amp; 40512</span> 12</p>\n'
        '<div translate="NO" class="x"><div>7</div> 12 <div>7</div></div>\n'
        '<p>40512 <img translate="no" src="a.png"> 7</p><p translate="yes">7</p>\n')


def test_html_elements_marked_translate_no_are_kept_byte_for_byte(demo):
    kept = ['<span translate="no">12 <b>7</b> &amp; 40512</span>',
            '<div translate="NO" class="x"><div>7</div> 12 <div>7</div></div>']
    document = html_document(PAGE, None)
    assert [s.source for s in document.segments] == ["7", "12", "40512", "7", "7"]
    out = translate_document(demo, PAGE, format="html", glossary=SEVEN)
    for piece in kept:
        assert piece in out
    assert out.startswith("<!doctype html><p>seven eleven <span") and '<img translate="no" src="a.png">' in out
    assert out.endswith('<p>forty thousand five hundred twelve <img translate="no" src="a.png"> seven eleven</p>'
                        '<p translate="yes">seven eleven</p>\n')  # a void element's translate="no" keeps itself
    assert '</span> twelve</p>' in out  # the text after an untranslated element is translated


def run(demo, doc, memory, **terms):
    gen = demo.generation(None, {})
    options = TextOptions(terminology=terminology(terms.get("glossary"), terms.get("keep", ())),
                          qe=terms.get("qe", False))
    with TranslationMemory(memory) as tm:
        documents = DocumentTranslator(demo, gen, text=options, memory=tm)
        return documents.translate([("d", doc)])[0].text, documents.tally


def test_the_memory_is_keyed_by_the_glossary(demo, tmp_path):
    memory, doc = tmp_path / "tm.db", "7\n\n12\n"
    plain, tally = run(demo, doc, memory)
    assert "eleven" not in plain and tally.decoded == 2
    seven, tally = run(demo, doc, memory, glossary=SEVEN)
    assert "seven eleven" in seven and tally.remembered == 0 and tally.decoded == 2  # never the plain ones
    other, tally = run(demo, doc, memory, glossary={"7": "seven twelve"})
    assert "seven twelve" in other and tally.remembered == 0
    kept, tally = run(demo, doc, memory, glossary=SEVEN, keep=[r"\d{5}"])
    assert tally.remembered == 0  # a kept pattern is part of the key too
    again, tally = run(demo, doc, memory, glossary=SEVEN, qe=True)  # qe changes no translation: a hit
    assert again == seven and tally.decoded == 0 and tally.remembered == 2
    back, tally = run(demo, doc, memory)
    assert back == plain and tally.decoded == 0  # and the plain translations are still there


def test_run_documents_with_a_glossary_end_to_end(demo_bundle, tmp_path):
    src, glossary, memory = tmp_path / "doc.md", tmp_path / "g.tsv", tmp_path / "tm.db"
    src.write_text("# 7\n\n*12* <dnt>eleven</dnt>\n\n- 7\n")
    glossary.write_text("7\tseven eleven\n")

    def run_cli(*more):
        r = CliRunner().invoke(main, ["run", str(demo_bundle), "--input-file", str(src), "--format", "markdown",
                                      "--memory", str(memory), *map(str, more)])
        assert r.exit_code == 0, r.output
        return r
    r = run_cli("--glossary", glossary)
    assert r.stdout.startswith("# seven eleven\n\n") and "- seven eleven\n" in r.stdout
    assert "<dnt>" not in r.stdout and "eleven" in r.stdout.split("\n\n")[1]
    assert ", 0 from the memory" in r.stderr
    again = run_cli("--glossary", glossary)
    assert again.stdout == r.stdout and ", 0 decoded" in again.stderr
    glossary.write_text("7\tseven twelve\n")
    changed = run_cli("--glossary", glossary)
    assert changed.stdout.startswith("# seven twelve\n") and ", 0 from the memory" in changed.stderr


def test_corpus_documents_take_the_glossary(demo_bundle, tmp_path):
    import json

    src, glossary = tmp_path / "in.jsonl", tmp_path / "g.tsv"
    src.write_text(json.dumps({"text": "7\n\n12 <dnt>eleven</dnt>"}) + "\n")
    glossary.write_text("7\tseven eleven\n")
    r = CliRunner().invoke(main, ["corpus", str(demo_bundle), str(src), "--output-dir", str(tmp_path / "o"),
                                  "--documents", "--glossary", str(glossary)])
    assert r.exit_code == 0, r.output
    got = json.loads((tmp_path / "o" / src.name).read_text())["translation"]
    assert got.startswith("seven eleven\n\n") and "eleven" in got.split("\n\n")[1] and "<dnt>" not in got


def test_a_term_the_search_cannot_place_is_counted(demo):
    options = TextOptions(terminology=terminology({"7": "banana"}))  # not in the demo's target vocabulary
    documents = DocumentTranslator(demo, demo.generation(None, {}), text=options)
    (result,) = documents.translate([("d", "7\n\n12\n")])
    assert result.text == "seven\n\ntwelve\n" and documents.tally.unmet == 1
