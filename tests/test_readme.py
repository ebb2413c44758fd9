"""The README's first command works: its xform invocations run here through the CLI."""
import re
import shlex
import subprocess
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from xform.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def block(marker: str) -> str:
    text = README.read_text()
    m = re.search(rf"<!-- {marker} -->\s*```bash\n(.*?)\n```\s*<!-- /{marker} -->", text, re.S)
    assert m, f"README has no {marker} block"
    return m.group(1)


def test_main_command_xform_steps_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    steps = [s.strip() for s in block("main-command").split("&&")]
    xform_steps = [s for s in steps if s.startswith("xform ")]
    assert [s.split()[1] for s in xform_steps] == ["export", "run", "run"]
    assert any("--check" in s for s in xform_steps) and any("--benchmark" in s for s in xform_steps)
    runner = CliRunner()
    outputs = []
    for step in xform_steps:
        r = runner.invoke(main, shlex.split(step)[1:])
        assert r.exit_code == 0, (step, r.output)
        outputs.append(r.output)
    assert "40512\tforty thousand five hundred twelve" in outputs[1]
    assert "check passed" in outputs[1]
    assert "tokens/s" in outputs[2]


def test_test_command_is_what_ci_runs():
    """.ci/run's own extraction of the README block yields exactly the README's test command."""
    cmd = block("test-command")
    assert "pytest" in cmd and "torch==2.13.0" in cmd
    ci = (README.parent / ".ci" / "run").read_text()
    extract = next(line for line in ci.splitlines() if line.startswith("cmd=$("))
    r = subprocess.run(["bash", "-c", f'{extract}\nprintf "%s" "$cmd"'], cwd=README.parent, capture_output=True,
                       text=True, check=True)
    assert r.stdout.strip() == cmd.strip()
    assert 'bash -euo pipefail -c "$cmd"' in ci


def test_python_snippet_runs_as_pasted(tmp_path, monkeypatch, capsys):
    """The README's Python block, run after its main command's export, in the same directory."""
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["export", "demo", "-o", "demo-bundle"])
    assert r.exit_code == 0, r.output
    code = re.search(r"<!-- python-snippet -->\s*```python\n(.*?)\n```\s*<!-- /python-snippet -->",
                     README.read_text(), re.S).group(1)
    scope: dict = {}
    exec(compile(code, "README.md python-snippet", "exec"), scope)
    assert scope["translator"].translate(["40512", "7"]) == ["forty thousand five hundred twelve", "seven"]
    assert scope["ids"].shape[0] == 4 and scope["scores"].shape == (4,) and scope["report"].passed
    assert scope["per_token"].shape == scope["best"].shape
    np.testing.assert_allclose(scope["best_scores"] * (scope["best"] != 0).sum(1), scope["per_token"].sum(1),
                               rtol=1e-5)  # length penalty 1: the sequence score is the tokens' mean
    assert scope["done"] == ["forty thousand five hundred twelve", "seven"]
    final = scope["parts"][-1]
    np.testing.assert_array_equal(np.stack(scope["parts"][:-1], 1), final)
    assert scope["session"].tokenizer.decode(final[0]) == "one hundred twenty three thousand four hundred fifty six"
    assert capsys.readouterr().out.splitlines() == ["40512 ['forty thousand five hundred twelve'] None",
                                                    "7 ['seven'] None"]


def test_gitignore_holds_what_the_readme_commands_write():
    """Every directory a README command writes (`xform export ... -o NAME`, `xform triton ... -o
    NAME`) is ignored, so following the README leaves `git status` clean."""
    written = re.findall(r"xform\s+(?:export|triton)\s+\S+\s+-o\s+([\w.-]+)", README.read_text())
    written = sorted({w for w in written if not w.isupper()})  # not the synopsis' BUNDLE / REPO
    assert {"demo-bundle", "demo16"} <= set(written), written
    ignored = (README.parent / ".gitignore").read_text().splitlines()
    assert [w for w in written if f"/{w}/" not in ignored] == []
    files = re.findall(r"> ([\w-]+\.\w+)|--json ([\w-]+\.\w+)", README.read_text())
    files = sorted({a or b for a, b in files if (a or b) != "FILE"})
    assert {"numbers.txt", "translations.tsv", "scores.json"} <= set(files), files
    assert [f for f in files if f"/{f}" not in ignored] == []


def test_models_guide_refuses_only_the_generation_settings_the_importer_refuses():
    """docs/models.md's M2M100 / BART section's list of refused generation settings is the
    importer's, and names none of those it records as the bundle's defaults (n-gram blocking,
    repetition penalty)."""
    from xform.models.huggingface import RECORDED_GENERATION, UNSUPPORTED_GENERATION

    section = (README.parent / "docs" / "models.md").read_text().split("## M2M100, NLLB, mBART, BART", 1)[1].split("\n## ", 1)[0]
    refused = re.search(r"Refused by name[^:]*: generation settings xform does not reproduce\s*\((.*?)\)",
                        section, re.S)
    assert refused, "the section no longer says which generation settings are refused"
    named = set(re.findall(r"`(\w+)`", refused.group(1)))
    assert named and named <= set(UNSUPPORTED_GENERATION), named - set(UNSUPPORTED_GENERATION)
    assert not named & set(RECORDED_GENERATION)
