"""A corpus's record in its output directory: what was asked, what is done, written so that a
crash loses nothing finished and nothing is done twice.

    DIR/xform-corpus.json      the record: the corpus's identity (the bundle's manifest hash; each
                               input's name, format, field, lines, bytes and sha256; the decoding,
                               the backend and device; the shard size), each run, and once
                               complete every shard's figures and the lines that failed
    DIR/xform-shards/ID.json   a finished shard: its lines' translations and errors, and its figures;
                               a shard is done exactly when its file exists whole (written
                               atomically; one a crash left empty or cut short is done again)
    DIR/.xform-corpus.lock     held by the run translating DIR (flock): a second one is refused
    DIR/NAME                   each input's translation, assembled once every shard is done (the
                               shard files are removed then)

Everything is written through a temporary and one rename (xform.files). A record whose identity
differs from the command's (a changed bundle, input or decoding flag) is refused, naming what
changed, unless `force` starts over; a record of other inputs, or files xform did not write, are
refused whatever `force` says.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from xform.errors import InputError, Message, message
from xform.files import TEMP, atomic_write

RECORD, SHARDS, LOCK = "xform-corpus.json", "xform-shards", ".xform-corpus.lock"
FORMAT, VERSION = "xform-corpus", 1
OURS = (RECORD, SHARDS, LOCK)
END = b"}\n"  # how a shard's file ends (save), once written whole
TEXT_FLAGS = {"backend": "--backend", "device": "--device (or --backend's default)",
              "scores": "--scores / --token-scores", "src_lang": "--src-lang", "tgt_lang": "--tgt-lang",
              "truncate": "--truncate", "prefix_column": "--prefix-column", "replace_unknowns": "--replace-unknowns",
              "vocab_map": "--vocab-map (its sha256)", "terminology": "--glossary / --keep (their fingerprint)",
              "qe": "--qe"}


@dataclass(frozen=True)
class Identity:
    """What makes a corpus's translations what they are: a run whose identity equals the record's
    may take over its finished shards. bundle: {"path", "sha256"} (of its manifest, which holds
    every file's hash); inputs: [{"name", "path", "format", "field", "lines", "bytes", "sha256"}];
    decoding: {"generation": ..., "text": ..., "vocab_map": sha256 or None, "backend", "device"}."""
    bundle: dict
    inputs: list
    decoding: dict
    shard_lines: int

    def to_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self)))  # as the record holds it: tuples as lists

    @property
    def names(self) -> list[str]:
        return [i["name"] for i in self.inputs]

    def changes(self, recorded: dict) -> list[str]:
        """What differs from a record of the same inputs, in words (a decoding control named by
        its marker, errors.py: the CLI words it as its flag)."""
        now = self.to_dict()
        out = []
        if recorded["bundle"]["sha256"] != now["bundle"]["sha256"]:
            out.append(f"another bundle (manifest sha256 {recorded['bundle']['sha256'][:12]} then, "
                       f"{now['bundle']['sha256'][:12]} now: {now['bundle']['path']})")
        for old, new in zip(recorded["inputs"], now["inputs"]):
            for key in ("sha256", "format", "field"):
                if old[key] != new[key]:
                    out.append(f"{new['path']}: its {'content' if key == 'sha256' else key} changed "
                               f"({str(old[key])[:12]} then, {str(new[key])[:12]} now)")
        for key, (old, new) in differences(recorded["decoding"], now["decoding"]).items():
            said, *named = flag_of(key)
            out.append(Message(f"{said}: {old!r} then, {new!r} now", *named))
        if recorded["shard_lines"] != now["shard_lines"]:
            out.append(f"--shard-lines: {recorded['shard_lines']} then, {now['shard_lines']} now")
        return out


def differences(old: dict, new: dict, prefix: str = "") -> dict[str, tuple]:
    """The keys (dotted) whose values differ between two nested dicts."""
    out: dict[str, tuple] = {}
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out.update(differences(a, b, f"{prefix}{key}."))
        elif a != b:
            out[f"{prefix}{key}"] = (a, b)
    return out


def flag_of(key: str) -> tuple[str, ...]:
    """A decoding key as what sets it, and the setting it names: a decoding control's marker
    (generation.num_beams: {num_beams}, the CLI's --num-beams), the text options' flags."""
    from xform.runtime.decoding.controls import CONTROLS

    group, _, name = key.rpartition(".")
    if group == "generation":
        if any(c.name == name for c in CONTROLS):
            return "{" + name + "}", name
        return (f"the decoding's {name}",)
    return (TEXT_FLAGS.get(name, key),)


class Record:
    """DIR's record, opened (and locked) for one run: see the module's docstring."""

    def __init__(self, directory: Path, data: dict, lock: int):
        self.directory, self.data, self.lock = directory, data, lock

    @property
    def shards_dir(self) -> Path:
        return self.directory / SHARDS

    @property
    def complete(self) -> bool:
        return bool(self.data.get("complete"))

    @classmethod
    def open(cls, directory: Path, identity: Identity, force: bool) -> "Record":
        """The record of `directory` for this identity: a new one, or the one there to resume;
        refused (InputError) as the module's docstring says. `force` starts over."""
        directory = Path(directory)
        recorded = read_record(directory) if directory.exists() else None
        check_foreign(directory, recorded)
        directory.mkdir(parents=True, exist_ok=True)
        lock = take_lock(directory)
        try:
            recorded = read_record(directory)  # again, under the lock
            if recorded is not None:
                check_same_corpus(directory, recorded, identity, force)
            record = cls(directory, recorded or {}, lock)
            if recorded is None or force:
                record.start_over(identity)
            return record
        except BaseException:
            os.close(lock)
            raise

    def start_over(self, identity: Identity) -> None:
        """Discard what an earlier record finished (its shard files and outputs: xform's own) and
        write a fresh record."""
        for name in self.data.get("inputs", []):
            output = self.directory / name["name"]
            if output.is_file():
                output.unlink()
        self.remove_shards()
        self.data = {"format": FORMAT, "version": VERSION, **identity.to_dict(), "runs": [], "complete": False}
        self.write()

    def write(self) -> None:
        atomic_write(self.directory / RECORD, json.dumps(self.data, indent=1) + "\n")

    def done(self) -> set[str]:
        """The ids of the shards finished: their files exist, whole (one a crash left empty or cut
        short, or that cannot be read, is not done: its shard is translated again, and the file
        replaced)."""
        if not self.shards_dir.is_dir():
            return set()
        return {p.name[:-len(".json")] for p in self.shards_dir.iterdir()
                if p.name.endswith(".json") and not TEMP.fullmatch(p.name) and whole(p)}

    def begin_run(self, about: dict) -> int:
        """Record a run starting (its number, what it runs on); returns its number."""
        run = len(self.data["runs"]) + 1
        self.data["runs"].append({"run": run, **about})
        self.write()
        return run

    def save(self, shard_id: str, result: dict) -> None:
        self.shards_dir.mkdir(exist_ok=True)
        atomic_write(self.shards_dir / f"{shard_id}.json", json.dumps(result) + "\n")

    def load(self, shard_id: str, lines: int) -> dict:
        """A finished shard's file, checked: a file changed by hand is named, never used."""
        path = self.shards_dir / f"{shard_id}.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise InputError(f"{path}: unreadable ({e}); remove it to translate its shard again") from None
        if not isinstance(data, dict) or not isinstance(data.get("lines"), list) or len(data["lines"]) != lines:
            raise InputError(f"{path}: not the {lines} lines of shard {shard_id}; remove it to translate the shard "
                             "again")
        return data

    def finish(self, summary: dict) -> None:
        """Mark the corpus complete with its summary (every shard's figures, the lines that
        failed, the outputs' hashes), then remove the shard files the outputs now hold."""
        self.data.update(summary, complete=True)
        self.write()
        self.remove_shards()

    def remove_shards(self) -> None:
        if self.shards_dir.is_dir():
            for p in self.shards_dir.iterdir():
                if p.name.endswith(".json") or TEMP.fullmatch(p.name):
                    p.unlink()
            if not any(self.shards_dir.iterdir()):
                self.shards_dir.rmdir()

    def close(self) -> None:
        os.close(self.lock)


def whole(path: Path) -> bool:
    """A shard's file written to its end, as `save` ends it: a JSON object and a newline."""
    try:
        with open(path, "rb") as f:
            if f.seek(0, os.SEEK_END) < len(END):
                return False
            f.seek(-len(END), os.SEEK_END)
            return f.read() == END
    except OSError:
        return False


def read_record(directory: Path) -> dict | None:
    """DIR's record, or None where there is none; one xform did not write is refused."""
    path = directory / RECORD
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not a corpus record xform can read ({e}): give another --output-dir") from None
    if not (isinstance(data, dict) and data.get("format") == FORMAT and isinstance(data.get("inputs"), list)):
        raise InputError(f"{path}: not a corpus record xform wrote: give another --output-dir")
    if data.get("version") != VERSION:
        raise InputError(f"{path}: a corpus record of version {data.get('version')!r}; this xform reads version "
                         f"{VERSION}: give another --output-dir")
    return data


def check_foreign(directory: Path, recorded: dict | None) -> None:
    """Refuse a DIR that is a file, or holds files xform did not write for this record."""
    if not directory.exists():
        return
    if not directory.is_dir():
        raise InputError(f"--output-dir {directory}: is a file; expected a directory (new, empty, or a corpus's)")
    ours = set(OURS) | {i.get("name") for i in (recorded or {}).get("inputs", []) if isinstance(i, dict)}
    foreign = sorted(p.name for p in directory.iterdir() if p.name not in ours and temporary_of(p.name) not in ours)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise InputError(f"--output-dir {directory}: holds files xform did not write ({shown}); a corpus goes into a "
                         "new or empty directory, or one holding its own record, --force or not: give another "
                         "--output-dir")


def temporary_of(name: str) -> str | None:
    """The target of an xform temporary file's name (files.py), else None."""
    m = TEMP.fullmatch(name)
    return m["target"] if m else None


def check_same_corpus(directory: Path, recorded: dict, identity: Identity, force: bool) -> None:
    """Refuse another corpus's record always, and a changed one without `force`."""
    old = [i.get("name") for i in recorded["inputs"] if isinstance(i, dict)]
    if old != identity.names:
        raise InputError(f"--output-dir {directory}: holds the record of another corpus (inputs "
                         f"{', '.join(map(str, old))}; this one: {', '.join(identity.names)}); xform never writes one "
                         "corpus over another, "
                         "--force or not: give another --output-dir")
    try:
        changes = identity.changes(recorded)
    except (KeyError, TypeError, AttributeError) as e:
        raise InputError(f"{directory / RECORD}: a corpus record with a field missing or malformed ({e}): give "
                         "another --output-dir") from None
    if changes and not force:
        said = [message(c) for c in changes]
        raise InputError(f"--output-dir {directory}: its record was made with other settings: "
                         + "; ".join(m.template for m in said) + ". Pass --force to start over (what it finished is "
                         "discarded), or give another --output-dir").naming(*(s for m in said for s in m.settings))


def take_lock(directory: Path) -> int:
    """Hold DIR's lock for this process's run, or refuse: another run is translating it."""
    import fcntl

    fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise InputError(f"--output-dir {directory}: another xform corpus (pid {holder}) is translating it now; "
                         "wait for it, or give another --output-dir") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd
