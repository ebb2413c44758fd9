"""Nothing destroyed: every command that writes with --force replaces only what xform wrote.

One table over the writing commands (export, triton, run --json) and the targets a user can name:
the command's input itself, a parent of it, a path inside it, a folder (or file) of someone
else's, the current directory, an empty one, and the command's own earlier output. Only the last
two are replaced (an empty directory without --force too: nothing in it is lost); for every
other target every file under the test's directory keeps its bytes.
"""
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from xform.cli import main

REFUSED = ["input itself", "parent of input", "inside input", "new path inside input", "someone else's",
           "current directory", "symlink to input"]
REPLACED = ["empty", "ours"]


def snapshot(root: Path) -> dict[str, str]:
    """Every path under root, with the sha256 of each file's bytes ('dir' for directories)."""
    return {p.relative_to(root).as_posix(): "dir" if p.is_dir() and not p.is_symlink()
            else hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else f"-> {p.readlink()}"
            for p in root.rglob("*")}


class Export:
    """xform export MODEL -o TARGET: MODEL is a user's checkpoint directory with a file of their own."""
    directory = True

    def __init__(self, home: Path, checkpoint_dir: Path, tiny_bundle: Path):
        self.input = home / "in" / "model"
        shutil.copytree(checkpoint_dir, self.input)
        (self.input / "notes.txt").write_text("my training notes\n")
        self.tiny_bundle = tiny_bundle

    def ours(self, target: Path) -> None:
        shutil.copytree(self.tiny_bundle, target)

    def args(self, target: Path) -> list[str]:
        return ["export", str(self.input), "-o", str(target)]

    def written(self, target: Path) -> bool:
        return json.loads((target / "manifest.json").read_text())["format"] == "xform-bundle"


class OnABundle:
    """A command (its `args`) that reads a copy of the tiny bundle and writes TARGET: xform wrote
    TARGET when the command ran and exited 0."""

    def __init__(self, home: Path, checkpoint_dir: Path, tiny_bundle: Path):
        self.input = home / "in" / "bundle"
        shutil.copytree(tiny_bundle, self.input)

    def ours(self, target: Path) -> None:
        r = CliRunner().invoke(main, self.args(target))
        assert r.exit_code == 0, r.output


class Triton(OnABundle):
    """xform triton BUNDLE -o REPO --name NAME writes REPO/NAME (dynamic scheduling: one model)."""
    directory = True

    def args(self, target: Path) -> list[str]:
        target = target.resolve()
        return ["triton", str(self.input), "-o", str(target.parent), "--name", target.name,
                "--scheduling", "dynamic"]

    def written(self, target: Path) -> bool:
        return (target / "config.pbtxt").is_file() and (target / "1" / "model.py").is_file()


class RunJson(OnABundle):
    """xform run BUNDLE --benchmark --json TARGET."""
    directory = False

    def args(self, target: Path) -> list[str]:
        return ["run", str(self.input), "--benchmark", "--batch", "1", "--src-len", "3", "--new-tokens", "2",
                "--warmup", "0", "--iters", "1", "--json", str(target)]

    def written(self, target: Path) -> bool:
        return json.loads(target.read_text())["benchmark"]["new_tokens"] == 2


COMMANDS = {"export": Export, "triton": Triton, "run --json": RunJson}


def make_target(case: str, command, home: Path) -> Path:
    inp = command.input
    if case == "input itself":
        return inp
    if case == "parent of input":
        return inp.parent
    if case == "inside input":
        inside = inp / ("sub" if command.directory else "manifest.json" if (inp / "manifest.json").exists()
                        else "notes.txt")
        if command.directory:
            inside.mkdir()
            (inside / "kept.txt").write_text("kept\n")
        return inside
    if case == "new path inside input":
        return inp / "new"
    if case == "someone else's":
        if command.directory:
            (home / "mine").mkdir()
            (home / "mine" / "thesis.txt").write_text("four years of work\n")
            return home / "mine"
        (home / "mine.json").write_text('{"thesis": "four years of work"}\n')
        return home / "mine.json"
    if case == "current directory":
        return Path(".")
    if case == "symlink to input":
        (home / "alias").symlink_to(inp)
        return home / "alias"
    if case == "empty":
        if command.directory:
            (home / "empty").mkdir()
        else:
            (home / "empty.json").write_text("")
        return home / ("empty" if command.directory else "empty.json")
    assert case == "ours"
    target = home / ("ours" if command.directory else "ours.json")
    command.ours(target)
    return target


@pytest.mark.parametrize("case", REFUSED + REPLACED)
@pytest.mark.parametrize("name", list(COMMANDS))
def test_force_replaces_only_what_xform_wrote(name, case, tmp_path, monkeypatch, checkpoint_dir, tiny_bundle):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.chdir(home)
    command = COMMANDS[name](home, checkpoint_dir, tiny_bundle)
    target = make_target(case, command, home)
    before = snapshot(tmp_path)
    if case == "empty" and command.directory:  # nothing in it to lose: taken without --force (issue 55)
        r = CliRunner().invoke(main, command.args(target))
        assert r.exit_code == 0 and command.written(target), r.output
    elif case in REPLACED:  # without --force, even these are kept
        r = CliRunner().invoke(main, command.args(target))
        assert r.exit_code == 1 and "already exists; pass --force" in r.output, r.output
        assert snapshot(tmp_path) == before
    r = CliRunner().invoke(main, [*command.args(target), "--force"])
    assert "Traceback" not in r.output and not isinstance(r.exception, AssertionError)
    if case in REPLACED:
        assert r.exit_code == 0, r.output
        assert command.written(target)
        changed = {p for p in set(before) | set(snapshot(tmp_path)) if before.get(p) != snapshot(tmp_path).get(p)}
        target_rel = target.resolve().relative_to(tmp_path.resolve()).as_posix()
        assert all(p == target_rel or p.startswith(target_rel + "/") for p in changed), changed
    else:
        assert r.exit_code == 1, r.output
        assert "replace" in r.output or "destroy" in r.output, r.output
        assert "-o" in r.output or "--json" in r.output, r.output
        assert snapshot(tmp_path) == before


def test_refusals_name_the_reason(tmp_path, monkeypatch, checkpoint_dir):
    """Each refusal says what the target is, so the user knows why."""
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "model"
    shutil.copytree(checkpoint_dir, model)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.txt").write_text("x")
    cases = {str(model): "is MODEL itself", str(tmp_path): "the current directory", ".": "the current directory",
             str(model / "sub"): "is inside MODEL", str(tmp_path / "mine"): "no manifest.json; it holds thesis.txt"}
    for target, reason in cases.items():
        r = CliRunner().invoke(main, ["export", str(model), "-o", target, "--force"])
        assert r.exit_code == 1 and reason in r.output, (target, r.output)


def test_bundle_with_a_file_of_yours_is_not_replaced(tmp_path, tiny_bundle, checkpoint_dir):
    """A real bundle the user added a file to: replacing it would delete that file, so it is refused."""
    from xform.errors import BundleError
    from xform.exporter.export import export_bundle

    out = tmp_path / "b"
    shutil.copytree(tiny_bundle, out)
    (out / "README.txt").write_text("how I exported this\n")
    before = snapshot(tmp_path)
    with pytest.raises(BundleError, match=r"holding files xform did not write \(README.txt\)"):
        export_bundle(checkpoint_dir, out, force=True)
    assert snapshot(tmp_path) == before
