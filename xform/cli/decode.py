"""`xform run` and `xform score`: translate, check, benchmark; score given translations."""
from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path

import click
from rich.markup import escape

from xform.cli import err, handle_errors, main
from xform.cli.documents import DocumentFlags, check_document_flags, document_options, run_documents
from xform.cli.flags import said
from xform.cli.groups import Placement, pass_group, pass_placement
from xform.cli.measure import BenchmarkFlags, CheckFlags, run_benchmark, run_check
from xform.cli.options import (
    BatchingFlags,
    GenerationFlags,
    batching_options,
    check_json_target,
    check_readable,
    count_lines,
    decoding_for,
    generation_options,
    progress_bar,
    text_options,
    warn_unjudged,
    write_json,
)
from xform.cli.qe_report import check_report_target, write_report
from xform.cli.terms import TermFlags, run_term_options
from xform.errors import XformError
from xform.runtime.decoding.request import TextOptions


def input_lines(texts: tuple[str, ...], input_file: Path | None, prefixes: tuple[str, ...] = ()):
    """(label, line) for each --text (with --target-prefix, a (text, prefix) pair), then each line of
    --input-file read lazily as bytes (so a non-UTF-8 line fails alone)."""
    for i, t in enumerate(texts, 1):
        yield f"--text {i}", (t, prefixes[i - 1]) if prefixes else t
    if input_file is not None and str(input_file) == "-":  # standard input, as a pipe's end
        for n, line in enumerate(sys.stdin.buffer, 1):
            yield f"<stdin>:{n}", line
    elif input_file is not None:
        with open(input_file, "rb") as f:
            for n, line in enumerate(f, 1):
                yield f"{input_file}:{n}", line


def labelled_results(translator, labelled, gen, batching, on_batch, text):
    """(label, LineResult) for each (label, line), in input order, under the text options
    (TextOptions: `tgt_lang` reaches the sources only where the model writes it there, MADLAD's <2xx>)."""
    labels: list[str] = []

    def lines():
        for label, line in labelled:
            labels.append(label)
            yield line

    warned = []

    def on_warning(index: int, message: str) -> None:
        warned.append(index)
        if len(warned) <= MAX_WARNINGS:
            err.print(f"[bold yellow]warning:[/] {escape(labels[index])}: {escape(said(message))}")

    results = translator.translate_lines(lines(), gen, batching, text, on_batch=on_batch, on_warning=on_warning)
    for i, result in enumerate(results):
        yield labels[i], result
    if len(warned) > MAX_WARNINGS:
        err.print(f"[bold yellow]warning:[/] {len(warned)} warnings in all (the first {MAX_WARNINGS} are above)")


MAX_WARNINGS = 10  # lines named one by one; the rest are counted


@dataclasses.dataclass
class CheckedLines:
    """The first `limit` translated lines (not blank), which --check compares, and how many there were."""
    limit: int
    texts: list[str] = dataclasses.field(default_factory=list)
    translated: int = 0

    def add(self, text: str) -> None:
        self.translated += 1
        if len(self.texts) < self.limit:
            self.texts.append(text)


def write_translations(results, n: int, report: dict, checked: CheckedLines, text: TextOptions,
                       output=None, echo: bool = True) -> tuple[int, int]:
    """Print `source<TAB>translation` lines (with scores, `<TAB>score` after, then the token
    scores; with qe, `<TAB>confidence` last; `echo` False: none), n per source (n empty ones for a
    failed line, its error on stderr); with an `output` file, write the translations there, one a
    line (a failed line's empty; the columns after it as printed). A glossary's term a
    translation could not hold is a warning naming the line; greedy decoding promoted to beams
    for the terms, a note once. Record them in the report, keep the translated texts --check
    compares in `checked`; return (failed lines, lines)."""
    report["translations"], errors, count = [], 0, 0
    scores, qe, promoted = text.scores, text.qe, False

    def emit(text: str, target: str, rest: str = "") -> None:
        if output is not None:
            output.write(target + rest + "\n")
        if echo:
            click.echo(f"{text}\t{target}{rest}")

    for count, (label, line) in enumerate(results, 1):
        source = line.text
        if line.error is not None:
            errors += 1
            err.print(f"[bold red]error:[/] {escape(label)}: {escape(said(line.error))}")
            report["translations"].append({"source": source, "error": said(line.error)})
            for _ in range(n):  # the output keeps one line per input line
                emit(source, "", ("\t\t" if scores == "tokens" else "\t" if scores else "") + ("\t" if qe else ""))
            continue
        if line.promoted_beams and not promoted:
            promoted = True
            err.print(f"note: greedy decoding searched with {line.promoted_beams} beams where a line has glossary "
                      "terms or kept spans (the search needs them to place the terms)")
        for k, missed in enumerate(line.unmet):
            if missed:
                err.print(f"[bold yellow]warning:[/] {escape(label)}: translation {k + 1} lacks "
                          f"{escape(', '.join(map(repr, missed)))} (no room within the length cap, or not in the "
                          "target vocabulary)")
        if source.strip():
            checked.add(source)
        for k, tgt in enumerate(line.hypotheses):
            entry = {"source": source, "target": tgt}
            rest = ""
            if scores:
                entry["score"] = line.scores[k]
                rest = f"\t{line.scores[k]:.4f}"  # plain tab-separated lines, for scripts
            if scores == "tokens":
                entry["token_scores"] = line.token_scores[k]
                rest += "\t" + " ".join(f"{v:.4f}" for v in line.token_scores[k])
            if qe:
                entry["confidence"], entry["line"] = (line.confidence[k] if line.confidence else None), label
                rest += f"\t{line.confidence[k]:.3f}" if line.confidence else "\t"
            if line.unmet and line.unmet[k]:
                entry["unmet"] = line.unmet[k]
            report["translations"].append(entry)
            emit(source, tgt, rest)
    return errors, count


@contextlib.contextmanager
def output_file(path: Path | None):
    """The --output file (written atomically: renamed into place when every line is written), or
    None. On Ctrl-C it keeps what was translated: the lines written so far, which are the first
    lines' translations in input order, are renamed into place (never half a line), and stderr
    says so and points to `xform corpus` for work that resumes."""
    if path is None:
        yield None
        return
    from xform.files import atomic_file
    stack = contextlib.ExitStack()
    try:
        f = stack.enter_context(atomic_file(path))
    except OSError as e:  # its directory missing or not writable: before any decoding
        raise XformError(f"--output {path}: {e.strerror or e}") from None
    stop: KeyboardInterrupt | None = None
    with stack:
        try:
            yield f
        except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (cli.Terminated)
            stop = e  # handled here, so that atomic_file keeps what was written
    if stop is not None:
        with open(path, "rb") as done:
            n = sum(1 for _ in done)
        err.print(f"interrupted: {path} holds the {n} translation lines written before it, the first lines' in "
                  "input order; `xform corpus` translates a file in shards and resumes where it stopped")
        raise stop


@dataclasses.dataclass(frozen=True)
class Sources:
    """run's text to translate: each --text (with its --target-prefix, if any) and --input-file."""
    texts: tuple[str, ...] = ()
    input_file: Path | None = None
    prefixes: tuple[str, ...] = ()

    @classmethod
    def of(cls, texts=(), input_file: Path | None = None, target_prefixes=()) -> "Sources":
        return cls(tuple(texts), input_file, tuple(target_prefixes))

    @property
    def given(self) -> bool:
        """Whether there is text to translate: --text or --input-file."""
        return bool(self.texts or self.input_file)

    @property
    def reads_file(self) -> bool:
        """Whether --input-file names a file (not `-`, standard input)."""
        return self.input_file is not None and str(self.input_file) != "-"

    def lines(self):
        return input_lines(self.texts, self.input_file, self.prefixes)


@dataclasses.dataclass(frozen=True)
class Output:
    """Where run's translations go: --output (None: stdout), and --echo (stdout too)."""
    path: Path | None = None
    echo: bool = False

    @classmethod
    def of(cls, output: Path | None, echo: bool) -> "Output":
        return cls(output, echo)

    @property
    def printed(self) -> bool:
        return self.path is None or self.echo


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--backend", type=click.Choice(["torch", "ort", "trt"]), default="ort", show_default=True)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="Default: cpu for torch and ort, cuda for trt.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="Intra-op threads (default: all cores).")
@click.option("--allow-tf32", is_flag=True,
              help="--device cuda with ort: let fp32 matmuls run in TF32 (faster on Ampere and newer; logits about "
                   "1e-3 off, so --check judges them by fp16's tolerance). Off by default: fp32 is fp32.")
@click.option("--no-cuda-graph", "uncaptured", is_flag=True,
              help="--device cuda with ort: run the decoder step uncaptured (by default it is captured as a CUDA "
                   "graph and replayed: 2.3-3x the tokens/s on an H100, same tokens and logits).")
@click.option("--text", "texts", multiple=True, help="Text to translate; repeat for a batch.")
@click.option("--input-file", type=click.Path(path_type=Path),
              help="Translate each line (read a --read-ahead window at a time, written in input order; a blank "
                   "line gives a blank translation). '-' reads standard input; a named pipe or <(command) "
                   "is read as a file.")
@click.option("--check", is_flag=True,
              help="Compare with eager PyTorch step by step; exit 1 beyond tolerance. With --text / --input-file it "
                   "compares the first --check-lines translated lines (and says how many), else random sources.")
@click.option("--check-lines", type=click.IntRange(min=1), default=32, show_default=True,
              help="--check: translated lines compared (eager PyTorch decodes them as one batch: memory grows "
                   "with N).")
@click.option("--atol", type=float, default=None, help="Absolute logit tolerance (default: the precision's).")
@click.option("--rtol", type=float, default=None, help="Relative logit tolerance (default: the precision's).")
@click.option("--target-prefix", "target_prefixes", multiple=True, metavar="TEXT",
              help="The start of the translation of the --text of the same rank: decoding continues after it "
                   "(repeat once per --text; '' for none).")
@click.option("--output", type=click.Path(path_type=Path), default=None,
              help="Write the translations to this file, one a line (n a source with --num-return-sequences; a "
                   "failed line's empty), as marian-decoder and CTranslate2's translate_file do; written atomically. "
                   "Without it, stdout gets source<TAB>translation lines.")
@click.option("--echo", is_flag=True, help="With --output: also print source<TAB>translation lines on stdout.")
@click.option("--benchmark", is_flag=True,
              help="Time the decode the flags choose (greedy by default, or the bundle's; --num-beams, --sample) on "
                   "--batch random sources of --src-len tokens, exactly --new-tokens steps each: tokens/s, "
                   "per-step latency percentiles and peak RSS.")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--src-len", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--new-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--iters", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write the figures as JSON.")
@click.option("--force", is_flag=True, help="Replace an existing --json report (only a report xform wrote).")
@click.option("--verbose", is_flag=True, help="Print how --input-file's batches are planned (rows, lines, tokens) "
                                              "and the memory those limits bound, on stderr.")
@batching_options
@text_options
@document_options
@generation_options
@run_term_options
@pass_placement("backend", "device", "threads", "allow_tf32", "uncaptured")
@pass_group("sources", Sources.of, ["texts", "input_file", "target_prefixes"])
@pass_group("check", CheckFlags.of, ["check", "check_lines", "atol", "rtol"])
@pass_group("output", Output.of, ["output", "echo"])
@pass_group("benchmark", BenchmarkFlags.of, ["benchmark", "batch", "src_len", "new_tokens", "warmup", "iters"])
@handle_errors
def run(bundle: Path, where: Placement, sources: Sources, check: CheckFlags, output: Output,
        benchmark: BenchmarkFlags, json_path: Path | None, force: bool, verbose: bool, batching: BatchingFlags,
        text: TextOptions, documents: DocumentFlags, generation: GenerationFlags, terms: TermFlags) -> None:
    """Translate with BUNDLE, check it against eager PyTorch, and/or benchmark it.

    Decoding is the bundle's default (greedy, or what a Marian model ships) unless the decoding
    flags say otherwise."""
    import xform.api

    check_run_flags(sources, text, output, check.on, benchmark.on)
    text = terms.applied(text)
    as_documents = documents.wanted
    if as_documents:
        check_document_flags(sources.given, {"--scores": text.scores is True, "--token-scores": text.scores == "tokens",
                                             "--target-prefix": bool(sources.prefixes),
                                             "--prefix-column": text.prefix_column, "--echo": output.echo,
                                             "--check": check.on})
    json_inputs = [("BUNDLE", bundle), *([("--vocab-map", text.vocab_map)] if text.vocab_map else []),
                   *([("--input-file", sources.input_file)] if sources.reads_file else [])]
    if json_path is not None:
        check_json_target(json_path, force, json_inputs)
    if terms.qe_report is not None:
        check_report_target(terms.qe_report, force, json_inputs)
    settings = generation.settings()
    lines = batching.checked()
    translator = where.open(bundle)  # the command's one translator
    session = translator.session
    warn_unjudged(session)
    languages = dataclasses.replace(text, src_lang=None) if as_documents and text.src_lang == "auto" else text
    gen, vocab_map = decoding_for(translator, bundle, where.backend, settings, sources.given,
                                  generation.max_new_tokens, languages)
    text = dataclasses.replace(text, vocab_map=vocab_map)
    report: dict = {"bundle": str(bundle), "backend": where.backend,
                    "device": where.device or xform.api.default_device(where.backend),
                    "tf32": bool(getattr(session.backend, "tf32", False)), "generation": gen.to_dict()}
    failed = False
    checked = CheckedLines(check.lines)  # --check compares the first --check-lines translated lines
    if verbose:
        print_plan(session, lines, gen)
    if as_documents:
        report.update(run_documents(translator, sources, output.path, gen, lines, text, documents, force))
    elif sources.given:
        failed = not translate_lines(translator, sources, output, gen, lines, text, report, checked)
    if check.on:
        failed = not run_check(session, bundle, gen, generation.max_new_tokens, checked, check, text.src_lang,
                               report) or failed
    if benchmark.on:
        report["benchmark"] = run_benchmark(session, where.backend, gen, benchmark)
    if json_path is not None:
        write_json(json_path, report, force, json_inputs)
    if terms.qe_report is not None:
        low = write_report(terms.qe_report, reviewed(report), terms.qe_below, force, json_inputs)
        err.print(f"{low} translations with a confidence below {terms.qe_below}: {terms.qe_report}")
    if failed:
        sys.exit(1)


def reviewed(report: dict) -> list:
    """What --qe-report judges, from what --json records: each translated line (FILE:LINE, --text N)
    or each document's sentence (DOCUMENT:LINE) with its translation and confidence."""
    rows = [(e["line"], e["source"], e["target"], e.get("confidence")) for e in report.get("translations", [])
            if "line" in e]
    return rows + [(f"{d['name']}:{s['line']}", s["source"], s["target"], s["confidence"])
                   for d in report.get("documents", []) for s in d.get("scored", [])]


def translate_lines(translator, sources: Sources, output: Output, gen, batching, text, report: dict,
                    checked: CheckedLines) -> bool:
    """`xform run` of --text / --input-file lines: printed, or written to --output; whether every
    line was translated (the failed ones are named on stderr, their output lines empty)."""
    input_file = sources.input_file
    with progress_bar(input_file is not None, "lines", "translated",
                      lambda: None if (n := count_lines(input_file)) is None else n + len(sources.texts)) as on_batch:
        results = labelled_results(translator, sources.lines(), gen, batching, on_batch, text)
        with output_file(output.path) as sink:
            errors, n = write_translations(results, gen.num_return_sequences, report, checked, text, sink,
                                           echo=output.printed)
    if errors:
        err.print(f"[bold red]error:[/] {errors} of {n} lines could not be translated (their output lines are empty)")
    return not errors


def print_plan(session, batching, gen) -> None:
    """run --verbose: the batches' limits and the memory they bound."""
    import numpy as np

    from xform.runtime.backends.cache import row_bytes

    c = session.config
    item = np.dtype(session.bundle.manifest.kv_dtype).itemsize if session.bundle is not None else 4
    per_line = gen.num_beams if gen.strategy == "beam" else gen.num_return_sequences
    layer = (c.n_decoder_layers, c.n_heads, c.head_dim)
    for line in batching.describe(per_line, row_bytes(*layer, min(c.max_len, gen.max_new_tokens + 1), item),
                                  row_bytes(*layer, c.max_len, item), 4 * c.tgt_vocab_size):
        err.print(said(line), markup=False, highlight=False)


def check_run_flags(sources: Sources, text: TextOptions, output: Output, check: bool, benchmark: bool) -> None:
    """run's flags that go together, before anything is loaded."""
    texts, input_file = sources.texts, sources.input_file
    if input_file is not None and sources.reads_file:
        check_readable("--input-file", input_file)
    if text.scores and not sources.given:
        raise click.UsageError(f"{'--token-scores' if text.scores == 'tokens' else '--scores'} goes with --text / "
                               "--input-file (the translations it scores)")
    if sources.prefixes and len(sources.prefixes) != len(texts):
        raise click.UsageError(f"--target-prefix is given {len(sources.prefixes)} times for {len(texts)} --text: "
                               "give one per --text ('' for none)")
    if text.prefix_column and input_file is None:
        raise click.UsageError("--prefix-column reads --input-file lines as source<TAB>prefix: give --input-file")
    if text.replace_unknowns and not sources.given:
        raise click.UsageError("--replace-unknowns goes with --text / --input-file")
    if output.path is not None and not sources.given:
        raise click.UsageError("--output writes the translations of --text / --input-file: give one")
    if output.echo and output.path is None:
        raise click.UsageError("--echo goes with --output (without it, stdout gets the translations)")
    if output.path is not None and input_file is not None and sources.reads_file and (
            output.path.resolve() == input_file.resolve()):
        raise click.UsageError(f"--output {output.path} is --input-file: write the translations elsewhere")
    if not (sources.given or check or benchmark):
        raise click.UsageError("nothing to do: give --text / --input-file, --check, or --benchmark")


