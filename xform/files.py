"""Files at the bottom of every layer: hashing, crash-safe writes and page-cache eviction.

Every write goes through a temporary named `.<target>.xform-<pid>-<random>` beside its target and
one rename(2). A process killed at any point leaves the target as it was (or absent) plus, at
worst, its temporary; the next write to that target removes temporaries whose process is gone.
The models, the exporter, the runtime and serving all write through here; it imports nothing of
xform but its errors.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator

from xform.errors import BundleError


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def drop_cached(path: Path, offset: int, nbytes: int) -> None:
    """Evict a file range from the page cache (clean pages nobody maps); where the OS has no
    posix_fadvise, nothing."""
    if not hasattr(os, "posix_fadvise"):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, offset, nbytes, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


TEMP = re.compile(r"\.(?P<target>.+)\.xform-(?P<pid>\d+)-[^/]*")


def temp_prefix(target: Path) -> str:
    return f".{target.name}.xform-{os.getpid()}-"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(target: Path, any_target: bool = False) -> None:
    """Temporaries of earlier writes to `target` (to anything in the directory `target` when
    `any_target`) whose process no longer runs: they were killed mid-write."""
    if any_target:
        directory, pattern = target, ".*.xform-*"
    else:
        directory, pattern = target.parent, f".{glob.escape(target.name)}.xform-*"
    if not directory.is_dir():
        return
    for p in directory.glob(pattern):
        m = TEMP.fullmatch(p.name)
        if not m or (not any_target and m["target"] != target.name):
            continue
        if int(m["pid"]) != os.getpid() and not pid_alive(int(m["pid"])):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()


def current_umask() -> int:
    """The process's umask (from /proc where it is readable, so no thread sees it changed)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def publish_modes(root: Path) -> None:
    """Files 0666 and directories 0777 less the umask, as open() and mkdir() would make them:
    temporaries (mkstemp, mkdtemp) and some writers (onnx's external data, safetensors) make
    theirs private, which would keep a bundle from another user or a non-root Triton container."""
    mask = current_umask()
    os.chmod(root, 0o777 & ~mask)
    for path in Path(root).rglob("*"):
        if not path.is_symlink():
            executable = path.is_dir() or path.stat().st_mode & 0o111
            os.chmod(path, (0o777 if executable else 0o666) & ~mask)


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write through a temporary file beside `path`, then rename: readers see old or new, never half.
    The file gets the mode a plain open() would give it (0666 less the umask), not mkstemp's 0600."""
    with atomic_file(path, binary=isinstance(data, bytes)) as f:
        f.write(data)


@contextlib.contextmanager
def atomic_file(path: Path, binary: bool = False) -> Iterator[IO[Any]]:
    """A file to write `path` through, renamed onto it when the block ends without an error (text
    is UTF-8); on an error (Ctrl-C included) it is removed and `path` is as it was."""
    remove_stale_temporaries(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=temp_prefix(path),
                               suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# Owned(path): None when `path` (which exists) is something xform wrote and may replace, else why not
Owned = Callable[[Path], "str | None"]


def empty_directory(path: Path) -> str | None:
    """Owned for a directory xform may write into only when it is empty."""
    if not path.is_dir():
        return "is a file, not a directory"
    return None if not any(path.iterdir()) else "is a directory with files in it"


def is_empty_directory(path: Path) -> bool:
    """A directory (not a link to one) with nothing in it, which a rename(2) of a directory replaces."""
    try:
        return path.is_dir() and not path.is_symlink() and not any(path.iterdir())
    except OSError:
        return False


def check_target(target: Path, force: bool, what: str, owned: Owned,
                 inputs: Iterable[tuple[str, str | Path]] = (), flag: str = "-o") -> None:
    """Refuse to write `target` (a `what`: bundle, Triton model, file) where that could lose anything.

    Refused whatever `force` says: the current directory or a parent of it, an input of the
    command (`inputs`: its name and path) or a parent of one, a path inside an input directory,
    and an existing target `owned` disowns (not a bundle, a bundle with files xform did not write,
    a folder of someone's files). An existing empty directory is taken as a new path is; any
    other existing target xform wrote is replaced only with `force`.
    Paths are compared after resolving symlinks, so no alias of an input gets through.
    """
    where = f"{flag} {target}"
    real = Path(os.path.realpath(target))
    cwd = Path.cwd().resolve()
    if real == cwd or real in cwd.parents:
        place = "the current directory" if real == cwd else "a parent of the current directory"
        raise BundleError(f"{where}: is {place}, which xform never replaces: give {flag} a new path")
    for name, path in inputs:
        inp = Path(os.path.realpath(path))
        relation = ("is " + name + " itself" if real == inp else f"holds {name} ({path})" if real in inp.parents
                    else f"is inside {name} ({path})" if inp in real.parents else None)
        if relation:
            raise BundleError(f"{where}: {relation}; writing the {what} there could destroy it, --force or not: "
                              f"give {flag} a path outside {name}")
    if not os.path.lexists(target):
        return
    reason = owned(Path(target))
    if reason is not None:
        raise BundleError(f"{where}: {reason}; xform replaces only a {what} it wrote, --force or not: move it "
                          f"away or give {flag} another path")
    if is_empty_directory(Path(target)):
        return  # nothing in it to lose: taken as a new path is, without --force
    if not force:
        raise BundleError(f"{where}: already exists; pass --force to replace the {what}")


@contextlib.contextmanager
def atomic_directory(target: Path, force: bool, owned: Owned = empty_directory) -> Iterator[Path]:
    """Yield a fresh temporary directory beside `target`; on success it becomes `target`.

    On any error the temporary directory is removed and `target` is left as it was. Without
    `force`, the final rename(2) of a directory onto an existing one fails, so of two writers
    racing to a new target one wins and the other is refused; with `force`, an existing target
    `owned` accepts (checked before and again just before the swap) is moved aside, the new one
    renamed in, and the old one removed (a kill in between leaves the target absent, and the old
    one as a temporary the next write removes). Anything else at `target` is never touched.
    """
    target = Path(os.path.abspath(target))
    check_target(target, force, "directory", owned)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(target)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=temp_prefix(target), suffix=".tmp"))
    try:
        yield tmp
        publish_modes(tmp)  # mkdtemp makes it 0700; a bundle is shared like any directory
        if force and os.path.lexists(target):
            reason = owned(target)
            if reason is not None:  # written by someone else while this one ran
                raise BundleError(f"{target}: {reason}; not replaced")
            old = target.with_name(f"{temp_prefix(target)}old")
            os.replace(target, old)
            os.replace(tmp, target)
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink()
        else:
            try:
                os.rename(tmp, target)
            except OSError as e:
                if not target.exists():
                    raise
                raise BundleError(f"{target}: already exists (written by another process while this one ran); "
                                  "pass --force to overwrite it") from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def shown(value: Any) -> str:
    """A value as a JSON file spells it (null, true, "text"), cut to 80 characters: how an error
    about a manifest's or a tokenizer.json's field shows what it found."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


BOMS = ((b"\xff\xfe\x00\x00", "UTF-32 (little-endian byte-order mark)"),
        (b"\x00\x00\xfe\xff", "UTF-32 (big-endian byte-order mark)"),
        (b"\xff\xfe", "UTF-16 (little-endian byte-order mark)"), (b"\xfe\xff", "UTF-16 (big-endian byte-order mark)"))


def wide_text(head: bytes) -> str | None:
    """The UTF-16 / UTF-32 flavour `head` (a file's first bytes, without a byte-order mark) decodes
    as text in (no NUL or other control characters but tabs and line ends), else None."""
    import codecs

    for codec, name in (("utf-32-le", "UTF-32"), ("utf-32-be", "UTF-32"), ("utf-16-le", "UTF-16"),
                        ("utf-16-be", "UTF-16")):
        try:
            text = codecs.getincrementaldecoder(codec)().decode(head, final=False)  # a cut last character is fine
        except UnicodeDecodeError:
            continue
        if text and all(ch.isprintable() or ch in "\t\n\r\f\v" for ch in text):
            return name
    return None


def utf8_head(head: bytes) -> bool:
    """Whether a file's first bytes read as UTF-8 (a character cut at the end is fine)."""
    import codecs
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return False
    return True


def not_utf8_text(path: Path, flag: str) -> str | None:
    """Why a regular file of lines is plainly not UTF-8 text, with what to do: a UTF-16 / UTF-32
    byte-order mark, or zero bytes in its first 4 KiB as UTF-16 has between ASCII letters that
    decode as UTF-16 / UTF-32 text (with how to convert it); zero bytes that do not (an
    executable, an image, an archive: a binary file, not text). None when it may be UTF-8 (a
    pipe is not read ahead)."""
    if not path.is_file():
        return None
    with open(path, "rb") as f:
        head = f.read(4096)
    found = next((name for bom, name in BOMS if head.startswith(bom)), None)
    zeros = head.count(b"\x00")
    if found is None and zeros:
        wide = wide_text(head) if zeros * 4 >= len(head) else None  # as many zeros as ASCII in UTF-16 has
        if wide is None and zeros * 4 < len(head) and utf8_head(head):
            return None  # UTF-8 text with a stray zero byte: its lines are read as they are
        if wide is None:
            kind = " (an ELF executable)" if head.startswith(b"\x7fELF") else ""
            return (f"{flag} {path}: a binary file{kind}, not text: its first {len(head):,} bytes hold "
                    f"{zeros:,} zero bytes and do not read as UTF-8, UTF-16 or UTF-32 text. "
                    f"xform reads UTF-8 text, one sentence a line; pass a text file")
        found = f"{wide} (zero bytes between the characters)"
    if found is None:
        return None
    wide = "UTF-32" if found.startswith("UTF-32") else "UTF-16"
    return (f"{flag} {path}: looks like {found}; xform reads UTF-8 text. Convert it first, for example: "
            f"iconv -f {wide} -t UTF-8 {path} > {path.stem}.utf8{path.suffix}")


def read_json_object(path: Path, error: type[Exception] = BundleError, what: str = "") -> dict:
    """A file holding one JSON object (`what`, for the message: a tokenizer, a vocabulary), or
    `error` naming the file and what is wrong with it."""
    import json
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{path}: unreadable ({e})") from None
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object{' (' + what + ')' if what else ''}, found {type(data).__name__}")
    return data


def load_spm(path: Path, error: type[Exception] = BundleError, name: str | None = None):
    """A sentencepiece model, or `error` naming the file (and `name`, the flag or file that named it)."""
    where = f"{name} {path}" if name else str(path)
    try:
        import sentencepiece
    except ImportError:
        raise error(f"{where}: a sentencepiece model needs sentencepiece: pip install sentencepiece") from None
    proc = sentencepiece.SentencePieceProcessor()
    try:
        ok = Path(path).is_file() and proc.Load(str(path))
    except (OSError, RuntimeError) as e:
        raise error(f"{where}: not a sentencepiece model ({e})") from None
    if not ok:
        raise error(f"{where}: missing or not a sentencepiece model")
    return proc
