"""The corpus the tests translate with the demo bundle, and `run --input-file`'s translations of it."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from xform.cli import main


def numbers(n: int, seed: int, blank_every: int = 9) -> list[str]:
    """n lines of numbers the demo model translates, a blank or whitespace line now and then."""
    rng = random.Random(seed)
    return ["" if i % blank_every == 3 else "  " if i % blank_every == 7 else str(rng.randint(0, 999_999))
            for i in range(n)]


@pytest.fixture(scope="session")
def corpus_inputs(tmp_path_factory) -> list[Path]:
    """Four inputs of different lengths: one long, one short without a final newline that starts and
    ends blank, one of a single line, one empty."""
    d = tmp_path_factory.mktemp("corpus-in")
    files = {"long.txt": "\n".join(numbers(230, 1)) + "\n", "short.txt": "\n7\n\n12\n40512\n\n ",
             "one.txt": "999999\n", "empty.txt": ""}
    for name, text in files.items():
        (d / name).write_text(text)
    return [d / name for name in files]


@pytest.fixture(scope="session")
def reference(demo_bundle, corpus_inputs):
    """run --input-file's output of each input, the source column cut: (beams, name) -> text."""
    out = {}
    for beams in (1, 4):
        for path in corpus_inputs:
            r = CliRunner().invoke(main, ["run", str(demo_bundle), "--input-file", str(path), "--num-beams",
                                          str(beams)])
            assert r.exit_code == 0, r.output
            out[beams, path.name] = "".join(line.split("\t", 1)[1] + "\n" for line in r.stdout.splitlines())
    return out
