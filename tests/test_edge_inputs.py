"""Inputs at the edges: what `run --text / --input-file` and `translate_lines` give a user for
blank lines, unknown characters, sources at and past max_len, non-UTF-8 lines, large files."""
import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

import xform
from xform.cli import main
from xform.runtime.decoding.request import LineResult
from xform.runtime.scheduling.batching import Batching
from xform.runtime.text.translator import Translator


@pytest.fixture(scope="module")
def demo(demo_bundle):
    return xform.load(demo_bundle, backend="ort")


def run(bundle, *args):
    return CliRunner().invoke(main, ["run", str(bundle), *args])


def test_every_input_line_gets_one_output_line_in_order(demo_bundle, tmp_path):
    f = tmp_path / "in.txt"
    f.write_bytes(b"40512\n\n   \n\xff\xfe bad\n7\r\n" + b"9" * 31 + b"\n" + b"9" * 32 + b"\n12")
    r = run(demo_bundle, "--input-file", str(f), "--text", "", "--batch-size", "2", "--json", str(tmp_path / "r.json"))
    assert r.exit_code == 1  # some lines failed
    out = [line for line in r.stdout.splitlines()]
    assert out == ["\t", "40512\tforty thousand five hundred twelve", "\t", "   \t", "\ufffd\ufffd bad\t", "7\tseven",
                   f"{'9' * 31}\t{out[6].split(chr(9))[1]}", f"{'9' * 32}\t", "12\ttwelve"]
    assert out[6].split("\t")[1]  # 31 digits + end-of-sentence = max_len 32: translated
    assert f"{f}:4: not UTF-8" in r.stderr
    assert f"{f}:7: 33 source tokens, more than the model's max_len 32 (--truncate to cut it)" in r.stderr
    assert "2 of 9 lines could not be translated" in r.stderr
    report = json.loads((tmp_path / "r.json").read_text())["translations"]
    assert len(report) == 9 and report[4]["error"].startswith("not UTF-8") and report[8]["target"] == "twelve"


def test_characters_outside_a_vocabulary_without_unk_fail_alone(demo, monkeypatch):
    monkeypatch.setattr(demo.tokenizer.src, "unk", None)
    results = list(Translator(demo).translate_lines(["12", "1x2", "7"], demo.generation_config(10)))
    assert results[0] == LineResult("12", ["twelve"]) and results[2] == LineResult("7", ["seven"])
    assert results[1].hypotheses == [] and "'x' is not in the source vocabulary and it has no <unk>" in \
        results[1].error


def test_a_thousand_lines_stream_in_windows_and_keep_their_order(demo, demo_bundle, tmp_path):
    numbers = [str(n) for n in np.random.default_rng(3).integers(0, 1_000_000, 1000)]
    consumed = []

    def lines():
        for n in numbers:
            consumed.append(n)
            yield n

    results = Translator(demo).translate_lines(lines(), demo.generation_config(16), Batching(batch_size=64))
    first = next(results)
    assert len(consumed) == 8 * 64  # one window (read_ahead 8 batches) read, no more: not the file
    got = [first.hypotheses[0]] + [r.hypotheses[0] for r in results]
    assert got == Translator(demo).translate(numbers, max_new_tokens=16)
    f = tmp_path / "many.txt"
    f.write_text("\n".join(numbers) + "\n")
    r = run(demo_bundle, "--input-file", str(f), "--batch-size", "100", "--max-new-tokens", "16")
    assert r.exit_code == 0
    assert [line.split("\t") for line in r.stdout.splitlines()] == [[n, t] for n, t in zip(numbers, got)]


def test_max_new_tokens_zero_and_batch_size_zero_are_usage_errors(demo_bundle):
    r = run(demo_bundle, "--text", "12", "--max-new-tokens", "0")
    assert r.exit_code == 2 and "--max-new-tokens" in r.output
    r = run(demo_bundle, "--text", "12", "--batch-size", "0")
    assert r.exit_code == 2 and "--batch-size" in r.output


def test_token_batches_from_the_command_line_keep_one_line_per_input_line(demo, demo_bundle, tmp_path):
    rng = np.random.default_rng(5)
    numbers = [str(rng.integers(10 ** (k - 1), 10 ** k)) for k in rng.integers(1, 13, 200)]  # 1 to 12 digits
    lines = numbers[:50] + ["", "4" * 40] + numbers[50:]
    f = tmp_path / "in.txt"
    f.write_text("\n".join(lines) + "\n")
    r = run(demo_bundle, "--input-file", str(f), "--batch-type", "tokens", "--max-batch-tokens", "40",
            "--read-ahead", "3", "--max-new-tokens", "24")
    assert r.exit_code == 1, r.output  # 41 tokens: more than max_len
    expected = [t[0] for t in (Translator(demo).translate([n], max_new_tokens=24) for n in numbers)]
    assert r.stdout.splitlines() == ([f"{n}\t{t}" for n, t in zip(numbers[:50], expected)] + ["\t", "4" * 40 + "\t"]
                                     + [f"{n}\t{t}" for n, t in zip(numbers[50:], expected[50:])])
    assert f"{f}:52:" in r.stderr and "1 of 202 lines could not be translated" in r.stderr


@pytest.mark.parametrize("flags, fragment", [
    (["--max-batch-tokens", "0"], "'--max-batch-tokens': 0 is not in the range x>=1"),
    (["--read-ahead", "0"], "'--read-ahead': 0 is not in the range x>=1"),
    (["--batch-type", "words"], "'words' is not one of 'examples', 'tokens'"),
    (["--batch-type", "tokens"], "--batch-type tokens needs --max-batch-tokens"),
    (["--batch-type", "examples", "--max-batch-tokens", "64"], "--max-batch-tokens goes with --batch-type tokens"),
])
def test_bad_batching_flags_are_usage_errors(demo_bundle, flags, fragment):
    r = run(demo_bundle, "--text", "12", *flags)
    assert r.exit_code == 2 and fragment in r.output, r.output


def test_max_batch_tokens_implies_token_batches(demo_bundle, monkeypatch):
    from xform.runtime.session import Session

    shapes, run_request = [], Session.run

    def spy(self, request, *args, **kwargs):
        shapes.append(request.src_ids.shape)
        return run_request(self, request, *args, **kwargs)

    monkeypatch.setattr(Session, "run", spy)
    r = run(demo_bundle, "--text", "12", "--text", "40512", "--max-batch-tokens", "6")
    assert r.exit_code == 0 and r.stdout == "12\ttwelve\n40512\tforty thousand five hundred twelve\n"
    assert shapes == [(1, 6), (1, 3)]  # 2 x 6 tokens would exceed 6: longest first, one a batch


def test_a_progress_bar_only_on_a_terminal(demo_bundle, tmp_path, monkeypatch):
    from io import StringIO

    from rich.console import Console

    import xform.cli.options

    f = tmp_path / "in.txt"
    f.write_text("12\n\n40512\n7\n")
    r = run(demo_bundle, "--input-file", str(f))
    assert r.exit_code == 0 and r.stderr == ""  # stderr is no terminal here: quiet
    terminal = StringIO()
    monkeypatch.setattr(xform.cli.options, "err", Console(file=terminal, force_terminal=True, width=140, color_system=None,
                                                   highlight=False))
    r = run(demo_bundle, "--input-file", str(f))
    assert r.exit_code == 0 and r.stdout.splitlines()[2] == "40512\tforty thousand five hundred twelve"
    # lines done of the file's, counted first; then a summary line that stays
    assert "4/4 lines" in terminal.getvalue() and "tokens/s" in terminal.getvalue() and "left" in terminal.getvalue()
    last = terminal.getvalue().rstrip().splitlines()[-1]
    assert re.search(r"translated 4 lines in [\d.]+ s \([\d.,]+ lines/s, [\d,]+ tokens/s\)", last), last
    terminal.truncate(0)
    terminal.seek(0)
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--input-file", "-"], input=f.read_text())
    assert r.exit_code == 0 and "/? lines" in terminal.getvalue()  # a pipe's lines are unknown until read
    assert "translated 4 lines in " in terminal.getvalue().rstrip().splitlines()[-1]


def test_score_shows_progress_on_a_terminal(demo_bundle, tmp_path, monkeypatch):
    from io import StringIO

    from rich.console import Console

    import xform.cli.options

    (tmp_path / "s.txt").write_text("12\n7\n40512\n")
    (tmp_path / "t.txt").write_text("twelve\nseven\nforty thousand five hundred twelve\n")
    args = ["score", str(demo_bundle), "--source", str(tmp_path / "s.txt"), "--target", str(tmp_path / "t.txt"),
            "--batch-size", "2"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0 and r.stderr == "" and len(r.stdout.splitlines()) == 3
    terminal = StringIO()
    monkeypatch.setattr(xform.cli.options, "err", Console(file=terminal, force_terminal=True, width=140, color_system=None,
                                                   highlight=False))
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 3
    assert "3/3 pairs" in terminal.getvalue() or "2/3 pairs" in terminal.getvalue()
    last = terminal.getvalue().rstrip().splitlines()[-1]
    assert re.search(r"scored 3 pairs in [\d.]+ s \([\d.,]+ pairs/s, [\d,]+ tokens/s\)", last), last
