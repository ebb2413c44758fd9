"""The bundle: a deployment directory and its versioned manifest (docs/bundle.md).

A directory and its manifest (xform/manifest.py, which reads, validates and writes the manifest
itself): `Bundle.open` holds the manifest's paths inside the directory and verifies every file's
sha256. Pure Python: no torch, no onnx.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from xform.config import TransformerConfig
from xform.contract import GraphSpec
from xform.errors import BundleError
from xform.files import drop_cached, sha256_file
from xform.manifest import MANIFEST, Manifest


@dataclass
class Bundle:
    path: Path
    manifest: Manifest

    @classmethod
    def open(cls, path: str | Path, verify: bool = True) -> "Bundle":
        path = Path(path)
        mpath = path / MANIFEST
        if not path.is_dir():
            raise BundleError(f"{path}: not a directory; a bundle is a directory made by `xform export`")
        if not mpath.is_file():
            raise BundleError(f"{mpath}: missing; {path} is not an xform bundle (run `xform export` to make one)")
        bundle = cls(path, Manifest.read(mpath))
        bundle.validate()
        if verify:
            bundle.verify_files()
        return bundle

    def validate(self) -> None:
        """What the manifest's own validation (Manifest.from_json) cannot see: every path it names
        stays inside the bundle (relative, no `..`, no symlink out), and every shared weight lies
        inside its file."""
        for name in self.manifest.named_files():
            self.inside(name)
        for i, w in enumerate(self.manifest.shared_weights):
            path = self.path / w.file
            size = path.stat().st_size if path.is_file() else None
            if size is None or w.end > size:
                raise BundleError(f"{self.path / MANIFEST}: shared_weights[{i}]: bytes {w.offset}..{w.end} lie outside "
                                  f"{path} ({'missing' if size is None else f'{size} bytes'})")

    def inside(self, name: Any) -> Path:
        """`name` as a path inside the bundle; refused when it could lead outside it."""
        mpath = self.path / MANIFEST
        if not isinstance(name, str) or not name or "\x00" in name:
            raise BundleError(f"{mpath}: names an invalid path {name!r}")
        pure = PurePosixPath(name)
        if pure.is_absolute() or ".." in pure.parts or "\\" in name:
            raise BundleError(f"{mpath}: names the path {name!r}, which leads outside the bundle; "
                              "a bundle names its files relative to itself")
        p = self.path / pure
        root = self.path.resolve()
        if p.is_symlink() or not p.resolve().is_relative_to(root):
            raise BundleError(f"{p}: a symlink (to {os.path.realpath(p)}); a bundle's files are its own, "
                              "not links to elsewhere")
        return p

    def verify_files(self, only: list[str] | None = None) -> None:
        """Every file (or `only` those) against its sha256. Hashing reads the shared weights too: their bytes are
        dropped from the page cache afterwards, so that this process (or another xform on the same
        bundle) does not leave them cached for a running session's lookups to map wholesale
        (ort_files.SharedWeight.page_out)."""
        files = self.manifest.files
        for name in only if only is not None else list(files):
            if name not in files:
                raise BundleError(f"{self.path / MANIFEST}: no hash recorded for {name}")
            p = self.path / name
            if not p.is_file():
                raise BundleError(f"{p}: missing (the manifest lists it)")
            got = sha256_file(p)
            if got != files[name]:
                raise BundleError(f"{p}: sha256 {got[:16]}... does not match the manifest's {files[name][:16]}...; "
                                  "the file was changed or corrupted after export; re-export the bundle")
        for w in self.manifest.shared_weights:
            if only is None or w.file in only:
                drop_cached(self.path / w.file, w.offset, w.nbytes)

    @property
    def config(self) -> TransformerConfig:
        """The model config (validated: Manifest.from_json)."""
        return self.manifest.config

    @property
    def precision(self) -> str:
        return self.manifest.precision

    @property
    def weights(self) -> str | None:
        """The weight-only quantization of export --weights (int8 / int4), None without one."""
        return self.manifest.weights["name"] if self.manifest.weights else None

    @property
    def fusions(self) -> tuple[str, ...]:
        """The decoder graphs' fusions into ONNX Runtime's operators (export --fuse), () for none."""
        return self.manifest.fusions

    @property
    def precision_label(self) -> str:
        """The precision as reports say it (Manifest.precision_label)."""
        return self.manifest.precision_label

    def has_graph(self, graph: str) -> bool:
        return graph in self.manifest.graphs

    def graph_spec(self, graph: str) -> GraphSpec:
        return self.manifest.graphs[graph].signature

    def file(self, key: str) -> Path:
        return self.path / key

    def graph_file(self, graph: str) -> Path:
        return self.path / self.manifest.graphs[graph].file

    @property
    def tokenizer_file(self) -> Path | None:
        tok = self.manifest.tokenizer
        return None if tok is None else self.path / tok.file
