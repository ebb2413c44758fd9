"""Small rooms, checked (issue 31): no function in xform/ over 60 lines, no file over 500. A
function or file past them is a concept without a home yet: give it one rather than raise these."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "xform"
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 500


def oversized(source: str, name: str) -> list[str]:
    """The file's and its functions' sizes over the limits, as messages."""
    found = []
    lines = source.count("\n")
    if lines > MAX_FILE_LINES:
        found.append(f"{name}: {lines} lines (at most {MAX_FILE_LINES})")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                found.append(f"{name}:{node.lineno} {node.name}: {n} lines (at most {MAX_FUNCTION_LINES})")
    return found


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_rooms_are_small(path):
    assert not oversized(path.read_text(), str(path.relative_to(ROOT)))


def test_the_check_finds_a_long_function_and_a_long_file():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    assert oversized(f"def f():\n{body}", "f.py") == [f"f.py:1 f: {MAX_FUNCTION_LINES + 1} lines (at most 60)"]
    assert oversized("x = 1\n" * (MAX_FILE_LINES + 1), "g.py") == [f"g.py: {MAX_FILE_LINES + 1} lines (at most 500)"]
    assert oversized(f"def f():\n{body[:-len('    x59 = 59')-1]}", "h.py") == []
