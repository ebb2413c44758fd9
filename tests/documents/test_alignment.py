"""Marks around the words they became: word alignments from the decoder's attention (a bundle
exported --with-attention), marks placed around the translated words aligned to the marked
source words, the whole sentence where no alignment says (crossing spans, nothing aligned,
another tokenizer); alignments kept in the memory so a second run decodes nothing and writes
the same."""
import re
from types import SimpleNamespace

import numpy as np
import pytest

import xform
from xform.runtime.decoding.request import TextOptions
from xform.runtime.documents.alignment import decode_aligned, word_alignment, word_index
from xform.runtime.documents.door import translate_document
from xform.runtime.documents.layout import Mark, Segment
from xform.runtime.documents.markdown import markdown
from xform.runtime.documents.marks import with_marks
from xform.runtime.documents.memory import TranslationMemory
from xform.runtime.documents.translate import DocumentTranslator
from xform.runtime.text.translator import Translator

pytest.importorskip("sentencex", reason="documents need the documents extra (pip install -e '.[dev]')")
SHORT = {"max_decoding_length": 40}  # whole sentences: this tokenizer spells words in pieces
LINK = Segment(0, 1, "see the red dog now.", 1, 0, (Mark(1, 4, "[", "](u)"), Mark(2, 3, "*", "*")))


def test_marks_go_around_the_aligned_words():
    assert with_marks("voir le chien rouge maintenant.", LINK, [[0], [1], [3], [2], [4]]) == \
        "voir [le chien *rouge*](u) maintenant."
    edge = Segment(0, 1, "the red cat sleeps.", 1, 0, (Mark(2, 4, "*", ""),))  # its close is the next sentence's
    assert with_marks("le chat rouge dort.", edge, [[0], [2], [1], [3]]) == "le *chat rouge dort."


@pytest.mark.parametrize("alignment", [
    [[0], [], [], [], [4]],  # no translated word aligned to the link's words
    [[0], [1]],  # not a word of the translation each
    [],  # none could be made (kept so in the memory)
])
def test_the_whole_sentence_where_no_alignment_says(alignment):
    assert with_marks("voir le chien rouge maintenant.", LINK, alignment) == "[*voir le chien rouge maintenant.*](u)"


def test_a_span_covers_every_word_aligned_to_the_marked_ones():
    # le -> the and dog: the link (the red dog) takes le to rouge, the emphasis (red) rouge alone
    assert with_marks("voir le chien rouge maintenant.", LINK, [[0], [1, 3], [4], [2], [4]]) == \
        "voir [le chien *rouge*](u) maintenant."


def test_crossing_spans_fall_back():
    crossing = Segment(0, 1, "a b c d", 1, 0, (Mark(0, 2, "*", "*"), Mark(2, 4, "_", "_")))
    # * (a b) -> w and y: words 0-2; _ (c d) -> x and z: words 1-3; they cross: the whole sentence
    assert with_marks("w x y z", crossing, [[0], [2], [1], [3]]) == "*_w x y z_*"
    assert with_marks("w x y z", crossing, [[0], [1], [2], [3]]) == "*w x* _y z_"


class Pieces:
    """A SentencePiece-like tokenizer double: pieces given, word starts marked with U+2581."""
    spm_words = True
    skip: list = []

    def __init__(self, pieces):
        self.pieces = pieces

    def source_pieces(self, text):
        return self.pieces


def test_word_alignment_from_attention():
    # source "the red dog" as pieces ▁the ▁re d ▁dog </s>; target "le chien rouge" as ▁le ▁chi en ▁rouge </s>
    tok = Pieces(["\u2581the", "\u2581re", "d", "\u2581dog", "</s>"])
    source = [10, 11, 12, 13, 0]
    target = {20: "\u2581le", 21: "\u2581chi", 22: "en", 23: "\u2581rouge"}
    row = np.array([20, 21, 22, 23, 0, 1])
    attention = np.zeros((6, 5))
    for t, s in enumerate([0, 3, 3, 2, 4, 4]):  # le->the, chi en->dog, rouge->d (of red)
        attention[t, s] = 1.0
    got = word_alignment(tok, {0, 1}, target.get, row, attention, source, "the red dog", "le chien rouge")
    assert got == [[0], [2], [1]]
    assert word_alignment(tok, {0, 1}, target.get, row, attention, source, "the red dog", "le chien") is None
    assert word_index(["x", "\u2581y"], [True, True]) is None  # no word starts at the first piece
    other = SimpleNamespace(spm_words=False)
    assert word_alignment(other, set(), target.get, row, attention, source, "the red dog", "x") is None


@pytest.fixture(scope="module")
def aligned(attention_marian):
    return Translator(xform.load(attention_marian))


def test_a_bundle_with_attention_places_marks_by_word(aligned, tmp_path, monkeypatch):
    text = ("the *red cat* sleeps. a blue dog **runs fast**. [my old bird](https://x.org/b) is here.\n\n"
            "one green cat eats _bread_.\n")
    out = translate_document(aligned, text, format="markdown", memory=tmp_path / "tm.db", **SHORT)
    document = markdown(text, None)
    alone = [aligned.translate_batch([s.source], **SHORT)[0].hypotheses[0] for s in document.segments]
    assert re.sub(r"\*\*|\*|_|\[|\]\(https://x\.org/b\)", "", out) == document.render(alone)  # marks added only
    gen = aligned.generation(None, dict(SHORT))
    found = decode_aligned(aligned, [s.source for s in document.segments], gen, TextOptions())
    placed = [with_marks(alone[k], s, found[s.source][1]) for k, s in enumerate(document.segments)]
    assert out == document.render(placed)
    whole = [with_marks(alone[k], s) for k, s in enumerate(document.segments)]
    assert sum(p != w for p, w in zip(placed, whole)) >= 2  # marks around words, not whole sentences
    steps: list = []
    real = aligned.session.backend.step
    monkeypatch.setattr(aligned.session.backend, "step", lambda *a, **k: steps.append(1) or real(*a, **k))
    with TranslationMemory(tmp_path / "tm.db") as tm:
        again = DocumentTranslator(aligned, gen, markup="markdown", memory=tm).translate([("x", text)])[0].text
    assert again == out and not steps  # alignments too come from the memory
