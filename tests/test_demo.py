"""The bundled demo model: exported, it translates numbers exactly and passes --check."""
import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

import xform
from xform.models.importers import bundled_path
from xform.runtime.text.translator import Translator

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from train_demo import to_words  # noqa: E402


@pytest.fixture(scope="module")
def demo(demo_bundle):
    return xform.load(demo_bundle, backend="ort")


def test_training_report_says_exact_on_held_out():
    report = json.loads((bundled_path("demo") / "training.json").read_text())
    assert report["validation_greedy_exact_match"] == 1.0
    assert report["test_greedy_exact_match"] == 1.0 and report["test_numbers"] == 2000


def test_translates_numbers_exactly(demo):
    rng = random.Random(123)
    numbers = [0, 7, 13, 40, 100, 105, 1000, 40512, 999999] + [rng.randrange(10 ** 6) for _ in range(200)]
    got = Translator(demo).translate([str(n) for n in numbers])
    wrong = [(n, g) for n, g in zip(numbers, got) if g != to_words(n)]
    assert not wrong, wrong[:5]


def test_check_on_text_identical_tokens(demo_bundle, demo):
    report = xform.check(demo_bundle, session=demo, texts=["40512", "7", "310019", "88"])
    assert report.passed and report.identical_tokens and report.tokens_compared > 12
    assert report.max_abs_err < 1e-4


def test_torch_backend_translates_the_same(demo_bundle, demo):
    texts = ["123456", "20", "5"]
    assert xform.Translator(demo_bundle, backend="torch").translate(texts) == Translator(demo).translate(texts)


def test_unknown_characters_map_to_unk_and_long_input_is_refused(demo):
    """The source vocabulary has <unk>: a letter maps to it (and is counted as unknown) rather than
    failing; a source longer than max_len is refused by name."""
    unk = demo.tokenizer.src.unk_id
    ids = demo.tokenizer.encode("12x4")
    assert unk is not None and ids.count(unk) == 1 and ids[2] == unk
    assert demo.tokenizer.unknown(ids) == (1, 4)
    assert demo.tokenizer.encode("1234").count(unk) == 0
    assert len(Translator(demo).translate(["12x4"])) == 1
    with pytest.raises(xform.XformError, match=r"41 source tokens, more than the model's max_len 32 \(truncate to cut it\)"):
        Translator(demo).translate(["1" * 40])
    assert Translator(demo).translate(["1" * 40], truncate=True) == Translator(demo).translate(["1" * 31])  # cut to max_len


def test_generate_matches_translate(demo):
    src = Translator(demo).policy.encode_texts(["40512", "7"])
    out = demo.generate(src, max_new_tokens=20)
    assert [demo.tokenizer.decode(r) for r in out] == ["forty thousand five hundred twelve", "seven"]
    assert out.dtype == np.int64


def test_cli_input_file(demo_bundle, tmp_path):
    from click.testing import CliRunner

    from xform.cli import main
    f = tmp_path / "numbers.txt"
    f.write_text("12\n\n300001\n")
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--input-file", str(f), "--text", "5"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == ["5\tfive", "12\ttwelve", "\t", "300001\tthree hundred thousand one"]
