"""The `xform` command line: thin click commands over the library.

Each command turns flags into one library call and prints a summary. Errors: an XformError is a
message on stderr and exit 1 (no traceback), a failed check is exit 1, bad usage is exit 2 (click),
Ctrl-C is exit 130.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import sys
import time
from pathlib import Path
from typing import Callable

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from xform import __version__
from xform.errors import XformError
from xform.manifest import PRECISIONS, Manifest
from xform.manifest import VERSION as BUNDLE_VERSION
from xform.models import STATE_DICT_ARCHS as ARCHS
from xform.models.vocab import TOKENIZE, VocabFiles

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


INTERRUPTED = 130  # 128 + SIGINT, what shells report for a command Ctrl-C stopped


def handle_errors(fn):
    """The one place where library errors become exit codes; Ctrl-C is exit 130 with one line,
    not click's "Aborted!" and exit 1."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except XformError as e:
            err.print(f"[bold red]error:[/] {escape(str(e))}")
            sys.exit(1)
        except KeyboardInterrupt:
            err.print("interrupted")
            sys.exit(INTERRUPTED)
    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="xform",
                      message=f"%(prog)s %(version)s (bundle format {BUNDLE_VERSION})")
def main() -> None:
    """Export encoder-decoder Transformers to ONNX / TensorRT and run them, checked against PyTorch."""
    import logging

    from rich.logging import RichHandler
    logging.basicConfig(level=logging.WARNING, format="%(message)s",
                        handlers=[RichHandler(console=err, show_time=False, show_path=False)])


@main.command()
@click.argument("model")
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path),
              help="Bundle directory to write.")
@click.option("--precision", type=click.Choice(list(PRECISIONS)), default="fp32", show_default=True,
              help="fp16: fp16 weights, matmuls and K/V; LayerNorm, softmax and logits in fp32 (for GPUs). "
                   "int8: int8 MatMul weights by ONNX Runtime dynamic quantization (for the CPU).")
@click.option("--opset", type=int, default=None,
              help="ONNX opset (default 17; 18 with --exporter dynamo, the oldest it writes).")
@click.option("--exporter", type=click.Choice(["torchscript", "dynamo"]), default="torchscript", show_default=True,
              help="dynamo: torch.export + onnxscript (pip install 'xform[dynamo]'), the exporter PyTorch develops; "
                   "torchscript: the tracer it has deprecated, still the default (docs/design.md).")
@click.option("--force", is_flag=True,
              help="Replace an existing bundle at -o: only a bundle xform wrote (nothing else in it) or an empty "
                   "directory; never MODEL, a folder of other files or the current directory.")
@click.option("--arch", type=click.Choice(list(ARCHS)), default=None,
              help="MODEL is a state dict file of this layout (default for a file: auto, recognised from its keys).")
@click.option("--n-heads", type=int, help="State dict: attention heads (not recorded in the weights).")
@click.option("--bos-id", type=int, help="State dict: start-of-sentence id, the decoder's first input.")
@click.option("--eos-id", type=int, help="State dict: end-of-sentence id.")
@click.option("--pad-id", type=int, help="State dict: pad id (default: the tutorial's, 0 or 1).")
@click.option("--max-len", type=int,
              help="State dict: positions to keep (default: the saved table, or the tutorial's).")
@click.option("--n-layers", type=int, help="State dict: encoder and decoder layers, checked against the weights.")
@click.option("--n-encoder-layers", type=int, help="State dict: checked against the weights.")
@click.option("--n-decoder-layers", type=int, help="State dict: checked against the weights.")
@click.option("--d-model", type=int, help="State dict: checked against the weights.")
@click.option("--d-ff", type=int, help="State dict: checked against the weights.")
@click.option("--src-vocab-size", type=int, help="State dict: checked against the weights.")
@click.option("--tgt-vocab-size", type=int, help="State dict: checked against the weights.")
@click.option("--norm-first", is_flag=True, default=None,
              help="torch-nn-transformer: built with norm_first=True (pre-LN); default post-LN, nn.Transformer's.")
@click.option("--activation", type=click.Choice(["relu", "gelu"]), default=None,
              help="torch-nn-transformer: the layers' activation (default relu, nn.Transformer's).")
@click.option("--layer-norm-eps", type=float, default=None, help="torch-nn-transformer: default 1e-5.")
@click.option("--scale-embedding/--no-scale-embedding", default=None,
              help="torch-nn-transformer: embeddings multiplied by sqrt(d_model), as the tutorial's TokenEmbedding "
                   "(default: scaled).")
@click.option("--src-embedding", metavar="KEY", help="torch-nn-transformer: the source embedding table's key.")
@click.option("--tgt-embedding", metavar="KEY", help="torch-nn-transformer: the target embedding table's key.")
@click.option("--generator", metavar="KEY", help="torch-nn-transformer: the output Linear's key.")
@click.option("--positions", metavar="KEY|sinusoidal",
              help="torch-nn-transformer: the position table's key, or sinusoidal when your code does not save one.")
@click.option("--src-vocab", type=click.Path(path_type=Path),
              help="Source vocabulary for text: a JSON list (id -> token) or dict (token -> id), or a "
                   "sentencepiece .model.")
@click.option("--tgt-vocab", type=click.Path(path_type=Path), help="Target vocabulary, as --src-vocab.")
@click.option("--tokenize", type=click.Choice(list(TOKENIZE)), default=None,
              help="How text is split with --src-vocab / --tgt-vocab (default: sentencepiece for a .model, "
                   "else whitespace).")
@click.option("--src-bos", is_flag=True, help="With --src-vocab: the source starts with the bos id too (as "
                                              "PyTorch's translation tutorial does); eos always ends it.")
@click.option("--max-new-tokens", "decode_cap", type=click.IntRange(min=1), default=None,
              help="The bundle's default limit on generated tokens (default: the model's max_length, else 256; "
                   "never beyond max_len). run --max-new-tokens overrides it per run.")
@click.option("--with-attention", is_flag=True,
              help="The decoder graph also returns a decoder layer's cross-attention (averaged over heads): "
                   "alignments (return_attention) and run --replace-unknowns. Off by default: the plain decoder "
                   "returns nothing it does not need.")
@click.option("--with-vocab-map", is_flag=True,
              help="Also the restricted decoder graph and the output table, so run --vocab-map can project onto "
                   "a per-batch target vocabulary (CPU speed).")
@click.option("--sample-file", type=click.Path(path_type=Path), default=None,
              help="Sentences of yours, one a line (token ids separated by spaces for a model without a "
                   "tokenizer; at most 256 used): the export is judged on their translations against eager "
                   "PyTorch. Without it, random token ids, on which fp16 / int8 are judged for gross breakage "
                   "only (a warning says so).")
@click.option("--attention-layer", type=int, default=None,
              help="With --with-attention: which decoder layer (0-based; negative counts from the end; default "
                   "-1, the last).")
@handle_errors
def export(model: str, output: Path, precision: str, opset: int | None, exporter: str, force: bool, arch: str | None,
           n_layers: int | None, src_vocab: Path | None, tgt_vocab: Path | None, tokenize: str | None,
           src_bos: bool, decode_cap: int | None, with_attention: bool, with_vocab_map: bool,
           attention_layer: int | None, sample_file: Path | None, **hparams) -> None:
    """Export MODEL to a verified bundle.

    MODEL is `demo`, an xform checkpoint directory, a Hugging Face directory (Marian / OPUS-MT,
    M2M100, NLLB, mBART / mBART-50, BART), or a state dict file of a torch.nn.Transformer or seed
    tutorial model (recognised from its keys, or named with --arch) with the hyper-parameters its
    weights do not record.
    """
    from xform.exporter.export import export_bundle
    from xform.models.importers import BUNDLED, KNOWN

    if model not in BUNDLED and not Path(model).exists():  # before any flag is judged against what it is
        raise XformError(f"{model}: no such file or directory; MODEL is {KNOWN}")
    if n_layers is not None:
        hparams["n_encoder_layers"] = hparams["n_encoder_layers"] or n_layers
        hparams["n_decoder_layers"] = hparams["n_decoder_layers"] or n_layers
    hparams = {k: v for k, v in hparams.items() if v is not None}
    if hparams and arch is None and not Path(model).is_file():
        raise click.UsageError(f"{', '.join('--' + k.replace('_', '-') for k in hparams)} only go with a state "
                               "dict file (or --arch)")
    if (src_vocab is None) != (tgt_vocab is None):
        raise click.UsageError("--src-vocab and --tgt-vocab go together")
    if src_vocab is None and (tokenize or src_bos):
        raise click.UsageError("--tokenize and --src-bos go with --src-vocab / --tgt-vocab")
    vocab = None if src_vocab is None or tgt_vocab is None else VocabFiles(src_vocab, tgt_vocab, tokenize, src_bos)
    if attention_layer is not None and not with_attention:
        raise click.UsageError("--attention-layer goes with --with-attention")
    with err.status("exporting") as status:
        result = export_bundle(model, output, precision=precision, opset=opset, exporter=exporter, force=force,
                               arch=arch, hparams=hparams, vocab=vocab, max_new_tokens=decode_cap,
                               attention_layer=(-1 if attention_layer is None else attention_layer)
                               if with_attention else None, vocab_map=with_vocab_map, sample_file=sample_file,
                               progress=lambda msg: status.update(msg))
    v = result.manifest.verification or {}
    c = v["check"]
    source = result.manifest.source
    recognised = " state dict, recognised from its keys" if source.get("recognised") else ""
    out.print(f"model: {source['kind']}{recognised}")
    if source.get("options"):
        out.print("assumed (not recorded in the weights): "
                  + ", ".join(f"{k}={v}" for k, v in source["options"].items())
                  + f"; found: {', '.join(f'{k} {v}' for k, v in source['roles'].items())}")
    out.print(f"wrote {result.path} ({precision}, opset {result.manifest.opset}"
              + (", dynamo exporter)" if exporter == "dynamo" else ")"))
    out.print("verified on onnxruntime against eager PyTorch: graphs "
              + ", ".join(f"{k.removesuffix('_max_abs_err')} {v[k]:.2e}" for k in v if k.endswith("max_abs_err"))
              + f"; decoding: max abs logit error {c['max_abs_err']:.2e}, token agreement "
              + f"{c['token_agreement']:.2%} of {c['tokens_compared']}"
              + (f"; translations {c['decode_agreement']:.2%} alike ({c['decodes_identical']:.2%} identical) over "
                 f"{c['decodes_compared']} sources, eager's tokens {c['logprob_drop']:+.4f} nats each"
                 if c.get("judged_by") == "decodes" else "")
              + (f"; BLEU {c['bleu_vs_eager']:.1f} / chrF {c['chrf_vs_eager']:.1f} against eager's translations"
                 if c.get("bleu_vs_eager") is not None else "")
              + f"; judged on {result.manifest.tolerance.get('judged_on', 'random sources')}"
              + ("; greedy tokens identical to the uncached reference" if v.get("greedy_tokens_identical") else ""))
    print_text_report(result.path, result.manifest)
    cap, why = decode_cap_of(result.manifest)
    out.print(f"decoding stops after {cap} new tokens unless end-of-sentence comes first: {why}. Change it with "
              "xform export --max-new-tokens N, or per run with xform run --max-new-tokens N")


@main.command("build-engine")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--flavor", type=click.Choice(["auto", "tensorrt", "tensorrt_rtx"]), default="auto", show_default=True,
              help="auto: tensorrt when installed, else tensorrt_rtx.")
@click.option("--max-batch", type=int, default=16, show_default=True, help="Sources per batch.")
@click.option("--max-beams", type=int, default=1, show_default=True,
              help="Beams (or samples) per source: the profile's batch is --max-batch x --max-beams.")
@click.option("--max-src-len", type=int, default=None, help="Default: the model's max_len.")
@click.option("--max-new-tokens", type=int, default=None, help="Default: the model's max_len.")
@click.option("--opt-batch", type=int, default=None, help="Default: min(8, --max-batch).")
@click.option("--opt-src-len", type=int, default=None, help="Default: min(32, --max-src-len).")
@click.option("--tf32", is_flag=True, help="Allow TF32 in fp32 layers (cleared by default).")
@click.option("--workspace", "workspace_mib", type=int, default=1024, show_default=True, help="Workspace limit, MiB.")
@click.option("--builder-opt-level", type=int, default=3, show_default=True, help="0 (fast build) to 5.")
@click.option("--timing-cache", type=click.Path(path_type=Path), default=None,
              help="Timing cache file to read and update (tensorrt only; TensorRT-RTX has none).")
@click.option("--force", is_flag=True, help="Rebuild existing engines.")
@handle_errors
def build_engine(bundle, flavor, max_batch, max_beams, max_src_len, max_new_tokens, opt_batch, opt_src_len, tf32,
                 workspace_mib, builder_opt_level, timing_cache, force) -> None:
    """Build TensorRT engines for BUNDLE's encoder and decoder and record them in its manifest."""
    from rich.progress import Progress, TaskID

    from xform.exporter.engine import BuildOptions, build_engines

    options = BuildOptions(tf32=tf32, workspace_mib=workspace_mib, builder_optimization_level=builder_opt_level,
                           timing_cache=timing_cache)
    with Progress(console=err, transient=True) as progress:
        tasks: dict[tuple[str, str], TaskID] = {}

        def on_progress(graph, phase, done, total):
            key = (graph, phase)
            if key not in tasks:
                tasks[key] = progress.add_task(f"{graph}: {phase}", total=max(total, 1))
            progress.update(tasks[key], completed=done)

        engines = build_engines(bundle, flavor, options=options, force=force, progress=on_progress,
                                max_batch=max_batch, max_beams=max_beams, max_src_len=max_src_len,
                                max_new_tokens=max_new_tokens, opt_batch=opt_batch, opt_src_len=opt_src_len)
    for key, e in engines.items():
        p = e.profile
        out.print(f"built {bundle / e.file} ({e.flavor} {e.tensorrt_version}, {e.precision}, "
                  f"{e.details['bytes'] / 2**20:.1f} MiB): batch {p['batch']}, src_len {p['src_len']}, "
                  f"cache_len {p['cache_len']} (min/opt/max); tf32 {'on' if e.details['tf32'] else 'off'}")


REPORT_KEYS = ("bundle", "backend", "generation")  # what every `run --json` report holds


def not_our_report(path: Path) -> str | None:
    """None when `path` is an empty file or a `run --json` report, which --force may replace."""
    if not path.is_file():
        return "is not a file"
    if path.stat().st_size == 0:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    return None if isinstance(data, dict) and all(k in data for k in REPORT_KEYS) else "is not a report xform wrote"


def check_json_target(path: Path, force: bool, inputs: list[tuple[str, Path]]) -> None:
    from xform.files import check_target
    check_target(path, force, "report", not_our_report, inputs, flag="--json")


def write_json(path: Path, data: dict, force: bool, inputs: list[tuple[str, Path]]) -> None:
    from xform.files import atomic_write

    check_json_target(path, force, inputs)  # again: the file may have appeared while this run decoded
    atomic_write(path, json.dumps(data, indent=2) + "\n")


def check_readable(flag: str, path: Path) -> None:
    """Refuse a path that is no file of lines to read: missing, a directory, unreadable. A named
    pipe or a process substitution's /dev/fd/N is read as a file is."""
    import os

    if path.is_dir():
        raise XformError(f"{flag} {path}: is a directory; expected a file of lines (or - for standard input)")
    if not path.exists():
        raise XformError(f"{flag} {path}: no such file")
    if not os.access(path, os.R_OK):
        raise XformError(f"{flag} {path}: not readable (permission denied)")


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


def labelled_results(session, labelled, gen, batching, on_batch, scores: bool | str = False,
                     src_lang: str | None = None, truncate: bool = False, prefix_column: bool = False,
                     replace_unknowns: bool = False, vocab_map=None, tgt_lang: str | None = None):
    """(label, text, translations or None, error or None) for each (label, line), in input order.
    `tgt_lang` reaches the sources only where the model writes it there (MADLAD-400's <2xx>)."""
    labels: list[str] = []

    def lines():
        for label, line in labelled:
            labels.append(label)
            yield line

    warned = []

    def on_warning(index: int, message: str) -> None:
        warned.append(index)
        if len(warned) <= MAX_WARNINGS:
            err.print(f"[bold yellow]warning:[/] {escape(labels[index])}: {escape(message)}")

    results = session.translate_lines(lines(), gen, batching.batch_size, batch_type=batching.batch_type,
                                      max_batch_tokens=batching.max_batch_tokens, read_ahead=batching.read_ahead,
                                      max_rows=batching.max_rows,
                                      on_batch=on_batch, on_warning=on_warning, return_scores=scores,
                                      src_lang=src_lang, truncate=truncate, prefix_column=prefix_column,
                                      replace_unknowns=replace_unknowns, vocab_map=vocab_map, tgt_lang=tgt_lang)
    for i, (text, targets, error) in enumerate(results):
        yield labels[i], text, targets, error
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


def write_translations(results, n: int, report: dict, checked: CheckedLines,
                       scores: bool | str = False) -> tuple[int, int]:
    """Print `source<TAB>translation` lines (with scores, `<TAB>score` after), n per source (n empty
    ones for a failed line, its error on stderr), record them in the report, keep the translated
    texts --check compares in `checked`; return (failed lines, lines)."""
    report["translations"], errors, count = [], 0, 0
    for count, (label, text, targets, error) in enumerate(results, 1):
        if error is not None:
            errors += 1
            err.print(f"[bold red]error:[/] {escape(label)}: {escape(error)}")
            report["translations"].append({"source": text, "error": error})
            for _ in range(n):  # the output keeps one line per input line
                click.echo(f"{text}\t" + ("\t\t" if scores == "tokens" else "\t" if scores else ""))
            continue
        if text.strip():
            checked.add(text)
        for tgt in targets:
            if scores == "tokens":
                tgt, score, per_token = tgt
                report["translations"].append({"source": text, "target": tgt, "score": score,
                                               "token_scores": per_token})
                click.echo(f"{text}\t{tgt}\t{score:.4f}\t" + " ".join(f"{v:.4f}" for v in per_token))
            elif scores:
                tgt, score = tgt
                report["translations"].append({"source": text, "target": tgt, "score": score})
                click.echo(f"{text}\t{tgt}\t{score:.4f}")  # plain tab-separated lines, for scripts
            else:
                report["translations"].append({"source": text, "target": tgt})
                click.echo(f"{text}\t{tgt}")
    return errors, count


def count_lines(path: Path | None) -> int | None:
    """The lines of a regular file, as reading it yields them (a last line without a newline
    counts), counted in 1 MiB blocks before the run; None for standard input or a pipe, whose
    lines are unknown until read."""
    if path is None or str(path) == "-" or not path.is_file():
        return None
    lines, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


@contextlib.contextmanager
def progress_bar(show: bool, unit: str, done: str, total: Callable[[], int | None]):
    """An advance(items, tokens) drawing a progress bar on stderr (items done of `total()`, `?`
    when unknown, target tokens per second, time elapsed and left), and at the end one line kept
    on stderr, `<done> N <unit> in T s (X <unit>/s, Y tokens/s)`; or None: shown only when asked,
    stderr is a terminal and stdout is not (the bar would garble lines printed on the same
    terminal). `total` is called only when the bar is shown."""
    if not (show and err.is_terminal and not out.is_terminal):
        yield None
        return
    import rich.progress as rp

    columns = (rp.SpinnerColumn(), rp.BarColumn(), rp.MofNCompleteColumn(), rp.TextColumn(unit),
               rp.TextColumn("{task.fields[rate]:,.0f} tokens/s"), rp.TimeElapsedColumn(), rp.TextColumn("left"),
               rp.TimeRemainingColumn())
    start, counts = time.perf_counter(), [0, 0]
    with rp.Progress(*columns, console=err, transient=True, redirect_stdout=False, redirect_stderr=False) as progress:
        task = progress.add_task(done, total=total(), rate=0.0)

        def advance(items: int, tokens: int) -> None:
            counts[0] += items
            counts[1] += tokens
            progress.update(task, advance=items, rate=counts[1] / max(time.perf_counter() - start, 1e-9))

        yield advance
    seconds = max(time.perf_counter() - start, 1e-9)
    err.print(f"{done} {counts[0]:,} {unit} in {seconds:.2f} s ({counts[0] / seconds:,.1f} {unit}/s, "
              f"{counts[1] / seconds:,.0f} tokens/s)")


def checked_batching(batch_type, batch_size, max_batch_tokens, read_ahead, max_rows=None):
    """The Batching for these flags (--max-batch-tokens implies --batch-type tokens); bad
    combinations are usage errors."""
    from xform.errors import InputError
    from xform.runtime.batching import Batching

    if batch_type is None:
        batch_type = "examples" if max_batch_tokens is None else "tokens"
    try:
        return Batching(batch_type, batch_size, max_batch_tokens, read_ahead, max_rows)
    except InputError as e:
        raise click.UsageError(str(e)) from None


def print_check(report) -> None:
    from xform.runtime.compare import GROSS_TOKEN_AGREEMENT
    t = Table(title=f"check: {report.backend} ({report.precision}, {report.strategy}) vs eager PyTorch, "
                    "teacher-forced on its best hypothesis")
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_column("tolerance", justify="right")
    by_decodes = report.judged_by == "decodes"
    gross = report.gross_only  # random sources: a reduced precision is judged for gross breakage only
    t.add_row("sources", "random token ids" if report.sources == "random" else "given sentences",
              "gross breakage only" if gross else "")
    if by_decodes:  # a reduced precision is judged by its translations; logit errors are reported
        t.add_row("decodes alike (edits)", f"{report.decode_agreement:.2%} of {report.decodes_compared}",
                  "reported" if gross else f">= {report.min_decode_agreement:.0%}")
        t.add_row("decodes identical", f"{report.decodes_identical:.2%}", "reported")
        t.add_row("log-prob drop", f"{report.logprob_drop:.4f} nats/tok", f"<= {report.max_logprob_drop:g}")
        if report.bleu_vs_eager is not None:
            t.add_row("BLEU / chrF vs eager", f"{report.bleu_vs_eager:.1f} / {report.chrf_vs_eager:.1f}", "reported")
    t.add_row("max abs logit error", f"{report.max_abs_err:.3e}",
              "reported" if by_decodes else f"atol {report.atol:g}, rtol {report.rtol:g}")
    t.add_row("max rel logit error", f"{report.max_rel_err:.3e}", "")
    t.add_row("smallest passing atol", f"{report.min_passing_atol:.3e}",
              "reported" if by_decodes else f"at rtol {report.rtol:g}")
    t.add_row("token agreement", f"{report.token_agreement:.2%} of {report.tokens_compared}",
              f">= {GROSS_TOKEN_AGREEMENT if gross else report.min_token_agreement:.0%}")
    t.add_row("first divergence (row, step)", str(report.first_divergence) if report.first_divergence else "none", "")
    t.add_row("non-finite values", "yes" if report.nonfinite else "no", "none")
    if report.beam_hypotheses_identical is not None:
        t.add_row("beam hypotheses = eager's", f"{report.beam_hypotheses_identical:.2%} of {report.beam_hypotheses}",
                  "reported" if gross else f">= {report.min_token_agreement:.0%}")
        t.add_row("max abs beam score error", f"{report.beam_score_max_abs_err:.3e}",
                  "reported" if by_decodes else report.beam_score_tolerance)
    out.print(t)
    out.print("[bold green]check passed[/]" if report.passed else "[bold red]check FAILED[/]")


def print_bench(r) -> None:
    t = Table(title=f"benchmark: {r.backend} {r.precision}, {r.strategy}, batch {r.batch}, src_len {r.src_len}, "
                    f"{r.new_tokens} new tokens, median of {r.iters}")
    for col in ("tokens/s", "latency p50 ms", "p90 ms", "p99 ms", "peak RSS MiB"):
        t.add_column(col, justify="right")
    t.add_row(f"{r.tokens_per_s:,.1f}", f"{r.latency_ms_p50:.2f}", f"{r.latency_ms_p90:.2f}",
              f"{r.latency_ms_p99:.2f}", f"{r.peak_rss_mib:,.0f}")
    out.print(t)


def generation_options(fn):
    """The decoding flags; unset ones take the bundle's defaults (greedy unless it records others)."""
    options = [
        click.option("--num-beams", type=int, default=None,
                     help="Beam search width (default: the bundle's; a Marian import records its model's)."),
        click.option("--greedy", is_flag=True, help="Greedy decoding, whatever the bundle's default (--num-beams 1)."),
        click.option("--length-penalty", type=float, default=None,
                     help="Beam scores are divided by length ** this (transformers' meaning; default 1.0)."),
        click.option("--early-stopping", type=click.Choice(["true", "false", "never"]), default=None,
                     help="Beam search stop rule, as in transformers (default false)."),
        click.option("--num-return-sequences", type=int, default=None,
                     help="Hypotheses per source (at most --num-beams; or samples with --sample)."),
        click.option("--sample", "do_sample", is_flag=True, default=None, help="Sample instead of searching."),
        click.option("--temperature", type=float, default=None, help="--sample: divide logits by this (> 0)."),
        click.option("--top-k", type=int, default=None, help="--sample: keep the k most likely tokens (0: all)."),
        click.option("--top-p", type=float, default=None, help="--sample: keep the smallest set of mass >= p, (0, 1]."),
        click.option("--seed", type=int, default=None, help="--sample: the same seed gives the same tokens."),
        click.option("--forced-bos-id", "forced_bos_token_id", type=int, default=None,
                     help="The first generated token, whatever the model prefers (transformers' forced_bos_token_id: "
                          "a multilingual model's target-language token; default: the bundle's, if it records one)."),
        click.option("--repetition-penalty", type=float, default=None,
                     help="Scores of tokens already in the output are divided by this (multiplied when negative), "
                          "as transformers' repetition_penalty; > 0, 1.0 off."),
        click.option("--no-repeat-ngram-size", type=int, default=None,
                     help="No n-gram of this size occurs twice in an output (transformers' meaning; 0 off)."),
        click.option("--bad-words", "bad_words", multiple=True, metavar="PHRASE",
                     help="A word or phrase never generated, split by the target tokenizer; repeat for more."),
        click.option("--bad-word-ids", "bad_word_ids", multiple=True, metavar="IDS",
                     help="An id sequence never generated, comma-separated (3,17,5); repeat for more."),
        click.option("--suppress-tokens", default=None, metavar="IDS",
                     help="Ids never generated, comma-separated (transformers' suppress_tokens)."),
        click.option("--alternatives", "return_alternatives", is_flag=True, default=None,
                     help="The --num-return-sequences best tokens at the first position after the target prefix, "
                          "each continued greedily (interactive translation's choices)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def id_list(flag: str, value: str) -> list[int]:
    try:
        ids = [int(v) for v in value.replace(" ", "").split(",") if v]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated token ids (3,17,5), got {value!r}", param_hint=flag)
    if not ids:
        raise click.BadParameter("expected at least one token id", param_hint=flag)
    return ids


def generation_settings(greedy: bool, num_beams, early_stopping, bad_words=(), bad_word_ids=(),
                        **settings) -> dict:
    """The flags as generate()'s settings; --bad-words phrases stay text until a tokenizer splits them
    (`bad_words` in the result)."""
    if settings.get("suppress_tokens") is not None:
        settings["suppress_tokens"] = id_list("--suppress-tokens", settings["suppress_tokens"])
    if bad_word_ids:
        settings["bad_words_ids"] = [id_list("--bad-word-ids", v) for v in bad_word_ids]
    settings["bad_words"] = list(bad_words)
    if greedy and num_beams not in (None, 1):
        raise click.UsageError(f"--greedy and --num-beams {num_beams} contradict each other")
    settings["num_beams"] = 1 if greedy else num_beams
    if greedy and settings.get("do_sample"):
        raise click.UsageError("--greedy and --sample contradict each other")
    settings["early_stopping"] = {"true": True, "false": False, "never": "never", None: None}[early_stopping]
    return settings


def print_text_report(bundle: Path, manifest: Manifest) -> None:
    """How the bundle turns text into ids and back, with a sample split, and the tokenizer's notes
    (inferences on stdout, warnings on stderr)."""
    from xform.runtime.tokenizer import load_tokenizer

    if manifest.tokenizer is None:
        notes = [n for n in manifest.source.get("notes", []) if "tokenizer" in n]
        out.print("text: none (" + ("; ".join(escape(n) for n in notes) if notes else
                                    "this model came without vocabularies: export again with --src-vocab / "
                                    "--tgt-vocab to translate text") + "): decode token ids with Session.generate")
        return
    tok = load_tokenizer(bundle / manifest.tokenizer.file, manifest.config_dict)
    for line in tok.describe():
        out.print(escape(line))
    for note in manifest.tokenizer.notes:
        if note.startswith("warning: "):
            err.print(f"[bold yellow]warning:[/] {escape(note.removeprefix('warning: '))}")
        else:
            out.print(escape(note))


def decode_cap_of(manifest: Manifest) -> tuple[int, str]:
    from xform.runtime.decoding import decode_cap
    return decode_cap(manifest.generation, manifest.config.max_len)


def checked_generation(session, max_new_tokens, settings: dict):
    """The GenerationConfig for these flags over the bundle's defaults; bad combinations are usage errors."""
    from xform.errors import InputError
    try:
        gen = session.generation_config(max_new_tokens or session.default_max_new_tokens(), **settings)
    except InputError as e:
        raise click.UsageError(str(e)) from None
    ignored = [flag for key, flag in SAMPLING_FLAGS.items() if settings.get(key) is not None]
    if ignored and not gen.do_sample:  # they would change nothing: a user who typed them expects a sample
        raise click.UsageError(f"{', '.join(ignored)} {'applies' if len(ignored) == 1 else 'apply'} only when "
                               f"sampling, and this decode "
                               f"{'searches with beams' if gen.num_beams > 1 else 'is greedy'}: add --sample")
    return gen


def split_bad_words(session, settings: dict) -> None:
    """--bad-words phrases (settings' `bad_words`, text) as target ids in `bad_words_ids`."""
    bad_words = settings.pop("bad_words")
    if bad_words:
        if session.tokenizer is None:
            raise click.UsageError("--bad-words: this bundle has no tokenizer to split them; give --bad-word-ids")
        settings["bad_words_ids"] = (settings.get("bad_words_ids") or []) + [session.target_ids(w) for w in bad_words]
        if any(not w for w in settings["bad_words_ids"]):
            raise click.UsageError(f"--bad-words: a phrase gives no target tokens ({bad_words})")


SAMPLING_FLAGS = {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p", "seed": "--seed"}


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--backend", type=click.Choice(["torch", "ort", "trt"]), default="ort", show_default=True)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="Default: cpu for torch and ort, cuda for trt.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="Intra-op threads (default: all cores).")
@click.option("--text", "texts", multiple=True, help="Text to translate; repeat for a batch.")
@click.option("--input-file", type=click.Path(path_type=Path),
              help="Translate each line (read a --read-ahead window at a time, written in input order; a blank "
                   "line gives a blank translation). '-' reads standard input; a named pipe or <(command) "
                   "is read as a file.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Lines of --text / --input-file decoded together (default 32); with --batch-type tokens, "
                   "a limit on lines only when given (a TensorRT engine's --max-batch, say).")
@click.option("--batch-type", type=click.Choice(["examples", "tokens"]), default=None,
              help="Batches of --batch-size lines (examples, the default) or of --max-batch-tokens source tokens "
                   "(tokens, implied by --max-batch-tokens).")
@click.option("--max-batch-tokens", type=click.IntRange(min=1), default=None,
              help="Padded source tokens per batch: lines x the batch's longest source (a longer line runs alone).")
@click.option("--max-batch-rows", "max_rows", type=click.IntRange(min=1), default=None,
              help="Decoder rows per batch, lines x beams (or samples), whatever the batch type (default 256): "
                   "bounds a batch's logits and K/V cache, so memory does not grow with a window of short lines.")
@click.option("--read-ahead", type=click.IntRange(min=1), default=8, show_default=True,
              help="Batches' worth of lines read, sorted by length and decoded before their results are written.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=None,
              help="Stop after this many generated tokens (default: the bundle's cap, which export prints: 256 "
                   "unless the model or export --max-new-tokens sets one; never beyond max_len).")
@click.option("--check", is_flag=True,
              help="Compare with eager PyTorch step by step; exit 1 beyond tolerance. With --text / --input-file it "
                   "compares the first --check-lines translated lines (and says how many), else random sources.")
@click.option("--check-lines", type=click.IntRange(min=1), default=32, show_default=True,
              help="--check: translated lines compared (eager PyTorch decodes them as one batch: memory grows "
                   "with N).")
@click.option("--atol", type=float, default=None, help="Absolute logit tolerance (default: the precision's).")
@click.option("--rtol", type=float, default=None, help="Relative logit tolerance (default: the precision's).")
@click.option("--src-lang", default=None,
              help="A multilingual model's source language code (NLLB: fra_Latn, mBART-50: fr_XX, M2M100: fr; "
                   "default: its tokenizer's).")
@click.option("--tgt-lang", default=None,
              help="A multilingual model's target language code: its token is forced first (--forced-bos-id).")
@click.option("--truncate", is_flag=True,
              help="Cut a line of more source tokens than the model's max_len to it (first max_len - 1 tokens and "
                   "end-of-sentence), with a warning naming the line; without it such a line fails alone.")
@click.option("--scores", is_flag=True,
              help="Print each translation's score after it (a third tab-separated column, and in --json): beam "
                   "search's length-penalized sum of log-probabilities, else the sum of log-probabilities.")
@click.option("--token-scores", is_flag=True,
              help="--scores, and each generated token's log-probability after it (a fourth column, "
                   "space-separated; in --json as token_scores).")
@click.option("--target-prefix", "target_prefixes", multiple=True, metavar="TEXT",
              help="The start of the translation of the --text of the same rank: decoding continues after it "
                   "(repeat once per --text; '' for none).")
@click.option("--prefix-column", is_flag=True,
              help="Each --input-file line is source<TAB>target prefix (an empty prefix is none).")
@click.option("--vocab-map", type=click.Path(path_type=Path), default=None,
              help="CTranslate2's vocabulary map (source n-gram TAB target tokens; an empty n-gram: always allowed): "
                   "each batch decodes over the target tokens its sources allow (a bundle exported "
                   "--with-vocab-map; ort backend).")
@click.option("--replace-unknowns", is_flag=True,
              help="Write an unknown target token (<unk>) as the source word (all its pieces, as written) of the "
                   "piece it attends to most (a bundle exported --with-attention).")
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
@generation_options
@handle_errors
def run(bundle, backend, device, threads, texts, input_file, batch_size, batch_type, max_batch_tokens, max_rows,
        read_ahead,
        max_new_tokens, check, check_lines, atol, rtol, src_lang, tgt_lang, truncate, scores, token_scores,
        target_prefixes, prefix_column, vocab_map, replace_unknowns, benchmark, batch, src_len, new_tokens, warmup,
        iters, json_path, force,
        greedy, num_beams, early_stopping, **settings) -> None:
    """Translate with BUNDLE, check it against eager PyTorch, and/or benchmark it.

    Decoding is the bundle's default (greedy, or what a Marian model ships) unless the decoding
    flags say otherwise."""
    import xform
    import xform.api
    from xform.errors import InputError

    if input_file is not None and str(input_file) != "-":
        check_readable("--input-file", input_file)
    scores = "tokens" if token_scores else scores
    if scores and not (texts or input_file):
        raise click.UsageError(f"{'--token-scores' if token_scores else '--scores'} goes with --text / --input-file "
                               "(the translations it scores)")
    if target_prefixes and len(target_prefixes) != len(texts):
        raise click.UsageError(f"--target-prefix is given {len(target_prefixes)} times for {len(texts)} --text: give "
                               "one per --text ('' for none)")
    if prefix_column and input_file is None:
        raise click.UsageError("--prefix-column reads --input-file lines as source<TAB>prefix: give --input-file")
    if replace_unknowns and not (texts or input_file):
        raise click.UsageError("--replace-unknowns goes with --text / --input-file")
    if not (texts or input_file or check or benchmark):
        raise click.UsageError("nothing to do: give --text / --input-file, --check, or --benchmark")
    json_inputs = [("BUNDLE", bundle), *([("--vocab-map", vocab_map)] if vocab_map else []),
                   *([("--input-file", input_file)] if input_file and str(input_file) != "-" else [])]
    if json_path is not None:
        check_json_target(json_path, force, json_inputs)
    settings = generation_settings(greedy, num_beams, early_stopping, **settings)
    batching = checked_batching(batch_type, batch_size, max_batch_tokens, read_ahead, max_rows)
    session = xform.load(bundle, backend=backend, device=device, threads=threads)
    if tgt_lang is not None and settings.get("forced_bos_token_id") is not None:
        raise click.UsageError("--tgt-lang and --forced-bos-id both name the first token: give one")
    if (src_lang or tgt_lang) and session.tokenizer is None:
        raise click.UsageError(f"{'--src-lang' if src_lang else '--tgt-lang'}: this bundle has no tokenizer, so no "
                               "languages (give --forced-bos-id for the target language's token id)")
    if texts or input_file or src_lang or tgt_lang:
        try:
            if settings.get("forced_bos_token_id") is None and session.tokenizer is not None:
                settings["forced_bos_token_id"] = session.target_language(tgt_lang)
            if src_lang is not None:
                session.check_src_lang(src_lang)
        except InputError as e:
            raise click.UsageError(str(e)) from None
    if replace_unknowns:
        try:
            session.check_replace_unknowns()
        except InputError as e:
            raise click.UsageError(f"{bundle}: {e}") from None
    if vocab_map is not None:
        if not (texts or input_file):
            raise click.UsageError("--vocab-map goes with --text / --input-file")
        if not vocab_map.is_file():
            raise XformError(f"--vocab-map {vocab_map}: no such file")
        if not getattr(session.backend, "has_restriction", False):
            raise click.UsageError(f"--vocab-map: {bundle} has no restricted decoder on the {backend} backend: export "
                                   "it with --with-vocab-map and run it with --backend ort")
        vocab_map = session.vocab_map(vocab_map)  # a malformed map or an unknown token: exit 1, naming the line
    split_bad_words(session, settings)
    gen = checked_generation(session, max_new_tokens, settings)
    report: dict = {"bundle": str(bundle), "backend": backend, "device": device or xform.api.default_device(backend),
                    "generation": gen.to_dict()}
    failed = False
    checked = CheckedLines(check_lines)  # --check compares the first --check-lines translated lines
    if texts or input_file:
        with progress_bar(input_file is not None, "lines", "translated",
                          lambda: None if (n := count_lines(input_file)) is None else n + len(texts)) as on_batch:
            lines = input_lines(texts, input_file, target_prefixes)
            results = labelled_results(session, lines, gen, batching, on_batch, scores, src_lang, truncate,
                                       prefix_column, replace_unknowns, vocab_map, tgt_lang)
            errors, n = write_translations(results, gen.num_return_sequences, report, checked, scores)
        if errors:
            err.print(f"[bold red]error:[/] {errors} of {n} lines could not be translated "
                      "(their output lines are empty)")
            failed = True
    if check:
        with err.status("checking against eager PyTorch"):
            check_gen = gen.updated(max_new_tokens=min(gen.max_new_tokens, max_new_tokens or 32),
                                    min_new_tokens=min(gen.min_new_tokens, max_new_tokens or 32))
            rep = xform.check(bundle, session=session, texts=checked.texts or None, atol=atol, rtol=rtol,
                              generation=check_gen, src_lang=src_lang)
        if checked.texts:
            out.print(f"check on {len(checked.texts)} of the {checked.translated} translated lines (the first; "
                      "--check-lines N for more)" if len(checked.texts) < checked.translated else
                      f"check on all {checked.translated} translated lines")
        print_check(rep)
        report["check"] = {**rep.to_dict(), "lines_compared": len(checked.texts),
                           "lines_translated": checked.translated}
        failed = failed or not rep.passed
    if benchmark:
        from rich.progress import Progress

        from xform.runtime.bench import benchmark as run_benchmark

        with Progress(console=err, transient=True) as progress:
            task = progress.add_task(f"benchmark {backend}", total=warmup + iters)
            res = run_benchmark(session, batch, src_len, new_tokens, warmup, iters,
                                on_iter=lambda i: progress.advance(task),
                                generation=gen.updated(max_new_tokens=new_tokens, min_new_tokens=new_tokens))
        print_bench(res)
        report["benchmark"] = res.to_dict()
    if json_path is not None:
        write_json(json_path, report, force, json_inputs)
    if failed:
        sys.exit(1)


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--source", "source_file", required=True, type=click.Path(path_type=Path),
              help="Source sentences, one a line.")
@click.option("--target", "target_file", required=True, type=click.Path(path_type=Path),
              help="Their translations, one a line, in the same order.")
@click.option("--backend", type=click.Choice(["torch", "ort", "trt"]), default="ort", show_default=True)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None)
@click.option("--threads", type=click.IntRange(min=1), default=None)
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--src-lang", default=None, help="A multilingual model's source language code (NLLB's fra_Latn).")
@click.option("--tgt-lang", default=None, help="A multilingual model's target language code: the targets' first token.")
@click.option("--tokens", "per_token", is_flag=True,
              help="Append each target token's log-probability (space-separated, end-of-sentence last).")
@handle_errors
def score(bundle, source_file, target_file, backend, device, threads, batch_size, src_lang, tgt_lang,
          per_token) -> None:
    """Score given translations: for each pair, the log-likelihood of the target under BUNDLE,
    teacher-forced. Prints `total<TAB>per-token<TAB>tokens<TAB>source<TAB>target` a line (what users
    filter parallel data and rerank by); with --tokens, a sixth column of each token's log-prob."""
    import xform
    from xform.errors import InputError

    for flag, path in (("--source", source_file), ("--target", target_file)):
        check_readable(flag, path)
    sources = source_file.read_text(encoding="utf-8").splitlines()
    targets = target_file.read_text(encoding="utf-8").splitlines()
    if len(sources) != len(targets):
        raise XformError(f"--source {source_file} has {len(sources)} lines, --target {target_file} {len(targets)}: "
                         "expected one translation a source")
    session = xform.load(bundle, backend=backend, device=device, threads=threads)
    if session.tokenizer is None:
        raise XformError(f"{bundle}: this bundle has no tokenizer to read text; score token ids with Session.score")
    try:
        session.encode_target("", tgt_lang)  # an unknown or missing language is refused before any work
        if src_lang is not None:
            session.check_src_lang(src_lang)
    except InputError as e:
        raise click.UsageError(str(e)) from None
    with progress_bar(True, "pairs", "scored", lambda: len(sources)) as advance:
        for start in range(0, len(sources), batch_size):
            src, tgt = sources[start:start + batch_size], targets[start:start + batch_size]
            src_ids = session.encode_texts(src, src_lang, tgt_lang)
            tgt_ids, _ = session.pad([session.encode_target(t, tgt_lang) for t in tgt])
            result = session.score(src_ids, tgt_ids)
            for i, (s_text, t_text) in enumerate(zip(src, tgt)):
                line = (f"{result['total'][i]:.4f}\t{result['normalized'][i]:.4f}\t{int(result['lengths'][i])}\t"
                        f"{s_text}\t{t_text}")
                if per_token:
                    line += "\t" + " ".join(f"{v:.4f}" for v in result["tokens"][i][:int(result["lengths"][i])])
                click.echo(line)
            if advance is not None:
                advance(len(src), int(result["lengths"].sum()))


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
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None,
              help="Write the figures as JSON (bleu, chrf, signature, lines, speed, each system, every sentence's "
                   "chrF difference).")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), default=None,
              help="With --against: a PNG histogram of the sentence chrF differences (needs matplotlib).")
@click.option("--force", is_flag=True, help="Replace an existing --json report or --plot image xform wrote.")
@generation_options
@handle_errors
def evaluate(bundle, source_file, reference_file, against, backend, threads, batch_size, max_new_tokens, src_lang,
             tgt_lang, json_path, plot_path, force, greedy, num_beams, early_stopping, **settings) -> None:
    """Translate --source with BUNDLE and score it with sacreBLEU (BLEU, chrF) against --reference,
    and/or side by side with a second system (--against eager or another bundle)."""
    import importlib.util

    import xform
    from xform.errors import InputError
    from xform.exporter import evaluate as ev

    ev.sacrebleu_module()  # missing: say so before any decoding
    if reference_file is None and against is None:
        raise click.UsageError("nothing to compare with: give --reference, --against, or both")
    if plot_path is not None and against is None:
        raise click.UsageError("--plot draws the differences between two systems: give --against")
    if plot_path is not None and importlib.util.find_spec("matplotlib") is None:
        raise XformError("--plot needs matplotlib: pip install matplotlib")
    inputs = [("BUNDLE", bundle), ("--source", source_file), *([("--reference", reference_file)] if reference_file
                                                               else [])]
    if json_path is not None:
        check_json_target(json_path, force, inputs)
    if plot_path is not None:
        check_plot_target(plot_path, force, inputs)
    sources = ev.read_lines("--source", source_file)
    references = ev.read_lines("--reference", reference_file) if reference_file is not None else None
    if references is not None and len(references) != len(sources):
        raise XformError(f"--reference {reference_file}: {len(references)} lines for the {len(sources)} of "
                         f"--source {source_file}; expected one translation a source line")
    session = xform.load(bundle, backend=backend, threads=threads)
    other = other_session(bundle, against, threads) if against is not None else None
    settings = generation_settings(greedy, num_beams, early_stopping, **settings)
    split_bad_words(session, settings)
    if session.tokenizer is not None and settings.get("forced_bos_token_id") is None:
        try:
            settings["forced_bos_token_id"] = session.target_language(tgt_lang)
        except InputError as e:
            raise click.UsageError(str(e)) from None
    gen = checked_generation(session, max_new_tokens, settings)
    systems = []
    for name, s in [(str(bundle), session), *([(against, other)] if other is not None else [])]:
        with progress_bar(True, "lines", f"{name}: translated", lambda: len(sources)) as advance:
            systems.append(ev.translate_file(name, s, sources, gen, src_lang, batch_size, advance))
    report = ev.evaluate(systems, references, str(source_file), str(reference_file) if reference_file else None)
    print_eval(report)
    if plot_path is not None:
        write_plot(report, plot_path, force, inputs)
    if json_path is not None:
        write_json(json_path, {"bundle": str(bundle), "backend": backend, "generation": gen.to_dict(),
                               **report.to_dict()}, force, inputs)


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
    import os
    import tempfile

    from xform.exporter.evaluate import plot
    check_plot_target(path, force, inputs)
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", suffix=".png")
    os.close(fd)
    try:
        plot(report, Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    if report.identical is not None:
        a, b = report.systems[0].name, report.systems[1].name
        out.print(f"identical translations: {report.identical:.2%} of {len(report.systems[0].translations)} lines")
        for w in report.worst:
            out.print(f"line {w['line']}: chrF {w['chrf_delta']:+.1f}\n  {escape(a)}: {escape(w[a])}\n  "
                      f"{escape(b)}: {escape(w[b])}" + (f"\n  reference: {escape(w['reference'])}"
                                                         if "reference" in w else ""))


def triton_model_options(fn):
    """The flags of a Triton model (xform triton, xform serve), as ModelOptions."""
    options = [
        click.option("--name", default=None, help="Model name (default: the bundle directory's name)."),
        click.option("--backend", type=click.Choice(["ort", "trt"]), default="ort", show_default=True,
                     help="trt needs engines (xform build-engine) and a GPU."),
        click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
                     help="Default: cpu for ort, cuda for trt."),
        click.option("--threads", type=click.IntRange(min=1), default=None,
                     help="Intra-op threads per instance (ort; default: all cores)."),
        click.option("--max-batch", type=click.IntRange(min=1), default=8, show_default=True,
                     help="Triton's max_batch_size: sources decoded together."),
        click.option("--max-queue-delay-us", type=click.IntRange(min=0), default=1000, show_default=True,
                     help="How long Triton's dynamic batcher waits to fill a batch."),
        click.option("--scheduling", type=click.Choice(["inflight", "dynamic"]), default=None,
                     help="inflight (the default on ort): requests join one running batch step by step, leave "
                          "when they end, and may stream (models NAME and NAME-stream); dynamic (the default with "
                          "--backend trt or --vocab-map): Triton's dynamic batcher forms batches decoded to their "
                          "longest request."),
        click.option("--max-rows", type=click.IntRange(min=1), default=64, show_default=True,
                     help="The most decoder rows (sources x beams) one request may ask for; inflight, also the "
                          "most the running batch holds: it bounds the cache and the logits."),
        click.option("--max-queue", type=click.IntRange(min=1), default=256, show_default=True,
                     help="inflight: requests that may wait for rows; more are refused as overloaded."),
        click.option("--dynamic-batching/--no-dynamic-batching", default=True, show_default=True),
        click.option("--instances", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Model instances (processes) decoding in parallel."),
        click.option("--vocab-map", type=click.Path(path_type=Path), default=None,
                     help="CTranslate2's vocabulary map: every text request decodes over the target tokens its "
                          "sources allow (a bundle exported --with-vocab-map; ort)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def model_options(**kw):
    from xform.serving.repository import ModelOptions
    return ModelOptions(**kw)


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("-o", "--output", "repo", required=True, type=click.Path(path_type=Path),
              help="Triton model repository (created if missing; other models in it are kept).")
@triton_model_options
@click.option("--reference", is_flag=True, help="Name the bundle's absolute path instead of copying it.")
@click.option("--force", is_flag=True,
              help="Replace an existing model of that name (only a Triton model xform wrote, or an empty directory).")
@handle_errors
def triton(bundle: Path, repo: Path, reference: bool, force: bool, **options) -> None:
    """Write BUNDLE as a Triton Inference Server model (Python backend) into a model repository."""
    from xform.serving.repository import model_names, write_model

    opts = model_options(**options)
    path = write_model(bundle, repo, opts, reference=reference, force=force)
    for name in model_names(path.name, opts):
        out.print(f"wrote {path.parent / name} (config.pbtxt, 1/model.py{'' if reference else ', 1/bundle'})")
    out.print(f"serve it here: xform serve {bundle} (with the same model flags; it starts the tritonserver of the "
              "nvidia-pytriton wheel, see README \"Serving\")")
    out.print(f"or in NVIDIA's container, with xform installed in its Python: docker run --gpus all -p 8000:8000 "
              f"-v {repo.resolve()}:/models nvcr.io/nvidia/tritonserver:<yy.mm>-py3 tritonserver "
              "--model-repository /models")


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path), required=False)
@click.option("--prepare", is_flag=True,
              help="Only prepare what serving needs (the nvidia-pytriton stub's numpy<2 environment, once, in "
                   "~/.cache/xform) and exit: run it when building an image, so the first serve needs no network.")
@click.option("--wheel-dir", type=click.Path(path_type=Path), default=None,
              help="Take the stub environment's numpy<2 from this directory of wheels, not the package index.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the endpoints listen on.")
@click.option("--http-port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--grpc-port", type=click.IntRange(1, 65535), default=8001, show_default=True)
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=8002, show_default=True)
@click.option("--grace", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds a stop lets requests in flight finish (new ones are refused) before tritonserver and "
                   "its stubs are killed; set it below your supervisor's own (Kubernetes' "
                   "terminationGracePeriodSeconds, systemd's TimeoutStopSec).")
@triton_model_options
@handle_errors
def serve(bundle: Path | None, prepare: bool, wheel_dir: Path | None, host: str, http_port: int, grpc_port: int,
          metrics_port: int, grace: float, **options) -> None:
    """Serve BUNDLE on Triton Inference Server until stopped (with --prepare: prepare, then exit).

    tritonserver comes from PATH (NVIDIA's containers) or the nvidia-pytriton wheel. Exit codes: 0
    stopped by a signal (SIGINT, SIGTERM, SIGHUP); 1 tritonserver did not start, died, or a model's
    stub died (the message says which and where Triton's log is kept); 2 bad flags.
    """
    from xform.serving.lifecycle import Stopper
    from xform.serving.server import find_triton

    if wheel_dir is not None and not wheel_dir.is_dir():
        raise XformError(f"--wheel-dir {wheel_dir}: no such directory")
    if prepare:
        if bundle is not None:
            raise click.UsageError("--prepare prepares the server, not a bundle: give no BUNDLE")
        install = find_triton(prepare=lambda msg: err.print(msg), wheel_dir=wheel_dir)
        where = f" (stub environment {install.backend_dir.parent})" if install.backend_dir is not None else ""
        out.print(f"ready to serve: {install.source} tritonserver {install.binary}{where}")
        return
    if bundle is None:
        raise click.UsageError("missing BUNDLE (or --prepare)")
    with Stopper() as stopper:  # from the first moment: a stop while starting stops what was started
        serve_bundle(bundle, wheel_dir, host, (http_port, grpc_port, metrics_port), grace, options, stopper)


def serve_bundle(bundle: Path, wheel_dir: Path | None, host: str, ports: tuple[int, int, int], grace: float,
                 options: dict, stopper) -> None:
    """`xform serve`'s run: write the models, start tritonserver, watch it until a stop or a death,
    stop it (always), and say how it ended."""
    import tempfile

    from xform.serving.lifecycle import STOPPED, first_error, keep_log, watch
    from xform.serving.repository import model_names, write_model
    from xform.serving.server import ServerError, StopRequested, TritonServer, find_triton

    with tempfile.TemporaryDirectory(prefix="xform-serve-") as tmp:
        opts = model_options(**options)
        model = write_model(bundle, Path(tmp) / "models", opts, reference=True)
        names = model_names(model.name, opts)
        server = stopper.server = TritonServer(Path(tmp) / "models", names, host, *ports,
                                               log_path=Path(tmp) / "tritonserver.log", bls_threads=opts.bls_threads,
                                               grace=grace)
        outcome, what = STOPPED, ""
        try:
            with err.status(f"starting tritonserver for {model.name}"):
                server.install = find_triton(prepare=lambda msg: err.print(msg), wheel_dir=wheel_dir)
                if not stopper.requested:
                    server.start(should_stop=lambda: stopper.requested)
            if not stopper.requested:
                print_endpoints(server, model.name, names)
                outcome, what = watch(server, stopper)
        except StopRequested:
            pass
        except ServerError as e:
            outcome, what = "failed", str(e).split("; its log", 1)[0].split("\n", 1)[0]
        finally:
            code = server.stop()
        if outcome != STOPPED:
            kept = keep_log(server)
            cause = first_error(server)
            raise XformError(f"{what}{': ' + cause if cause and cause not in what else ''}"
                             f"{f'; Triton log kept at {kept}' if kept else ''}")
    out.print(f"{what or 'stopped before tritonserver was ready on ' + stopper.name}; stopped tritonserver "
              f"(exit code {code})")


def print_endpoints(server, name: str, names: list[str]) -> None:
    process = server.process
    out.print(f"serving model [bold]{name}[/] ({server.install.source} tritonserver, pid {process.pid}); Ctrl-C "
              "stops it")
    out.print(f"  HTTP    {server.http_url}/v2/models/{name}/infer")
    out.print(f"  gRPC    {server.host}:{server.grpc_port}")
    if len(names) > 1:
        out.print(f"  stream  {server.http_url}/v2/models/{names[1]}/generate_stream (and gRPC streaming "
                  f"to {names[1]})")
    out.print(f"  metrics http://{server.host}:{server.metrics_port}/metrics")
