"""A document's sentences and layout, without a model: the spans rejoin to the text byte for byte,
whitespace and markers stay outside them, each language's segmenter rules apply, Markdown's code,
URLs, link targets and tags are never inside a sentence, and marks go back around a translation."""
import pytest

from tests.documents.texts import MARKDOWN, PLAIN, UNTOUCHED
from xform.runtime.documents.layout import Mark, Segment, plain, units
from xform.runtime.documents.markdown import markdown
from xform.runtime.documents.marks import with_marks

pytest.importorskip("sentencex", reason="documents need the documents extra (pip install -e '.[dev]')")


def spans(document):
    return [document.text[s.start:s.end] for s in document.segments]


@pytest.mark.parametrize("language", list(PLAIN))
def test_the_spans_rejoin_the_text_and_hold_no_layout(language):
    text = PLAIN[language]
    document = plain(text, language)
    assert document.render([None] * len(document.segments)) == text
    assert document.render(spans(document)) == text
    for span, segment in zip(spans(document), document.segments):
        assert span == span.strip() and span  # whitespace is layout
        assert not span.startswith(("- ", "1. ", "2) ", "\u2022 "))  # list markers are layout
        assert segment.source == " ".join(span.split())
        assert text[:segment.start].count("\n") + 1 == segment.line
    starts = [s.start for s in document.segments]
    assert starts == sorted(starts) and all(a.end <= b.start for a, b in zip(document.segments, document.segments[1:]))


def test_sentences_follow_each_language_and_the_paragraphs():
    en = plain(PLAIN["en"], "en")
    assert [s.source for s in en.segments] == [
        "the red cat sleeps.", "a blue dog runs fast!", "my old bird is here?", "one green cat eats bread.",
        "the red dog is here.", "a blue bird sleeps", "my old cat runs fast.", "the red bird eats bread",
        "one green dog is here."]
    assert [s.paragraph for s in en.segments] == [0, 0, 0, 1, 1, 1, 1, 1, 2]
    de = plain(PLAIN["de"], "de")  # German abbreviations (z.B., Dr.) do not end a sentence
    assert [s.source for s in de.segments][:2] == ["the red cat sleeps, z.B. a blue dog.", "Dr. my old bird is here."]
    fr = plain(PLAIN["fr"], "fr")  # the list item goes on over the line without a marker
    assert fr.segments[-1].source == "one green cat eats bread the red dog is here\u2026 a blue bird sleeps."
    assert fr.segments[-1].line == 3


def test_a_list_item_starts_anew_and_a_wrapped_line_goes_on():
    text = "a b\nc d\n- e f\n  g\n\n3) h"
    assert [text[a:b] for a, b, _ in units(text)] == ["a b\nc d", "e f\n  g", "h"]


def test_markdown_leaves_code_urls_targets_and_tags_outside_every_sentence():
    document = markdown(MARKDOWN, "en")
    assert document.render(spans(document)) == MARKDOWN
    for piece in UNTOUCHED:
        start = MARKDOWN.index(piece)
        end = start + len(piece)
        inside = [s for s in document.segments if s.start < end and start < s.end]
        # outside every sentence, or a mark (a link's target, a paired tag) the sentence carries as written
        assert not inside or any(piece in (m.open, m.close, "]" + m.close[2:]) or m.close == "]" + piece
                                 for m in inside[0].marks), piece
    translated = document.render([with_marks(s.source.upper(), s) for s in document.segments])
    assert all(piece in translated for piece in UNTOUCHED)
    assert "[SEE THE RED DOG NOW.](https://example.org/a_(b)?q=1)" in translated
    sources = [s.source for s in document.segments]
    assert "the red cat sleeps" in sources  # the heading
    assert "see the red dog now." in sources  # the link's text is translated, its target is not
    assert "then my old cat runs fast." in sources  # the comma after the URL is layout
    assert "my old bird is here and" in sources  # emphasis taken out; inline code cuts the sentence
    assert "the red bird is here." in sources and "a blue cat sleeps." in sources  # the quote
    assert {"the red cat", "a blue dog", "my old bird", "is here"} <= set(sources)  # table cells
    assert not any("never translated" in s or "indented code" in s or "html block" in s for s in sources)


def test_marks_go_around_the_translation():
    doc = markdown("see [the red dog](https://x.org) now. my old *cat*.\n", "en")
    link, emphasis = doc.segments
    assert link.marks == (Mark(1, 4, "[", "](https://x.org)"),)  # words 1-3: the red dog
    assert with_marks("VOIR LE CHIEN", link) == "[VOIR LE CHIEN](https://x.org)"
    assert doc.text[emphasis.start:emphasis.end] == "my old *cat*."
    assert with_marks("T", emphasis) == "*T*"
    assert with_marks("T", Segment(0, 1, "x", 1, 0)) == "T"


def test_an_emphasis_cut_by_a_sentence_keeps_its_sides_in_order():
    text = "the red *cat sleeps. a blue* dog runs.\n"
    doc = markdown(text, "en")
    translated = doc.render([with_marks(s.source.upper(), s) for s in doc.segments])
    assert translated.count("*") == 2 and translated.index("*") < translated.rindex("*")
