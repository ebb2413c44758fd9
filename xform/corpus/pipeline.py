"""The corpus pipeline: plan the shards, translate those not done on a pool of workers, record each
as it lands, and assemble the outputs in order once every shard is done.

The driver (this module, in the process that runs the command) reads the inputs, writes the
record and the outputs; workers only translate lists of lines, so the nodes of a cluster need the
bundle (checked against the driver's manifest hash) and xform (the driver's version: Ray imports
RayShardWorker by its module there), nothing else. A pool takes shard tasks and yields results as
they finish, in any order: `LocalPool` is one ShardWorker in this process (no Ray), `RayPool` an
actor pool of them on a Ray cluster (the connection is cluster.py's), each actor one session,
restarted by Ray when its process or node dies with the shards it held retried on it. A shard is
recorded once, when its result arrives: a crash of the driver loses nothing recorded, a re-run
does only the rest.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator

from xform.corpus import formats
from xform.corpus.cluster import STALL_TIMEOUT_S
from xform.corpus.cluster import one_line as cause
from xform.corpus.formats import Failed, Source
from xform.corpus.record import OURS, Identity, Record
from xform.corpus.shards import Shard, ShardTask, cut, plan
from xform.corpus.worker import Job, ShardResult, ShardWorker
from xform.errors import InputError, XformError
from xform.files import TEMP, sha256_file

WAIT_S = 5.0  # how long the driver waits for a shard at a time before it checks the stall


@dataclass(frozen=True)
class Corpus:
    """The inputs, their identity and their shards; `n` translations a line, `scores` and `qe` as
    TextOptions'."""
    sources: list[Source]
    identity: Identity
    shards: list[Shard]
    n: int = 1
    scores: bool | str = False
    qe: bool = False

    def shards_of(self, file: int) -> list[Shard]:
        return [s for s in self.shards if s.file == file]


def plan_corpus(paths: list[Path], field_name: str, shard_lines: int, bundle: Path, decoding: dict, n: int = 1,
                scores: bool | str = False, qe: bool = False) -> Corpus:
    """Read each input once (its lines, bytes and sha256) and cut the corpus into shards."""
    sources = [Source.of(Path(p), field_name) for p in paths]
    check_names(sources)
    inputs, counts = [], []
    for s in sources:
        lines, size, digest = formats.measure(s)
        counts.append(lines)
        inputs.append({"name": s.name, "path": str(s.path), "format": s.format, "field": s.field, "lines": lines,
                       "bytes": size, "sha256": digest})
    identity = Identity({"path": str(bundle), "sha256": sha256_file(Path(bundle) / "manifest.json")}, inputs,
                        decoding, shard_lines)
    return Corpus(sources, identity, plan(counts, shard_lines), n, scores, qe)


def check_names(sources: list[Source]) -> None:
    """Refuse inputs whose outputs would be one file, or a file of the corpus's own (record.py)."""
    seen: dict[str, Path] = {}
    for s in sources:
        if s.name in OURS or TEMP.fullmatch(s.name):
            raise InputError(f"INPUT {s.path}: its output would be --output-dir's {s.name}, a name the corpus keeps "
                             f"for its own files ({', '.join(OURS)}, and xform's temporaries): give the input "
                             "another name (a link of another name will do)")
        if s.name in seen:
            raise InputError(f"{seen[s.name]} and {s.path} have the same name: their outputs would be one file in "
                             "--output-dir; translate them into separate directories")
        seen[s.name] = s.path


def tasks(corpus: Corpus, done: set[str]) -> Iterator[ShardTask]:
    """The shards not done, their lines read in order (an input whose shards are all done is not read)."""
    for f, source in enumerate(corpus.sources):
        mine = corpus.shards_of(f)
        if all(s.id in done for s in mine):
            continue
        for shard, items in cut(mine, formats.read(source), str(source.path)):
            if shard.id not in done:
                failed = {i: item.message for i, item in enumerate(items) if isinstance(item, Failed)}
                yield ShardTask(shard, ["" if isinstance(item, Failed) else item for item in items], failed,
                                str(source.path))


@dataclass
class Figures:
    """One run's work: shards, lines and target tokens translated, seconds, and per worker the same."""
    shards: int = 0
    lines: int = 0
    tokens: int = 0
    seconds: float = 0.0
    workers: dict[int, dict] = field(default_factory=dict)

    def add(self, r: ShardResult) -> None:
        self.shards += 1
        self.lines += r.shard.lines
        self.tokens += r.tokens
        w = self.workers.setdefault(r.worker, {"worker": r.worker, "shards": 0, "lines": 0, "tokens": 0,
                                               "busy_s": 0.0, "shards_after_restart": 0})
        w.update(shards=w["shards"] + 1, lines=w["lines"] + r.shard.lines, tokens=w["tokens"] + r.tokens,
                 busy_s=w["busy_s"] + r.seconds, pid=r.pid, node=r.node,
                 peak_rss_mib=max(w.get("peak_rss_mib", 0.0), r.peak_rss_mib))
        w["sentences_per_s"] = w["lines"] / max(w["busy_s"], 1e-9)
        w["shards_after_restart"] += r.restarted  # translated by an actor Ray had restarted

    def to_dict(self) -> dict:
        s = max(self.seconds, 1e-9)
        return {"shards": self.shards, "lines": self.lines, "tokens": self.tokens, "seconds": self.seconds,
                "sentences_per_s": self.lines / s, "tokens_per_s": self.tokens / s,
                "workers": [self.workers[k] for k in sorted(self.workers)]}


def shard_file(r: ShardResult, run: int) -> dict:
    """A finished shard as its file in the record holds it."""
    return {"shard": r.shard.id, "run": run, "lines": r.lines, "warnings": r.warnings, "tokens": r.tokens,
            "seconds": r.seconds, "worker": r.worker, "pid": r.pid, "node": r.node, "restarted": r.restarted,
            "peak_rss_mib": r.peak_rss_mib}


def translate(corpus: Corpus, record: Record, pool, run: int,
              on_shard: Callable[[ShardResult], None] | None = None) -> Figures:
    """Translate the shards the record lacks on `pool`, recording each as it lands."""
    figures = Figures()
    start = time.perf_counter()
    for result in pool.run(tasks(corpus, record.done())):
        record.save(result.shard.id, shard_file(result, run))
        figures.add(result)
        if on_shard is not None:
            on_shard(result)
    figures.seconds = time.perf_counter() - start
    return figures


def assemble(corpus: Corpus, record: Record) -> dict:
    """Write each input's output from its shards, in order; return the record's summary: every
    shard's figures, the lines that failed and the warnings (FILE:LINE and message), the outputs'
    hashes. An input that changed since the plan measured it is refused (InputError), before any
    output is written."""
    summary: dict = {"shards": {}, "failed": [], "warnings": [], "outputs": {}}
    for source, measured in zip(corpus.sources, corpus.identity.inputs, strict=True):
        formats.check_unchanged(source, measured["bytes"], measured["sha256"])  # all, before any output
    for f, source in enumerate(corpus.sources):
        target = record.directory / source.name
        formats.write(source, target, shard_lines(corpus.shards_of(f), source, record, summary), corpus.n,
                      corpus.scores, corpus.qe)
        summary["outputs"][source.name] = sha256_file(target)
    return summary


def shard_lines(shards: list[Shard], source: Source, record: Record, summary: dict) -> Iterator:
    """An input's lines' results from its shards' files, noting failures, warnings and figures in `summary`."""
    for shard in shards:
        data = record.load(shard.id, shard.lines)
        summary["shards"][shard.id] = {k: v for k, v in data.items() if k not in ("lines", "warnings", "shard")}
        for i, message in data.get("warnings", []):
            summary["warnings"].append({"line": source.label(shard.start + i), "warning": message})
        for i, (translations, error) in enumerate(data["lines"]):
            if error is not None:
                summary["failed"].append({"line": source.label(shard.start + i), "error": error})
            yield translations, error


class LocalPool:
    """One ShardWorker in this process: the pipeline without Ray. `on_batch(lines, tokens)` hears
    of each batch as it is decoded."""
    workers = 1

    def __init__(self, worker: ShardWorker, on_batch: Callable[[int, int], None] | None = None):
        self.worker, self.on_batch = worker, on_batch

    def run(self, todo: Iterator[ShardTask]) -> Iterator[ShardResult]:
        for task in todo:
            yield self.worker.translate(task, self.on_batch)

    def close(self) -> None:
        pass


class RayShardWorker(ShardWorker):
    """A ShardWorker as a Ray actor: says which node it runs on and whether Ray restarted it."""

    def where(self) -> tuple[str, bool]:
        import ray

        ctx = ray.get_runtime_context()
        return ctx.get_node_id(), bool(ctx.was_current_actor_reconstructed)


class RayPool:
    """An actor pool of ShardWorkers on the connected Ray cluster (cluster.py): `workers` actors,
    each one session with `num_cpus` CPUs (and `num_gpus` GPUs) reserved, spread over the nodes,
    `inflight` shards queued on each so none waits for the driver. An actor whose process or node
    dies is restarted by Ray (at most `max_restarts` times) and the shards it held are retried on
    it; past that the run stops with what it finished recorded. So does a run in which no shard
    finishes for `stall_timeout` seconds (workers Ray cannot place, or that hang), naming them."""

    def __init__(self, job: Job, workers: int, num_cpus: float, max_restarts: int, inflight: int = 2,
                 num_gpus: float = 0, stall_timeout: float = STALL_TIMEOUT_S):
        import ray

        remote: Any = ray.remote(RayShardWorker)
        self.workers, self.max_restarts, self.inflight = workers, max_restarts, inflight
        self.stall_timeout = stall_timeout
        options = remote.options(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=max_restarts, max_task_retries=-1,
                                 scheduling_strategy="SPREAD")
        self.pending: dict = {}  # the shards submitted and not yet answered (run)
        self.actors: list[Any] = [ray_call(partial(options.remote, job, i), f"starting worker {i}")
                                  for i in range(workers)]

    def run(self, todo: Iterator[ShardTask]) -> Iterator[ShardResult]:
        import ray

        pending: dict = self.pending  # ref -> (worker, task); what close() finds here was cut short

        def submit(worker: int) -> None:
            task = next(todo, None)
            if task is not None:
                pending[ray_call(lambda: self.actors[worker].translate.remote(task), f"worker {worker}")] = (
                    worker, task)

        for _ in range(self.inflight):
            for worker in range(self.workers):
                submit(worker)
        progress = time.monotonic()
        while pending:
            ready, _ = ray_call(lambda: ray.wait(list(pending), num_returns=1,
                                                 timeout=min(WAIT_S, self.stall_timeout)), "waiting for shards")
            if not ready:
                if time.monotonic() - progress > self.stall_timeout:
                    raise XformError(stalled(pending, self.stall_timeout))
                continue
            worker, task = pending.pop(ready[0])
            yield self.result(ready[0], worker, task)
            submit(worker)
            progress = time.monotonic()

    def result(self, ref, worker: int, task: ShardTask) -> ShardResult:
        import ray
        from ray import exceptions

        try:
            return ray.get(ref)
        except exceptions.RayActorError as e:
            if e.actor_init_failed:
                raise XformError(f"worker {worker} could not start: {cause(e)}") from None
            raise XformError(f"worker {worker} is lost and Ray gave up on it (at most --max-restarts "
                             f"{self.max_restarts} restarts) while it held {task.label}: {cause(e)}. The finished "
                             "shards are recorded: run the command again to go on") from None
        except exceptions.RayTaskError as e:
            raise XformError(f"worker {worker} failed on {task.label}: {cause(e)}") from None
        except exceptions.RayError as e:
            raise XformError(f"worker {worker}, {task.label}: Ray failed ({type(e).__name__}: {cause(e)})") from None

    def abandon(self) -> None:
        """A run cut short (Ctrl-C, an error) on its way out of the cluster: killed one by one, each
        worker's shards in flight would fail in Ray with retries left, and Ray would print a "task
        failed" line for each (four on a Ctrl-C of two workers), though stopping them is this run's
        own doing. So the driver leaves the cluster now, which stops every actor of its job, and
        nothing of the stop is printed. Only for a caller about to leave anyway (the command)."""
        import ray

        if self.pending:
            os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"  # nor the abandoned results' errors
            ray.shutdown()  # the job ends: Ray stops its actors (connect's own shutdown is then a no-op)
            self.actors = []

    def close(self) -> None:
        """Stop the workers (none left after abandon)."""
        import ray

        for actor in self.actors:
            ray.kill(actor)


def ray_call(call: Callable[[], Any], what: str) -> Any:
    """`call()`, a Ray error it raises said as an XformError naming `what`."""
    from ray import exceptions

    try:
        return call()
    except exceptions.RayError as e:
        raise XformError(f"Ray failed, {what} ({type(e).__name__}: {cause(e)})") from None


def stalled(pending: dict, timeout: float) -> str:
    """Why a run stops when no shard finished for `timeout` s: the workers waited on and their shards."""
    held: dict[int, list[str]] = {}
    for worker, task in pending.values():
        held.setdefault(worker, []).append(task.label)
    waiting = "; ".join(f"worker {w} ({', '.join(labels)})" for w, labels in sorted(held.items()))
    return (f"no shard finished in {timeout:.0f} s (--stall-timeout): waiting on {waiting}. Ray may have no room "
            "to place these workers (their CPUs or GPUs are taken), or they hang; the finished shards are recorded: "
            "run the command again to go on, with a larger --stall-timeout where a shard takes longer")
