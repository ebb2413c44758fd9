"""`xform corpus` with run's terminology flags (--glossary, --keep, --qe; issue 56): the outputs
equal `run`'s columns, JSON lines and Parquet carry the confidence, the glossary's fingerprint is
in the record's identity (a changed glossary never takes over old shards), a term the search
cannot place is a warning of its line, and the job's terminology travels to a worker pickled."""
from __future__ import annotations

import json
import pickle

import pytest
from click.testing import CliRunner

from xform.cli import main
from xform.cli.corpus import decoding_identity
from xform.corpus import formats
from xform.corpus.record import RECORD
from xform.corpus.shards import Shard, ShardTask
from xform.corpus.worker import Job, ShardWorker, TextOptions
from xform.runtime.text.terminology import terminology

SOURCES = "7\n12\n\n7 40512\n"


def corpus(*args):
    return CliRunner().invoke(main, ["corpus", *map(str, args)])


@pytest.fixture
def files(tmp_path):
    src, glossary = tmp_path / "in.txt", tmp_path / "g.tsv"
    src.write_text(SOURCES)
    glossary.write_text("7\tseven eleven\n")
    return src, glossary


def run_columns(bundle, src, *flags) -> list[str]:
    r = CliRunner().invoke(main, ["run", str(bundle), "--input-file", str(src), *map(str, flags)])
    assert r.exit_code == 0, r.output
    return [line.split("\t", 1)[1] for line in r.stdout.splitlines()]


@pytest.mark.parametrize("flags", [["--qe"], ["--qe", "--scores", "--num-beams", 3]])
def test_text_output_is_run_s_columns_with_the_confidence_last(demo_bundle, files, tmp_path, flags):
    src, glossary = files
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "o", "--glossary", glossary, *flags)
    assert r.exit_code == 0, r.output
    got = (tmp_path / "o" / src.name).read_text().splitlines()
    assert got == run_columns(demo_bundle, src, "--glossary", glossary, *flags)
    assert got[0].startswith("seven eleven\t") and got[3].startswith("seven eleven")
    assert got[2] == ("\t" if "--scores" not in flags else "\t0.0000\t")  # a blank line: no confidence
    sure = [float(line.rsplit("\t", 1)[1]) for i, line in enumerate(got) if i != 2]
    assert all(0.0 <= s <= 1.0 for s in sure)


def test_json_lines_and_parquet_carry_the_confidence(demo_bundle, files, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    _, glossary = files
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps({"id": i, "text": t}) for i, t in enumerate(["7", "12"])) + "\n")
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "o", "--glossary", glossary, "--qe")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in (tmp_path / "o" / src.name).read_text().splitlines()]
    assert rows[0]["translation"] == "seven eleven" and rows[1]["translation"] == "twelve"
    assert all(isinstance(row["confidence"], float) and 0 <= row["confidence"] <= 1 for row in rows)
    assert "error" not in rows[0]

    par = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": ["7", None, "12"]}), par)
    r = corpus(demo_bundle, par, "--output-dir", tmp_path / "p", "--glossary", glossary, "--qe", "--num-beams", 3,
               "--num-return-sequences", 2)
    assert r.exit_code == 0, r.output
    table = pq.read_table(tmp_path / "p" / par.name).to_pydict()
    assert table["translation"][0][0] == "seven eleven" and len(table["confidence"][0]) == 2
    assert all(0 <= c <= 1 for c in table["confidence"][0] + table["confidence"][2])
    assert table["confidence"][1] == [None, None]  # a blank row has no confidence
    assert pq.read_schema(tmp_path / "p" / par.name).field("confidence").type == pa.list_(pa.float64())


def test_a_stored_translation_reads_back_whatever_it_holds():
    for stored, scores, qe, want in [("a", False, False, ("a", None, None, None)),
                                     (["a", 0.5], False, True, ("a", None, None, 0.5)),
                                     (["a", -1.0, 0.25], True, True, ("a", -1.0, None, 0.25)),
                                     (["a", -1.0, [-0.5, -0.5], 0.25], "tokens", True, ("a", -1.0, [-0.5, -0.5], 0.25)),
                                     (["a", -1.0, [-1.0]], "tokens", False, ("a", -1.0, [-1.0], None))]:
        assert formats.parts(stored, scores, qe) == want
    assert formats.text_columns([["a", -1.0, None]], None, 1, True, True) == ["a\t-1.0000\t"]
    assert formats.text_columns(None, "failed", 2, True, True) == ["\t\t", "\t\t"]
    assert formats.fields([["a", 0.5], ["b", 0.25]], None, 2, False, True) == {
        "translation": ["a", "b"], "confidence": [0.5, 0.25], "error": None}


def job_with(bundle, glossary=None, keep=(), qe=False) -> Job:
    from tests.corpus.test_corpus import cli_job  # the CLI's decoding, no flags

    job = cli_job(bundle)
    return Job(job.bundle, job.gen, TextOptions(terminology=terminology(glossary, keep), qe=qe))


def test_the_identity_holds_the_glossary_s_fingerprint(demo_bundle):
    def identity(job):
        return decoding_identity(job.gen, job.text, "ort", None, None)

    plain, seven = job_with(demo_bundle), job_with(demo_bundle, {"7": "seven eleven"})
    assert identity(plain)["text"].get("terminology") is None
    assert identity(seven)["text"]["terminology"] == seven.text.terminology.fingerprint()
    assert identity(seven) == identity(job_with(demo_bundle, {"7": "seven eleven"}))  # the same glossary again
    for other in (job_with(demo_bundle, {"7": "seven twelve"}), job_with(demo_bundle, {"7": "seven eleven"},
                                                                         keep=[r"\d{5}"]),
                  job_with(demo_bundle, {"7": "seven eleven"}, qe=True)):
        assert identity(other) != identity(seven)


def test_a_changed_glossary_never_takes_over_the_record_s_shards(demo_bundle, files, tmp_path):
    src, glossary = files
    out = tmp_path / "o"
    assert corpus(demo_bundle, src, "--output-dir", out, "--glossary", glossary).exit_code == 0
    r = corpus(demo_bundle, src, "--output-dir", out, "--glossary", glossary)
    assert r.exit_code == 0 and "nothing to translate" in r.stdout, r.output
    glossary.write_text("7\tseven twelve\n")
    r = corpus(demo_bundle, src, "--output-dir", out, "--glossary", glossary)
    assert r.exit_code == 1 and "--glossary / --keep (their fingerprint)" in r.output and "--force" in r.output
    r = corpus(demo_bundle, src, "--output-dir", out)  # no glossary: another corpus too
    assert r.exit_code == 1 and "--glossary" in r.output
    r = corpus(demo_bundle, src, "--output-dir", out, "--glossary", glossary, "--force")
    assert r.exit_code == 0, r.output
    assert (out / src.name).read_text().splitlines()[0] == "seven twelve"
    decoding = json.loads((out / RECORD).read_text())["decoding"]
    assert decoding["text"]["terminology"] == terminology(glossary).fingerprint()


def test_an_unplaceable_term_is_a_warning_of_its_line(demo_bundle, files, tmp_path):
    src, glossary = files
    glossary.write_text("7\tbanana\n")  # not in the demo's target vocabulary
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "o", "--glossary", glossary, "--keep", "4051")
    assert r.exit_code == 0, r.output
    warned = json.loads((tmp_path / "o" / RECORD).read_text())["warnings"]
    assert [w["line"] for w in warned] == [f"{src}:1", f"{src}:4"]
    assert "lacks 'banana'" in warned[0]["warning"] and "lacks 'banana', '4051'" in warned[1]["warning"]
    assert f"{src}:1: translation 1 lacks 'banana'" in r.output


def test_a_bad_glossary_and_qe_with_documents_are_refused(demo_bundle, files, tmp_path):
    src, glossary = files
    bad = tmp_path / "bad.tsv"
    bad.write_text("7\tseven\tthree\n")
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "o", "--glossary", bad)
    assert r.exit_code != 0 and f"{bad}, line 1" in r.output, r.output
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "o", "--qe", "--documents")
    assert r.exit_code == 2 and "--qe with --documents" in r.output, r.output
    assert not (tmp_path / "o").exists()


def test_the_job_s_terminology_travels_pickled_to_a_worker(demo_bundle, tmp_path):
    job = job_with(demo_bundle, {"7": "seven eleven"}, keep=[r"\{\w+\}"], qe=True)
    sent = pickle.loads(pickle.dumps(job))
    assert sent.text.terminology.fingerprint() == job.text.terminology.fingerprint()
    assert sent.text.terminology.targets("7 {name}") == ["seven eleven", "{name}"]
    worker = ShardWorker(sent)
    done = worker.translate(ShardTask(Shard(0, 0, 0, 2), ["7", "12"]))
    (first, _), (second, _) = done.lines
    assert first[0][0] == "seven eleven" and 0 <= first[0][1] <= 1 and second[0][0] == "twelve"


@pytest.mark.ray
def test_ray_workers_take_the_glossary_and_qe(ray_cluster, demo_bundle, files, tmp_path):
    """The job's terminology reaches a Ray actor (pickled with the job): its shards equal this
    process's."""
    src, glossary = files
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "local", "--glossary", glossary, "--qe")
    assert r.exit_code == 0, r.output
    r = corpus(demo_bundle, src, "--output-dir", tmp_path / "ray", "--glossary", glossary, "--qe", "--ray",
               ray_cluster.address, "--workers", 1, "--threads", 1)
    assert r.exit_code == 0, r.output
    got = (tmp_path / "ray" / src.name).read_text()
    assert got == (tmp_path / "local" / src.name).read_text() and got.startswith("seven eleven\t")
