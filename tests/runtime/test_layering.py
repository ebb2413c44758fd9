"""Layers point one way: every import between xform's layers, checked from the sources (imports
inside functions too), and `import xform` / ONNX Runtime generation load no torch.

    base      xform.errors, .contract, .files, .config,   (nothing of xform above them)
              .manifest, .tokenizer_spec
    models    PyTorch only                                (base)
    runtime   numpy + onnxruntime / tensorrt              (base; never torch, models, exporter)
    exporter  models -> graphs, checks, engines           (base, models, runtime)
    serving   Triton, above the runtime                   (base, runtime; never torch)
    corpus    corpus files, shards, record, Ray workers   (base, runtime; never torch)
    ray       xform.ray, Ray Data's building block        (base, runtime, corpus; never torch)
    api       xform.load / xform.check                    (everything below it)
    cli       the commands, a package (cli/)          (everything)
"""
import ast
import pathlib
import subprocess
import sys

import pytest

import xform

ROOT = pathlib.Path(xform.__file__).parent
BASE = ("xform.errors", "xform.contract", "xform.files", "xform.config", "xform.manifest", "xform.tokenizer_spec")
LAYERS = {  # a layer's files -> the xform modules (by prefix) they may import, and whether torch
    "base": ([ROOT / f"{m.removeprefix('xform.')}.py" for m in BASE], BASE, False),
    "models": (sorted((ROOT / "models").glob("*.py")), BASE + ("xform.models",), True),
    "runtime": (sorted((ROOT / "runtime").rglob("*.py")), BASE + ("xform.runtime",), False),
    "exporter": (sorted((ROOT / "exporter").glob("*.py")),
                 BASE + ("xform.models", "xform.runtime", "xform.exporter", "xform.__version__"), True),
    "serving": (sorted((ROOT / "serving").glob("*.py")), BASE + ("xform.runtime", "xform.serving"), False),
    "corpus": (sorted((ROOT / "corpus").glob("*.py")), BASE + ("xform.runtime", "xform.corpus"), False),
    "ray": ([ROOT / "ray.py"], BASE + ("xform.runtime", "xform.corpus"), False),
    "api": ([ROOT / "api.py"], BASE + ("xform.models", "xform.runtime", "xform.exporter"), True),
    "cli": (sorted((ROOT / "cli").glob("*.py")), ("xform",), True),
}


def imports(path: pathlib.Path) -> list[str]:
    """Every module a file imports (`from xform import __version__` as xform.__version__)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            # `from xform.runtime.text import translator`: the package and each name (a module or not)
            out += [f"{node.module}.{a.name}" for a in node.names] if node.module.startswith("xform") else []
            out += [] if node.module == "xform" else [node.module]
    return out


# inside the runtime, the numbers sit below the text and the server layer: a module -> the runtime
# modules it must not import (text is a layer above the session: a Translator holds its session,
# the session never makes one)
RUNTIME_BELOW = {
    "controls": "*",  # the controls' table is data: nothing of xform
    "loop": {"session", "scheduler", "translator", "text_policy", "open"},
    "strategies": {"session", "scheduler", "translator", "text_policy", "loop", "open"},
    "backend": {"session", "scheduler", "translator", "text_policy", "loop", "strategies", "open"},
    "request": {"session", "scheduler", "translator", "text_policy", "loop", "open"},
    "scheduler": {"translator", "text_policy", "open"},
    "session": {"scheduler", "translator", "text_policy", "text_lines", "open"},
    "text_policy": {"translator", "scheduler", "loop", "open"},
    "translator": {"scheduler", "open"},
}


@pytest.mark.parametrize("module", sorted(RUNTIME_BELOW))
def test_runtime_modules_keep_their_order(module):
    path, = (ROOT / "runtime").rglob(f"{module}.py")  # in its room: text/, backends/, decoding/, ...
    names = [n for n in imports(path) if n == "xform" or n.startswith("xform.")]
    if RUNTIME_BELOW[module] == "*":
        assert names == [], f"{path} imports {names}"
        return
    bad = [n for n in names if n.startswith("xform.runtime.") and set(n.split(".")[2:]) & RUNTIME_BELOW[module]]
    assert bad == [], f"{path} imports {bad}"


# the runtime's rooms, lowest first (issue 54): a room imports only rooms below it, never one above
# or beside it (documents and fleet are beside each other: neither imports the other's room back).
# Modules at the runtime's top level are rooms of their own: the bundle below everything, the
# session between scheduling and text, the openers and tools (open, bench, soak, compare) above.
ROOMS = [("bundle",), ("backends",), ("decoding",), ("scheduling",), ("session",), ("text",),
         ("documents", "fleet"), ("open", "bench", "compare"), ("soak",)]


def room(module: str) -> str | None:
    """The runtime room of an xform module (its sub-package, or a top-level module's name)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "runtime" else None


def rank(name: str) -> int:
    return next(i for i, names in enumerate(ROOMS) if name in names)


def wrong_way(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports between runtime rooms that point up, or sideways from one room into another."""
    out = []
    for module, deps in graph.items():
        a = room(module)
        for dep in deps:
            b = room(dep)
            if a is not None and b is not None and a != b and rank(b) >= rank(a):
                out.append((module, dep))
    return sorted(out)


def test_runtime_rooms_keep_their_order():
    """doors > documents / fleet > text > session > scheduling > decoding > backends > bundle: no
    room imports one above it or beside it (so no circle between rooms can form)."""
    graph = import_graph()
    rooms = {room(m) for m in graph} - {None}
    assert rooms <= {n for names in ROOMS for n in names}, f"a runtime room without a rank: {rooms}"
    assert wrong_way(graph) == []


def test_a_wrong_way_room_import_is_found():
    graph = {"xform.runtime.session": {"xform.runtime.text.translator"}, "xform.runtime.text.translator": set(),
             "xform.runtime.documents.door": {"xform.runtime.fleet.local"}, "xform.runtime.fleet.local": set()}
    assert wrong_way(graph) == [("xform.runtime.documents.door", "xform.runtime.fleet.local"),
                                ("xform.runtime.session", "xform.runtime.text.translator")]


def import_graph() -> dict[str, set[str]]:
    """Each xform module (package roots aside) -> the xform modules it imports, inside functions too."""
    modules = {}
    for path in ROOT.rglob("*.py"):
        if path.parent.name == "__pycache__" or path.name == "__init__.py":
            continue
        name = ".".join(("xform",) + path.relative_to(ROOT).with_suffix("").parts)
        found = set()
        for n in imports(path):
            found |= {n, n.rpartition(".")[0]}  # `from a.b import c`: the module a.b, or a.b.c if c is one
        modules[name] = found
    return {m: {d for d in deps if d in modules and d != m} for m, deps in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = stack[stack.index(node):]
                    del stack[stack.index(node):]
                    if len(group) > 1:
                        out.append(sorted(group))
            elif nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
    return out


def test_no_import_circles():
    """No two modules import each other, directly or round a circle (issue 42 broke the last three:
    the tokenizer modules, session / text policy / translator, and the exporter's graphs / beam
    graph)."""
    assert circles(import_graph()) == []


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_each_layer_imports_only_the_layers_below_it(layer):
    files, allowed, torch_ok = LAYERS[layer]
    assert files
    for path in files:
        for name in imports(path):
            if name == "xform" or name.startswith("xform."):
                assert name.startswith(allowed), f"{layer}: {path.relative_to(ROOT)} imports {name}"
            elif name == "torch" or name.startswith("torch."):
                assert torch_ok, f"{layer}: {path.relative_to(ROOT)} imports {name}"


def test_every_module_is_in_a_layer():
    """A new file cannot escape the check: each is in a layer above, or is the cli / package root."""
    layered = {p for files, _, _ in LAYERS.values() for p in files}
    for path in ROOT.rglob("*.py"):
        if path.parent.name == "__pycache__" or path.name == "__init__.py" and path.parent != ROOT:
            continue
        assert path in layered or path.name in ("__init__.py", "__main__.py"), f"{path.relative_to(ROOT)} is in no layer"


def test_a_wrong_way_import_fails(tmp_path):
    """The check itself: a runtime file importing the models layer is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from xform.models.transformer import Seq2SeqTransformer\n")
    assert any(not n.startswith(LAYERS["runtime"][1]) for n in imports(bad) if n.startswith("xform"))


def test_import_xform_and_ort_generation_load_no_torch(tiny_bundle):
    code = f"""
import sys, numpy as np
import xform
assert 'torch' not in sys.modules and 'onnxruntime' not in sys.modules, 'import xform is heavy'
s = xform.load({str(tiny_bundle)!r}, backend='ort')
out = s.generate(np.array([[5, 6, 7, 2]], np.int64), max_new_tokens=5)
assert out.shape[0] == 1
bad = [m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'xform.models', 'xform.exporter'))]
assert not bad, bad
"""
    subprocess.run([sys.executable, "-c", code], check=True)
