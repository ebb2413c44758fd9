"""A translation memory: an SQLite database of sentences translated before, so a sentence seen
again (in the same run or a later one) is not decoded again.

An entry is keyed by its context (a hash of the bundle's manifest, which hashes every file of it,
the decoding settings and the languages: change one and nothing matches) and the normalised
source sentence. Entries are written a batch at a time in one transaction: a process killed
mid-run leaves the batches it committed and nothing half written. WAL journaling and a busy
timeout let corpus workers write the same file at once.

Opening is serialised by a lock file beside the memory (`PATH.lock`, flock): shared while a run
inspects the file and connects, exclusive while one creates it, so runs starting together on a
memory not there yet see it missing or whole, never half made. A new memory is written beside its
path and renamed onto it (a run killed meanwhile leaves the path as it was), and SQLite's header
marks it xform's (application_id). A file that is not an xform memory is refused by name and
never touched; one that shows it is xform's but no longer reads as one (damaged, truncated,
another format version) or an empty file (what a run of an earlier xform killed while creating
the memory left) is replaced, in one rename, only with `force`."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from xform.errors import InputError
from xform.files import current_umask, remove_stale_temporaries, temp_prefix

FORMAT, VERSION = "xform-translation-memory", "1"
SQLITE_HEADER = b"SQLite format 3\x00"
APPLICATION_ID = int.from_bytes(b"xfTM", "big")  # SQLite's header, bytes 68-71: the mark of an xform memory
# how a memory from before the mark shows it is xform's: its entries table, defined on page 1
ENTRIES_SQL = b"CREATE TABLE entries (context TEXT NOT NULL, source TEXT NOT NULL, target TEXT NOT NULL,"
SNIFFED = 65536  # bytes read to tell whose a file is: the largest SQLite page
EXPECTED = "an xform translation memory (an SQLite database)"
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


@dataclass(frozen=True)
class Problem:
    """Why an existing file is not a usable memory: what was found instead of what was expected,
    and whether it is xform's (then `force` replaces it)."""
    found: str
    ours: bool
    expected: str = EXPECTED

    def error(self, path: Path) -> InputError:
        hint = ("{force} replaces it with a new, empty memory" if self.ours else
                "nothing in it shows xform wrote it, so it is never replaced, even with {force}: choose another path")
        return InputError(f"{{memory}} {path}: expected {self.expected}, found {self.found}; {hint}"
                          ).naming("memory", "force")


def bears_mark(head: bytes) -> bool:
    """Whether a file's first bytes show an xform memory: the mark in SQLite's header or (a memory
    from before the mark) the entries table's definition in the schema."""
    return head[68:72] == APPLICATION_ID.to_bytes(4, "big") or ENTRIES_SQL in head


@contextlib.contextmanager
def locked(path: Path, exclusive: bool) -> Iterator[None]:
    """Hold the lock of the memory at `path` (flock on `PATH.lock`, made when missing and left
    there): shared to inspect the memory and connect, exclusive to create or replace it."""
    import fcntl

    lock = Path(f"{path}.lock")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise InputError(f"{{memory}} {path}: cannot open its lock file {lock} ({e.strerror or e}); give a path in "
                         "a directory that exists and you can write").naming("memory") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # and with it the lock


class TranslationMemory:
    """An SQLite translation memory at `path` (created when missing)."""

    def __init__(self, path: str | Path, force: bool = False):
        self.path = Path(path)
        self.counts = Counts()
        self.db = self.opened(force)

    def opened(self, force: bool) -> sqlite3.Connection:
        """A connection to the memory, inspected under the shared lock; made (missing, or xform's
        but unusable and `force` given) under the exclusive one, looking again: another run may
        have made it between the two."""
        with locked(self.path, exclusive=False):
            if self.usable(force):
                return self.connected()
        with locked(self.path, exclusive=True):
            if not self.usable(force):
                self.create()
            return self.connected()

    def usable(self, force: bool) -> bool:
        """Whether the file is there and a memory; False: missing, or to be replaced (xform's but
        unusable, and `force`). A file not to replace is refused."""
        if not self.path.exists():
            return False
        problem = self.problem()
        if problem is not None and not (force and problem.ours):
            raise problem.error(self.path)
        return problem is None

    def problem(self) -> Problem | None:
        """Why the existing file is not a usable memory, and whether xform wrote it; None: it is one."""
        if self.path.is_dir():
            return Problem("a directory", ours=False)
        with open(self.path, "rb") as f:
            head = f.read(SNIFFED)
        if not head:
            return Problem("an empty file (what a run killed while creating the memory left)", ours=True)
        if not head.startswith(SQLITE_HEADER):
            return Problem("another kind of file", ours=False)
        marked = bears_mark(head)
        try:
            return self.schema_problem(marked)
        except sqlite3.DatabaseError as e:
            if marked:
                return Problem(f"a damaged xform translation memory ({e})", ours=True)
            return Problem(f"an SQLite database that cannot be read ({e})", ours=False)

    def schema_problem(self, marked: bool) -> Problem | None:
        """What the SQLite database at the path holds that a memory does not (`marked`: its bytes
        show it is xform's); None: nothing. SQLite's errors reading it are raised."""
        db = sqlite3.connect(f"{self.path.absolute().as_uri()}?mode=ro", uri=True, timeout=BUSY_MS / 1000)
        try:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "meta" not in tables:
                if marked:
                    return Problem("a damaged xform translation memory (no meta table)", ours=True)
                return Problem("an SQLite database that is not an xform translation memory (no meta table)", ours=False)
            meta = dict(db.execute("SELECT key, value FROM meta"))
            if meta.get("format") != FORMAT:
                return Problem(f"an SQLite database of another format ({meta.get('format')!r})", ours=False)
            if meta.get("version") != VERSION:
                return Problem(f"one of version {meta.get('version')}", ours=True,
                               expected=f"an xform translation memory of version {VERSION}")
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok" or not {"contexts", "entries"} <= tables:
                return Problem(f"a damaged xform translation memory ({check})", ours=True)
        finally:
            db.close()
        return None

    def create(self) -> None:
        """A new, empty memory at the path (replacing what is there): written beside it, then renamed
        onto it, so a run killed meanwhile leaves the path as it was and at worst a temporary (which
        a later run removes). The WAL and shared-memory files of the file replaced go first: SQLite
        would read them as the new one's."""
        remove_stale_temporaries(self.path)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=temp_prefix(self.path), suffix=".tmp")
        os.close(fd)
        try:
            os.chmod(tmp, 0o666 & ~current_umask())  # as open() would make it, not mkstemp's 0600
            write_schema(tmp)
            for suffix in ("-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            os.replace(tmp, self.path)
        finally:
            for leftover in (tmp, f"{tmp}-journal", f"{tmp}-wal", f"{tmp}-shm"):
                Path(leftover).unlink(missing_ok=True)

    def connected(self) -> sqlite3.Connection:
        """A connection to the memory at the path (which is one), WAL journaling and a busy timeout;
        a memory from before the mark is marked."""
        db = sqlite3.connect(self.path, timeout=BUSY_MS / 1000, isolation_level=None)
        try:
            db.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            if db.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
                db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        except BaseException:
            db.close()
            raise
        return db

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


def write_schema(path: str) -> None:
    """An empty memory at `path` (a new file): its tables, its meta, the mark; WAL journaling set
    last, so the file closes whole with no WAL beside it."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        db.executescript(SCHEMA)
        db.execute("INSERT INTO meta VALUES ('format', ?), ('version', ?)", (FORMAT, VERSION))
        db.execute("PRAGMA journal_mode = WAL")
    finally:
        db.close()
