"""`xform corpus --ray` on a real two-node Ray cluster on this machine (conftest.py): the outputs
equal `run --input-file`'s; a killed driver loses nothing finished; a killed worker costs only
its shard; xform.ray.Translate in a Ray Data pipeline."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from tests.corpus.conftest import numbers
from tests.corpus.test_corpus import cli_job
from tests.ray_cluster import NODE_CPUS, run_with_local_ray, wait_sessions_gone
from xform.cli import main
from xform.cli.corpus import decoding_identity
from xform.corpus import pipeline
from xform.corpus.cluster import connect
from xform.corpus.record import RECORD, SHARDS, Record
from xform.errors import XformError

pytestmark = pytest.mark.ray
KILL_TIMEOUT_S = 90


def corpus(*args):
    return CliRunner().invoke(main, ["corpus", *map(str, args)])


def run_file(bundle, path, *flags) -> str:
    """run --input-file's translations of a file, the source column cut."""
    r = CliRunner().invoke(main, ["run", str(bundle), "--input-file", str(path), *map(str, flags)])
    assert r.exit_code == 0, r.output
    return "".join(line.split("\t", 1)[1] + "\n" for line in r.stdout.splitlines())


@pytest.mark.parametrize("beams,workers", [(1, 1), (1, 2), (4, 1), (4, 2)],
                         ids=["greedy-1-worker", "greedy-2-workers", "beam4-1-worker", "beam4-2-workers"])
def test_outputs_equal_run_input_file_on_one_and_two_nodes(ray_cluster, demo_bundle, corpus_inputs, reference,
                                                            tmp_path, beams, workers, monkeypatch):
    """Two workers run on the cluster's two nodes (`ray start --head` and a second `ray start
    --address` with CPUs and a resource of its own): one corpus, both nodes, the same lines. Each
    reserves --threads 2 of Ray's CPUs and each node offers 2, so Ray cannot place both on one
    (SPREAD alone is best effort). One worker joins by `--ray auto`, which reads RAY_ADDRESS."""
    out = tmp_path / "out"
    address = ray_cluster.address
    if workers == 1 and beams == 1:
        monkeypatch.setenv("RAY_ADDRESS", address)
        address = "auto"
    threads = NODE_CPUS if workers == 2 else 1
    r = corpus(demo_bundle, *corpus_inputs, "--output-dir", out, "--ray", address, "--workers", workers,
               "--threads", threads, "--num-beams", beams, "--shard-lines", 40, "--json", tmp_path / "r.json")
    assert r.exit_code == 0, r.output
    assert {p.name: (out / p.name).read_text() for p in corpus_inputs} == {
        p.name: reference[beams, p.name] for p in corpus_inputs}
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["nodes"] == 2 and report["workers"] == workers and report["threads"] == threads
    assert report["ray"] == address
    shards = json.loads((out / RECORD).read_text())["shards"]
    assert len(shards) == 8 and len({s["pid"] for s in shards.values()}) == workers
    assert len({s["node"] for s in shards.values()}) == workers  # two workers: one on each node
    assert [w["lines"] for w in report["translated"]["workers"]] and sum(
        w["lines"] for w in report["translated"]["workers"]) == 238


def test_a_killed_driver_loses_nothing_and_the_rerun_does_only_the_rest(ray_cluster, demo_bundle, tmp_path):
    src = tmp_path / "big.txt"
    src.write_text("\n".join(numbers(1200, 5)) + "\n")
    out = tmp_path / "out"
    args = [demo_bundle, src, "--output-dir", out, "--ray", ray_cluster.address, "--workers", 2, "--threads", 1,
            "--num-beams", 4, "--shard-lines", 20]
    log = tmp_path / "driver.log"
    with open(log, "w") as f:
        driver = subprocess.Popen([sys.executable, "-m", "xform", "corpus", *map(str, args)], env=dict(os.environ),
                                  stdout=subprocess.DEVNULL, stderr=f, start_new_session=True)
    try:
        deadline = time.monotonic() + KILL_TIMEOUT_S
        while len(list((out / SHARDS).glob("*.json"))) < 2:
            assert driver.poll() is None, f"the driver ended before it could be killed:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"no shard done within {KILL_TIMEOUT_S} s:\n{log.read_text()}"
            time.sleep(0.02)
    finally:
        driver.kill()
        driver.wait(10)
    done = {p.name[:-len(".json")] for p in (out / SHARDS).glob("*.json")}  # the driver alone wrote them
    assert 2 <= len(done) < 60
    r = corpus(*args)
    assert r.exit_code == 0, r.output
    record = json.loads((out / RECORD).read_text())
    assert {k for k, v in record["shards"].items() if v["run"] == 1} == done
    assert sum(v["run"] == 2 for v in record["shards"].values()) == 60 - len(done)
    assert [run["shards_done_before"] for run in record["runs"]] == [0, len(done)]
    assert (out / "big.txt").read_text() == run_file(demo_bundle, src, "--num-beams", 4)


def beam_corpus(demo_bundle, tmp_path, seed: int):
    """480 lines in 12 shards of 40, beam 4 on one-thread workers, and its record opened:
    (the input, the job, the plan, the record)."""
    src = tmp_path / "in.txt"
    src.write_text("\n".join(numbers(480, seed)) + "\n")
    job = cli_job(demo_bundle)
    job = dataclasses.replace(job, gen=job.gen.updated(num_beams=4), threads=1)
    decoding = {"generation": job.gen.to_dict(), "text": job.text.to_dict(), "vocab_map": None}
    plan = pipeline.plan_corpus([src], "text", 40, demo_bundle, decoding)
    return src, job, plan, Record.open(tmp_path / "out", plan.identity, force=False)


def killer():
    """A result callback that SIGKILLs the first result's worker process, and the pids it killed."""
    killed: list[int] = []

    def kill_once(result):
        if not killed:
            os.kill(result.pid, signal.SIGKILL)
            killed.append(result.pid)
    return kill_once, killed


def test_a_worker_killed_mid_shard_costs_only_its_shard(ray_cluster, demo_bundle, tmp_path):
    """The first shard back, its worker's process is SIGKILLed while it translates its next one:
    Ray restarts the actor and retries the shard; every line is there once."""
    src, job, plan, record = beam_corpus(demo_bundle, tmp_path, seed=8)
    kill_once, killed = killer()
    try:
        with connect(ray_cluster.address):
            pool = pipeline.RayPool(job, workers=2, num_cpus=1, max_restarts=2)
            try:
                figures = pipeline.translate(plan, record, pool, 1, kill_once)
            finally:
                pool.close()
        summary = pipeline.assemble(plan, record)
    finally:
        record.close()
    assert figures.shards == 12 and figures.lines == 480 and sorted(summary["shards"]) == sorted(
        s.id for s in plan.shards)
    restarted = [s for s in summary["shards"].values() if s["restarted"]]
    assert restarted and all(s["pid"] != killed[0] for s in restarted)
    assert (tmp_path / "out" / "in.txt").read_text() == run_file(demo_bundle, src, "--num-beams", 4)


def test_a_worker_lost_past_max_restarts_stops_the_run_with_what_it_finished(ray_cluster, demo_bundle, tmp_path):
    src, job, plan, record = beam_corpus(demo_bundle, tmp_path, seed=9)
    kill_once, killed = killer()
    try:
        with connect(ray_cluster.address):
            pool = pipeline.RayPool(job, workers=1, num_cpus=1, max_restarts=0)
            try:
                with pytest.raises(XformError, match="worker 0 is lost and Ray gave up on it .at most --max-restarts "
                                                     "0 restarts.*run the command again to go on"):
                    pipeline.translate(plan, record, pool, 1, kill_once)
            finally:
                pool.close()
    finally:
        record.close()
    assert 1 <= len(record.done()) < 12 and killed


def test_a_run_that_cannot_go_on_stops_naming_its_shards(ray_cluster, demo_bundle, tmp_path):
    """A worker's error names the shard it was translating (its file and lines); a worker Ray
    cannot place (more CPUs than a node has) stops the run after --stall-timeout, naming it and
    the shards it waits on, instead of waiting for ever."""
    src = tmp_path / "in.txt"
    src.write_text("\n".join(numbers(60, 4)) + "\n")
    job = dataclasses.replace(cli_job(demo_bundle), threads=1)
    plan = pipeline.plan_corpus([src], "text", 40, demo_bundle, decoding_identity(job.gen, job.text, "ort", None,
                                                                                  None))
    bad = dataclasses.replace(job, text=dataclasses.replace(job.text, src_lang="zz"))  # the CLI refuses it first
    with connect(ray_cluster.address):
        for pool, fragment in [
                (pipeline.RayPool(bad, workers=1, num_cpus=1, max_restarts=0),
                 f"worker 0 failed on {src} lines 1-40 (shard 0-0): "),
                (pipeline.RayPool(job, workers=1, num_cpus=NODE_CPUS + 1, max_restarts=0, stall_timeout=2),
                 f"no shard finished in 2 s (--stall-timeout): waiting on worker 0 ({src} lines 1-40 (shard 0-0), "
                 f"{src} lines 41-60 (shard 0-1))")]:
            try:
                with pytest.raises(XformError) as e:
                    list(pool.run(pipeline.tasks(plan, set())))
            finally:
                pool.close()
            assert fragment in str(e.value)


def test_more_workers_than_the_cluster_holds_is_refused(ray_cluster, demo_bundle, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("7\n")
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "o", "--ray", ray_cluster.address, "--workers", 3,
               "--threads", 2)
    assert r.exit_code == 1 and "--workers 3 x --threads 2 is more than the cluster holds (CPUs per node: 2, 2; " \
                                "room for 2 such workers)" in r.output, r.output


def test_ray_local_needs_no_ray_settings_and_leaves_nothing_running(demo_bundle, tmp_path):
    """--ray local as a user runs it: a process of its own whose environment sets no RAY_AUTH_*,
    with no token in its home; a Ray of its own on this machine, the output that of a run
    without Ray, nothing of that Ray running after, nothing written to ~/.ray."""
    src = tmp_path / "in.txt"
    src.write_text("7\n\n40512\n")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_")} | {"HOME": str(home)}
    code, output, sessions = run_with_local_ray(
        [sys.executable, "-m", "xform", "corpus", str(demo_bundle), str(src), "--output-dir", str(tmp_path / "o"),
         "--ray", "local", "--threads", "1"], tmp_path / "log", 180, env=env)
    assert code == 0 and "Traceback" not in output, output
    assert sessions  # its Ray was seen running
    assert corpus(demo_bundle, src, "--output-dir", tmp_path / "plain").exit_code == 0
    assert (tmp_path / "o" / "in.txt").read_text() == (tmp_path / "plain" / "in.txt").read_text() == (
        "seven\n\nforty thousand five hundred twelve\n")
    assert [run["ray"] for run in json.loads((tmp_path / "o" / RECORD).read_text())["runs"]] == ["local"]
    assert not (home / ".ray").exists()
    wait_sessions_gone(sessions)


def test_translate_in_a_ray_data_pipeline(ray_cluster, demo_bundle, tmp_path):
    import ray

    from xform.ray import Translate

    texts = numbers(60, 3)
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n")
    ray.init(address=ray_cluster.address, log_to_driver=False)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(texts)])
        ds = ds.map_batches(Translate, fn_constructor_kwargs={"bundle": str(demo_bundle), "num_beams": 4},
                            concurrency=2, num_cpus=1, batch_size=16)
        rows = sorted(ds.take_all(), key=lambda row: row["id"])
    finally:
        ray.shutdown()
    assert [row["text"] for row in rows] == texts and all(row["error"] is None for row in rows)
    assert "".join(row["translation"] + "\n" for row in rows) == run_file(demo_bundle, src, "--num-beams", 4)


def test_a_ctrl_c_of_a_ray_corpus_says_it_stopped_without_ray_tracebacks(ray_cluster, demo_bundle, tmp_path):
    """Ctrl-C of `xform corpus --ray`: exit 130, one line saying the workers stopped and how to go
    on, and none of Ray's "task failed" lines for the shards the stopped workers held (it printed
    one a shard in flight). The workers are gone: the same command again gets their CPUs and
    finishes the file."""
    from tests.test_first_hour import interrupt
    src, out = tmp_path / "in.txt", tmp_path / "out"
    src.write_text("\n".join(numbers(800, 3)) + "\n")
    args = [demo_bundle, src, "--output-dir", out, "--ray", ray_cluster.address, "--workers", 2, "--threads", 1,
            "--num-beams", 4, "--shard-lines", 20]
    proc = subprocess.Popen([sys.executable, "-m", "xform", "corpus", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ))
    output = interrupt(proc, "a finished shard", lambda: len(list((out / SHARDS).glob("*.json"))) >= 2, 180)
    assert proc.returncode == 130, output
    assert "run the same command again" in output, output
    assert "failed" not in output and "Traceback" not in output and "Unhandled error" not in output, output
    r = corpus(*args)
    assert r.exit_code == 0, r.output
    assert (out / "in.txt").read_text() == run_file(demo_bundle, src, "--num-beams", 4)
