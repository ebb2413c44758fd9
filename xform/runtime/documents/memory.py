"""A translation memory: an SQLite database of sentences translated before, so a sentence seen
again (in the same run or a later one) is not decoded again.

An entry is keyed by its context (a hash of the bundle's manifest, which hashes every file of it,
the decoding settings and the languages: change one and nothing matches) and the normalised
source sentence. Entries are written a batch at a time in one transaction: a process killed
mid-run leaves the batches it committed and nothing half written. WAL journaling and a busy
timeout let corpus workers write the same file at once. A file that is not an xform memory is
refused by name and never touched; one xform wrote but that no longer reads as one (corrupted,
another format version) is replaced only with `force`."""
from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from xform.errors import InputError

FORMAT, VERSION = "xform-translation-memory", "1"
SQLITE_HEADER = b"SQLite format 3\x00"
BUSY_MS = 60_000  # how long a writer waits for another's transaction before failing
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS contexts (id TEXT PRIMARY KEY, settings TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (context TEXT NOT NULL, source TEXT NOT NULL, target TEXT NOT NULL,
                                    alignment TEXT, PRIMARY KEY (context, source)) WITHOUT ROWID;
"""


def context_id(settings: Mapping[str, Any]) -> str:
    """The key of a decoding context: a hash of its settings as canonical JSON."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:32]


@dataclass
class Counts:
    hits: int = 0
    misses: int = 0


class TranslationMemory:
    """An SQLite translation memory at `path` (created when missing)."""

    def __init__(self, path: str | Path, force: bool = False):
        self.path = Path(path)
        self.counts = Counts()
        self.db = self.opened(force)

    def opened(self, force: bool) -> sqlite3.Connection:
        if self.path.exists():
            problem = self.problem()
            if problem is not None:
                if not (force and problem[1]):
                    hint = ("{force} replaces it (xform wrote it)" if problem[1] else
                            "it is not one xform wrote, so it is never replaced: choose another path")
                    raise InputError(f"{{memory}} {self.path}: {problem[0]}; {hint}").naming("memory", "force")
                self.path.unlink()
                for suffix in ("-wal", "-shm"):
                    Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        db = sqlite3.connect(self.path, timeout=BUSY_MS / 1000, isolation_level=None)
        db.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        db.executescript(SCHEMA)
        db.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?), ('version', ?)", (FORMAT, VERSION))
        return db

    def problem(self) -> tuple[str, bool] | None:
        """Why the existing file is not a usable memory, and whether xform wrote it; None: it is one."""
        with open(self.path, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
        if head != SQLITE_HEADER:
            found = "an empty file" if not head else "another kind of file"
            return f"expected an xform translation memory (an SQLite database), found {found}", False
        try:
            db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=BUSY_MS / 1000)
            try:
                tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                if "meta" not in tables:
                    return "an SQLite database that is not an xform translation memory (no meta table)", False
                meta = dict(db.execute("SELECT key, value FROM meta"))
                if meta.get("format") != FORMAT:
                    return f"an SQLite database of another format ({meta.get('format')!r})", False
                if meta.get("version") != VERSION:
                    return f"an xform translation memory of version {meta.get('version')}, expected {VERSION}", True
                check = db.execute("PRAGMA quick_check").fetchone()[0]
                if check != "ok" or not {"contexts", "entries"} <= tables:
                    return f"a damaged xform translation memory ({check})", True
            finally:
                db.close()
        except sqlite3.DatabaseError as e:
            return f"a damaged SQLite database ({e})", False
        return None

    def context(self, settings: Mapping[str, Any]) -> str:
        """Register a decoding context; its key."""
        key = context_id(settings)
        self.db.execute("INSERT OR IGNORE INTO contexts VALUES (?, ?)",
                        (key, json.dumps(settings, sort_keys=True, default=str)))
        return key

    def lookup(self, context: str, sources: Iterable[str]) -> dict[str, str]:
        """The translations the memory holds for `sources` in `context`; counts hits and misses."""
        sources = list(dict.fromkeys(sources))
        found = dict(self.select("target", "", context, sources))
        self.counts.hits += len(found)
        self.counts.misses += len(sources) - len(found)
        return found

    def select(self, column: str, where: str, context: str, sources: list[str]) -> Iterator[tuple[str, Any]]:
        """(source, `column`) of the entries of `context` among `sources` (and `where`), queried 500
        sources at a time (SQLite's bound-variable limit)."""
        for i in range(0, len(sources), 500):
            chunk = sources[i:i + 500]
            yield from self.db.execute(f"SELECT source, {column} FROM entries WHERE context = ? {where}AND source "
                                       f"IN ({','.join('?' * len(chunk))})", (context, *chunk))

    def store(self, context: str, translated: Mapping[str, str],
              alignments: Mapping[str, list | None] | None = None) -> None:
        """Add translations (and, for some, their word alignments: alignment.py) in one transaction:
        all of them or, killed mid-write, none."""
        if not translated:
            return
        aligned = alignments or {}
        rows = [(context, s, t, None if aligned.get(s) is None else json.dumps(aligned[s]))
                for s, t in translated.items()]
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.executemany("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?)", rows)
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def alignments(self, context: str, sources: Iterable[str]) -> dict[str, list]:
        """The word alignments the memory holds for `sources` in `context` (those stored with one)."""
        return {s: json.loads(a) for s, a in self.select("alignment", "AND alignment IS NOT NULL ", context,
                                                         list(dict.fromkeys(sources)))}

    def __len__(self) -> int:
        return self.db.execute("SELECT count(*) FROM entries").fetchone()[0]

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "TranslationMemory":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
