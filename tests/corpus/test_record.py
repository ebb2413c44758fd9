"""What keeps a corpus's record true across runs and crashes: its identity (the backend and
device too), the bundle every worker holds, the names the corpus keeps for itself, the --json
report of the same command."""
from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from click.testing import CliRunner

from tests.corpus.test_corpus import cli_job
from xform.cli import main
from xform.corpus import pipeline
from xform.corpus.record import LOCK, RECORD, SHARDS
from xform.corpus.worker import ShardWorker
from xform.errors import BundleError
from xform.files import sha256_file


def corpus(*args):
    return CliRunner().invoke(main, ["corpus", *map(str, args)])


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
