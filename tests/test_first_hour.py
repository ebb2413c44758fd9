"""What a new user tripped over in their first hour (issue 43), each fixed and held here: `run
--check` compares what it printed, a bundle's default beams leave sampling and alternatives alone,
a UTF-16 file is named as such, `run --output` keeps its translations on Ctrl-C, and the docs'
links resolve. (export's stages off a terminal: tests/test_cli.py; the eval plot's mode and extra:
tests/test_eval.py; a Ctrl-C of a Ray corpus: tests/corpus/test_ray.py.)"""
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import xform
from xform.cli import main
from xform.runtime.text.translator import Translator

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def text_marian(tmp_path_factory):
    """A Marian with a sentencepiece tokenizer and 64 positions: translations longer than 32 tokens."""
    pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e '.[dev]')")
    from tests.marian_fixtures import text_marian_bundle
    return text_marian_bundle(tmp_path_factory, "hour", 3, 10, encoder_layers=1, decoder_layers=2,
                              activation_function="relu", scale_embedding=True)


@pytest.mark.parametrize("beams", [1, 3])
def test_check_compares_every_step_of_the_translations_printed(text_marian, tmp_path, beams):
    """Translations of 41 to 60 tokens: the check compares all their steps (it re-decoded at most
    32 new tokens, and with beams another search than the one printed) and says so."""
    texts, js = ["the cat sleeps", "a dog", "the bird sings"], tmp_path / "r.json"
    r = run("run", text_marian, *sum((["--text", t] for t in texts), []), "--min-new-tokens", 40,
            "--max-new-tokens", 60, "--num-beams", beams, "--check", "--json", js)
    assert r.exit_code == 0, r.output
    session = xform.load(text_marian)
    printed = session.generate(Translator(session).policy.encode_texts(texts), min_new_tokens=40, max_new_tokens=60, num_beams=beams)
    longest = int((printed != session.pad_id).sum(1).max())
    check = json.loads(js.read_text())["check"]
    assert longest > 40 and check["steps"] == longest, (check["steps"], longest)
    assert check["steps_compared"] == "every step of the translations printed" and check["passed"]
    assert "steps compared" in r.output  # the table says what it compared (its words: steps_compared)
    if beams > 1:
        assert check["beam_hypotheses_identical"] == 1.0


@pytest.fixture(scope="module")
def beam_default(demo_bundle, tmp_path_factory):
    """The demo bundle with an OPUS-MT-style default of 4 beams in its manifest."""
    path = tmp_path_factory.mktemp("beams") / "demo4"
    shutil.copytree(demo_bundle, path)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["generation"]["num_beams"] = 4
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


@pytest.mark.parametrize("flags", [["--sample", "--seed", "3"], ["--sample", "--top-k", "5", "--seed", "3"],
                                   ["--alternatives", "--num-return-sequences", "2"]])
def test_sampling_and_alternatives_set_aside_a_default_of_beams(beam_default, flags):
    r = run("run", beam_default, "--text", "40512", *flags)
    assert r.exit_code == 0 and "num-beams" not in r.output, r.output


def test_the_python_door_samples_and_gives_alternatives_on_a_beam_default(beam_default):
    t = xform.Translator(beam_default)
    assert len(t.translate_batch(["40512"], sampling_topk=5, sampling_temperature=2.0)[0].hypotheses) == 1
    alternatives = t.translate_batch(["40512"], return_alternatives=True, num_hypotheses=2)[0].hypotheses
    assert len(alternatives) == 2 and alternatives[0] != alternatives[1]
    # beams asked for with sampling: refused, naming the flag the user gave
    with pytest.raises(xform.XformError, match="beam sampling"):
        t.translate_batch(["40512"], sampling_topk=5, beam_size=2)


def test_generate_tokens_on_a_beam_default_bundle_is_greedy(beam_default, demo_bundle):
    """CTranslate2's generate_tokens takes no beams: on a bundle whose default is 4 beams it
    decodes greedily (it failed with a bare AssertionError), token for token the greedy decode."""
    steps = list(xform.Translator(beam_default).generate_tokens("40512"))
    greedy = xform.Translator(demo_bundle).translate_batch(["40512"], beam_size=1)[0].hypotheses[0]
    demo = xform.load(demo_bundle)
    assert steps[-1].is_last and " ".join(s.token for s in steps if s.token_id != demo.eos_id) == greedy


def test_a_refusal_the_bundle_default_causes_says_so(beam_default):
    r = run("run", beam_default, "--text", "40512", "--num-return-sequences", "5")
    assert r.exit_code == 2 and "this bundle's default" in r.output and "num_beams 4" in r.output, r.output


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
def test_a_utf16_file_is_named_with_the_command_that_converts_it(demo_bundle, tmp_path, encoding):
    f = tmp_path / "in.txt"
    f.write_bytes("40512\n7\n".encode(encoding))
    for args in (["run", demo_bundle, "--input-file", f], ["eval", demo_bundle, "--source", f, "--against", "eager"],
                 ["corpus", demo_bundle, f, "--output-dir", tmp_path / "out"]):
        r = run(*args)
        assert r.exit_code == 1 and "UTF-" in r.output and "iconv -f UTF-" in r.output, r.output
    plain = tmp_path / "plain.txt"
    plain.write_text("40512\n7\n")
    assert run("run", demo_bundle, "--input-file", plain).exit_code == 0


def test_a_binary_file_is_called_binary_not_utf16(demo_bundle, tmp_path):
    """An executable given as the input (zero bytes that read as no UTF-16 / UTF-32 text) is called
    a binary file, named, with no iconv advice (it was called UTF-16 or UTF-32, issue 55)."""
    rng = np.random.default_rng(0)
    elf = tmp_path / "prog"
    noise = rng.integers(0, 256, 6000, dtype=np.uint8).tobytes()
    # an executable's first 4 KiB: a header and tables, a third or more of their bytes zeros
    elf.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(57) + noise[:1500] + bytes(2000) + noise[1500:])
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)) * 20)
    for f in (elf, blob):
        r = run("run", demo_bundle, "--input-file", f)
        assert r.exit_code == 1 and f"--input-file {f}: a binary file" in r.output and "not text" in r.output, r.output
        assert "UTF-16 or" not in r.output.replace("UTF-8, UTF-16 or UTF-32 text", "") and "iconv" not in r.output
    assert "an ELF executable" in run("run", demo_bundle, "--input-file", elf).output


def test_a_language_a_pair_bundle_lacks_is_refused_with_the_pair_it_translates(text_marian, tmp_path):
    """--tgt-lang fr on an en>de bundle (a Marian, one pair, as its manifest records): the refusal
    says it translates en>de only and that fr cannot be served (it said the tokenizer had no
    languages, issue 55); the pair's own codes are told to be left out."""
    bundle = tmp_path / "en-de"
    shutil.copytree(text_marian, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["languages"] = [["en", "de"]]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    r = run("run", bundle, "--text", "the cat", "--tgt-lang", "fr")
    assert r.exit_code == 2 and "--tgt-lang fr: this bundle translates en>de only" in r.output, r.output
    assert "--tgt-lang fr cannot be served" in r.output and "no languages" not in r.output, r.output
    r = run("run", bundle, "--text", "the cat", "--src-lang", "fr")
    assert r.exit_code == 2 and "--src-lang fr: this bundle translates en>de only" in r.output, r.output
    r = run("run", bundle, "--text", "the cat", "--tgt-lang", "de")
    assert r.exit_code == 2 and "translates en>de only" in r.output and "leave it out" in r.output, r.output
    with pytest.raises(xform.XformError, match="^tgt_lang fr: this bundle translates en>de only"):
        Translator(xform.load(bundle)).translate(["the cat"], tgt_lang="fr")


def interrupt(proc, what: str, ready, timeout: float, sig: int = signal.SIGINT) -> str:
    """Ctrl-C `proc` (a command with its stderr piped; or send it `sig`) once `ready()`, waiting
    at most `timeout` s for it; its stderr (and stdout, where piped together) when it has ended."""
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert proc.poll() is None, f"ended before {what}: {proc.communicate()[0 if proc.stdout else 1]}"
            assert time.monotonic() < deadline, f"no {what} within {timeout} s"
            time.sleep(0.02)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
        return out if out is not None else err
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_run_output_interrupted_keeps_the_first_lines_translations_in_order(demo_bundle, tmp_path, sig, code):
    """Ctrl-C or SIGTERM during `run --output`: the file holds the translations written so far,
    which are the first lines' in input order, whole lines only; stderr says so and names
    `xform corpus`; no temporary is left (SIGTERM killed the process on the spot and left one)."""
    rng = np.random.default_rng(0)
    lines = [str(int(n)) for n in rng.integers(1, 999999, 3000)]
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen([sys.executable, "-m", "xform", "run", str(demo_bundle), "--input-file", str(src),
                             "--output", str(out), "--batch-size", "8", "--read-ahead", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    def partial() -> bool:  # the temporary beside --output holds some lines
        return any(p.stat().st_size > 200 for p in tmp_path.iterdir() if p.name not in ("in.txt", "out.txt"))
    stderr = interrupt(proc, "translations written", partial, 120, sig)
    assert proc.returncode == code, stderr
    got = out.read_text().splitlines()
    assert 0 < len(got) < len(lines) and "xform corpus" in stderr, stderr
    want = xform.Translator(demo_bundle).translate(lines[:len(got)])
    assert got == want  # the first lines, in order
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]  # no temporary left


def test_links_in_the_readme_and_docs_resolve():
    """Every relative link (and its #anchor, against the target's headings as GitHub makes them)."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

    def slug(heading: str) -> str:
        return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
    headings = {f: {slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", f.read_text(), re.M)} for f in files}
    broken = []
    for f in files:
        text = re.sub(r"```.*?```", "", f.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (f.parent / path).resolve() if path else f
            if not resolved.exists():
                broken.append(f"{f.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in headings.get(resolved, set()):
                broken.append(f"{f.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == [], broken
