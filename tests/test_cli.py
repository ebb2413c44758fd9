"""The command line through click's CliRunner: results, exit codes, and nothing written on error."""
import json

import pytest
from click.testing import CliRunner

from xform.cli import main
from xform.runtime.text.translator import Translator


@pytest.fixture
def runner():
    return CliRunner()


def test_export_run_check_benchmark_json(runner, checkpoint_dir, tmp_path):
    out = tmp_path / "b"
    r = runner.invoke(main, ["export", str(checkpoint_dir), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "greedy tokens identical" in r.output
    # off a terminal (a log, CI) each stage is a line as it starts, the verification's too (issue 43)
    stages = [line.split("] ", 1)[1] for line in r.output.splitlines() if line.startswith("[") and " s] " in line]
    assert stages[:2] == ["exporting", "loading model"] and any(s.startswith("exporting decoder") for s in stages)
    assert sum(s.startswith("verifying: ") for s in stages) >= 3, r.output
    js = tmp_path / "r.json"
    r = runner.invoke(main, ["run", str(out), "--backend", "ort", "--check", "--benchmark", "--batch", "2",
                             "--src-len", "6", "--new-tokens", "5", "--warmup", "1", "--iters", "2",
                             "--json", str(js)])
    assert r.exit_code == 0, r.output
    assert "check passed" in r.output and "tokens/s" in r.output and "per-token latency" in r.output
    data = json.loads(js.read_text())
    assert data["check"]["passed"] and data["check"]["identical_tokens"]
    assert data["benchmark"]["batch"] == 2 and data["benchmark"]["new_tokens"] == 5
    assert data["benchmark"]["tokens_per_s"] > 0 and data["benchmark"]["peak_rss_mib"] > 0
    # the table says which CPU it ran on (a ratio depends on it: docs/benchmarks.md)
    from xform.runtime.bench import cpu_model
    assert data["benchmark"]["machine"].startswith(cpu_model()) and f"on {cpu_model()}" in r.output
    # an existing --json is not overwritten without --force, and nothing runs
    r = runner.invoke(main, ["run", str(out), "--check", "--json", str(js)])
    assert r.exit_code == 1 and "already exists" in r.output


def test_check_fails_beyond_tolerance(runner, tiny_bundle):
    r = runner.invoke(main, ["run", str(tiny_bundle), "--check", "--atol", "1e-12", "--rtol", "0"])
    assert r.exit_code == 1
    assert "check FAILED" in r.output and "smallest passing atol" in r.output


def test_torch_backend_check(runner, tiny_bundle):
    r = runner.invoke(main, ["run", str(tiny_bundle), "--backend", "torch", "--check"])
    assert r.exit_code == 0, r.output
    assert "0.000e+00" in r.output  # the reference against itself


def test_beam_search_check_translate_and_benchmark(runner, demo_bundle, tmp_path):
    js = tmp_path / "beam.json"
    r = runner.invoke(main, ["run", str(demo_bundle), "--num-beams", "3", "--num-return-sequences", "2",
                             "--text", "40512", "--text", "7", "--check", "--benchmark", "--batch", "2",
                             "--src-len", "5", "--new-tokens", "6", "--warmup", "0", "--iters", "1", "--json", str(js)])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if "\t" in ln]
    assert lines[0] == "40512\tforty thousand five hundred twelve" and lines[2] == "7\tseven"
    assert [ln.split("\t")[0] for ln in lines] == ["40512", "40512", "7", "7"] and lines[0] != lines[1]
    data = json.loads(js.read_text())
    assert data["generation"]["num_beams"] == 3 and data["check"]["strategy"] == "beam"
    assert data["check"]["beam_hypotheses_identical"] == 1.0 and data["check"]["passed"]
    assert data["benchmark"]["strategy"] == "beam 3" and "beam hypotheses" in r.output


def test_sampling_flags_are_reproducible(runner, demo_bundle):
    args = ["run", str(demo_bundle), "--sample", "--temperature", "1.5", "--seed", "4", "--text", "123456"]
    a, b = runner.invoke(main, args), runner.invoke(main, args)
    assert a.exit_code == 0 and a.output == b.output


@pytest.mark.parametrize("flags, fragment", [
    (["--num-beams", "2", "--num-return-sequences", "3"], "--num-return-sequences 3 exceeds --num-beams 2"),
    (["--sample", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["--sample", "--temperature", "0"], "--temperature must be > 0"),
    (["--greedy", "--num-beams", "3"], "--greedy and --num-beams 3 contradict"),
    (["--sample", "--num-beams", "2"], "beam sampling is not supported"),
    (["--early-stopping", "maybe"], "'maybe' is not one of"),
    (["--temperature", "0.7"], "--temperature applies only when sampling, and this decode is greedy: add --sample"),
    (["--top-k", "5", "--seed", "3"], "--top-k, --seed apply only when sampling"),
    (["--num-beams", "2", "--top-p", "0.9"], "this decode searches with beams: add --sample"),
])
def test_bad_decoding_flags_are_usage_errors(runner, tiny_bundle, flags, fragment):
    r = runner.invoke(main, ["run", str(tiny_bundle), "--check", *flags])
    assert r.exit_code == 2 and fragment in r.output, r.output


def test_nothing_to_do_is_usage_error(runner, tiny_bundle):
    r = runner.invoke(main, ["run", str(tiny_bundle)])
    assert r.exit_code == 2 and "nothing to do" in r.output


@pytest.mark.parametrize("args, fragment", [
    (["export", "missing-dir", "-o", "{tmp}/b"], "missing-dir: no such file or directory"),
    (["export", "{tmp}", "-o", "{tmp}-b"], "config.json: missing"),
    (["export", "demo", "-o", "{tmp}/b", "--opset", "11"], "--opset 11 is too old"),
    (["run", "{tmp}", "--check"], "manifest.json: missing"),
    (["run", "{tmp}/nope", "--benchmark"], "not a directory"),
])
def test_errors_exit_1_with_message_and_write_nothing(runner, tmp_path, args, fragment):
    before = sorted(tmp_path.rglob("*"))
    r = runner.invoke(main, [a.replace("{tmp}", str(tmp_path)) for a in args])
    assert r.exit_code == 1, r.output
    assert fragment in r.output and "Traceback" not in r.output
    assert sorted(tmp_path.rglob("*")) == before


def test_corrupt_checkpoint_exit_1(runner, checkpoint_dir, tmp_path):
    import shutil
    ck = tmp_path / "ck"
    shutil.copytree(checkpoint_dir, ck)
    (ck / "model.safetensors").write_bytes(b"\x00" * 10)
    r = runner.invoke(main, ["export", str(ck), "-o", str(tmp_path / "b")])
    assert r.exit_code == 1 and "not a readable safetensors file" in r.output
    assert not (tmp_path / "b").exists()


def test_input_file_errors(runner, tiny_bundle, tmp_path):
    r = runner.invoke(main, ["run", str(tiny_bundle), "--input-file", str(tmp_path / "missing.txt")])
    assert r.exit_code == 1 and "missing.txt: no such file" in r.output
    blank = tmp_path / "in.txt"
    blank.write_text("\n  \n")
    r = runner.invoke(main, ["run", str(tiny_bundle), "--input-file", str(blank)])
    assert r.exit_code == 1 and "no tokenizer" in r.output
    r = runner.invoke(main, ["run", str(tiny_bundle), "--text", "12"])
    assert r.exit_code == 1 and "no tokenizer" in r.output


def test_input_file_dash_reads_standard_input(runner, demo_bundle, tmp_path):
    text = "7\n40512\n\n999999\n"
    f = tmp_path / "in.txt"
    f.write_text(text)
    from_file = runner.invoke(main, ["run", str(demo_bundle), "--greedy", "--input-file", str(f)])
    from_stdin = runner.invoke(main, ["run", str(demo_bundle), "--greedy", "--input-file", "-"], input=text)
    assert from_file.exit_code == 0 and from_stdin.exit_code == 0, from_stdin.output
    assert from_stdin.output == from_file.output and len(from_stdin.output.splitlines()) == 4


def test_input_file_reads_named_pipes_and_process_substitution(runner, demo_bundle, tmp_path):
    """A named pipe, or the /dev/fd/N path bash's <(command) gives, is read as a file; a directory
    is called one."""
    import os
    import threading

    text = "7\n40512\n"
    want = runner.invoke(main, ["run", str(demo_bundle), "--greedy", "--input-file", "-"], input=text).output
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def write():
        with open(fifo, "w") as f:
            f.write(text)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    r = runner.invoke(main, ["run", str(demo_bundle), "--greedy", "--input-file", str(fifo)])
    if writer.is_alive():  # the run never opened the pipe: open it here so the writer ends
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
    writer.join(10)
    assert r.exit_code == 0 and r.output == want and len(want.splitlines()) == 2, r.output
    if os.path.isdir("/dev/fd"):  # <(printf ...) is the read end of a pipe, as /dev/fd/N
        read, write_end = os.pipe()
        os.write(write_end, text.encode())
        os.close(write_end)
        try:
            r = runner.invoke(main, ["run", str(demo_bundle), "--greedy", "--input-file", f"/dev/fd/{read}"])
        finally:
            os.close(read)
        assert r.exit_code == 0 and r.output == want, r.output
    r = runner.invoke(main, ["run", str(demo_bundle), "--input-file", str(tmp_path)])
    assert r.exit_code == 1 and f"--input-file {tmp_path}: is a directory" in r.output, r.output


def test_a_mistyped_model_path_with_state_dict_flags_says_no_such_file(runner, tmp_path):
    r = runner.invoke(main, ["export", str(tmp_path / "modle.pt"), "-o", str(tmp_path / "b"), "--n-heads", "4"])
    assert r.exit_code == 1 and "modle.pt: no such file or directory" in r.output, r.output
    assert "only go with" not in r.output


def test_run_warns_on_lines_of_mostly_unknown_tokens(runner, demo_bundle, tmp_path):
    r = runner.invoke(main, ["run", str(demo_bundle), "--greedy", "--text", "40512", "--text", "hello",
                             "--text", "12x"])
    assert r.exit_code == 0, r.output
    warnings = [line for line in r.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "--text 2: 5 of its 5 source tokens are unknown" in warnings[0], r.output
    assert sum("\t" in line for line in r.output.splitlines()) == 3  # all three translated
    f = tmp_path / "in.txt"
    f.write_text("7\n" + "abc\n" * 12)  # past the first ten, counted rather than named
    r = runner.invoke(main, ["run", str(demo_bundle), "--greedy", "--input-file", str(f)])
    warnings = [line for line in r.output.splitlines() if line.startswith("warning:")]
    assert r.exit_code == 0 and len(warnings) == 11, r.output
    assert f"{f}:2:" in warnings[0] and "12 warnings in all" in warnings[-1]


def test_scores_on_the_command_line_for_beams_and_samples(runner, demo_bundle, tmp_path):
    import xform
    session = xform.load(demo_bundle)
    texts = ["40512", "7", "999"]
    src = Translator(session).policy.encode_texts(texts)
    for flags, settings in ((["--num-beams", "4", "--num-return-sequences", "2"],
                             dict(num_beams=4, num_return_sequences=2)),
                            (["--sample", "--seed", "5", "--num-return-sequences", "3", "--top-k", "5"],
                             dict(do_sample=True, seed=5, num_return_sequences=3, top_k=5))):
        js = tmp_path / f"{flags[0]}.json"
        r = runner.invoke(main, ["run", str(demo_bundle), "--scores", "--json", str(js), *flags,
                                 *[a for t in texts for a in ("--text", t)]])
        assert r.exit_code == 0, r.output
        rows = [line.split("\t") for line in r.output.splitlines()]
        ids, scores = session.generate(src, return_scores=True, **settings)
        assert [row[1] for row in rows] == [session.tokenizer.decode(i) for i in ids]
        assert [float(row[2]) for row in rows] == pytest.approx(scores.tolist(), abs=1e-4)
        assert [t["score"] for t in json.loads(js.read_text())["translations"]] == pytest.approx(scores.tolist())
        assert len(set(row[2] for row in rows)) > 1
    r = runner.invoke(main, ["run", str(demo_bundle), "--scores", "--benchmark"])
    assert r.exit_code == 2 and "--scores goes with --text / --input-file" in r.output


def test_version_moves_with_the_bundle_format(runner):
    import importlib.metadata

    from xform import __version__
    from xform.manifest import VERSION
    r = runner.invoke(main, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"xform {__version__} (bundle format {VERSION})"
    assert int(__version__.split(".")[1]) == VERSION  # the minor number is the bundle format
    assert importlib.metadata.version("xform") == __version__  # one version: pyproject reads this one


def test_truncate_cuts_a_long_line_to_max_len_with_a_warning(runner, demo_bundle):
    """demo's max_len is 32: 40 digits + end-of-sentence fail alone, or are cut to 31 + eos."""
    digits = "1234567890" * 4
    r = runner.invoke(main, ["run", str(demo_bundle), "--greedy", "--text", digits, "--text", "7"])
    assert r.exit_code == 1 and "41 source tokens, more than the model's max_len 32" \
        in r.output, r.output
    r = runner.invoke(main, ["run", str(demo_bundle), "--greedy", "--truncate", "--text", digits, "--text", "7"])
    assert r.exit_code == 0, r.output
    assert "warning: --text 1: 41 source tokens cut to the model's max_len 32 (--truncate)" in r.output
    cut = runner.invoke(main, ["run", str(demo_bundle), "--greedy", "--text", digits[:31]])
    translations = [line.split("\t")[1] for line in r.output.splitlines() if "\t" in line]
    assert translations[0] == cut.output.strip().split("\t")[1] and len(translations) == 2


def test_decoding_controls_on_the_command_line(runner, demo_bundle, tmp_path):
    """--target-prefix per --text, --prefix-column in a file, the repetition controls, --bad-words,
    --suppress-tokens, --alternatives and --token-scores: each line as the Python API gives it."""
    import xform
    session = xform.load(demo_bundle)
    texts = ["40512", "123456"]
    r = runner.invoke(main, ["run", str(demo_bundle), "--text", texts[0], "--target-prefix", "forty one",
                             "--text", texts[1], "--target-prefix", ""])
    assert r.exit_code == 0, r.output
    want = [Translator(session).translate([texts[0]], target_prefix=["forty one"])[0], Translator(session).translate([texts[1]])[0]]
    assert [line.split("\t")[1] for line in r.output.splitlines()] == want and want[0].startswith("forty one")
    f = tmp_path / "in.tsv"
    f.write_text("40512\tforty one\n7\t\n123456\tone hundred twenty four\n")
    r = runner.invoke(main, ["run", str(demo_bundle), "--input-file", str(f), "--prefix-column"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == [
        f"40512\t{want[0]}", f"7\t{Translator(session).translate(['7'])[0]}",
        f"123456\t{Translator(session).translate(['123456'], target_prefix=['one hundred twenty four'])[0]}"]
    flags = ["--repetition-penalty", "3.0", "--no-repeat-ngram-size", "1", "--bad-words", "thousand",
             "--suppress-tokens", "5,6"]
    r = runner.invoke(main, ["run", str(demo_bundle), "--text", texts[1], "--token-scores", *flags])
    assert r.exit_code == 0, r.output
    ids, score, tokens = session.generate(
        Translator(session).policy.encode_texts([texts[1]]), repetition_penalty=3.0, no_repeat_ngram_size=1, suppress_tokens=[5, 6],
        bad_words_ids=[Translator(session).policy.target_ids("thousand")], return_token_scores=True)
    row = r.output.splitlines()[0].split("\t")
    assert row[1] == session.tokenizer.decode(ids[0]) != Translator(session).translate([texts[1]])[0]
    assert float(row[2]) == pytest.approx(float(score[0]), abs=1e-4)
    assert [float(v) for v in row[3].split()] == pytest.approx(tokens[0][ids[0] != session.pad_id].tolist(), abs=1e-4)
    r = runner.invoke(main, ["run", str(demo_bundle), "--text", texts[0], "--target-prefix", "forty",
                             "--alternatives", "--num-return-sequences", "3"])
    assert r.exit_code == 0, r.output
    alts = [line.split("\t")[1] for line in r.output.splitlines()]
    assert len(alts) == 3 and len(set(alts)) == 3 and all(a.startswith("forty") for a in alts)


@pytest.mark.parametrize("flags, fragment", [
    (["--text", "1", "--target-prefix", "a", "--target-prefix", "b"], "--target-prefix is given 2 times for 1 --text"),
    (["--text", "1", "--prefix-column"], "--prefix-column reads --input-file lines"),
    (["--text", "1", "--suppress-tokens", "5,x"], "expected comma-separated token ids"),
    (["--text", "1", "--bad-word-ids", ","], "expected at least one token id"),
    (["--text", "1", "--repetition-penalty", "0"], "--repetition-penalty must be a number > 0"),
    (["--text", "1", "--no-repeat-ngram-size", "-1"], "--no-repeat-ngram-size must be"),
    (["--text", "1", "--suppress-tokens", "99999"], "--suppress-tokens: ids [99999] are outside"),
    (["--text", "1", "--alternatives", "--num-return-sequences", "2", "--num-beams", "2"],
     "continues each alternative greedily"),
])
def test_bad_control_flags_are_usage_errors(runner, demo_bundle, flags, fragment):
    r = runner.invoke(main, ["run", str(demo_bundle), *flags])
    assert r.exit_code == 2 and fragment in r.output, r.output


def test_export_with_attention_and_replace_unknowns(runner, demo_bundle, tmp_path):
    """export --with-attention records the layer and adds the decoder's attention output; run
    --replace-unknowns needs it (a usage error on a plain bundle) and otherwise translates."""
    import xform
    out = tmp_path / "aligned"
    r = runner.invoke(main, ["export", "demo", "-o", str(out), "--with-attention", "--attention-layer", "0"])
    assert r.exit_code == 0, r.output
    session = xform.load(out)
    assert session.bundle.manifest.attention_layer == 0
    assert "attention" in session.bundle.graph_spec("decoder").output_names
    r = runner.invoke(main, ["run", str(out), "--text", "40512", "--replace-unknowns"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == [f"40512\t{xform.Translator(demo_bundle).translate(['40512'])[0]}"]
    r = runner.invoke(main, ["run", str(demo_bundle), "--text", "40512", "--replace-unknowns"])
    assert r.exit_code == 2 and "(xform export MODEL -o BUNDLE --with-attention)" in r.output, r.output
    r = runner.invoke(main, ["export", "demo", "-o", str(tmp_path / "x"), "--attention-layer", "0"])
    assert r.exit_code == 2 and "--attention-layer goes with --with-attention" in r.output


def test_export_help_names_the_hugging_face_families_it_imports(runner):
    r = runner.invoke(main, ["export", "--help"])
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    for family in ("Marian / OPUS-MT", "M2M100", "NLLB", "mBART / mBART-50", "BART"):
        assert family in text, family


def test_ctrl_c_exits_130_quietly(demo_bundle):
    """SIGINT while `run --input-file -` waits on a pipe that stays open: exit 130 (128 + SIGINT),
    one short line on stderr, no traceback and no click "Aborted!"."""
    import os
    import select
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    xform_bin = str(Path(sys.executable).parent / "xform")
    proc = subprocess.Popen([xform_bin, "run", str(demo_bundle), "--input-file", "-", "--batch-size", "1",
                             "--read-ahead", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        proc.stdin.write(b"7\n")
        proc.stdin.flush()
        deadline, seen = time.monotonic() + 60, b""
        while b"\n" not in seen and time.monotonic() < deadline:  # its first line: it is running
            if select.select([proc.stdout], [], [], 1)[0]:
                seen += os.read(proc.stdout.fileno(), 1024) or b"\n"
        assert seen.startswith(b"7\tseven\n"), seen
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)  # closes stdin only after the signal
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr.decode() and "Aborted" not in stderr.decode()
    assert stderr.decode().strip() == "interrupted"


def test_check_with_an_input_file_says_how_many_lines_it_compares(runner, demo_bundle, tmp_path, monkeypatch):
    """--check compares the first --check-lines (default 32) translated lines, not blank ones, and
    says so; the --json report records both counts."""
    import xform.exporter.check

    compared, check = [], xform.exporter.check.check

    def spy(*args, texts=None, **kwargs):
        compared.append(len(texts or []))
        return check(*args, texts=texts, **kwargs)

    monkeypatch.setattr(xform.exporter.check, "check", spy)
    f = tmp_path / "in.txt"
    f.write_text("\n".join(str(n * 37) for n in range(40)) + "\n\n")
    r = runner.invoke(main, ["run", str(demo_bundle), "--input-file", str(f), "--check", "--json",
                             str(tmp_path / "r.json")])
    assert r.exit_code == 0 and "check on 32 of the 40 translated lines" in r.output, r.output
    assert json.loads((tmp_path / "r.json").read_text())["check"]["lines_compared"] == 32
    r = runner.invoke(main, ["run", str(demo_bundle), "--input-file", str(f), "--check", "--check-lines", "50"])
    assert r.exit_code == 0 and "check on all 40 translated lines" in r.output, r.output
    assert compared == [32, 40]
    r = runner.invoke(main, ["run", "--help"])
    check_lines_help = " ".join(r.output.split()).split("--check-lines INTEGER RANGE", 1)[1].split("--atol")[0]
    assert "[default: 32;" in check_lines_help, check_lines_help


def test_tgt_lang_with_forced_bos_id_is_refused_before_the_tokenizer_is_asked_for(tiny_bundle):
    """A bundle without a tokenizer: --tgt-lang with --forced-bos-id is the two-names refusal (the
    no-tokenizer one would advise giving --forced-bos-id, which was given); --tgt-lang alone is the
    no-tokenizer one, saying what to give instead."""
    r = CliRunner().invoke(main, ["run", str(tiny_bundle), "--check", "--tgt-lang", "fr", "--forced-bos-id", "5"])
    assert r.exit_code == 2 and "--tgt-lang and --forced-bos-id both name the first token" in r.output, r.output
    r = CliRunner().invoke(main, ["run", str(tiny_bundle), "--check", "--tgt-lang", "fr"])
    assert r.exit_code == 2 and "this bundle has no tokenizer, so no languages (give --forced-bos-id" in r.output
