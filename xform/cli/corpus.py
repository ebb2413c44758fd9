"""`xform corpus`: translate files into a directory, sharded and resumable, in this process or on a
Ray cluster (`--ray`), with `run`'s decoding flags; a progress bar, then the figures."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from xform.cli import err, handle_errors, main, out, stopped_code
from xform.cli.documents import DocumentFlags, corpus_documents, document_options
from xform.cli.flags import table
from xform.cli.groups import Placement, pass_group, pass_placement
from xform.cli.options import (
    BatchingFlags,
    GenerationFlags,
    batching_options,
    check_json_target,
    check_readable,
    decoding_for,
    generation_options,
    text_options,
    warn_unjudged,
    write_json,
)
from xform.cli.terms import TermFlags, term_options
from xform.corpus.cluster import STALL_TIMEOUT_S
from xform.corpus.shards import DEFAULT_SHARD_LINES
from xform.errors import XformError
from xform.runtime.decoding.request import TextOptions

MAX_SHOWN = 10  # failed lines and warnings named one by one on stderr; all of them are in the record


@dataclasses.dataclass(frozen=True)
class RayRun:
    """How the command runs on Ray: its --ray address (None: in this process) and the flags of its workers."""
    address: str | None
    workers: int = 1
    oversubscribe: bool = False
    max_restarts: int = 3
    stall_timeout: float = STALL_TIMEOUT_S

    @classmethod
    def of(cls, ray_address: str | None, workers: int, oversubscribe: bool, max_restarts: int,
           stall_timeout: float) -> "RayRun":
        return cls(ray_address, workers, oversubscribe, max_restarts, stall_timeout)


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path), metavar="INPUT...")
@click.option("--output-dir", required=True, type=click.Path(path_type=Path),
              help="Where each input's translation goes, under its own name, line for line; also the corpus's "
                   "record (xform-corpus.json) and finished shards, so that the same command run again goes on "
                   "where it stopped.")
@click.option("--field", default="text", show_default=True,
              help="The text of a .jsonl input (a field of each line's object) or a .parquet one (a column).")
@click.option("--ray", "ray_address", default=None, metavar="ADDRESS|auto|local",
              help="Run on Ray: join the cluster at ADDRESS (host:port), auto (RAY_ADDRESS, else the one "
                   "`ray start` started here), or local (start one on this machine, stopped after). Without it, "
                   "one session translates in this process.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Ray actors, each holding one session of the bundle (needs --ray).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Intra-op threads of each worker (default: with --ray, the cluster's CPUs shared among the "
                   "workers; without, all cores).")
@click.option("--oversubscribe", is_flag=True,
              help="Run workers x threads beyond the CPUs of the cluster's nodes (refused without it).")
@click.option("--shard-lines", type=click.IntRange(min=1), default=DEFAULT_SHARD_LINES, show_default=True,
              help="Lines a shard: the unit of work, of retry and of the record.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=3, show_default=True,
              help="Times Ray restarts a worker whose process or node died (its shards retried) before the run "
                   "stops.")
@click.option("--stall-timeout", type=click.FloatRange(min=1), default=STALL_TIMEOUT_S, show_default=True,
              metavar="SECONDS",
              help="With --ray: stop the run (what it finished recorded) when no shard has finished for this long, "
                   "naming the workers it waits on (ones Ray cannot place, or that hang); raise it where one "
                   "worker's shard takes longer.")
@click.option("--backend", type=click.Choice(["ort", "trt"]), default="ort", show_default=True)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="Default: cpu for ort, cuda for trt.")
@click.option("--json", "json_path", type=click.Path(path_type=Path),
              help="Write the figures as JSON (sentences/s, tokens/s, each worker's, the lines that failed).")
@click.option("--force", is_flag=True,
              help="Start over: discard what --output-dir's record finished (needed when the bundle, an input or "
                   "a decoding flag changed); also replaces an existing --json report (one of this --output-dir's "
                   "is replaced without it).")
@batching_options
@text_options
@document_options
@generation_options
@term_options
@pass_placement("backend", "device", "threads")
@pass_group("ray", RayRun.of, ["ray_address", "workers", "oversubscribe", "max_restarts", "stall_timeout"])
@handle_errors
def corpus(bundle: Path, inputs: tuple[Path, ...], output_dir: Path, field: str, ray: RayRun, shard_lines: int,
           where: Placement, json_path: Path | None, force: bool, batching: BatchingFlags, text: TextOptions,
           documents: DocumentFlags, generation: GenerationFlags, terms: TermFlags) -> None:
    """Translate INPUT files (text, .jsonl, .parquet) with BUNDLE into --output-dir, one output a
    input under its name, in shards recorded as they finish: run again, the same command goes on
    where it stopped. --ray runs the shards on a Ray cluster's workers. BUNDLE may be a directory
    of bundles: --src-lang and --tgt-lang pick the one that translates the pair."""
    from xform.cli.fleet import routed_bundle
    from xform.corpus.pipeline import plan_corpus
    from xform.corpus.record import Record
    from xform.corpus.worker import Job

    bundle, src_lang, tgt_lang = routed_bundle(bundle, text.src_lang, text.tgt_lang)  # a directory: its route's
    text = dataclasses.replace(text, src_lang=src_lang, tgt_lang=tgt_lang)
    check_corpus_flags(bundle, inputs, output_dir, ray, json_path, force)
    if terms.qe and documents.wanted:
        raise click.UsageError("--qe with --documents: a document's translation has no one confidence (its "
                               "sentences' are per line: translate lines without --documents)")
    text = terms.applied(text)  # the glossary's fingerprint goes into the record's identity (text.to_dict)
    if ray.address is None and where.threads is not None:
        from xform.corpus.cluster import worker_threads
        worker_threads([os.cpu_count() or 1], 1, where.threads, ray.oversubscribe, "this machine")
    settings = generation.settings()
    lines = batching.checked()
    local = ray.address is None  # the driver's session translates; with Ray it only checks the flags
    translator = (where if local else Placement(threads=1)).open(bundle)  # the driver's one translator
    warn_unjudged(translator.session)
    as_documents = corpus_documents(documents, bool(text.scores), text.prefix_column, force)
    languages = dataclasses.replace(text, src_lang=None) if as_documents and text.src_lang == "auto" else text
    gen, vocab = decoding_for(translator, bundle, where.backend, settings, True, generation.max_new_tokens,
                              languages)
    vocab_map, text = text.vocab_map, dataclasses.replace(text, vocab_map=None)  # the job carries the map read
    identity = decoding_identity(gen, text, where.backend, where.device, vocab_map)
    if as_documents is not None:  # a record without it is a corpus of lines, as before documents
        identity["documents"] = as_documents.to_dict()
    plan = plan_corpus(list(inputs), field, shard_lines, bundle, identity, gen.num_return_sequences, text.scores,
                       text.qe)
    # the bundle's path as given, made absolute (its links not resolved: each node resolves its own)
    job = Job(str(bundle.absolute()), gen, text, lines, where.backend, where.device, where.threads, vocab,
              plan.identity.bundle["sha256"], table(), as_documents)  # errors and warnings name the flags
    own, translator = (translator if local else None), None  # with Ray, the checking one goes before the workers come
    record = Record.open(output_dir, plan.identity, force)
    try:
        report = go(plan, record, job, own, ray)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the workers are stopped on the way out (RayPool.close)
        err.print(f"interrupted: the workers are stopped and every finished shard is recorded in {output_dir}; run "
                  "the same command again to go on where it stopped")
        sys.exit(stopped_code(e))
    finally:
        record.close()
    report.update(bundle=str(bundle), backend=where.backend, generation=gen.to_dict(),
                  output_dir=str(output_dir.absolute()))
    if json_path is not None:
        write_json(json_path, report, force or own_report(json_path, output_dir),
                   [("BUNDLE", bundle), *(("INPUT", p) for p in inputs)])
    if report["failed"]:
        sys.exit(1)


def decoding_identity(gen, text, backend: str, device: str | None, vocab_map: Path | None) -> dict:
    """What, besides the bundle and the inputs, makes the corpus's translations what they are (the
    record's identity): the decoding, the text policy, the vocabulary map, the backend and device."""
    from xform.files import sha256_file
    from xform.runtime.open import default_device

    return {"generation": gen.to_dict(), "text": text.to_dict(),
            "vocab_map": sha256_file(vocab_map) if vocab_map is not None else None,
            "backend": backend, "device": device or default_device(backend)}


def check_corpus_flags(bundle: Path, inputs, output_dir: Path, ray: RayRun, json_path, force) -> None:
    """corpus's flags that go together, and the paths it reads and writes, before anything is loaded
    or written."""
    if ray.workers > 1 and ray.address is None:
        raise click.UsageError(f"--workers {ray.workers} runs Ray actors: give --ray (local, auto or an address)")
    if ray.address is not None:
        check_ray_flag(ray.address)
    for path in inputs:
        if path.is_dir():
            raise XformError(f"INPUT {path}: is a directory; expected a file (text, .jsonl or .parquet): give its "
                             "files")
        check_readable("INPUT", path, text=path.suffix.lower() != ".parquet")
    out_dir = Path(os.path.realpath(output_dir))
    for name, path in [("BUNDLE", bundle), *(("INPUT", p) for p in inputs)]:
        real = Path(os.path.realpath(path))
        if real == out_dir or out_dir in real.parents or real in out_dir.parents:
            raise click.UsageError(f"--output-dir {output_dir}: {name} {path} is "
                                   f"{'inside it' if out_dir in real.parents else 'it, or holds it'}; the corpus "
                                   "writes its outputs and record there: give a directory apart from the inputs")
    if json_path is not None:
        check_report_path(json_path, output_dir, force, [("BUNDLE", bundle), *(("INPUT", p) for p in inputs)])


def check_ray_flag(address: str) -> None:
    """What --ray needs and can be checked without a cluster: Ray installed, `ray` for local, an
    address where something listens."""
    from xform.corpus.cluster import check_ray_installed

    check_ray_installed()
    if address == "local":
        from xform.corpus.local import ray_command
        ray_command()
    elif address != "auto" and "://" not in address:
        from xform.corpus.cluster import check_reachable
        check_reachable(address, address)


def check_report_path(json_path: Path, output_dir: Path, force: bool, inputs: list[tuple[str, Path]]) -> None:
    """--json: outside --output-dir; an existing file replaced only if it is this --output-dir's
    report (the same command run again), or with --force if it is another xform report."""
    replace = force or own_report(json_path, output_dir)
    if json_path.exists() and not replace:  # --force would also start the corpus over: say so
        raise click.UsageError(f"--json {json_path}: already exists, and is no report of --output-dir "
                               f"{output_dir}'s; give a new path (--force replaces it, and also starts the corpus "
                               "over)")
    if Path(os.path.realpath(output_dir)) in Path(os.path.realpath(json_path)).parents:
        raise click.UsageError(f"--json {json_path}: inside --output-dir, where the corpus keeps only its own "
                               "files: write it elsewhere")
    check_json_target(json_path, replace, inputs)


def own_report(path: Path, output_dir: Path) -> bool:
    """Whether `path` is a report `xform corpus` wrote for `output_dir`: the same command run again
    replaces it."""
    from xform.cli.options import not_our_report

    if not path.is_file() or not_our_report(path) is not None:
        return False
    try:
        written = json.loads(path.read_text(encoding="utf-8")).get("output_dir")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(written, str) and os.path.realpath(written) == os.path.realpath(output_dir)


def go(plan, record, job, translator, ray: RayRun) -> dict:
    """Translate what the record lacks (in this process with `translator`, else on the Ray cluster),
    assemble the outputs, print the figures; the report."""
    from xform.corpus.pipeline import LocalPool, RayPool, ShardWorker

    if record.complete:
        return already_complete(plan, record)
    if ray.address is None:
        return run_pool(plan, record, LocalPool(ShardWorker(job, 0, translator)), {"ray": None, "workers": 1,
                                                                                 "threads": job.threads})
    from xform.corpus.cluster import connect, worker_gpus, worker_threads

    with connect(ray.address) as cluster:
        threads = worker_threads(list(cluster.nodes.values()), ray.workers, job.threads, ray.oversubscribe)
        gpus = worker_gpus(job.backend == "trt" or job.device == "cuda", ray.workers, cluster.gpus,
                           ray.oversubscribe)
        pool = RayPool(dataclasses.replace(job, threads=threads), ray.workers, 0 if ray.oversubscribe else threads,
                       ray.max_restarts, num_gpus=gpus, stall_timeout=ray.stall_timeout)
        try:
            return run_pool(plan, record, pool, {"ray": ray.address, "workers": ray.workers, "threads": threads,
                                                 "nodes": len(cluster.nodes), "cluster_cpus": cluster.cpus})
        except BaseException:
            pool.abandon()  # the command leaves the cluster anyway: its workers stop without Ray's noise
            raise
        finally:
            pool.close()


def run_pool(plan, record, pool, about: dict) -> dict:
    """The shards not done, translated on `pool` under a progress bar; the outputs assembled."""
    from xform.corpus import pipeline
    from xform.runtime.bench import peak_rss_mib

    done = record.done()
    run = record.begin_run({**about, "pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                            "shards_done_before": len(done)})
    total = sum(s.lines for s in plan.shards)
    with corpus_progress(total, sum(s.lines for s in plan.shards if s.id in done), len(plan.shards), len(done),
                         about["workers"]) as progress:
        if isinstance(pool, pipeline.LocalPool):
            pool.on_batch = progress.batch
        figures = pipeline.translate(plan, record, pool, run, progress.shard)
    summary = pipeline.assemble(plan, record)
    record.finish(summary)
    report = {"run": run, **about, "lines": total, "shards": len(plan.shards), "skipped_shards": len(done),
              **{k: summary[k] for k in ("failed", "warnings", "outputs")}, "translated": figures.to_dict(),
              "driver_peak_rss_mib": peak_rss_mib()}
    print_figures(report)
    return report


def already_complete(plan, record) -> dict:
    """A corpus finished by an earlier run: its outputs checked against the record, nothing translated."""
    from xform.files import sha256_file

    for name, digest in record.data.get("outputs", {}).items():
        path = record.directory / name
        if not path.is_file() or sha256_file(path) != digest:
            raise XformError(f"{path}: missing or changed since this corpus was completed; --force translates "
                             "the corpus again")
    record.remove_shards()  # what a run stopped between marking the corpus complete and removing them left
    out.print(f"{record.directory}: complete ({sum(i['lines'] for i in plan.identity.inputs):,} lines in "
              f"{len(plan.sources)} files); nothing to translate")
    report = {k: record.data.get(k, []) for k in ("failed", "warnings")}
    print_problems(report)
    return {**report, "outputs": record.data.get("outputs", {}), "skipped_shards": len(plan.shards),
            "translated": None}


class Progress:
    """The bar's updates: lines as batches (this process) or shards (Ray workers) finish."""

    def __init__(self, bar=None, task=None, shards: tuple[int, int] = (0, 0), workers: int = 1):
        self.bar, self.task, self.shards, self.workers = bar, task, list(shards), workers
        self.start, self.lines, self.per_batch = time.perf_counter(), 0, False

    def update(self, lines: int) -> None:
        self.lines += lines
        if self.bar is not None:
            rate = self.lines / max(time.perf_counter() - self.start, 1e-9)
            self.bar.update(self.task, advance=lines, rate=rate, shards=f"{self.shards[0]}/{self.shards[1]}")

    def batch(self, lines: int, tokens: int) -> None:
        self.per_batch = True
        self.update(lines)

    def shard(self, result) -> None:
        self.shards[0] += 1
        self.update(0 if self.per_batch else result.shard.lines)


@contextlib.contextmanager
def corpus_progress(total: int, done: int, shards: int, shards_done: int, workers: int):
    """A progress bar on stderr (lines, sentences/s, shards done, workers), only on a terminal."""
    if not err.is_terminal:
        yield Progress(shards=(shards_done, shards), workers=workers)
        return
    import rich.progress as rp

    columns = (rp.SpinnerColumn(), rp.BarColumn(), rp.MofNCompleteColumn(), rp.TextColumn("lines"),
               rp.TextColumn("{task.fields[rate]:,.1f} sentences/s"), rp.TextColumn("shards {task.fields[shards]}"),
               rp.TextColumn(f"{workers} worker{'s' if workers > 1 else ''}"), rp.TimeElapsedColumn())
    with rp.Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task("corpus", total=total, completed=done, rate=0.0, shards=f"{shards_done}/{shards}")
        yield Progress(bar, task, (shards_done, shards), workers)


def print_figures(report: dict) -> None:
    """The run's figures: lines, sentences/s, tokens/s, and each worker's."""
    f = report["translated"]
    skipped = f" ({report['skipped_shards']} shards done by an earlier run)" if report["skipped_shards"] else ""
    out.print(f"translated {f['lines']:,} lines in {f['shards']} shards{skipped} in {f['seconds']:.2f} s: "
              f"{f['sentences_per_s']:,.1f} sentences/s, {f['tokens_per_s']:,.0f} tokens/s")
    if f["workers"]:
        t = Table(title=f"workers ({'Ray ' + report['ray'] if report['ray'] else 'this process'})")
        for col in ("worker", "node", "pid", "shards", "lines", "busy s", "sentences/s", "peak RSS MiB"):
            t.add_column(col, justify="left" if col == "node" else "right")
        for w in f["workers"]:
            t.add_row(str(w["worker"]), str(w["node"])[:12], str(w["pid"]), str(w["shards"]), f"{w['lines']:,}",
                      f"{w['busy_s']:.2f}", f"{w['sentences_per_s']:,.1f}", f"{w['peak_rss_mib']:,.0f}")
        out.print(t)
    print_problems(report)


def print_problems(report: dict) -> None:
    """Warnings and failed lines on stderr, FILE:LINE first, the first MAX_SHOWN of each."""
    for kind, key, style in (("warnings", "warning", "bold yellow"), ("failed", "error", "bold red")):
        items = report[kind]
        for item in items[:MAX_SHOWN]:
            err.print(f"[{style}]{key}:[/] {escape(item['line'])}: {escape(item[key])}")
        if len(items) > MAX_SHOWN:
            err.print(f"[{style}]{key}:[/] {len(items)} in all (the first {MAX_SHOWN} are above; the record has "
                      "all)")
    if report["failed"]:
        err.print(f"[bold red]error:[/] {len(report['failed'])} lines could not be translated (their output lines "
                  "are empty; the record lists them)")
