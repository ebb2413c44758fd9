"""The runtime never imports torch, xform.models or xform.exporter; `import xform` imports neither."""
import ast
import pathlib
import subprocess
import sys

import xform.runtime

FORBIDDEN = ("torch", "xform.models", "xform.exporter", "xform.api", "xform.cli")


def test_runtime_sources_import_nothing_forbidden():
    root = pathlib.Path(xform.runtime.__file__).parent
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(FORBIDDEN), f"{path.name} imports {name}"


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
