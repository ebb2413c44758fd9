"""Glossaries (TSV, TBX) read and refused by file and line, their terms matched in source text
(whole words, case, longest first, Unicode), do-not-translate spans (entries, keep patterns, <dnt>
tags) kept byte for byte, and the fingerprint a translation memory is keyed by (issue 56)."""
import pickle
import unicodedata

import pytest

from xform.errors import InputError
from xform.runtime.text.glossary import Entry, Glossary
from xform.runtime.text.terminology import Terminology, strip_dnt, within

TBX_BASIC = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE martif SYSTEM "TBXBasiccoreStructV02.dtd">
<martif type="TBX-Basic" xml:lang="de">
  <martifHeader><fileDesc><sourceDesc><p>test</p></sourceDesc></fileDesc></martifHeader>
  <text><body>
    <termEntry id="c1">
      <langSet xml:lang="de">
        <tig><term>Kündigung</term>
          <termNote type="administrativeStatus">preferredTerm-admn-sts</termNote></tig>
        <tig><term>Kündigungserklärung</term></tig>
      </langSet>
      <langSet xml:lang="en">
        <tig><term>notice</term>
          <termNote type="administrativeStatus">deprecatedTerm-admn-sts</termNote></tig>
        <tig><term>termination</term>
          <termNote type="administrativeStatus">preferredTerm-admn-sts</termNote></tig>
      </langSet>
    </termEntry>
    <termEntry id="c2">
      <langSet xml:lang="de"><ntig><termGrp><term>Vertrag</term></termGrp></ntig></langSet>
      <langSet xml:lang="en"><ntig><termGrp><term>contract</term></termGrp></ntig></langSet>
    </termEntry>
  </body></text>
</martif>
"""

TBX_V3 = """<?xml version="1.0" encoding="UTF-8"?>
<tbx type="TBX-Basic" style="dca" xml:lang="en" xmlns="urn:iso:std:iso:30042:ed-2">
  <tbxHeader><fileDesc><sourceDesc><p>v3</p></sourceDesc></fileDesc></tbxHeader>
  <text><body>
    <conceptEntry id="1">
      <langSec xml:lang="en"><termSec><term>user account</term></termSec></langSec>
      <langSec xml:lang="fr"><termSec><term>compte utilisateur</term></termSec></langSec>
      <langSec xml:lang="de"><termSec><term>Benutzerkonto</term></termSec></langSec>
    </conceptEntry>
  </body></text>
</tbx>
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def refusal(path, *where):
    with pytest.raises(InputError) as e:
        Glossary.load(path)
    said = str(e.value)
    assert str(path) in said, said
    for w in where:
        assert w in said, said
    return said


# -- reading -----------------------------------------------------------------------------------
def test_tsv_with_comments_header_and_languages(tmp_path):
    path = write(tmp_path, "g.tsv", "# a glossary\n\nsource\ttarget\tsource_lang\ttarget_lang\n"
                                    "Kündigung\ttermination\n Vertrag \tcontract\tde\ten\r\n\nXForm\tXForm\n")
    g = Glossary.load(path)
    assert [(e.source, e.target, e.source_lang, e.target_lang) for e in g.entries] == [
        ("Kündigung", "termination", None, None), ("Vertrag", "contract", "de", "en"), ("XForm", "XForm", None, None)]
    assert g.entries[1].origin == f"{path}, line 5"
    assert g.languages == ("de", "en") and g.entries[2].kept and len(g) == 3


def test_tsv_without_header_first_line_is_an_entry(tmp_path):
    g = Glossary.load(write(tmp_path, "g.txt", "source code\tQuellcode\n"))
    assert g.entries[0].source == "source code"


def test_tbx_basic_two_languages_many_terms(tmp_path):
    g = Glossary.load(write(tmp_path, "t.tbx", TBX_BASIC))
    assert g.languages == ("de", "en") and g.default_pair == ("de", "en")
    de_en = g.pair()
    got = {(e.source, e.target) for e in de_en.entries}
    # every German term to the preferred English one; the deprecated English term is never a target
    assert got == {("Kündigung", "termination"), ("Kündigungserklärung", "termination"), ("Vertrag", "contract")}
    en_de = {(e.source, e.target) for e in g.pair("en", "de").entries}
    assert ("notice", "Kündigung") in en_de and ("termination", "Kündigung") in en_de
    line = TBX_BASIC.splitlines().index("        <tig><term>Kündigungserklärung</term></tig>") + 1
    assert next(e for e in de_en.entries if e.source == "Kündigungserklärung").origin.endswith(f"line {line}")


def test_tbx_v3_namespace_and_three_languages(tmp_path):
    g = Glossary.load(write(tmp_path, "t.xml", TBX_V3))
    assert g.languages == ("en", "fr", "de") and g.default_pair is None
    assert [(e.source, e.target) for e in g.pair("en", "fr").entries] == [("user account", "compte utilisateur")]
    # a model's codes find the file's by the language they name
    assert [e.target for e in g.pair("eng_Latn", "deu_Latn").entries] == ["Benutzerkonto"]
    with pytest.raises(InputError, match="several target languages") as e:
        g.pair("en")
    assert e.value.settings == ("tgt_lang",)


def test_tbx_sniffed_without_suffix(tmp_path):
    assert len(Glossary.load(write(tmp_path, "terms", TBX_V3)).pair("de", "en")) == 1


def test_pair_keeps_entries_without_languages_and_refuses_two_regions(tmp_path):
    g = Glossary.load(write(tmp_path, "g.tsv", "bus\tônibus\ten\tpt-BR\nbus\tautocarro\ten\tpt-PT\nxform\txform\n"))
    assert {e.target for e in g.pair("en", "pt-PT").entries} == {"autocarro", "xform"}
    assert {e.target for e in g.pair("en", "PT_br").entries} == {"ônibus", "xform"}
    with pytest.raises(InputError, match="several codes"):
        g.pair("en", "por_Latn")
    assert [e.target for e in g.pair("fr", "de").entries] == ["xform"]


# -- refusals ---------------------------------------------------------------------------------
@pytest.mark.parametrize("body, line, said", [
    ("a\tb\nc\td\te\n", 2, "3 tab-separated columns"),
    ("a\tb\nonly\n", 2, "1 tab-separated column;"),
    ("a\tb\n\n \tb\n", 3, "empty source term"),
    ("# c\na\t \n", 2, "empty target term"),
])
def test_malformed_tsv_refused_naming_file_and_line(tmp_path, body, line, said):
    refusal(write(tmp_path, "bad.tsv", body), f"line {line}", said)


def test_tsv_not_utf8_refused_with_its_line(tmp_path):
    path = tmp_path / "latin1.tsv"
    path.write_bytes("a\tb\nKündigung\ttermination\n".encode("latin-1"))
    refusal(path, "line 2", "UTF-8")


def test_same_source_two_targets_refused_naming_both_lines(tmp_path):
    path = write(tmp_path, "dup.tsv", "bank\tBank\n# x\nriver\tFluss\nBANK\tUfer\n")
    said = refusal(path, "lines 1 and 4", "'Bank'", "'Ufer'")
    assert "two targets" in said
    # the same target twice is one entry; case-sensitive glossaries keep Bank and bank apart
    assert len(Glossary.load(write(tmp_path, "same.tsv", "bank\tBank\nBank\tBank\n"))) == 1
    assert len(Glossary.load(path, case_sensitive=True)) == 3
    # different language pairs do not meet
    assert len(Glossary.load(write(tmp_path, "pairs.tsv", "bank\tBank\ten\tde\nbank\tbanque\ten\tfr\n"))) == 2


def test_empty_files_refused(tmp_path):
    refusal(write(tmp_path, "empty.tsv", "# nothing\n\n"), "no entries")
    refusal(write(tmp_path, "empty.tbx", "<martif><text><body/></text></martif>"), "no <termEntry>")


def test_broken_xml_refused_with_its_line(tmp_path):
    broken = TBX_BASIC.replace("<tig><term>Vertrag", "<tig><term>Vertrag</tig>", 1).replace(
        "<ntig><termGrp><term>Vertrag</term>", "<ntig><termGrp><term>Vertrag", 1)
    line = next(n for n, text in enumerate(broken.splitlines(), 1) if "Vertrag" in text)
    refusal(write(tmp_path, "broken.tbx", broken), f"line {line}", "not well-formed XML")


def test_tbx_problems_refused_naming_line(tmp_path):
    no_lang = TBX_V3.replace('<langSec xml:lang="fr">', "<langSec>")
    refusal(write(tmp_path, "nolang.tbx", no_lang), "line 7", "without xml:lang")
    empty = TBX_V3.replace("<term>Benutzerkonto</term>", "<term> </term>")
    refusal(write(tmp_path, "emptyterm.tbx", empty), "line 8", "empty <term>")
    refusal(write(tmp_path, "html.xml", "<html><body/></html>"), "line 1", "not a TBX file")
    two = TBX_BASIC.replace("<term>Vertrag</term>", "<term>Kündigung</term>")  # in two concepts
    first = TBX_BASIC.splitlines().index("        <tig><term>Kündigung</term>") + 1
    second = next(n for n, text in enumerate(TBX_BASIC.splitlines(), 1) if "Vertrag" in text)
    refusal(write(tmp_path, "clash.tbx", two), "two targets", f"lines {first} and {second}",
            "'termination'", "'contract'")


def test_entities_refused(tmp_path):
    bomb = ('<?xml version="1.0"?>\n<!DOCTYPE martif [\n<!ENTITY a "aaaaaaaaaa">\n'
            '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">\n]>\n<martif><text><body>&b;</body></text></martif>')
    refusal(write(tmp_path, "bomb.tbx", bomb), "line 3", "entity declaration")
    external = ('<?xml version="1.0"?>\n<!DOCTYPE martif [\n<!ENTITY x SYSTEM "file:///etc/passwd">\n]>\n'
                '<martif>&x;</martif>')
    refusal(write(tmp_path, "ext.tbx", external), "entity")


def test_missing_file_and_python_entries():
    with pytest.raises(InputError, match="no such file"):
        Glossary.load("/nonexistent/g.tsv")
    with pytest.raises(InputError, match="entry 2"):
        Glossary.of([("a", "b"), ("c",)])
    with pytest.raises(InputError, match="two targets"):
        Glossary.of([("a", "b"), Entry("A", "c")])
    assert Glossary.of({"a": "b"}).entries == (Entry("a", "b"),)


# -- matching ---------------------------------------------------------------------------------
def spans(g, text):
    return [(text[m.start:m.end], m.entry.target) for m in g.matches(text)]


def test_whole_words_not_substrings():
    g = Glossary.of({"cat": "Katze", "art": "Kunst"})
    assert spans(g, "cats concatenate; cat, art. (cat)") == [("cat", "Katze"), ("art", "Kunst"), ("cat", "Katze")]
    assert spans(g, "cat_art cat1 art") == [("art", "Kunst")]


def test_case_insensitive_by_default():
    g = Glossary.of({"Kündigung": "termination"})
    assert spans(g, "KÜNDIGUNG und kündigung") == [("KÜNDIGUNG", "termination"), ("kündigung", "termination")]
    assert spans(Glossary.of({"Kündigung": "termination"}, case_sensitive=True), "KÜNDIGUNG und Kündigung") == [
        ("Kündigung", "termination")]


def test_longest_match_first_and_multi_word():
    g = Glossary.of({"New York": "New York", "York City Hall": "Rathaus", "City": "Stadt",
                     "terms of service": "AGB"})
    assert spans(g, "New York City Hall") == [("York City Hall", "Rathaus")]
    assert spans(g, "New York City") == [("New York", "New York"), ("City", "Stadt")]
    assert spans(g, "our Terms  of\nService apply") == [("Terms  of\nService", "AGB")]


def test_a_term_twice_and_unicode():
    g = Glossary.of({"Kündigung": "termination", "Vertrag": "contract", "東京": "Tokyo"})
    text = "Die Kündigung, die Kündigungsfrist und die Kündigung des Vertrags; 東京都"
    assert spans(g, text) == [("Kündigung", "termination"), ("Kündigung", "termination"), ("東京", "Tokyo")]
    decomposed = unicodedata.normalize("NFD", "eine Kündigung")
    (m,) = g.matches(decomposed)
    assert decomposed[m.start:m.end] == unicodedata.normalize("NFD", "Kündigung")
    hindi = Glossary.of({"हिन्दी": "Hindi"})  # vowel signs and viramas are inside the word
    assert spans(hindi, "हिन्दीभाषा हिन्दी") == [("हिन्दी", "Hindi")]


def test_symbols_in_terms():
    g = Glossary.of({"C++": "C++", ".NET": ".NET", "e-mail": "E-Mail"})
    assert spans(g, "C++ and .NET by e-mail, not e-mails") == [("C++", "C++"), (".NET", ".NET"),
                                                              ("e-mail", "E-Mail")]


# -- do not translate ---------------------------------------------------------------------------
def test_dnt_tags_removed_and_spans_exact():
    text = "Press <dnt>Ctrl+S</dnt> to save\nin <DNT>Big  Corp™</DNT>.<dnt></dnt>"
    clean, kept = strip_dnt(text)
    assert clean == "Press Ctrl+S to save\nin Big  Corp™."
    assert [clean[s:e] for s, e in kept] == ["Ctrl+S", "Big  Corp™"]
    markdown = "- *Use* <dnt>`xform run`</dnt> [here](http://x)"
    clean, kept = strip_dnt(markdown)
    assert clean == "- *Use* `xform run` [here](http://x)" and clean[kept[0][0]:kept[0][1]] == "`xform run`"


@pytest.mark.parametrize("text, said", [("a <dnt>b\nc", "line 1: a <dnt> never closed"),
                                        ("a\nb</dnt>", "line 2: a </dnt> without"),
                                        ("<dnt>a\n<dnt>b</dnt></dnt>", "line 2: a <dnt> inside")])
def test_dnt_tags_unbalanced_refused(text, said):
    with pytest.raises(InputError, match=said):
        strip_dnt(text, name="doc.md")


def test_keep_patterns_and_kept_entries():
    g = Glossary.of({"xform": "xform", "Kündigung": "termination", "order": "Bestellung"})
    t = Terminology(g, keep=(r"\{\w+\}", r"%s", r"https?://\S+", r"[A-Z]{2}-\d+"))
    text = "Hello {name}, XFORM order AB-123 at https://x.example/order %s Kündigung"
    cs = t.constraints(text)
    assert [(c.kind, c.source, c.target) for c in cs] == [
        ("keep", "{name}", "{name}"), ("keep", "XFORM", "XFORM"), ("term", "order", "Bestellung"),
        ("keep", "AB-123", "AB-123"), ("keep", "https://x.example/order", "https://x.example/order"),
        ("keep", "%s", "%s"), ("term", "Kündigung", "termination")]
    assert all(text[c.start:c.end] == c.source for c in cs)  # byte for byte, as written
    assert t.targets(text) == [c.target for c in cs]


def test_kept_spans_win_over_terms_and_merge():
    g = Glossary.of({"order": "Bestellung", "Big Corp": "Big Corp"})
    t = Terminology(g, keep=(r"Big \w+", r"Corp order"))
    clean, cs = t.prepare("my <dnt>order</dnt> at Big Corp order now")
    assert clean == "my order at Big Corp order now"
    assert [(c.kind, c.target) for c in cs] == [("keep", "order"), ("keep", "Big Corp order")]


def test_bad_keep_pattern_refused_by_name():
    with pytest.raises(InputError, match=r"the keep pattern '\(unclosed' is not a regular expression") as e:
        Terminology(keep=("ok", "(unclosed"))
    assert e.value.settings == ("keep",)
    assert e.value.render(lambda s: "--" + s).startswith("the --keep pattern")


def test_within_a_sentence():
    assert within([(2, 5), (8, 12), (20, 22)], 4, 10) == [(0, 1), (4, 6)]


# -- fingerprint ------------------------------------------------------------------------------
def test_fingerprint_changes_with_an_entry(tmp_path):
    a = Glossary.load(write(tmp_path, "a.tsv", "Kündigung\ttermination\nVertrag\tcontract\n"))
    b = Glossary.load(write(tmp_path, "b.tsv", "# same entries, other order\nVertrag\tcontract\n"
                                               "Kündigung\ttermination\n"))
    c = Glossary.load(write(tmp_path, "c.tsv", "Kündigung\tnotice\nVertrag\tcontract\n"))
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    assert a.fingerprint() != Glossary.of(a.entries, case_sensitive=True).fingerprint()
    ta = Terminology(a, keep=("x",))
    assert ta.fingerprint() == Terminology(b, keep=("x",)).fingerprint()
    assert ta.fingerprint() not in {Terminology(c, keep=("x",)).fingerprint(), Terminology(a).fingerprint(),
                                    Terminology(a, keep=("y",)).fingerprint()}
    assert Terminology().fingerprint() == "" and not Terminology()
    assert pickle.loads(pickle.dumps(ta)).targets("die Kündigung") == ["termination"]
