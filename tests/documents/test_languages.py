"""Languages detected: with src_lang "auto" each paragraph of a mixed document is identified
(py3langid, among the bundle's languages) and decoded with the model's own code for it, split by
that language's rules; skip_target_language leaves paragraphs already in the target language as
they are; the codes of every family reduce to the language they name."""
import pytest

import xform
from xform.runtime.documents.detect import Detector
from xform.runtime.documents.door import translate_document
from xform.runtime.documents.translate import DocumentTranslator
from xform.runtime.text.codes import base_language, codes_for
from xform.runtime.text.translator import Translator

pytest.importorskip("py3langid", reason="documents need the documents extra (pip install -e '.[dev]')")
SHORT = {"max_decoding_length": 6}
PARAGRAPHS = {
    "en": "The weather is very nice today. We are going to the park with our children this afternoon.",
    "fr": "Il fait très beau aujourd'hui. Nous allons au parc avec nos enfants cet après-midi.",
    "de": "Das Wetter ist heute sehr schön. Wir gehen heute Nachmittag mit unseren Kindern in den Park.",
}
MIXED = "\n\n".join([PARAGRAPHS["en"], PARAGRAPHS["fr"], "  " + PARAGRAPHS["de"] + "\n", PARAGRAPHS["fr"]]) + "\n"


@pytest.fixture(scope="module")
def translator(m2m):
    return Translator(xform.load(m2m))


def routed(translator, monkeypatch) -> list:
    """(sentence, src_lang) of each sentence the line stream decodes."""
    seen: list = []
    real = translator.translate_lines

    def spy(lines, gen, batching=None, text=None, **kw):
        lines = list(lines)
        seen.extend((line, text.src_lang) for line in lines)
        return real(lines, gen, batching, text, **kw)
    monkeypatch.setattr(translator, "translate_lines", spy)
    return seen


def test_each_paragraph_is_decoded_with_its_language(translator, monkeypatch):
    seen = routed(translator, monkeypatch)
    gen = translator.generation("es", dict(SHORT))
    documents = DocumentTranslator(translator, gen, text=xform_options(src_lang="auto", tgt_lang="es"))
    result, = documents.translate([("mixed.txt", MIXED)])
    assert result.languages == {"en": 1, "fr": 2, "de": 1}
    expected = {**{s: "en" for s in split(PARAGRAPHS["en"])}, **{s: "fr" for s in split(PARAGRAPHS["fr"])},
                **{s: "de" for s in split(PARAGRAPHS["de"])}}
    assert dict(seen) == expected  # each sentence once, with its paragraph's code
    by_hand = "\n\n".join([
        translate_document(translator, PARAGRAPHS["en"], src_lang="en", tgt_lang="es", **SHORT),
        translate_document(translator, PARAGRAPHS["fr"], src_lang="fr", tgt_lang="es", **SHORT),
        "  " + translate_document(translator, PARAGRAPHS["de"], src_lang="de", tgt_lang="es", **SHORT) + "\n",
        translate_document(translator, PARAGRAPHS["fr"], src_lang="fr", tgt_lang="es", **SHORT)]) + "\n"
    assert result.text == by_hand
    assert translate_document(translator, MIXED, src_lang="auto", tgt_lang="es", **SHORT) == by_hand


def test_paragraphs_in_the_target_language_are_kept(translator, monkeypatch):
    seen = routed(translator, monkeypatch)
    out = translate_document(translator, MIXED, src_lang="auto", tgt_lang="fr", skip_target_language=True, **SHORT)
    assert out.count(PARAGRAPHS["fr"]) == 2 and PARAGRAPHS["en"] not in out and PARAGRAPHS["de"] not in out
    assert out.endswith("\n\n" + PARAGRAPHS["fr"] + "\n")
    assert {lang for _, lang in seen} == {"en", "de"}
    # without auto, the source language is the one given, and only the target's paragraphs are kept
    seen.clear()
    translate_document(translator, MIXED, src_lang="en", tgt_lang="fr", skip_target_language=True, **SHORT)
    assert {lang for _, lang in seen} == {"en"} and len(seen) == 4


def test_a_bundle_code_is_refused_by_name(translator):
    from xform.errors import InputError
    with pytest.raises(InputError, match="xx_YY"):
        translate_document(translator, "a b.", src_lang="xx_YY", tgt_lang="fr")


@pytest.mark.parametrize("code, language", [("fra_Latn", "fr"), ("fr_XX", "fr"), ("fr", "fr"), ("fra", "fr"),
                                            ("__fr__", "fr"), ("<2fr>", "fr"), ("zho_Hans", "zh"), ("arb_Arab", "ar"),
                                            ("zh-Hant", "zh"), ("deu_Latn", "de"), ("yue", "yue"), ("EN", "en")])
def test_codes_name_their_language(code, language):
    assert base_language(code) == language


def test_the_detector_answers_among_the_bundle_codes():
    detector = Detector(["eng_Latn", "fra_Latn", "deu_Latn"])
    assert [detector.code(PARAGRAPHS[k]) for k in ("en", "fr", "de")] == ["eng_Latn", "fra_Latn", "deu_Latn"]
    assert codes_for("fr", ["en_XX", "fr_XX", "fr_CA"]) == ["fr_XX", "fr_CA"]


def split(paragraph):
    from xform.runtime.documents.layout import plain
    return [s.source for s in plain(paragraph, None).segments]


def xform_options(**kw):
    from xform.runtime.decoding.request import TextOptions
    return TextOptions(**kw)
