"""A catalog of bundles: a directory of them (each subdirectory holding a manifest.json) or a list
of bundle paths, each entry named by its directory and knowing what it translates
(languages.py). Reading a catalog opens no session; the pool (pool.py) loads what a route needs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from xform.errors import BundleError, InputError
from xform.manifest import MANIFEST
from xform.runtime.fleet.languages import Languages, bundle_languages

# a bundle's name: its directory's, as a Triton model is named (serving/repository.py takes it from here)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class Entry:
    """One bundle of a catalog: its `name` (its directory's), `path` and `languages`."""
    name: str
    path: Path
    languages: Languages

    def describe(self) -> str:
        said = self.languages.summary()
        return f"{self.name}: " + ("; ".join(said) if said else "no languages known (ask it by name)")


def is_bundle(path: Path) -> bool:
    return (path / MANIFEST).is_file()


def holds_bundles(path: Path) -> bool:
    """A directory that is no bundle but holds some (a directory of bundles)."""
    return path.is_dir() and not is_bundle(path) and any(p.is_dir() and is_bundle(p) for p in path.iterdir())


def bundle_paths(where: str | Path | Sequence[str | Path]) -> list[Path]:
    """A directory of bundles as the bundles in it (by name), or a list of bundle paths as given."""
    if isinstance(where, (str, Path)):
        root = Path(where)
        if not root.is_dir():
            raise InputError(f"{root}: no such directory of bundles")
        if is_bundle(root):
            raise InputError(f"{root}: a bundle, not a directory of bundles; give the directory that holds it, "
                             "or a list of bundle paths")
        paths = sorted((p for p in root.iterdir() if p.is_dir() and is_bundle(p)), key=lambda p: p.name)
        if not paths:
            raise InputError(f"{root}: holds no bundle (a subdirectory with a {MANIFEST})")
        return paths
    paths = [Path(p) for p in where]
    if not paths:
        raise InputError("an empty list of bundles")
    for p in paths:
        if not is_bundle(p):
            raise BundleError(f"{p}: not a bundle (no {MANIFEST})")
    return paths


class Catalog:
    """Bundles by name, in name order. `Catalog.scan(DIR or [paths])` reads them."""

    def __init__(self, entries: Sequence[Entry]):
        self.entries: dict[str, Entry] = {}
        for e in sorted(entries, key=lambda e: e.name):
            if not NAME.fullmatch(e.name):
                raise InputError(f"{e.path}: the bundle name {e.name!r} is not a model name (letters, digits, "
                                 "_ . -, starting with a letter or digit): rename its directory")
            if e.name in self.entries:
                raise InputError(f"two bundles named {e.name!r}: {self.entries[e.name].path} and {e.path}; "
                                 "rename one directory")
            self.entries[e.name] = e

    @classmethod
    def scan(cls, where: str | Path | Sequence[str | Path]) -> "Catalog":
        return cls([Entry(p.name, p, bundle_languages(p)) for p in bundle_paths(where)])

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries.values())

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __getitem__(self, name: str) -> Entry:
        if name not in self.entries:
            raise InputError(f"{{model}} {name!r}: no such bundle; known: {', '.join(self.entries)}").naming("model")
        return self.entries[name]

    def summary(self) -> list[str]:
        """Each bundle and what it translates, a line a bundle."""
        return [e.describe() for e in self]
