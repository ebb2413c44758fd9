"""Every command and snippet in the README and the guides in docs/ runs somewhere in the suite.

The README's quick starts run here, with small models built by the tests standing in for the
downloads they name (`path/to/opus-mt-en-de`, `path/to/nllb-200-distilled-600M`, a tutorial's
`model.pt`); its main and test commands, Python and serving lines in tests/test_readme.py and
tests/serving; what cannot run here (a GPU, systemd, Kubernetes) is listed in ELSEWHERE with the
reason, and its xform command line is still parsed by the CLI. A block added to the README or a
guide without a test that runs it fails `test_every_block_is_accounted_for`.
"""
import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from xform.cli import main

ROOT = Path(__file__).resolve().parents[1]
GUIDES = ["README.md", "docs/cli.md", "docs/models.md", "docs/decoding.md", "docs/quality.md", "docs/serving.md",
          "docs/python.md", "docs/bundle.md", "docs/corpus.md", "docs/documents.md"]

# marked blocks and who runs them
RUN = {"main-command": "tests/test_readme.py", "test-command": ".ci/run (tests/test_readme.py checks it)",
       "python-snippet": "tests/test_readme.py", "serve-command": "tests/serving/test_server.py",
       "grpc-stream-snippet": "tests/serving/test_inflight_server.py",
       "file-command": "here", "hf-command": "here", "own-model-command": "here",
       "corpus-command": "here", "corpus-ray-command": "here", "corpus-python": "here", "eval-command": "here",
       "ct2-python": "here", "documents-command": "here", "fleet-python": "tests/runtime/test_fleet_translator.py",
       "fleet-serve-command": "tests/serving/test_fleet_server.py"}
# guides whose commands take a GPU, or minutes to hours with the peers installed: every xform flag,
# script and script flag they name is checked to exist (test_named_commands_exist)
NAMED_ONLY = {"docs/benchmarks.md": "benchmarks: minutes to hours, with the bench extra's peers",
              "docs/gpu.md": "needs a GPU (none here)"}
# unmarked blocks, by their first line
ELSEWHERE = {
    "curl -s -X POST localhost:8000/v2/models/demo-bundle/infer": "tests/serving/test_server.py",
    "curl -s -N -X POST localhost:8000/v2/models/demo-bundle-stream/generate_stream":
        "tests/serving/test_inflight_server.py",
    "xform export demo -o demo16 --precision fp16": "needs a GPU to run engines: tests/exporter/test_engine.py "
                                                   "builds the demo's fp16 engines with TensorRT-RTX; "
                                                   "tests/runtime/test_trt_backend.py runs them on a GPU",
    "[Unit]": "a systemd unit (no systemd here): its ExecStart is parsed below; "
              "tests/serving/test_lifecycle.py tests the SIGTERM stop it relies on",
    "containers:": "a Kubernetes container spec: its args are parsed below; the probes' endpoints are "
                   "Triton's, tested by tests/serving/test_server.py",
    "ray start --head --port 6379": "a cluster of several machines: its xform line is parsed below; "
                                    "tests/corpus/test_ray.py runs a corpus on two Ray nodes of this machine",
    "tritonserver exited on its own with code -11 (SIGSEGV)": "serve's line on a crash: "
                                                               "tests/serving/test_lifecycle.py crashes a server",
}


def blocks():
    """(file, language, marker or None, text) of every fenced block."""
    for name in [*GUIDES, *NAMED_ONLY]:
        text = (ROOT / name).read_text()
        for m in re.finditer(r"(?:<!-- ([\w-]+) -->\s*)?^```(\w*)\n(.*?)^```", text, re.S | re.M):
            yield name, m.group(2), m.group(1), m.group(3)


def test_every_block_is_accounted_for():
    missing, seen = [], set()
    for name, lang, marker, text in blocks():
        first = text.splitlines()[0].strip() if text.strip() else ""
        if marker in RUN:
            seen.add(marker)
        elif name in NAMED_ONLY:
            continue  # test_named_commands_exist
        elif lang == "text":
            continue  # synopses and layouts, not commands
        elif any(first.startswith(k) for k in ELSEWHERE):
            seen.add(next(k for k in ELSEWHERE if first.startswith(k)))
        else:
            missing.append(f"{name}: ```{lang} block starting {first!r}")
    assert missing == [], "blocks no test runs (mark them and run them, or list them in ELSEWHERE):\n" + \
        "\n".join(missing)
    assert set(RUN) | set(ELSEWHERE) == seen, f"listed but gone from the docs: {set(RUN) | set(ELSEWHERE) - seen}"


def marked(marker: str, name: str = "README.md", lang: str = "bash") -> str:
    text = (ROOT / name).read_text()
    m = re.search(rf"<!-- {marker} -->\s*```{lang}\n(.*?)\n```\s*<!-- /{marker} -->", text, re.S)
    assert m, f"{name} has no {marker} block"
    return m.group(1)


def run_lines(block: str, cwd: Path) -> list[str]:
    """Each line of a README block as a user pastes it: xform commands through the CLI (with a
    `> FILE` redirect written), anything else through bash. Returns each command's output."""
    outputs = []
    for line in block.splitlines():
        line = line.split("  #")[0].strip()
        if not line.startswith("xform "):
            subprocess.run(["bash", "-euo", "pipefail", "-c", line], cwd=cwd, check=True)
            continue
        command, _, redirect = line.partition(" > ")
        r = CliRunner().invoke(main, shlex.split(command)[1:])
        assert r.exit_code == 0, (line, r.output)
        if redirect:
            (cwd / redirect.strip()).write_text(r.stdout)
        outputs.append(r.output)
    return outputs


def test_file_quick_start(demo_bundle, tmp_path, monkeypatch):
    pytest.importorskip("sacrebleu")
    monkeypatch.chdir(tmp_path)
    shutil.copytree(demo_bundle, tmp_path / "demo-bundle")
    run_lines(marked("file-command"), tmp_path)
    rows = (tmp_path / "translations.tsv").read_text().split("\n")
    assert rows[:4] == ["40512\tforty thousand five hundred twelve", "7\tseven", "\t",
                        "123456\tone hundred twenty three thousand four hundred fifty six"]
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert scores["bleu"] == pytest.approx(100) and scores["chrf"] == pytest.approx(100) and scores["lines"] == 4


def test_documents_guide(tmp_path, monkeypatch):
    """docs/documents.md's block, on a small trained Marian exported where it says."""
    pytest.importorskip("transformers")
    pytest.importorskip("sentencex")
    from tests.marian_fixtures import build_text_marian
    from xform.exporter.export import export_bundle
    monkeypatch.chdir(tmp_path)
    (tmp_path / "opus-mt-en-de").mkdir()
    build_text_marian(tmp_path / "opus-mt-en-de", seed=0, steps=40, d_model=32, encoder_layers=1, decoder_layers=2)
    export_bundle(tmp_path / "opus-mt-en-de", tmp_path / "en-de")
    outputs = run_lines(marked("documents-command", "docs/documents.md"), tmp_path)
    first, again = (tmp_path / "notes.de.md").read_text(), (tmp_path / "again.de.md").read_text()
    assert first == again and first != (tmp_path / "notes.md").read_text()
    assert "`cat --help`" in first and "](https://example.org/guide)" in first and first.startswith("# ")
    assert "6 from the memory notes.db, 0 decoded" in outputs[1] and "0 from the memory" in outputs[0]


def test_hugging_face_quick_start(tmp_path, monkeypatch):
    """The README's Marian and NLLB lines, on a small trained Marian with OPUS-MT's tokenizer files
    and a small NLLB with NllbTokenizer's, saved by transformers where the README's paths point."""
    pytest.importorskip("transformers")
    from tests.marian_fixtures import build_text_marian
    from tests.models.test_multilingual_text import make_model, make_tokenizer
    monkeypatch.chdir(tmp_path)
    (tmp_path / "path/to/opus-mt-en-de").mkdir(parents=True)
    build_text_marian(tmp_path / "path/to/opus-mt-en-de", seed=0, steps=40, d_model=32, encoder_layers=1,
                      decoder_layers=2)
    nllb = tmp_path / "path/to/nllb-200-distilled-600M"
    nllb.mkdir()
    tok = make_tokenizer("nllb", tmp_path)
    make_model("nllb", len(tok)).save_pretrained(nllb)
    tok.save_pretrained(nllb)
    outputs = run_lines(marked("hf-command"), tmp_path)
    assert outputs[1].startswith("The cat sleeps.\t") and "check passed" in outputs[1]
    assert outputs[3].startswith("Le chat dort.\t") and "check passed" in outputs[3]


def test_own_model_quick_start(tmp_path, monkeypatch):
    """The README's state dict lines, on PyTorch's translation tutorial model with 8 heads and
    torchtext-style vocabularies (`<unk>`, `<pad>`, `<bos>`, `<eos>` at ids 0-3)."""
    import torch

    from tests import torch_nn_modules as tn
    monkeypatch.chdir(tmp_path)
    specials = ["<unk>", "<pad>", "<bos>", "<eos>"]
    src = specials + "ein mann fährt fahrrad . eine frau".split()
    tgt = specials + "a man rides bike . woman".split()
    (tmp_path / "src_vocab.json").write_text(json.dumps(src))
    (tmp_path / "tgt_vocab.json").write_text(json.dumps(tgt))
    torch.manual_seed(0)
    model = tn.Seq2SeqTransformer(2, 1, 32, 8, len(src), len(tgt), dim_feedforward=40)
    torch.save(model.state_dict(), tmp_path / "model.pt")
    outputs = run_lines(marked("own-model-command"), tmp_path)
    assert "check passed" in outputs[1] and outputs[1].startswith("ein mann fährt fahrrad .\t")


def test_eval_guide(demo_bundle, tmp_path, monkeypatch):
    """docs/quality.md's eval block: scores, an int8 export judged on the file, int8 against fp32
    with a plot, the bundle against eager PyTorch (identical on fp32)."""
    pytest.importorskip("sacrebleu")
    pytest.importorskip("matplotlib")
    sys.path.insert(0, str(ROOT / "scripts"))
    from train_demo import to_words
    monkeypatch.chdir(tmp_path)
    shutil.copytree(demo_bundle, tmp_path / "demo-bundle")
    numbers = [7, 40512, 999999, 12, 300001, 68, 5005, 123456]
    (tmp_path / "test.src").write_text("".join(f"{n}\n" for n in numbers))
    (tmp_path / "test.ref").write_text("".join(f"{to_words(n)}\n" for n in numbers))
    outputs = run_lines(marked("eval-command", "docs/quality.md"), tmp_path)
    assert json.loads((tmp_path / "scores.json").read_text())["bleu"] == pytest.approx(100)
    assert "judged on --sample-file test.src (8 sources)" in " ".join(outputs[1].split())
    assert (tmp_path / "diff.png").read_bytes()[:4] == b"\x89PNG" and "identical" in outputs[2]
    assert "identical translations: 100.00% of 8 lines" in outputs[3]


def test_ctranslate2_users_snippet(demo_bundle, tmp_path):
    """docs/python.md's CTranslate2 switch: the constructor, translate_batch with CTranslate2's
    names and scores, translate_file."""
    shutil.copytree(demo_bundle, tmp_path / "demo-bundle")
    (tmp_path / "numbers.txt").write_text("40512\n7\n")
    r = subprocess.run([sys.executable, "-c", marked("ct2-python", "docs/python.md", "python")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = eval(r.stdout)  # the printed list of (translation, score)
    assert [t for t, _ in got] == ["forty thousand five hundred twelve", "seven"] and all(s <= 0 for _, s in got)
    assert (tmp_path / "translations.txt").read_text() == "forty thousand five hundred twelve\nseven\n"


def harness_flags(source: str) -> set[str]:
    """The flags a script's `harness.parser(__doc__, work=..., rounds=...)` call adds: --NAME for
    each keyword given a value other than None, where scripts/harness.py defines that flag."""
    harness = (ROOT / "scripts" / "harness.py").read_text()
    flags = set()
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "parser"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "harness"):
            flags |= {f"--{k.arg}" for k in node.keywords
                      if k.arg and not (isinstance(k.value, ast.Constant) and k.value.value is None)}
    return {f for f in flags if f'"{f}"' in harness}


def flags_named(text: str):
    """(program, subcommand or None, flags) of each xform or scripts/ command in a block."""
    text = text.replace("\\\n", " ")
    for line in text.splitlines():
        if line.startswith("git worktree add") and "the script as it was" in line:
            return  # the rest runs an older checkout's script
        line = line.split("  #")[0]
        for m in re.finditer(r"(?:^|[\s;&|(])(xform \S+|python (?:-m )?scripts/\S+\.py)([^;&|#]*)", line):
            program, rest = m.group(1), m.group(2)
            flags = {w.split("=")[0] for w in rest.split() if w.startswith("--")}
            yield (program.split()[-1], None, flags) if program.startswith("python") else ("xform",
                                                                                               program.split()[1],
                                                                                               flags)


def test_named_commands_exist():
    """The benchmark and GPU guides' commands cannot run here: each xform subcommand and flag they
    name (in blocks and in `code`) is the CLI's, each script exists and takes each flag given to
    it (its own, or one its scripts/harness.py parser adds). The pip extras they name are pyproject's."""
    import tomllib
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    wrong, named = [], 0
    spans = [(name, m.group(1)) for name in NAMED_ONLY for m in re.finditer(
        r"`((?:xform |python scripts/)[^`]+)`", (ROOT / name).read_text())
        if " --" in m.group(1) or m.group(1).startswith("python")]  # not an engine's name (`xform torch`)
    for name, text in [*((n, t) for n, _, _, t in blocks() if n in NAMED_ONLY), *spans]:
        for extra in re.findall(r'pip install -e "\.\[([\w,-]+)\]"', text):
            wrong += [f"{name}: extra {e}" for e in extra.split(",") if e not in extras]
        for program, sub, flags in flags_named(text):
            named += 1
            if program == "xform":
                command = main.commands.get(sub)
                if command is None:
                    wrong.append(f"{name}: xform {sub}")
                    continue
                known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
            else:
                script = ROOT / program
                if not script.is_file():
                    wrong.append(f"{name}: {program}")
                    continue
                source = script.read_text()
                known = {f for f in flags if f'"{f}"' in source or f"'{f}'" in source} | harness_flags(source)
            wrong += [f"{name}: {program} {sub or ''} {f}" for f in sorted(flags - known)]
    assert named > 20 and wrong == [], wrong


@pytest.mark.parametrize("start", ["[Unit]", "containers:"])
def test_production_configs_name_a_command_the_cli_takes(start, tmp_path):
    """The systemd unit's ExecStart and the Kubernetes args are `xform serve` lines whose flags the
    CLI accepts: run against a missing bundle, the error is the bundle's, not a usage error."""
    text = next(t for _, _, _, t in blocks() if t.startswith(start))
    if start == "[Unit]":
        argv = shlex.split(re.search(r"^ExecStart=\S+ (.*)$", text, re.M).group(1))
    else:
        argv = json.loads(re.search(r"args: (\[.*\])", text).group(1))[1:]
    assert argv[0] == "serve"
    argv[1] = str(tmp_path / "absent")
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 1 and "absent" in r.output, r.output


def test_corpus_guide(demo_bundle, ray_cluster, tmp_path, monkeypatch):
    """docs/corpus.md: its one-machine block here, its `--ray local` block as a user runs it (a
    process of its own, nothing left running after), its Ray Data snippet on the tests' cluster."""
    from tests.ray_cluster import run_with_local_ray, wait_sessions_gone

    monkeypatch.chdir(tmp_path)
    shutil.copytree(demo_bundle, tmp_path / "demo-bundle")
    outputs = run_lines(marked("corpus-command", "docs/corpus.md"), tmp_path)
    assert "sentences/s" in outputs[0] and "nothing to translate" in outputs[1]
    assert (tmp_path / "translated/numbers.txt").read_text() == (
        "forty thousand five hundred twelve\nseven\n\none hundred twenty three thousand four hundred fifty six\n")
    assert [json.loads(line) for line in (tmp_path / "translated/more.jsonl").read_text().splitlines()] == [
        {"id": 1, "text": "12", "translation": "twelve"}, {"id": 2, "text": "99", "translation": "ninety nine"}]
    for i, line in enumerate(marked("corpus-ray-command", "docs/corpus.md").splitlines()):
        code, output, sessions = run_with_local_ray([sys.executable, "-m", "xform", *shlex.split(line)[1:]],
                                                    tmp_path / f"ray-{i}.log", 180, cwd=tmp_path)
        assert code == 0 and sessions, output
        wait_sessions_gone(sessions)
    for name in ("numbers.txt", "more.jsonl"):
        assert (tmp_path / "translated-ray" / name).read_text() == (tmp_path / "translated" / name).read_text()
    r = subprocess.run([sys.executable, "-c", marked("corpus-python", "docs/corpus.md", "python")], cwd=tmp_path,
                       env={**os.environ, "RAY_ADDRESS": ray_cluster.address}, capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr
    # Ray forwards its processes' log lines to the driver's stdout, each headed "(raylet)" or
    # "(name pid=...)" (once, a worker's OOM-kill notice from the raylet), and under load a line of
    # its own logging; the snippet prints one list, its only line that is one
    ours = [line for line in r.stdout.splitlines() if line.startswith("[(")]
    assert ours == ["[(1, 'forty thousand five hundred twelve'), (2, 'seven')]"], r.stdout


def test_corpus_cluster_block_names_a_command_the_cli_takes(tmp_path):
    """docs/corpus.md's cluster block: its xform line's flags parse; run here, the error is its
    missing input's, not a usage error."""
    text = next(t for _, _, _, t in blocks() if t.startswith("ray start --head"))
    line = next(x for x in text.splitlines() if x.startswith("xform ")).split("  #")[0]
    r = CliRunner().invoke(main, shlex.split(line)[1:])
    assert r.exit_code == 1 and "INPUT /data/corpus/part-*.txt: no such file" in r.output, r.output
