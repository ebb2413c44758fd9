"""Markup around a sentence's words put back around its translation (Markdown's emphasis and
links): around the whole translation, outermost first, since which translated words a marked
source word became is not known without alignments."""
from __future__ import annotations

from xform.runtime.documents.layout import Segment


def with_marks(translation: str, segment: Segment) -> str:
    """`translation` with the segment's marks around it (none: as it is)."""
    if not segment.marks:
        return translation
    marks = sorted(segment.marks, key=lambda m: (m.start, -m.end))
    return "".join(m.open for m in marks) + translation + "".join(m.close for m in reversed(marks))
