"""`xform eval`: a file translated and scored with sacreBLEU, against references or a second system."""
from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from xform.cli import err, handle_errors, main, out
from xform.cli.flags import said
from xform.cli.groups import Placement, pass_placement
from xform.cli.options import (
    GenerationFlags,
    check_json_target,
    checked_generation,
    generation_options,
    progress_bar,
    split_bad_words,
    write_json,
)
from xform.errors import XformError
from xform.runtime.text.translator import Translator


@main.command("eval")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--source", "source_file", required=True, type=click.Path(path_type=Path),
              help="Source sentences, one a line.")
@click.option("--reference", "reference_file", type=click.Path(path_type=Path), default=None,
              help="Their reference translations, one a line (optional with --against: then the other system's "
                   "translations are the reference).")
@click.option("--against", default=None, metavar="eager|BUNDLE",
              help="A second system decoding the same file with the same settings: eager PyTorch from BUNDLE's "
                   "reference weights, or another bundle (fp32 against int8, say).")
@click.option("--backend", type=click.Choice(["ort", "trt"]), default="ort", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=None)
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=None)
@click.option("--src-lang", default=None, help="A multilingual model's source language code.")
@click.option("--tgt-lang", default=None, help="A multilingual model's target language code.")
@click.option("--vocab-map", type=click.Path(path_type=Path), default=None,
              help="BUNDLE decodes with this vocabulary map (CTranslate2's vmap; a bundle exported "
                   "--with-vocab-map). With --against BUNDLE, the same bundle, the table compares the map with "
                   "the full vocabulary.")
@click.option("--truncate", is_flag=True,
              help="Cut a source line longer than the model's max_len to fit (else that line fails alone, left out "
                   "of the scores), as run --truncate does.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None,
              help="Write the figures as JSON (bleu, chrf, signature, lines, speed, each system, every sentence's "
                   "chrF difference).")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=None,
              help="With --against: a PNG histogram of the sentence chrF differences (needs matplotlib).")
@click.option("--force", is_flag=True, help="Replace an existing --json report or --plot image xform wrote.")
@click.option("--qe", is_flag=True,
              help="Score each translation's confidence (docs/terminology.md's formula) and print its Spearman rank "
                   "correlation with the sentence chrF against --reference: what the confidence is worth here.")
@generation_options
@pass_placement("backend", "threads")
@handle_errors
def evaluate(bundle, source_file, reference_file, against, where: Placement, batch_size, src_lang, tgt_lang,
             vocab_map, truncate, json_path, plot_path, force, qe, generation: GenerationFlags) -> None:
    """Translate --source with BUNDLE and score it with sacreBLEU (BLEU, chrF) against --reference,
    and/or side by side with a second system (--against eager or another bundle)."""
    from xform.errors import InputError
    from xform.exporter import evaluate as ev

    ev.sacrebleu_module()  # missing: say so before any decoding
    check_eval_flags(reference_file, against, plot_path, qe)
    inputs = [("BUNDLE", bundle), ("--source", source_file), *([("--reference", reference_file)] if reference_file
                                                               else []), *([("--vocab-map", vocab_map)] if vocab_map
                                                                           else [])]
    if json_path is not None:
        check_json_target(json_path, force, inputs)
    if plot_path is not None:
        check_plot_target(plot_path, force, inputs)
    sources = ev.read_lines("--source", source_file, per_line=True)  # a line not UTF-8 fails alone, as in run
    references = ev.read_lines("--reference", reference_file) if reference_file is not None else None
    if references is not None and len(references) != len(sources):
        raise XformError(f"--reference {reference_file}: {len(references)} lines for the {len(sources)} of "
                         f"--source {source_file}; expected one translation a source line")
    translator = where.open(bundle)  # the command's translators, each opened once
    other = Translator(other_session(bundle, against, where.threads)) if against is not None else None
    settings = generation.settings()
    split_bad_words(translator, settings)
    try:
        translator.policy.first_token(settings, tgt_lang)
    except InputError as e:
        raise click.UsageError(said(e)) from None
    gen = checked_generation(translator.session, generation.max_new_tokens, settings)
    systems = []
    first = f"{bundle} + {vocab_map.name}" if vocab_map is not None else str(bundle)  # names differ: same bundle
    for name, t, vmap in [(first, translator, vocab_map), *([(against, other, None)] if other is not None else [])]:
        with progress_bar(True, "lines", f"{name}: translated", lambda: len(sources)) as advance:
            systems.append(ev.translate_file(name, t, sources, gen, src_lang, batch_size, advance, tgt_lang, vmap,
                                             truncate, qe and t is translator))
    failed = report_failed(systems, source_file)
    scored, scored_refs, lines = ev.without_failed(systems, references)
    report = ev.evaluate(scored, scored_refs, str(source_file), str(reference_file) if reference_file else None,
                         lines)
    print_eval(report)
    if plot_path is not None:
        write_plot(report, plot_path, force, inputs)
    if json_path is not None:
        write_json(json_path, {"bundle": str(bundle), "backend": where.backend, "generation": gen.to_dict(),
                               "vocab_map": None if vocab_map is None else str(vocab_map), **report.to_dict(),
                               "failed": [{"line": n, "error": said(m)} for n, m in sorted(failed.items())]},
                   force, inputs)
    if failed:
        err.print(f"[bold red]error:[/] {len(failed)} of {len(sources)} lines could not be translated (left out of "
                  "the scores)")
        sys.exit(1)


def check_eval_flags(reference_file, against, plot_path, qe: bool) -> None:
    """The flags that go together, refused before any work."""
    import importlib.util

    if reference_file is None and against is None:
        raise click.UsageError("nothing to compare with: give --reference, --against, or both")
    if plot_path is not None and against is None:
        raise click.UsageError("--plot draws the differences between two systems: give --against")
    if plot_path is not None and importlib.util.find_spec("matplotlib") is None:
        raise XformError("--plot needs matplotlib: pip install matplotlib")
    if qe and reference_file is None:
        raise click.UsageError("--qe measures the confidence against --reference: give it")


def report_failed(systems, source_file: Path) -> dict:
    """The lines some system could not translate, each on stderr as `run` says it (FILE:LINE: why):
    line number -> its error (the first system's that failed it)."""
    failed: dict = {}
    for s in systems:
        for n, why in s.failed.items():
            failed.setdefault(n, why)
    for n in sorted(failed):
        err.print(f"[bold red]error:[/] {escape(f'{source_file}:{n}: {said(failed[n])}')}")
    return failed


def other_session(bundle: Path, against: str, threads: int | None):
    """The second system of `xform eval`: eager PyTorch over BUNDLE's reference weights, or a bundle."""
    import xform
    from xform.models.backend import TorchBackend
    from xform.runtime.bundle import Bundle
    from xform.runtime.open import open_session

    if against == "eager":
        opened = Bundle.open(bundle)
        if not opened.file(opened.manifest.reference_dir).is_dir():
            raise XformError(f"--against eager: {bundle} holds no reference weights ({opened.manifest.reference_dir})")
        return open_session(opened, "torch", threads=threads, torch_factory=TorchBackend.for_bundle)
    if not Path(against).is_dir():
        raise XformError(f"--against {against}: expected eager or a bundle directory")
    return xform.load(against, backend="ort", threads=threads)


def check_plot_target(path: Path, force: bool, inputs) -> None:
    from xform.files import check_target

    def not_our_plot(p: Path) -> str | None:
        return None if p.is_file() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" else "is not a PNG plot"
    check_target(path, force, "plot", not_our_plot, inputs, flag="--plot")


def write_plot(report, path: Path, force: bool, inputs) -> None:
    """The PNG written atomically, with the mode any other output gets (0666 less the umask)."""
    from xform.exporter.evaluate import plot
    from xform.files import atomic_file
    check_plot_target(path, force, inputs)
    with atomic_file(path, binary=True) as f:
        plot(report, f)


def print_eval(report) -> None:
    ref = report.reference or f"{report.systems[1].name}'s translations"
    t = Table(title=f"{report.source}: translations scored against {ref}")
    for col in ("system", "BLEU", "chrF", "lines", "lines/s"):
        t.add_column(col, justify="left" if col == "system" else "right")
    for s in report.systems:
        t.add_row(escape(s.name), "-" if s.bleu is None else f"{s.bleu:.2f}", "-" if s.chrf is None else
                  f"{s.chrf:.2f}", str(len(s.translations)), f"{s.lines_per_s:,.1f}")
    out.print(t)
    out.print(f"BLEU {report.bleu_signature}")
    out.print(f"chrF {report.chrf_signature}")
    if report.qe_lines:
        rho = "-" if report.qe_spearman is None else f"{report.qe_spearman:+.3f}"
        out.print(f"confidence (--qe): Spearman {rho} with sentence chrF over {report.qe_lines} lines")
    if report.identical is not None:
        a, b = report.systems[0].name, report.systems[1].name
        out.print(f"identical translations: {report.identical:.2%} of {len(report.systems[0].translations)} lines")
        for w in report.worst:
            out.print(f"line {w['line']}: chrF {w['chrf_delta']:+.1f}\n  {escape(a)}: {escape(w[a])}\n  "
                      f"{escape(b)}: {escape(w[b])}" + (f"\n  reference: {escape(w['reference'])}"
                                                         if "reference" in w else ""))
