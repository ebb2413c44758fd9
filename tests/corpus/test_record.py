"""What keeps a corpus's record true across runs and crashes: its identity (the backend and
device too), the bundle every worker holds, the names the corpus keeps for itself, shard files a
crash left broken, inputs that change during a run, the --json report of the same command."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest
from click.testing import CliRunner

from tests.corpus.test_corpus import cli_job
from xform.cli import main
from xform.cli.corpus import decoding_identity
from xform.corpus import formats, pipeline
from xform.corpus.formats import Source
from xform.corpus.record import LOCK, RECORD, SHARDS, Record
from xform.corpus.worker import ShardWorker
from xform.errors import BundleError, InputError
from xform.files import sha256_file


def corpus(*args):
    return CliRunner().invoke(main, ["corpus", *map(str, args)])


def interrupted(bundle, src, out, shard_lines: int, stop_at: int) -> Record:
    """A run of `src` into `out` stopped (as by Ctrl-C) once shard `stop_at` is recorded; the
    record, closed, with the decoding `xform corpus` gives without flags."""
    job = cli_job(bundle)
    plan = pipeline.plan_corpus([src], "text", shard_lines, bundle, decoding_identity(job.gen, job.text, "ort",
                                                                                      None, None))
    record = Record.open(out, plan.identity, force=False)

    def stop(result):
        if result.shard.index == stop_at:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pipeline.translate(plan, record, pipeline.LocalPool(ShardWorker(job)), record.begin_run({}), stop)
    record.close()
    return record


def test_a_changed_backend_or_device_is_refused_naming_the_flag(demo_bundle, tmp_path):
    """The record holds the backend and the resolved device: an explicit --device cpu is ort's
    default, so the corpus is found complete; --backend trt or --device cuda is refused by flag,
    before anything runs (--ray local: the driver checks on ort, and the record refuses first)."""
    pytest.importorskip("ray")
    src = tmp_path / "in.txt"
    src.write_text("7\n")
    out = tmp_path / "o"
    assert corpus(demo_bundle, src, "--output-dir", out).exit_code == 0
    decoding = json.loads((out / RECORD).read_text())["decoding"]
    assert (decoding["backend"], decoding["device"]) == ("ort", "cpu")
    r = corpus(demo_bundle, src, "--output-dir", out, "--device", "cpu")
    assert r.exit_code == 0 and "nothing to translate" in r.output, r.output
    for flags, fragment in [(["--backend", "trt"], "--backend: 'ort' then, 'trt' now"),
                            (["--device", "cuda"], "--device (or --backend's default): 'cpu' then, 'cuda' now")]:
        r = corpus(demo_bundle, src, "--output-dir", out, "--ray", "local", *flags)
        assert r.exit_code == 1 and fragment in r.output and "--force" in r.output, r.output


def test_a_worker_refuses_a_bundle_other_than_the_drivers(demo_bundle, tmp_path):
    """A worker (in this process here; a Ray actor on a node the same) checks the bundle at the
    job's path against the manifest's sha256 the driver read, naming the node and the path."""
    job = dataclasses.replace(cli_job(demo_bundle), manifest_sha256=sha256_file(demo_bundle / "manifest.json"))
    ShardWorker(job)  # the driver's own bundle
    other = tmp_path / "other"
    shutil.copytree(demo_bundle, other)
    (other / "manifest.json").write_text((other / "manifest.json").read_text() + " ")
    with pytest.raises(BundleError, match=f"worker 0 on .* \\(node local\\): {other}/manifest.json: sha256 "
                                          f"{sha256_file(other / 'manifest.json')[:12]}, expected the driver's"):
        ShardWorker(dataclasses.replace(job, bundle=str(other)))
    with pytest.raises(BundleError, match=f"{tmp_path}/absent/manifest.json: unreadable .No such file"):
        ShardWorker(dataclasses.replace(job, bundle=str(tmp_path / "absent")))


def test_the_command_gives_its_workers_the_bundle_as_named_and_its_manifests_hash(demo_bundle, tmp_path,
                                                                                   monkeypatch):
    """The job's bundle is the path given, made absolute but not resolved (a link stays a link,
    which each node resolves for itself), and carries the manifest's sha256 the driver read."""
    seen = []

    class Spy(ShardWorker):
        def __init__(self, job, *args):
            seen.append(job)
            super().__init__(job, *args)

    link = tmp_path / "bundle-link"
    link.symlink_to(demo_bundle)
    src = tmp_path / "in.txt"
    src.write_text("7\n")
    monkeypatch.setattr(pipeline, "ShardWorker", Spy)
    monkeypatch.chdir(tmp_path)
    assert corpus("bundle-link", src, "--output-dir", tmp_path / "o").exit_code == 0
    assert [(j.bundle, j.manifest_sha256) for j in seen] == [(str(link), sha256_file(demo_bundle / "manifest.json"))]


@pytest.mark.parametrize("name", [RECORD, SHARDS, LOCK])
def test_an_input_named_as_the_corpus_keeps_its_own_files_is_refused(demo_bundle, tmp_path, name):
    src = tmp_path / "in" / name
    src.parent.mkdir()
    src.write_text("7\n")
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "o")
    assert r.exit_code == 1 and f"INPUT {src}: its output would be --output-dir's {name}, a name the corpus " \
                                "keeps for its own files" in r.output, r.output
    assert not (tmp_path / "o").exists()


def test_the_same_command_replaces_its_own_report_and_no_other(demo_bundle, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("7\n")
    report = tmp_path / "r.json"
    args = [demo_bundle, src, "--output-dir", tmp_path / "o", "--json", report]
    assert corpus(*args).exit_code == 0 and json.loads(report.read_text())["skipped_shards"] == 0
    r = corpus(*args)  # the same command again: the corpus is complete, its report rewritten
    assert r.exit_code == 0, r.output
    assert json.loads(report.read_text())["skipped_shards"] == 1
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "o2", "--json", report)  # another directory's report
    assert r.exit_code == 2 and f"--json {report}: already exists, and is no report of --output-dir" in r.output
    assert json.loads(report.read_text())["output_dir"] == str(tmp_path / "o") and not (tmp_path / "o2").exists()


def test_shard_files_a_crash_left_broken_are_translated_again(demo_bundle, corpus_inputs, reference, tmp_path):
    """An empty shard file, or one of zeros (what a crash can leave of a file renamed before its
    data reached the disk), is not a done shard: the next run translates it again."""
    long = corpus_inputs[0]
    out = tmp_path / "out"
    record = interrupted(demo_bundle, long, out, 30, 2)
    assert record.done() == {"0-0", "0-1", "0-2"}
    size = (out / SHARDS / "0-1.json").stat().st_size
    (out / SHARDS / "0-0.json").write_bytes(b"")
    (out / SHARDS / "0-1.json").write_bytes(bytes(size))
    assert record.done() == {"0-2"}
    r = corpus(demo_bundle, long, "--output-dir", out, "--shard-lines", 30)
    assert r.exit_code == 0, r.output
    shards = json.loads((out / RECORD).read_text())["shards"]
    assert {k for k, v in shards.items() if v["run"] == 1} == {"0-2"}
    assert (out / long.name).read_text() == reference[1, long.name]


def test_shard_files_left_by_a_run_stopped_once_complete_are_removed(demo_bundle, tmp_path):
    """A run stopped between marking the corpus complete and removing its shard files: the next
    finds it complete, checks the outputs, and removes them."""
    src = tmp_path / "in.txt"
    src.write_text("7\n")
    out = tmp_path / "o"
    assert corpus(demo_bundle, src, "--output-dir", out).exit_code == 0
    (out / SHARDS).mkdir()
    (out / SHARDS / "0-0.json").write_text('{"lines": [[["seven"], null]]}\n')
    r = corpus(demo_bundle, src, "--output-dir", out)
    assert r.exit_code == 0 and "nothing to translate" in r.output, r.output
    assert sorted(os.listdir(out)) == sorted([LOCK, RECORD, "in.txt"])


@pytest.mark.parametrize("change", ["same size", "longer"])
def test_an_input_changed_during_the_run_is_refused_before_any_output(demo_bundle, tmp_path, change):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "7"}\n{"text": "12"}\n')
    other = tmp_path / "other.txt"
    other.write_text("40512\n")
    job = cli_job(demo_bundle)
    plan = pipeline.plan_corpus([other, src], "text", 1, demo_bundle, decoding_identity(job.gen, job.text, "ort",
                                                                                        None, None))
    record = Record.open(tmp_path / "o", plan.identity, force=False)
    try:
        pipeline.translate(plan, record, pipeline.LocalPool(ShardWorker(job)), 1)
        before = src.stat().st_size
        src.write_text('{"text": "8"}\n{"text": "12"}\n' if change == "same size" else '{"text": "7"}\n' * 3)
        why = "sha256 " if change == "same size" else f"{before} bytes when it was read, {src.stat().st_size} bytes now"
        with pytest.raises(InputError, match=f"{src}: changed while the corpus was translated \\({why}"):
            pipeline.assemble(plan, record)
    finally:
        record.close()
    assert sorted(os.listdir(tmp_path / "o")) == sorted([LOCK, RECORD, SHARDS])  # other.txt's output neither


@pytest.mark.parametrize("results,fragment", [(1, "more lines than"), (3, "fewer lines than")])
def test_outputs_zipped_with_their_inputs_refuse_a_count_that_differs(tmp_path, results, fragment):
    """Writing a .jsonl or .parquet output pairs each input line with its result: one too few or
    too many is an input that changed, named, and no output."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    jsonl, parquet = tmp_path / "in.jsonl", tmp_path / "in.parquet"
    jsonl.write_text('{"text": "7"}\n{"text": "12"}\n')
    pq.write_table(pa.table({"text": ["7", "12"]}), parquet)
    for path in (jsonl, parquet):
        target = tmp_path / f"out{path.suffix}"
        with pytest.raises(InputError, match=f"{path}: changed while the corpus was translated \\(it has {fragment}"):
            formats.write(Source.of(path, "text"), target, iter([(["x"], None)] * results), 1, False)
        assert not target.exists()
