"""The runtime speaks in settings, not flags (issue 42): no CLI flag in xform/runtime/'s strings.

An error of the runtime names a setting by its marker (`{src_lang}`, xform/errors.py), which each
door words its own way: the CLI as its flag (xform/cli/flags.py), the server as its input, Python
as the keyword. So no string of the runtime writes a flag, except inside a command line for the
operator to run (`xform build-engine BUNDLE --force`: the same advice from every door), and no
function of the runtime takes a door's name for a setting (`flag=`, `names=`): one that may
complain about different settings takes the setting's runtime name (`setting=`).

Docstrings and comments are documentation and may mention flags; an argv handed to another
program (`subprocess.run(["nvidia-smi", "--query-gpu=..."])`) is that program's.
"""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "xform" / "runtime"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# a command line for the operator: `xform <command>` and its words, up to a sentence's punctuation
COMMAND = re.compile(r"\bxform [a-z][a-z-]*(?: [^\s;,()`]+)*")
DOOR_PARAMETERS = {"flag", "flags", "names", "src_flag", "tgt_flag"}
HOLE = "X"  # an f-string's formatted value, as it reads in the checks


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the nodes that are docstrings (a module's, a class's, a function's)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def subprocess_arguments(tree: ast.AST) -> set[int]:
    """The ids of the nodes inside a call of subprocess.* (another program's argv)."""
    out = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "subprocess"):
            out |= {id(n) for arg in node.args for n in ast.walk(arg)}
    return out


def text_of(node: ast.AST) -> str | None:
    """A string constant's text, or an f-string's with each formatted value as HOLE; else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else HOLE for v in node.values)
    return None


def flags_in(text: str) -> list[str]:
    """The flags a string writes outside `xform <command>` command lines."""
    return FLAG.findall(COMMAND.sub("", text))


def violations(source: str, name: str) -> list[str]:
    """The flags a module's strings write and the door parameters its functions take, as messages."""
    tree = ast.parse(source)
    skip = docstrings(tree) | subprocess_arguments(tree)
    inside_fstrings = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    found = []
    for node in ast.walk(tree):
        if id(node) in skip or id(node) in inside_fstrings:
            continue
        text = text_of(node)
        if text is not None:
            found += [f"{name}:{node.lineno} writes {flag!r}" for flag in flags_in(text)]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                if arg.arg in DOOR_PARAMETERS:
                    found.append(f"{name}:{node.lineno} {node.name}() takes {arg.arg!r}")
    return found


def test_the_runtime_writes_no_flag_and_takes_no_door_names():
    paths = sorted(ROOT.rglob("*.py"))  # every room: text/, backends/, decoding/, scheduling/
    assert len(paths) > 30
    found = [v for path in paths for v in violations(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == [], "\n".join(found)


def test_the_check_finds_flags_and_door_parameters():
    """The check itself, on what the runtime held before issue 42 and what it may hold."""
    bad = '''
def encode(text, lang=None, flag="--src-lang"):
    """Docstrings may say --src-lang."""
    raise InputError(f"{flag} {lang}: unknown; rebuild with a larger --max-batch")


def run(names=None, *, tgt_flag="x"):
    return "sampling (--sample)"
'''
    assert sorted(violations(bad, "bad.py")) == [
        "bad.py:2 encode() takes 'flag'", "bad.py:2 writes '--src-lang'", "bad.py:4 writes '--max-batch'",
        "bad.py:7 run() takes 'names'", "bad.py:7 run() takes 'tgt_flag'", "bad.py:8 writes '--sample'"]
    good = '''
import subprocess


def f(bundle, setting="src_lang"):
    """Exported --with-attention."""
    subprocess.run(["nvidia-smi", "--query-gpu=name"])
    return (f"{{{setting}}} unknown; rebuild them: xform build-engine {bundle} --force --max-batch N",
            "an argument - 1 -- or x--y is no flag", "(xform export MODEL -o BUNDLE --with-attention)")
'''
    assert violations(good, "good.py") == []
