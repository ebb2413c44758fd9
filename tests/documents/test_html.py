"""HTML documents (Python's html.parser): text translated, everything else as written (tags and
their attributes, comments, the doctype, scripts, styles, code and pre); inline elements are marks
around their words, block elements end a sentence's run; entities resolved for the model and the
translation escaped back."""
import html

import pytest

import xform
from tests.documents.texts import HTML, HTML_UNTOUCHED
from xform.runtime.documents.door import translate_document
from xform.runtime.documents.html import html_document
from xform.runtime.documents.marks import with_marks
from xform.runtime.text.translator import Translator

pytest.importorskip("sentencex", reason="documents need the documents extra (pip install -e '.[dev]')")
SHORT = {"max_decoding_length": 40}


def test_only_text_is_a_sentence():
    document = html_document(HTML, "en")
    assert document.render([None] * len(document.segments)) == HTML
    sources = [s.source for s in document.segments]
    assert sources == ["the red cat sleeps", "the red cat sleeps", "a blue dog runs fast.",
                       "my old bird is here & the red dog.", "one green cat eats bread.", "my old cat runs fast",
                       "a blue", "bird sleeps.", "my old dog", "is here"]
    assert [m.open for s in document.segments for m in s.marks] == [
        "<b>", '<a href="https://example.org/a?b=1&amp;c=2">']
    for piece in HTML_UNTOUCHED:  # never inside a sentence, or a mark carried as written
        start = HTML.index(piece)
        inside = [s for s in document.segments if s.start < start + len(piece) and start < s.end]
        assert not inside or any(piece in (m.open, m.close) for m in inside[0].marks), piece


def test_a_translation_is_escaped_and_the_rest_kept(text_marian):
    translator = Translator(xform.load(text_marian))
    out = translate_document(translator, HTML, format="html", **SHORT)
    for piece in HTML_UNTOUCHED:
        assert piece in out, piece
    document = html_document(HTML, None)
    alone = [translator.translate_batch([s.source], **SHORT)[0].hypotheses[0] for s in document.segments]
    assert out == document.render([with_marks(html.escape(t, quote=False), s) for t, s in zip(alone, document.segments)])
    assert out != HTML


def test_escaping_a_translation():
    document = html_document("<p>the red &lt;cat&gt; &amp; dog</p>", "en")
    assert [s.source for s in document.segments] == ["the red <cat> & dog"]
    assert document.escape("A < B & C") == "A &lt; B &amp; C"
