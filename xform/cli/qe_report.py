"""run --qe-report FILE: the translations whose confidence is below --qe-below, a line each, for a
reviewer (line, sentence, translation, confidence, tab-separated): the sentences worth a look."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

HEADER = "line\tsentence\ttranslation\tconfidence"

# a row: where (FILE:LINE, --text N, DOCUMENT:LINE), the sentence, its translation, its confidence (None: none
# computed, a sentence the translation memory held)
Row = tuple[str, str, str, "float | None"]


def not_our_report(path: Path) -> str | None:
    """None when `path` is an empty file or a confidence report (its header line), which --force
    may replace."""
    if not path.is_file():
        return "is not a file"
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline().rstrip("\n")
    except (OSError, UnicodeDecodeError):
        return "is not a confidence report xform wrote"
    return None if first in ("", HEADER) else "is not a confidence report xform wrote"


def check_report_target(path: Path, force: bool, inputs: list[tuple[str, Path]]) -> None:
    from xform.files import check_target
    check_target(path, force, "confidence report", not_our_report, inputs, flag="--qe-report")


def clean(text: str) -> str:
    """A column's text on one line: tabs and line breaks as spaces."""
    return " ".join(text.replace("\t", " ").split())


def write_report(path: Path, rows: Iterable[Row], below: float, force: bool, inputs: list[tuple[str, Path]]) -> int:
    """The rows below the threshold, in input order, written atomically; how many."""
    from xform.files import atomic_write
    check_report_target(path, force, inputs)  # again: the file may have appeared while this run decoded
    low = [r for r in rows if r[3] is not None and r[3] < below]
    lines = [HEADER, *(f"{where}\t{clean(s)}\t{clean(t)}\t{c:.3f}" for where, s, t, c in low)]
    atomic_write(path, "\n".join(lines) + "\n")
    return len(low)
