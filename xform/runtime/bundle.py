"""The bundle: a deployment directory and its versioned manifest (DESIGN section 2).

Reads and validates manifests, verifies file hashes, and writes directories atomically. The
exporter and the engine builder write through `write_manifest` / `atomic_directory`; the runtime
reads through `Bundle.open`. Pure Python + json: no torch, no onnx.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from xform.contract import GraphSpec
from xform.errors import BundleError

MANIFEST = "manifest.json"
FORMAT = "xform-bundle"
VERSION = 1
KNOWN_VERSIONS = (1,)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Bundle:
    path: Path
    manifest: dict[str, Any]

    @classmethod
    def open(cls, path: str | Path, verify: bool = True) -> "Bundle":
        path = Path(path)
        mpath = path / MANIFEST
        if not path.is_dir():
            raise BundleError(f"{path}: not a directory; a bundle is a directory made by `xform export`")
        if not mpath.is_file():
            raise BundleError(f"{mpath}: missing; {path} is not an xform bundle (run `xform export` to make one)")
        try:
            manifest = json.loads(mpath.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BundleError(f"{mpath}: corrupt manifest, not valid JSON ({e})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise BundleError(f"{mpath}: not an xform manifest (expected \"format\": \"{FORMAT}\")")
        if manifest.get("version") not in KNOWN_VERSIONS:
            raise BundleError(f"{mpath}: manifest version {manifest.get('version')!r} is not one this xform "
                              f"knows {list(KNOWN_VERSIONS)}; re-export the bundle or upgrade xform")
        bundle = cls(path, manifest)
        if verify:
            bundle.verify_files()
        return bundle

    def verify_files(self, names: list[str] | None = None) -> None:
        files: dict[str, str] = self.manifest.get("files", {})
        for name in names if names is not None else list(files):
            if name not in files:
                raise BundleError(f"{self.path / MANIFEST}: no hash recorded for {name}")
            p = self.path / name
            if not p.is_file():
                raise BundleError(f"{p}: missing (the manifest lists it)")
            got = sha256_file(p)
            if got != files[name]:
                raise BundleError(f"{p}: sha256 {got[:16]}... does not match the manifest's {files[name][:16]}...; "
                                  "the file was changed or corrupted after export; re-export the bundle")

    @property
    def config(self) -> dict[str, Any]:
        return self.manifest["model"]["config"]

    @property
    def precision(self) -> str:
        return self.manifest["precision"]

    def graph_spec(self, graph: str) -> GraphSpec:
        return GraphSpec.from_dict(self.manifest["graphs"][graph]["signature"])

    def file(self, key: str) -> Path:
        return self.path / key

    def graph_file(self, graph: str) -> Path:
        return self.path / self.manifest["graphs"][graph]["file"]

    @property
    def tokenizer_file(self) -> Path | None:
        tok = self.manifest.get("tokenizer")
        return None if not tok else self.path / tok["file"]


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Hash every file under `directory` (but the manifest) into manifest["files"] and write it."""
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    manifest["files"] = {p.relative_to(directory).as_posix(): sha256_file(p) for p in files}
    atomic_write(directory / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write through a temporary file beside `path`, then rename: readers see old or new, never half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def refuse_existing(path: Path, force: bool, what: str = "bundle") -> None:
    if path.exists() and not force:
        raise BundleError(f"{path}: already exists; pass --force to overwrite the {what}")


@contextlib.contextmanager
def atomic_directory(target: Path, force: bool) -> Iterator[Path]:
    """Yield a fresh temporary directory beside `target`; on success it replaces `target`.

    On any error the temporary directory is removed and `target` is left as it was.
    """
    target = Path(target)
    refuse_existing(target, force)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        yield tmp
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; a bundle is shared like any directory
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
