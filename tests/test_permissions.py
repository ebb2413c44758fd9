"""Bundles others can read: every file and directory xform writes takes the process's umask, as
open() and mkdir() would, not the private mode of the temporaries it writes through."""
import os
import stat
from contextlib import contextmanager

import pytest

from xform.exporter.export import export_bundle
from xform.files import atomic_write, current_umask


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(root):
    out = {root.name: stat.S_IMODE(root.stat().st_mode)}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = stat.S_IMODE(p.stat().st_mode)
    return out


@pytest.mark.parametrize("mask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_export_and_reports_follow_the_umask(tmp_path, mask, file_mode, dir_mode):
    with umask(mask):
        assert current_umask() == mask
        bundle = export_bundle("demo", tmp_path / "bundle").path
        atomic_write(tmp_path / "report.json", "{}\n")
    found = modes(bundle)
    # the writers that made private files before: the manifest, onnx's external data, safetensors
    for name in ("manifest.json", "decoder.onnx.data", "encoder.onnx.data", "reference/model.safetensors"):
        assert found[name] == file_mode, (name, oct(found[name]))
    for name, mode in found.items():
        assert mode == (dir_mode if (tmp_path / "bundle" / name).is_dir() or name == "bundle" else file_mode), (
            name, oct(mode))
    assert stat.S_IMODE((tmp_path / "report.json").stat().st_mode) == file_mode
