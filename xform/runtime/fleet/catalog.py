"""A catalog of bundles: a directory of them (each subdirectory holding a manifest.json) or a list
of bundle paths, each entry named by its directory and knowing what it translates
(languages.py). Reading a catalog opens no session; the pool (pool.py) loads what a route needs.

A catalog read again (`rescan`) says what changed since (`Changes`): bundles added, removed, and
changed (their manifest, which holds every file's hash, is not the one read before); a bundle
that cannot be read is refused with its reason, not the whole scan.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from xform.errors import BundleError, InputError, XformError
from xform.files import sha256_file
from xform.manifest import MANIFEST
from xform.runtime.text.languages import Languages, bundle_languages

log = logging.getLogger(__name__)

# a bundle's name: its directory's, as a Triton model is named (serving/repository.py takes it from here)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class Entry:
    """One bundle of a catalog: its `name` (its directory's), `path`, `languages`, and `stamp`, its
    manifest's sha256 when it was read ('' where not known)."""
    name: str
    path: Path
    languages: Languages
    stamp: str = ""

    def differs(self, other: "Entry") -> bool:
        """Whether this is another bundle than `other` read before: its manifest (every file's
        hash) or its languages; not its path's spelling (a link and its target are one bundle)."""
        return (self.stamp, self.languages) != (other.stamp, other.languages)

    @classmethod
    def read(cls, path: Path) -> "Entry":
        return cls(path.name, path, bundle_languages(path), sha256_file(path / MANIFEST))

    def describe(self) -> str:
        said = self.languages.summary()
        return f"{self.name}: " + ("; ".join(said) if said else "no languages known (ask it by name)")


def is_bundle(path: Path) -> bool:
    return (path / MANIFEST).is_file()


def holds_bundles(path: Path) -> bool:
    """A directory that is no bundle but holds some (a directory of bundles)."""
    return path.is_dir() and not is_bundle(path) and any(p.is_dir() and is_bundle(p) for p in path.iterdir())


def not_a_bundle(path: Path) -> str | None:
    """Why a directory in a directory of bundles is no bundle (None where it is one)."""
    manifest = path / MANIFEST
    if manifest.is_file():
        return None
    if manifest.exists():
        return f"its {MANIFEST} is not a file"
    if holds_bundles(path):
        return (f"no {MANIFEST}; it holds bundles of its own, and a directory of bundles is read one level deep "
                "(move them up, or give this directory)")
    try:
        empty = not any(path.iterdir())
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    return f"no {MANIFEST}" + (" (an empty directory)" if empty else
                               "; a bundle is a directory xform export wrote (xform export MODEL -o DIR)")


def other_directories(root: Path) -> dict[Path, str]:
    """The directories in a directory of bundles that are no bundle, and why (not dot-directories:
    xform's own temporaries)."""
    out = {}
    for p in sorted(root.iterdir(), key=lambda p: p.name):
        if not p.name.startswith(".") and p.is_dir() and (why := not_a_bundle(p)) is not None:
            out[p] = why
    return out


def bundle_paths(where: str | Path | Sequence[str | Path]) -> list[Path]:
    """A directory of bundles as the bundles in it (by name), or a list of bundle paths as given."""
    if isinstance(where, (str, Path)):
        root = Path(where)
        if not root.is_dir():
            raise InputError(f"{root}: no such directory of bundles")
        if is_bundle(root):
            raise InputError(f"{root}: a bundle, not a directory of bundles; give the directory that holds it, "
                             "or a list of bundle paths")
        # not a dot-directory: xform's own temporaries (.NAME.xform-PID-*.tmp, a --force's -old) hold a manifest
        paths = sorted((p for p in root.iterdir() if not p.name.startswith(".") and p.is_dir() and is_bundle(p)),
                       key=lambda p: p.name)
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
        return cls([Entry.read(p) for p in bundle_paths(where)])

    def rescan(self, where: str | Path | Sequence[str | Path]) -> tuple["Catalog", "Changes"]:
        """`where` read again: the new catalog and what changed from this one. A bundle that cannot
        be read (a damaged manifest) is refused with its reason: a new one is left out, a known one
        kept as it was read before (its loads fail with the reason, as they would have). A
        directory of `where` that is no bundle is skipped with a warning naming it and why."""
        entries, refused = [], {}
        # a list of bundles: one gone is removed (a directory: bundle_paths' errors if none is left)
        paths = bundle_paths(where) if isinstance(where, (str, Path)) else [Path(p) for p in where
                                                                           if is_bundle(Path(p))]
        if isinstance(where, (str, Path)):  # a directory not served is said, not passed over without a word
            for path, why in other_directories(Path(where)).items():
                log.warning("%s: skipped, not a bundle: %s", path, why)
        for path in paths:
            if not NAME.fullmatch(path.name):
                refused[path.name] = (f"the bundle name {path.name!r} is not a model name (letters, digits, _ . -, "
                                      "starting with a letter or digit): rename its directory")
                continue
            try:
                entries.append(Entry.read(path))
            except (XformError, OSError, ValueError, KeyError) as e:
                refused[path.name] = f"{type(e).__name__}: {e}" if not isinstance(e, XformError) else str(e)
                if path.name in self.entries:
                    entries.append(self.entries[path.name])
        new = Catalog(entries)
        changed = [e.name for e in new if e.name in self.entries and e.differs(self.entries[e.name])]
        return new, Changes([e.name for e in new if e.name not in self.entries],
                            [n for n in self.entries if n not in new], changed, refused)

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


@dataclass(frozen=True)
class Changes:
    """What a rescan found: bundles `added`, `removed`, `changed` (their files or languages), and
    `refused`: name -> why it could not be read."""
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)

    def said(self) -> str:
        parts = [f"{what} {', '.join(names)}" for what, names in
                 (("added", self.added), ("removed", self.removed), ("changed", self.changed)) if names]
        parts += [f"refused {n} ({why})" for n, why in self.refused.items()]
        return "; ".join(parts) or "no change"
