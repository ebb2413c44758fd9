"""The terminology flags of translating text (run, corpus): a glossary, kept patterns and the
confidence, as TermFlags `terms`, which a command applies to its TextOptions once the languages
are known (the glossary's entries for that pair: runtime/text/glossary.py)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from xform.cli.groups import option_group


def term_options(fn):
    """--glossary, --keep, --qe as TermFlags `terms` (corpus: its outputs carry the confidence)."""
    return option_group("terms", TermFlags, term_flags())(fn)


def run_term_options(fn):
    """term_options and run's --qe-report, --qe-below."""
    return option_group("terms", TermFlags, [*term_flags(), *report_flags()])(fn)


def term_flags() -> list:
    return [
        click.option("--glossary", type=click.Path(path_type=Path), default=None,
                     help="Terms and their required translations (TSV: source TAB target [TAB source language TAB "
                          "target language]; or TBX): a term found in a line (whole words, any case, longest "
                          "first) appears in its translation as the glossary writes it, enforced in the beam "
                          "search (greedy decoding takes the beam the terms need). docs/terminology.md."),
        click.option("--keep", multiple=True, metavar="PATTERN",
                     help="A regular expression whose matches stay as written in the translation (product codes, "
                          "placeholders, URLs); repeat for more. <dnt>...</dnt> in a line marks a span too."),
        click.option("--qe", is_flag=True,
                     help="Each translation's confidence in [0, 1] after it, tab-separated (and `confidence` in "
                          "--json): the formula in docs/terminology.md; low is worth a look."),
    ]


def report_flags() -> list:
    return [
        click.option("--qe-report", type=click.Path(path_type=Path), default=None,
                     help="Write the translations whose confidence is below --qe-below to this file, for review: "
                          "line, sentence, translation, confidence, tab-separated (a document's sentences with "
                          "--documents; implies --qe)."),
        click.option("--qe-below", type=click.FloatRange(0.0, 1.0), default=0.5, show_default=True,
                     help="--qe-report's threshold."),
    ]


@dataclasses.dataclass(frozen=True)
class TermFlags:
    """The terminology flags as given."""
    glossary: Path | None = None
    keep: tuple[str, ...] = ()
    qe: bool = False
    qe_report: Path | None = None
    qe_below: float = 0.5

    def applied(self, text):
        """`text` (TextOptions) with the glossary's entries for its languages and the kept patterns
        as its terminology, and qe; a glossary that cannot be read is refused naming the file."""
        from xform.runtime.text.terminology import terminology

        terms = terminology(self.glossary, self.keep, text.src_lang, text.tgt_lang)
        return dataclasses.replace(text, terminology=terms, qe=self.qe or self.qe_report is not None)
