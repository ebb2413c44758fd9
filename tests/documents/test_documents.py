"""Documents translated with a text Marian (conftest.py: trained to reverse its input, so each sentence's
translation depends on it): the output is the input's layout with each sentence replaced by its
translation alone (translate_batch of that sentence by itself), whatever the format, the language
rules or the batching; nothing in code or a URL changes; a sentence over max_len is cut at its
clauses, else refused by document and line, or truncated."""
import pytest

from tests.documents.texts import MARKDOWN, PLAIN, UNTOUCHED
from xform.errors import InputError
from xform.runtime.decoding.request import TextOptions
from xform.runtime.documents.door import translate_document, translate_documents
from xform.runtime.documents.layout import plain
from xform.runtime.documents.markdown import markdown
from xform.runtime.documents.marks import with_marks
from xform.runtime.documents.translate import DocumentTranslator
from xform.runtime.text.translator import Translator

pytest.importorskip("sentencex", reason="documents need the documents extra (pip install -e '.[dev]')")
SHORT = {"max_decoding_length": 12}


@pytest.fixture(scope="module")
def translator(text_marian):
    import xform
    return Translator(xform.load(text_marian))


def alone(translator, source, **options):
    return translator.translate_batch([source], **{**SHORT, **options})[0].hypotheses[0]


def expected(translator, document, **options):
    """The document with each sentence replaced by its translation alone, marks around it."""
    return document.render([with_marks(alone(translator, s.source, **options), s) for s in document.segments])


@pytest.mark.parametrize("language", list(PLAIN))
def test_each_sentence_as_translated_alone_in_the_layout(translator, language):
    text = PLAIN[language]
    out = translate_document(translator, text, src_lang=None, **SHORT)
    document = plain(text, language)
    assert out != text
    assert len({alone(translator, s.source) for s in document.segments}) > 2  # translations depend on the input
    assert translate_document(translator, text, **SHORT) == expected(translator, plain(text, None))
    # the language's rules: sentences split as its segmenter says
    gen = translator.generation(None, dict(SHORT))
    doc = DocumentTranslator(translator, gen, text=TextOptions())
    doc.splitter = lambda: lambda t, lang, name: plain(t, language, name)  # the language's rules, not the bundle's
    assert doc.translate([("x", text)])[0].text == expected(translator, document)


def test_markdown_translates_only_text(translator):
    out = translate_document(translator, MARKDOWN, format="markdown", **SHORT)
    assert out == expected(translator, markdown(MARKDOWN, None))
    for piece in UNTOUCHED:
        assert piece in out, piece
    assert out.count("\n") == MARKDOWN.count("\n")  # no sentence here spans a line


def test_sentences_of_many_documents_decode_together_in_batches(translator, monkeypatch):
    texts = list(PLAIN.values())
    together = translate_documents(translator, texts, max_batch_size=3, **SHORT)
    assert together == [translate_document(translator, t, **SHORT) for t in texts]
    runs = []
    real = translator.session.run
    monkeypatch.setattr(translator.session, "run", lambda request, *a, **k: runs.append(request.batch) or
                        real(request, *a, **k))
    translate_documents(translator, texts, max_batch_size=3, **SHORT)
    distinct = {s.source for t in texts for s in plain(t, None).segments}
    assert sum(runs) == len(distinct) and max(runs) == 3  # each distinct sentence once, three at a time


def test_a_long_sentence_is_cut_at_its_clauses(translator):
    n = translator.session.config.max_len
    clause = "the red cat sleeps"
    assert len(translator.policy.encode_text(clause)) < n // 2
    k = 2 * n // len(translator.policy.encode_text(clause)) + 1  # over max_len together
    sentence = ", ".join([clause] * k) + "."
    assert len(translator.policy.encode_text(sentence)) > n
    out = translate_document(translator, f"a blue dog.\n\n{sentence}\n", **SHORT)
    gen = translator.generation(None, dict(SHORT))
    pieces = DocumentTranslator(translator, gen).fitted(sentence, None, ["x:3"])
    assert len(pieces) > 1 and " ".join(pieces) == sentence
    assert all(len(translator.policy.encode_text(p)) <= n for p in pieces)
    assert out == f"{alone(translator, 'a blue dog.')}\n\n{' '.join(alone(translator, p) for p in pieces)}\n"


def test_a_long_sentence_without_clauses_is_refused_by_line_or_truncated(translator):
    n = translator.session.config.max_len
    sentence = " ".join(["the red cat sleeps"] * n) + "."
    text = f"a blue dog.\n\nmy old cat. {sentence}\n"
    with pytest.raises(InputError, match=r"texts\[0\]:3: a sentence of \d+ source tokens, more than the model's "
                                         rf"max_len {n}.*truncate") as e:
        translate_document(translator, text, **SHORT)
    assert e.value.settings == ("truncate",)
    out = translate_document(translator, text, truncate=True, **SHORT)
    assert out.startswith(alone(translator, "a blue dog.") + "\n\n")
    assert out.endswith(alone(translator, sentence, truncate=True) + "\n")


def test_an_empty_document_and_one_of_only_layout(translator):
    assert translate_documents(translator, ["", "\n\n  \t\n", "```\ncode\n```\n"], format="markdown") == [
        "", "\n\n  \t\n", "```\ncode\n```\n"]


def test_bad_settings_are_refused_by_name(translator):
    with pytest.raises(InputError, match="format: expected one of text, markdown, html, got 'rtf'"):
        translate_document(translator, "a.", format="rtf")
    with pytest.raises(InputError, match="src_lang auto: this bundle takes no source language"):
        translate_document(translator, "a.", src_lang="auto")
    with pytest.raises(InputError, match="texts: expected a list of texts"):
        translate_documents(translator, "a text")


def test_a_pair_bundle_knows_its_target_language(translator, demo_bundle):
    """skip_target_language with no tgt_lang: the bundle's one pair says the target (this Marian's
    tokenizer_config: en to EN), so paragraphs in English stay as they are and others translate;
    a bundle that declares no pair is refused, naming the setting to give."""
    import xform
    text = "the red cat sleeps and the blue dog runs fast.\n\nle chat rouge dort et le chien bleu court.\n"
    out = translate_document(translator, text, skip_target_language=True, **SHORT)
    assert out.startswith("the red cat sleeps and the blue dog runs fast.\n\n")
    assert not out.endswith("le chat rouge dort et le chien bleu court.\n")
    with pytest.raises(InputError, match="skip_target_language: name the target language .tgt_lang.; this bundle "
                                         "does not declare one pair"):
        xform.Translator(demo_bundle).translate_document("12", skip_target_language=True)
