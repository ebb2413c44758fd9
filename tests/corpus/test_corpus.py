"""`xform corpus` in this process (no --ray): the outputs equal `run --input-file`'s, formats,
the record's refusals and resume, bad input. The same pipeline runs on Ray in test_ray.py."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from xform.cli import main
from xform.cli.corpus import decoding_identity
from xform.corpus import pipeline
from xform.corpus.record import RECORD, SHARDS, Record
from xform.corpus.worker import Job, ShardWorker, TextOptions


def corpus(*args) -> "CliRunner":
    return CliRunner().invoke(main, ["corpus", *map(str, args)])


def outputs(directory, inputs) -> dict:
    return {p.name: (directory / p.name).read_text() for p in inputs}


@pytest.mark.parametrize("beams", [1, 4])
def test_outputs_equal_run_input_file_line_for_line(demo_bundle, corpus_inputs, reference, tmp_path, beams):
    out = tmp_path / "out"
    r = corpus(demo_bundle, *corpus_inputs, "--output-dir", out, "--num-beams", beams, "--shard-lines", 40,
               "--json", tmp_path / "r.json")
    assert r.exit_code == 0, r.output
    assert outputs(out, corpus_inputs) == {p.name: reference[beams, p.name] for p in corpus_inputs}
    record = json.loads((out / RECORD).read_text())
    assert record["complete"] and not (out / SHARDS).exists()  # the shards' files go once assembled
    assert [i["lines"] for i in record["inputs"]] == [230, 7, 1, 0] and len(record["shards"]) == 6 + 1 + 1
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["translated"]["lines"] == 238 and report["translated"]["sentences_per_s"] > 0
    assert report["generation"]["num_beams"] == beams and report["failed"] == []
    assert "sentences/s" in r.stdout and "tokens/s" in r.stdout


def test_scores_are_a_column_as_run_prints_them(demo_bundle, corpus_inputs, tmp_path):
    short = corpus_inputs[1]
    r = corpus(demo_bundle, short, "--output-dir", tmp_path / "o", "--scores", "--num-beams", 4)
    assert r.exit_code == 0, r.output
    ran = CliRunner().invoke(main, ["run", str(demo_bundle), "--input-file", str(short), "--scores", "--num-beams",
                                    "4"])
    assert (tmp_path / "o" / short.name).read_text().splitlines() == [
        line.split("\t", 1)[1] for line in ran.stdout.splitlines()]


def test_a_rerun_resumes_only_the_missing_shards(demo_bundle, corpus_inputs, reference, tmp_path):
    """A driver stopped after two shards (Ctrl-C from the pool): the same command then translates
    the other shards only, as the record shows, and the outputs are those of one whole run."""
    long = corpus_inputs[0]
    out = tmp_path / "out"
    r = corpus(demo_bundle, long, "--output-dir", out, "--shard-lines", 30, "--json", tmp_path / "1.json")
    assert r.exit_code == 0
    whole = (out / long.name).read_text()
    out2 = tmp_path / "out2"
    job = cli_job(demo_bundle)
    plan = pipeline.plan_corpus([long], "text", 30, demo_bundle, decoding_identity(job.gen, job.text, "ort", None,
                                                                                   None))
    record = Record.open(out2, plan.identity, force=False)

    def stop_after_two(result):
        if result.shard.index == 1:
            raise KeyboardInterrupt

    run = record.begin_run({"interrupted": True})
    with pytest.raises(KeyboardInterrupt):
        pipeline.translate(plan, record, pipeline.LocalPool(ShardWorker(job)), run, stop_after_two)
    record.close()
    assert record.done() == {"0-0", "0-1"}
    r = corpus(demo_bundle, long, "--output-dir", out2, "--shard-lines", 30)
    assert r.exit_code == 0, r.output
    assert "translated 170 lines in 6 shards (2 shards done by an earlier run)" in r.stdout
    rec = json.loads((out2 / RECORD).read_text())
    assert {k for k, v in rec["shards"].items() if v["run"] == 1} == {"0-0", "0-1"}
    assert sorted(v["run"] for v in rec["shards"].values()) == [1, 1] + [2] * 6
    assert [r["shards_done_before"] for r in rec["runs"][1:]] == [2]
    assert (out2 / long.name).read_text() == whole == reference[1, long.name]


def cli_job(bundle) -> Job:
    """The Job `xform corpus BUNDLE ...` makes with no decoding flags (so its record is the CLI's)."""
    import xform
    from xform.cli.options import decoding_for, generation_settings
    from xform.runtime.text.translator import Translator

    gen, _ = decoding_for(Translator(xform.load(bundle)), bundle, "ort", generation_settings(False), True, None, TextOptions())
    return Job(str(bundle), gen, TextOptions())


def test_a_finished_corpus_is_not_translated_again_and_a_changed_flag_is_refused(demo_bundle, corpus_inputs,
                                                                                 reference, tmp_path):
    short = corpus_inputs[1]
    out = tmp_path / "out"
    assert corpus(demo_bundle, short, "--output-dir", out).exit_code == 0
    r = corpus(demo_bundle, short, "--output-dir", out)
    assert r.exit_code == 0 and "complete (7 lines in 1 files); nothing to translate" in r.stdout, r.output
    before = (out / RECORD).read_text()
    r = corpus(demo_bundle, short, "--output-dir", out, "--num-beams", 4)
    assert r.exit_code == 1 and "--num-beams: 1 then, 4 now" in r.output and "--force" in r.output, r.output
    assert (out / RECORD).read_text() == before and (out / short.name).read_text() == reference[1, short.name]
    r = corpus(demo_bundle, short, "--output-dir", out, "--num-beams", 4, "--force")
    assert r.exit_code == 0, r.output
    assert (out / short.name).read_text() == reference[4, short.name]
    assert json.loads((out / RECORD).read_text())["decoding"]["generation"]["num_beams"] == 4
    (out / short.name).write_text("edited\n")  # an output changed after the corpus completed
    r = corpus(demo_bundle, short, "--output-dir", out, "--num-beams", 4)
    assert r.exit_code == 1 and "missing or changed since this corpus was completed" in r.output


def test_a_changed_input_is_refused_naming_it(demo_bundle, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("1\n2\n")
    assert corpus(demo_bundle, src, "--output-dir", tmp_path / "o").exit_code == 0
    src.write_text("1\n3\n")
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "o")
    assert r.exit_code == 1 and f"{src}: its content changed" in r.output, r.output


@pytest.mark.parametrize("case", ["other corpus", "foreign file", "a file", "holds the input", "missing input",
                                  "a directory as input"])
def test_output_dirs_and_inputs_refused_by_name(demo_bundle, tmp_path, case):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("1\n")
    b.write_text("2\n")
    out = tmp_path / "out"
    args, fragment = [a, "--output-dir", out], ""
    if case == "other corpus":
        assert corpus(demo_bundle, b, "--output-dir", out).exit_code == 0
        args, fragment = [a, "--output-dir", out, "--force"], "holds the record of another corpus (inputs b.txt"
    elif case == "foreign file":
        out.mkdir()
        (out / "thesis.tex").write_text("years of work")
        args, fragment = [a, "--output-dir", out, "--force"], "holds files xform did not write (thesis.tex)"
    elif case == "a file":
        out.write_text("x")
        fragment = "is a file"
    elif case == "holds the input":
        args, fragment = [a, "--output-dir", tmp_path], f"INPUT {a} is inside it"
    elif case == "missing input":
        args, fragment = [tmp_path / "nope.txt", "--output-dir", out], "nope.txt: no such file"
    else:
        (tmp_path / "texts").mkdir()
        args, fragment = [tmp_path / "texts", "--output-dir", out], "texts: is a directory; expected a file"
    before = sorted((p.name, p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file())
    r = corpus(demo_bundle, *args)
    assert r.exit_code in (1, 2) and fragment in r.output, r.output
    assert "Traceback" not in r.output
    assert sorted((p.name, p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file()) == before


def test_a_run_in_progress_holds_the_directory(demo_bundle, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("1\n")
    code = ("import sys; from pathlib import Path; from xform.corpus.record import take_lock; "
            "Path(sys.argv[1]).mkdir(); take_lock(Path(sys.argv[1])); print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "o")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:  # the holder keeps the lock until its standard input closes
        assert holder.stdout.readline().strip() == "held"
        r = corpus(demo_bundle, src, "--output-dir", tmp_path / "o")
        assert r.exit_code == 1 and f"another xform corpus (pid {holder.pid}) is translating it now" in r.output
        assert holder.poll() is None  # it held the lock all along
    finally:
        holder.stdin.close()
        holder.wait(10)
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "o")  # the lock goes with its holder
    assert r.exit_code == 0 and (tmp_path / "o" / "in.txt").read_text() == "one\n", r.output


def test_undecodable_bytes_fail_alone_with_file_and_line(demo_bundle, tmp_path):
    src = tmp_path / "bytes.txt"
    src.write_bytes(b"12\n\xff\xfe 7\n\n40512\n")
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "o", "--json", tmp_path / "r.json")
    assert r.exit_code == 1
    assert f"{src}:2: not UTF-8" in r.output and "1 lines could not be translated" in r.output
    assert (tmp_path / "o" / "bytes.txt").read_text() == "twelve\n\n\nforty thousand five hundred twelve\n"
    failed = json.loads((tmp_path / "o" / RECORD).read_text())["failed"]
    assert [f["line"] for f in failed] == [f"{src}:2"] == [f["line"] for f in json.loads(
        (tmp_path / "r.json").read_text())["failed"]]


def test_a_failed_lines_error_names_the_setting_in_its_doors_words(demo_bundle, tmp_path):
    """A line over max_len fails alone; the runtime names truncate by its marker (errors.py): the
    corpus made by the CLI records its flag, xform.ray's error column the keyword."""
    import numpy as np

    from xform.ray import Translate

    src = tmp_path / "long.txt"
    src.write_text("1" * 40 + "\n7\n")
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "o")
    assert r.exit_code == 1 and f"{src}:1: 41 source tokens" in r.output, r.output
    failed = json.loads((tmp_path / "o" / RECORD).read_text())["failed"]
    assert [f["error"] for f in failed] == ["41 source tokens, more than the model's max_len 32 (--truncate to cut it)"]
    out = Translate(demo_bundle)({"text": np.array(["1" * 40], dtype=object)})
    assert list(out["error"]) == ["41 source tokens, more than the model's max_len 32 (truncate to cut it)"]


def test_json_lines_keep_their_objects_and_fail_bad_lines_alone(demo_bundle, tmp_path):
    src = tmp_path / "in.jsonl"
    lines = [json.dumps({"id": 1, "text": "12"}), "", json.dumps({"id": 2, "body": "7"}), "{not json",
             json.dumps({"id": 3, "text": "40512"}), json.dumps(["a list"])]
    src.write_bytes(("\n".join(lines) + "\n").encode() + b'{"id": 4, "text": "\xff"}\n')
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "o", "--scores")
    assert r.exit_code == 1
    got = (tmp_path / "o" / "in.jsonl").read_text().split("\n")
    assert len(got) == 8 and got[1] == "" and got[7] == ""
    first, third = json.loads(got[0]), json.loads(got[4])
    assert first["id"] == 1 and first["translation"] == "twelve" and first["score"] < 0 and "error" not in first
    assert third == {"id": 3, "text": "40512", "translation": "forty thousand five hundred twelve",
                     "score": third["score"]}
    bad = [json.loads(got[i]) for i in (2, 3, 5, 6)]
    assert [b["translation"] for b in bad] == [""] * 4 and bad[0]["id"] == 2
    assert "field 'text': expected a string, found no such field" in bad[0]["error"]
    assert "not JSON" in bad[1]["error"] and "expected a JSON object" in bad[2]["error"]
    assert "not UTF-8" in bad[3]["error"] and "error" in bad[3]
    assert f"{src}:3: field 'text'" in r.output and f"{src}:7: not UTF-8" in r.output


def test_parquet_gets_translation_columns(demo_bundle, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3, 4], "sentence": ["12", None, "7", "40512"]}), src, row_group_size=3)
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "o", "--field", "sentence", "--num-beams", 4,
               "--num-return-sequences", 2, "--shard-lines", 3)
    assert r.exit_code == 0, r.output
    table = pq.read_table(tmp_path / "o" / "in.parquet").to_pydict()
    assert table["id"] == [1, 2, 3, 4] and table["sentence"] == ["12", None, "7", "40512"]
    ran = CliRunner().invoke(main, ["run", str(demo_bundle), "--text", "12", "--text", "7", "--text", "40512",
                                    "--num-beams", "4", "--num-return-sequences", "2"])
    pairs = [line.split("\t")[1] for line in ran.stdout.splitlines()]
    assert table["translation"] == [pairs[0:2], ["", ""], pairs[2:4], pairs[4:6]]
    assert table["error"] == [None] * 4
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "o2")  # the column --field names is not there
    assert r.exit_code == 1 and "no column 'text' (--field names the text); columns: id, sentence" in r.output


def test_without_ray_installed_ray_is_asked_for_by_its_extra(demo_bundle, tmp_path):
    """--ray without Ray names the extra and exits 1; without --ray the corpus needs no Ray."""
    src = tmp_path / "in.txt"
    src.write_text("7\n")
    code = ("import sys; sys.modules['ray'] = None; from xform.cli import main; "
            "main(['corpus', sys.argv[1], sys.argv[2], '--output-dir', sys.argv[3], *sys.argv[4:]])")
    base = [sys.executable, "-c", code, str(demo_bundle), str(src)]
    r = subprocess.run([*base, str(tmp_path / "a"), "--ray", "local"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and 'pip install -e ".[ray]"' in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "a").exists()  # refused before --output-dir is made
    r = subprocess.run([*base, str(tmp_path / "b")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and (tmp_path / "b" / "in.txt").read_text() == "seven\n", r.stderr


def test_flags_that_need_ray_or_more_cpus_are_refused(demo_bundle, tmp_path):
    import os

    src = tmp_path / "in.txt"
    src.write_text("7\n")
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "o", "--workers", 2)
    assert r.exit_code == 2 and "--workers 2 runs Ray actors: give --ray" in r.output
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "o", "--threads", (os.cpu_count() or 1) + 1)
    assert r.exit_code == 1 and "--oversubscribe" in r.output and not (tmp_path / "o").exists()


def test_ray_data_translate_block_without_ray(demo_bundle):
    """xform.ray.Translate is a plain callable on a batch (Ray Data's numpy format): called here
    directly; test_ray.py runs it in a Ray Data pipeline."""
    import numpy as np

    from xform.ray import Translate

    t = Translate(demo_bundle, num_beams=4, return_scores=True)
    out = t({"id": np.array([1, 2, 3]), "text": np.array(["40512", "", "7"], dtype=object)})
    assert list(out["id"]) == [1, 2, 3] and list(out["translation"]) == ["forty thousand five hundred twelve", "",
                                                                          "seven"]
    assert list(out["error"]) == [None] * 3 and out["score"][0] < 0
    out = t({"text": np.array([b"\xff", "7"], dtype=object)})
    assert list(out["translation"]) == ["", "seven"] and out["error"][0].startswith("not UTF-8")
    strict = Translate(demo_bundle, error_column=None, beam_size=2)  # CTranslate2's name for num_beams
    with pytest.raises(Exception, match="line 0 of the batch: not UTF-8"):
        strict({"text": np.array([b"\xff"], dtype=object)})
    with pytest.raises(Exception, match="no column 'text'"):
        strict({"sentence": np.array(["7"], dtype=object)})


def test_the_progress_bar_on_a_terminal(demo_bundle, corpus_inputs, tmp_path, monkeypatch):
    """On a terminal, stderr shows lines done, sentences/s, shards done and the workers."""
    import io

    from rich.console import Console

    import xform.cli.corpus as cli_corpus

    screen = io.StringIO()
    monkeypatch.setattr(cli_corpus, "err", Console(file=screen, force_terminal=True, width=200))
    r = corpus(demo_bundle, *corpus_inputs[:2], "--output-dir", tmp_path / "o", "--shard-lines", 100)
    assert r.exit_code == 0, r.output
    shown = screen.getvalue()
    assert "lines" in shown and "sentences/s" in shown and "shards 4/4" in shown and "1 worker" in shown


def test_an_address_where_nothing_listens_and_an_existing_report_are_refused_at_once(demo_bundle, tmp_path):
    pytest.importorskip("ray")  # the session's Ray token is set before any import (tests/ray_cluster.py)
    src = tmp_path / "in.txt"
    src.write_text("7\n")
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "o", "--ray", "127.0.0.1:1")
    assert r.exit_code == 1 and "--ray 127.0.0.1:1: nothing answers there" in r.output, r.output
    (tmp_path / "r.json").write_text("{}")
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "o", "--json", tmp_path / "r.json")
    assert r.exit_code == 2 and "--force replaces it, and also starts the corpus over" in r.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("error,fragment", [
    (ConnectionError("Could not find any running Ray instance."), "--ray auto: no Ray cluster to join"),
    (RuntimeError("Traceback ...\n  raise\nThe authentication token is invalid."),
     "--ray auto: Ray could not join the cluster at auto (RuntimeError: The authentication token is invalid.); a "
     "cluster started with a token")])
def test_ray_failing_to_join_is_said_naming_the_flag(error, fragment):
    """Whatever ray.init raises (no cluster, a refused token, a version mismatch) is an error naming
    --ray and Ray's reason in a line, never a traceback."""
    from types import SimpleNamespace

    from xform.corpus.cluster import join
    from xform.errors import XformError

    def init(**_):
        raise error

    with pytest.raises(XformError) as e:
        join(SimpleNamespace(init=init), "auto", "auto")
    assert fragment in str(e.value) and "RAY_AUTH_TOKEN" in str(e.value)


def test_workers_on_gpus_reserve_one_each():
    from xform.corpus.cluster import worker_gpus
    from xform.errors import XformError

    assert worker_gpus(False, 4, 0, False) == 0
    assert worker_gpus(True, 2, 4, False) == 1.0 and worker_gpus(True, 4, 2, True) == 0.5
    with pytest.raises(XformError, match="the cluster has no GPU"):
        worker_gpus(True, 1, 0, False)
    with pytest.raises(XformError, match="--workers 3 decoding on GPUs, and the cluster has 2"):
        worker_gpus(True, 3, 2, False)
