"""The flags and helpers the commands share: the decoding flags (from the controls' table,
runtime/decoding/controls.py), batching, progress, reports written as JSON."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from pathlib import Path
from typing import Callable

import click

from xform.cli import err, out
from xform.cli.flags import help_text, said
from xform.cli.flags import option as option_of
from xform.cli.groups import option_group
from xform.errors import XformError

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


def check_readable(flag: str, path: Path, text: bool = True) -> None:
    """Refuse a path that is no file of lines to read: missing, a directory, unreadable, or (`text`)
    plainly not UTF-8 (UTF-16, with the command that converts it). A named pipe or a process
    substitution's /dev/fd/N is read as a file is."""
    import os

    from xform.files import not_utf8_text

    if path.is_dir():
        raise XformError(f"{flag} {path}: is a directory; expected a file of lines (or - for standard input)")
    if not path.exists():
        raise XformError(f"{flag} {path}: no such file")
    if not os.access(path, os.R_OK):
        raise XformError(f"{flag} {path}: not readable (permission denied)")
    why = not_utf8_text(path, flag) if text else None
    if why is not None:
        raise XformError(why)


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


class Advance:
    """A progress bar's advance(items, tokens); `grow(n)` adds n items to its total (work counted
    as it is known: a document's sentences to decode, a language at a time)."""

    def __init__(self, progress, task) -> None:
        self.progress, self.task = progress, task
        self.start, self.counts = time.perf_counter(), [0, 0]

    def __call__(self, items: int, tokens: int) -> None:
        self.counts[0] += items
        self.counts[1] += tokens
        self.progress.update(self.task, advance=items,
                             rate=self.counts[1] / max(time.perf_counter() - self.start, 1e-9))

    def grow(self, n: int) -> None:
        total = self.progress.tasks[self.task].total
        self.progress.update(self.task, total=(total or 0) + n)


@contextlib.contextmanager
def progress_bar(show: bool, unit: str, done: str, total: Callable[[], int | None]):
    """An Advance drawing a progress bar on stderr (items done of `total()` and of what
    `Advance.grow` adds, `?` while unknown, target tokens per second, time elapsed and left), and
    at the end one line kept on stderr, `<done> N <unit> in T s (X <unit>/s, Y tokens/s)`; or None:
    shown only when asked, stderr is a terminal and stdout is not (the bar would garble lines
    printed on the same terminal). `total` is called only when the bar is shown."""
    if not (show and err.is_terminal and not out.is_terminal):
        yield None
        return
    import rich.progress as rp

    columns = (rp.SpinnerColumn(), rp.BarColumn(), rp.MofNCompleteColumn(), rp.TextColumn(unit),
               rp.TextColumn("{task.fields[rate]:,.0f} tokens/s"), rp.TimeElapsedColumn(), rp.TextColumn("left"),
               rp.TimeRemainingColumn())
    with rp.Progress(*columns, console=err, transient=True, redirect_stdout=False, redirect_stderr=False) as progress:
        advance = Advance(progress, progress.add_task(done, total=total(), rate=0.0))
        yield advance
    seconds, counts = max(time.perf_counter() - advance.start, 1e-9), advance.counts
    err.print(f"{done} {counts[0]:,} {unit} in {seconds:.2f} s ({counts[0] / seconds:,.1f} {unit}/s, "
              f"{counts[1] / seconds:,.0f} tokens/s)")


def warn_unjudged(session) -> None:
    """A bundle exported --no-judgement (a speed benchmark's) says so on stderr: its quality is unknown."""
    judged_on = session.bundle.manifest.tolerance.get("judged_on", "") if session.bundle is not None else ""
    if judged_on.startswith("not judged"):
        err.print(f"[bold yellow]warning:[/] {session.bundle.path}: {session.bundle.precision_label} export "
                  f"{judged_on}; export it with --sample-file to judge its translations")


@dataclasses.dataclass(frozen=True)
class BatchingFlags:
    """The batching flags (batching_options), as given: `checked()` is their Batching."""
    batch_size: int | None = None
    batch_type: str | None = None
    max_batch_tokens: int | None = None
    max_rows: int | None = None
    read_ahead: int = 8

    def checked(self):
        """The Batching for these flags (--max-batch-tokens implies --batch-type tokens); bad
        combinations are usage errors."""
        from xform.errors import InputError
        from xform.runtime.scheduling.batching import Batching

        batch_type = self.batch_type
        if batch_type is None:
            batch_type = "examples" if self.max_batch_tokens is None else "tokens"
        try:
            return Batching(batch_type, self.batch_size, self.max_batch_tokens, self.read_ahead, self.max_rows)
        except InputError as e:
            raise click.UsageError(said(e)) from None


def with_options(fn, options):
    """`fn` with click `options` applied, the first listed first in --help."""
    for option in reversed(options):
        fn = option(fn)
    return fn


def batching_options(fn):
    """How a file's lines are batched (run --input-file, corpus): --batch-size, --batch-type,
    --max-batch-tokens, --max-batch-rows, --read-ahead, as BatchingFlags `batching` (its
    `checked()`: the Batching, the flags checked together)."""
    return option_group("batching", BatchingFlags, [
        click.option("--batch-size", type=click.IntRange(min=1), default=None,
                     help="Lines decoded together (default 32); with --batch-type tokens, a limit on lines only "
                          "when given (a TensorRT engine's --max-batch, say)."),
        click.option("--batch-type", type=click.Choice(["examples", "tokens"]), default=None,
                     help="Batches of --batch-size lines (examples, the default) or of --max-batch-tokens source "
                          "tokens (tokens, implied by --max-batch-tokens)."),
        click.option("--max-batch-tokens", type=click.IntRange(min=1), default=None,
                     help="Padded source tokens per batch: lines x the batch's longest source (a longer line runs "
                          "alone)."),
        click.option("--max-batch-rows", "max_rows", type=click.IntRange(min=1), default=None,
                     help="Decoder rows per batch, lines x beams (or samples), whatever the batch type (default "
                          "256): bounds a batch's logits and K/V cache, so memory does not grow with a window of "
                          "short lines."),
        click.option("--read-ahead", type=click.IntRange(min=1), default=8, show_default=True,
                     help="Batches' worth of lines read, sorted by length and decoded before their results are "
                          "written."),
    ])(fn)


def text_options(fn):
    """The flags of translating text besides the decoding controls (run, corpus): the decode cap
    (--max-new-tokens, which generation_options takes into GenerationFlags), then languages,
    truncation, scores, target prefixes in a column, a vocabulary map, unknowns replaced, as the
    TextOptions `text` (its vocab_map the flag's path); checked against the loaded bundle by
    decoding_for."""
    return with_options(fn, [
        click.option("--max-new-tokens", type=click.IntRange(min=1), default=None,
                     help="Stop after this many generated tokens (default: the bundle's cap, which export prints: "
                          "256 unless the model or export --max-new-tokens sets one; never beyond max_len)."),
        option_group("text", text_flags, text_flag_options()),
    ])


def text_flag_options() -> list:
    """text_options' flags after --max-new-tokens, which make the TextOptions."""
    return [
        click.option("--src-lang", default=None,
                     help="A multilingual model's source language code (NLLB: fra_Latn, mBART-50: fr_XX, M2M100: "
                          "fr; default: its tokenizer's)."),
        click.option("--tgt-lang", default=None,
                     help="A multilingual model's target language code: its token is forced first "
                          "(--forced-bos-id)."),
        click.option("--truncate", is_flag=True,
                     help="Cut a line of more source tokens than the model's max_len to it (first max_len - 1 "
                          "tokens and end-of-sentence), with a warning naming the line; without it such a line "
                          "fails alone."),
        click.option("--scores", is_flag=True,
                     help="Each translation's score after it, tab-separated (run: a third column; corpus: a column "
                          "of the text output, `score` in JSON lines and Parquet) and in --json: beam search's "
                          "length-penalized sum of log-probabilities, else the sum of log-probabilities."),
        click.option("--token-scores", is_flag=True,
                     help="--scores, and each generated token's log-probability after it (space-separated; "
                          "token_scores in JSON)."),
        click.option("--prefix-column", is_flag=True,
                     help="Each line read (run: --input-file's; corpus: each input's text) is source<TAB>target "
                          "prefix: decoding continues after the prefix (an empty prefix is none)."),
        click.option("--vocab-map", type=click.Path(path_type=Path), default=None,
                     help="CTranslate2's vocabulary map (source n-gram TAB target tokens; an empty n-gram: always "
                          "allowed): each batch decodes over the target tokens its sources allow (a bundle exported "
                          "--with-vocab-map; ort backend)."),
        click.option("--replace-unknowns", is_flag=True,
                     help="Write an unknown target token (<unk>) as the source word (all its pieces, as written) of "
                          "the piece it attends to most (a bundle exported --with-attention)."),
    ]


def text_flags(src_lang, tgt_lang, truncate, scores, token_scores, prefix_column, vocab_map, replace_unknowns):
    """The TextOptions of text_options' flags (--token-scores: scores "tokens")."""
    from xform.runtime.decoding.request import TextOptions

    return TextOptions("tokens" if token_scores else scores, src_lang, tgt_lang, truncate, prefix_column,
                       replace_unknowns, vocab_map)


def decoding_for(translator, bundle, backend: str, settings: dict, has_text: bool, max_new_tokens, text):
    """The decoding the flags ask for, checked against the loaded bundle, as run and corpus take
    it: (the generation config, the vocabulary map read or None). `text`: the TextOptions of the
    text flags (its vocab_map the flag's path). The languages, bad words and limits are usage
    errors naming the flag; a malformed vocabulary map is an error naming its line."""
    vocab_map = text_settings(translator, bundle, backend, settings, has_text, text)
    split_bad_words(translator, settings)
    return checked_generation(translator.session, max_new_tokens, settings), vocab_map


def text_settings(translator, bundle, backend: str, settings: dict, has_text: bool, text):
    """The languages (the target's forced first token into `settings`), replace-unknowns and the
    vocabulary map of the TextOptions `text` checked against the loaded bundle; the map, read."""
    src_lang, tgt_lang, vocab_map = text.src_lang, text.tgt_lang, text.vocab_map
    session, policy = translator.session, translator.policy
    from xform.errors import InputError

    # the first token's rule first (--tgt-lang with --forced-bos-id is refused, tokenizer or not); a
    # --tgt-lang alone without a tokenizer is the refusal below, which says what to give instead
    alone = session.tokenizer is None and tgt_lang is not None and settings.get("forced_bos_token_id") is None
    try:
        if (has_text or src_lang or tgt_lang) and not alone:
            policy.first_token(settings, tgt_lang)
        if (src_lang or tgt_lang) and session.tokenizer is None:
            raise click.UsageError(f"{'--src-lang' if src_lang else '--tgt-lang'}: this bundle has no tokenizer, so "
                                   "no languages (give --forced-bos-id for the target language's token id)")
        if src_lang is not None:
            policy.check_src_lang(src_lang)
    except InputError as e:
        raise click.UsageError(said(e)) from None
    if text.replace_unknowns:
        try:
            policy.check_replace_unknowns()
        except InputError as e:
            raise click.UsageError(f"{bundle}: {said(e)}") from None
    if vocab_map is None:
        return None
    if not has_text:
        raise click.UsageError("--vocab-map goes with --text / --input-file")
    if not vocab_map.is_file():
        raise XformError(f"--vocab-map {vocab_map}: no such file")
    if not session.capabilities.restriction:
        raise click.UsageError(f"--vocab-map: {bundle} has no restricted decoder on the {backend} backend: export "
                               "it with --with-vocab-map and run it with --backend ort")
    # a malformed map or an unknown token: exit 1, naming the line
    return policy.vocab_map(vocab_map)


def generation_options(fn):
    """The decoding flags, one a control of the controls' table (runtime/decoding/controls.py), with
    --greedy and --bad-words; unset ones take the bundle's defaults (greedy unless it records others).
    With the command's --max-new-tokens (declared where the command lists it), they reach the
    command as GenerationFlags `generation`."""
    from xform.runtime.decoding import controls

    options = [click.option("--greedy", is_flag=True,
                            help="Greedy decoding, whatever the bundle's default (--num-beams 1)."),
               click.option("--bad-words", "bad_words", multiple=True, metavar="PHRASE",
                            help="A word or phrase never generated, split by the target tokenizer; repeat for more.")]
    for c in controls.CONTROLS:
        if c.option:
            options.append(control_option(c))
    return option_group("generation", GenerationFlags.of, options, also=["max_new_tokens"])(fn)


@dataclasses.dataclass(frozen=True)
class GenerationFlags:
    """The decoding flags as given: --greedy, --bad-words, each control's flag by its parameter
    (`controls`, None where not given) and --max-new-tokens. `settings()` checks them against each
    other: the generation config's settings."""
    greedy: bool = False
    bad_words: tuple[str, ...] = ()
    controls: dict = dataclasses.field(default_factory=dict)
    max_new_tokens: int | None = None

    @classmethod
    def of(cls, greedy: bool = False, bad_words=(), max_new_tokens: int | None = None, **controls):
        return cls(greedy, tuple(bad_words), controls, max_new_tokens)

    def settings(self) -> dict:
        """generation_settings of these flags (--max-new-tokens apart: checked_generation takes it)."""
        return generation_settings(self.greedy, self.bad_words, **self.controls)


def control_option(c):
    """The click option of a control, by its kind: its flag (flags.py) and its help, the other
    controls it names as their flags."""
    from xform.runtime.decoding import controls

    dest, name = c.dest or c.name, option_of(c.name)
    help = help_text(c.help, [other.name for other in controls.CONTROLS])
    if c.kind == "bool":
        return click.option(name, dest, is_flag=True, default=None, help=help)
    if c.kind == "choice":
        return click.option(name, dest, type=click.Choice(list(c.choices or {})), default=None, help=help)
    if c.kind in ("ids", "id_lists"):
        return click.option(name, dest, multiple=c.kind == "id_lists", default=None, metavar="IDS", help=help)
    return click.option(name, dest, type={"int": int, "float": float}[c.kind], default=None, help=help)


def id_list(flag: str, value: str) -> list[int]:
    try:
        ids = [int(v) for v in value.replace(" ", "").split(",") if v]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated token ids (3,17,5), got {value!r}", param_hint=flag)
    if not ids:
        raise click.BadParameter("expected at least one token id", param_hint=flag)
    return ids


def generation_settings(greedy: bool, bad_words=(), **flags) -> dict:
    """The CLI's door: the decoding flags as the generation config's settings (None: the
    bundle's default); --bad-words phrases stay text until a tokenizer splits them (`bad_words`
    in the result)."""
    from xform.runtime.decoding import controls

    settings: dict = {}
    for c in controls.CONTROLS:
        value = flags.pop(c.dest or c.name, None) if c.option else None
        if c.kind == "ids" and value is not None:
            value = id_list(option_of(c.name), value)
        elif c.kind == "id_lists":
            value = [id_list(option_of(c.name), v) for v in value] if value else None
        elif c.kind == "choice" and value is not None:
            value = (c.choices or {})[value]
        if c.option:
            settings[c.name] = value
    settings["bad_words"] = list(bad_words)
    if greedy and settings.get("num_beams") not in (None, 1):
        raise click.UsageError(f"--greedy and --num-beams {settings['num_beams']} contradict each other")
    if greedy:
        settings["num_beams"] = 1
    if greedy and settings.get("do_sample"):
        raise click.UsageError("--greedy and --sample contradict each other")
    return settings


def checked_generation(session, max_new_tokens, settings: dict):
    """The GenerationConfig for these flags over the bundle's defaults; bad combinations are usage errors."""
    from xform.errors import InputError
    try:
        gen = session.generation_config(max_new_tokens, **settings)  # None: the bundle's cap
    except InputError as e:
        raise click.UsageError(said(e)) from None
    ignored = [flag for key, flag in SAMPLING_FLAGS.items() if settings.get(key) is not None]
    if ignored and not gen.do_sample:  # they would change nothing: a user who typed them expects a sample
        raise click.UsageError(f"{', '.join(ignored)} {'applies' if len(ignored) == 1 else 'apply'} only when "
                               f"sampling, and this decode "
                               f"{'searches with beams' if gen.num_beams > 1 else 'is greedy'}: add --sample")
    return gen


def split_bad_words(translator, settings: dict) -> None:
    """--bad-words phrases (settings' `bad_words`, text) as target ids in `bad_words_ids`."""
    from xform.errors import InputError

    bad_words = settings.pop("bad_words")
    if bad_words:
        if translator.session.tokenizer is None:
            raise click.UsageError("--bad-words: this bundle has no tokenizer to split them; give --bad-word-ids")
        try:
            words = translator.policy.bad_word_ids(bad_words)
        except InputError as e:
            raise click.UsageError(said(e)) from None
        settings["bad_words_ids"] = (settings.get("bad_words_ids") or []) + words


SAMPLING_FLAGS = {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p", "seed": "--seed"}
