"""Markup around a sentence's words put back around its translation (Markdown's emphasis, links,
paired tags): around the translated words aligned to the marked source words where an alignment
says which (alignment.py: a bundle exported --with-attention), else around the whole translation,
outermost first."""
from __future__ import annotations

from xform.runtime.documents.alignment import Alignment
from xform.runtime.documents.layout import Segment


def with_marks(translation: str, segment: Segment, alignment: Alignment | None = None) -> str:
    """`translation` with the segment's marks around the words they became (none: as it is)."""
    if not segment.marks:
        return translation
    if alignment is not None:
        placed = around_words(translation, segment, alignment)
        if placed is not None:
            return placed
    marks = sorted(segment.marks, key=lambda m: (m.start, -m.end))
    return "".join(m.open for m in marks) + translation + "".join(m.close for m in reversed(marks))


def around_words(translation: str, segment: Segment, alignment: Alignment) -> str | None:
    """Each mark around the span of translated words aligned to its source words; None where a mark
    has no aligned word or two marks' spans cross (neither inside the other)."""
    words = translation.split()
    if len(words) != len(alignment) or not words:
        return None
    spans = []
    for mark in segment.marks:
        covered = set(range(mark.start, mark.end))
        hit = [j for j, sources in enumerate(alignment) if covered & set(sources)]
        if not hit:
            return None
        spans.append((min(hit), max(hit) + 1, mark))
    for a in spans:
        for b in spans:
            if a[0] < b[0] < a[1] < b[1]:
                return None
    before: list[list[str]] = [[] for _ in words]
    after: list[list[str]] = [[] for _ in words]
    for first, last, mark in sorted(spans, key=lambda s: (s[0], -s[1])):  # outer opens first
        before[first].append(mark.open)
    for first, last, mark in sorted(spans, key=lambda s: (s[1], -s[0])):  # inner closes first
        after[last - 1].append(mark.close)
    return " ".join("".join(b) + w + "".join(a) for b, w, a in zip(before, words, after))
