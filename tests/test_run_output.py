"""`xform run --input-file F --output O`: one translation a line, written atomically; the
source<TAB>translation echo on stdout only when asked (and, without --output, as before)."""
from click.testing import CliRunner

import xform
from xform.cli import main


def test_output_is_one_translation_a_line(demo_bundle, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("40512\n7\n\n123456\n")
    out = tmp_path / "out.txt"
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--input-file", str(src), "--output", str(out)])
    assert r.exit_code == 0, r.output
    want = xform.Translator(demo_bundle).translate(["40512", "7", "123456"])
    assert out.read_text().splitlines() == [want[0], want[1], "", want[2]]
    assert r.stdout == ""
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--input-file", str(src), "--output", str(out), "--echo"])
    assert r.exit_code == 0 and r.stdout.splitlines()[0] == f"40512\t{want[0]}"
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--input-file", str(src)])
    assert r.stdout.splitlines()[1] == f"7\t{want[1]}"  # without --output: as before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]  # no temporary left


def test_output_with_scores_holds_them_after_each_translation(demo_bundle, tmp_path):
    """--output with --scores: `translation<TAB>score`, the printed lines' columns without the source."""
    src = tmp_path / "in.txt"
    src.write_text("40512\n7\n")
    for flag, columns in (("--scores", 2), ("--token-scores", 3)):
        out = tmp_path / f"out{flag}.txt"
        r = CliRunner().invoke(main, ["run", str(demo_bundle), "--input-file", str(src), "--output", str(out), flag,
                                      "--num-beams", "2"])
        assert r.exit_code == 0, r.output
        printed = CliRunner().invoke(main, ["run", str(demo_bundle), "--input-file", str(src), flag, "--num-beams",
                                            "2"]).stdout.splitlines()
        lines = out.read_text().splitlines()
        assert [line.split("\t") for line in lines] == [p.split("\t")[1:] for p in printed]
        assert all(len(line.split("\t")) == columns and float(line.split("\t")[1]) < 0 for line in lines)


def test_output_refusals(demo_bundle, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("7\n")
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--input-file", str(src), "--output", str(src)])
    assert r.exit_code == 2 and "is --input-file" in r.output and src.read_text() == "7\n"
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--check", "--output", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--output writes the translations" in r.output
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--text", "7", "--echo"])
    assert r.exit_code == 2 and "--echo goes with --output" in r.output
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--text", "7", "--output", str(tmp_path / "no" / "o")])
    assert r.exit_code == 1 and "--output" in r.output


def test_verbose_prints_the_plan_and_the_memory_it_bounds(demo_bundle, tmp_path):
    """run --verbose: the rows limit and where it comes from, the lines it leaves at this beam
    width, and the memory those limits bound, computed from the bundle's config."""
    from xform.runtime.bundle import Bundle
    from xform.runtime.scheduling.batching import size

    c = Bundle.open(demo_bundle).config
    src = tmp_path / "in.txt"
    src.write_text("40512\n7\n")
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--input-file", str(src), "--verbose", "--num-beams", "3",
                                  "--max-batch-rows", "12", "--max-new-tokens", "9"])
    assert r.exit_code == 0, r.output
    assert "at most 12 decoder rows (--max-batch-rows), so 4 lines at 3 rows a line" in r.stderr
    self_kv = 12 * 2 * c.n_decoder_layers * c.n_heads * c.head_dim * 10 * 4  # 12 rows, 9 new tokens + start
    cross = 4 * 2 * c.n_decoder_layers * c.n_heads * c.head_dim * c.max_len * 4  # 4 lines, sources up to max_len
    logits = 12 * c.tgt_vocab_size * 4
    assert min(self_kv, cross, logits) >= 1024  # KiB figures that a factor of two would change
    assert (f"{size(self_kv)} of self-attention cache, {size(cross)} of cross-attention keys and values, "
            f"{size(logits)} of step logits") in r.stderr
    plain = CliRunner().invoke(main, ["run", str(demo_bundle), "--input-file", str(src)])
    assert "decoder rows" not in plain.stderr and plain.stdout == r.stdout
