"""What keeps a corpus's record true across runs and crashes: its identity (the backend and
device too)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from xform.cli import main
from xform.corpus.record import RECORD


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
