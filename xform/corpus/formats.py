"""A corpus's files: its inputs read a line at a time, its outputs written line for line in the same format.

The format comes from the input's name: `.jsonl` is JSON lines (one object a line, its text in a
field), `.parquet` is Parquet (its text in a string column, read with pyarrow, which Ray Data
brings), anything else is text (one sentence a line). Reading yields, in order, what a worker
translates for each line: a text line's bytes (a line that is not UTF-8 fails alone, in the
worker, as `xform run` fails it), a field's text, or a `Failed` line the reader could not use (not
JSON, no such field). Writing puts each line's translations back in the input's format, blank
line for blank line. Nothing here decodes; it imports nothing of xform but errors and files.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Iterable, Iterator

from xform.errors import InputError
from xform.files import atomic_file, sha256_file

FORMATS = {".jsonl": "jsonl", ".parquet": "parquet"}  # by suffix; anything else is text
READ_BLOCK = 1 << 20
PARQUET_BATCH = 4096  # rows read at a time


@dataclass(frozen=True)
class Failed:
    """A line the reader could not turn into text: it fails alone, with this message."""
    message: str


@dataclass(frozen=True)
class Source:
    """One input: its path, format (text, jsonl, parquet) and, for jsonl and parquet, the field
    holding the text."""
    path: Path
    format: str
    field: str | None = None

    @classmethod
    def of(cls, path: Path, field: str) -> "Source":
        fmt = FORMATS.get(path.suffix.lower(), "text")
        return cls(path, fmt, None if fmt == "text" else field)

    @property
    def name(self) -> str:
        return self.path.name

    def label(self, index: int) -> str:
        """How a message names line `index` (0-based): FILE:LINE, or FILE:row N for Parquet."""
        return f"{self.path}:{'row ' if self.format == 'parquet' else ''}{index + 1}"


def measure(source: Source) -> tuple[int, int, str]:
    """(lines, bytes, sha256) of an input, read once: lines as reading yields them (a last line
    without a newline counts), rows for Parquet; a Parquet file without the column is refused here."""
    h = hashlib.sha256()
    lines, size, last = 0, 0, b"\n"
    with open(source.path, "rb") as f:
        while block := f.read(READ_BLOCK):
            h.update(block)
            lines += block.count(b"\n")
            size += len(block)
            last = block[-1:]
    if source.format == "parquet":
        return parquet_file(source).metadata.num_rows, size, h.hexdigest()
    return lines + (last != b"\n"), size, h.hexdigest()


def check_unchanged(source: Source, size: int, sha256: str) -> None:
    """Refuse an input that is no longer what was measured (`size` bytes of `sha256`): it changed
    while the corpus was translated, so its shards may hold lines of two versions."""
    try:
        now = os.stat(source.path).st_size
        digest = sha256_file(source.path) if now == size else None
    except OSError as e:
        raise changed(source, f"unreadable now: {e.strerror or e}") from None
    if now != size or digest != sha256:
        found = f"{now:,} bytes" if now != size else f"sha256 {str(digest)[:12]}"
        was = f"{size:,} bytes" if now != size else f"sha256 {sha256[:12]}"
        raise changed(source, f"{was} when it was read, {found} now")


def changed(source: Source, why: str) -> InputError:
    return InputError(f"{source.path}: changed while the corpus was translated ({why}); its output is not "
                      "written: once it no longer changes, run the command again (--force translates it anew)")


def read(source: Source) -> Iterator[bytes | str | Failed]:
    """Each line's text to translate, in order (see the module's docstring)."""
    if source.format == "parquet":
        yield from parquet_texts(source)
        return
    with open(source.path, "rb") as f:
        for line in f:
            yield line if source.format == "text" else jsonl_text(line, source.field or "")


def jsonl_text(raw: bytes, field: str) -> str | Failed:
    """The text of a JSON line's `field`; a blank line is blank."""
    if not raw.strip():
        return ""
    try:
        obj = json.loads(raw)
    except UnicodeDecodeError as e:
        return Failed(f"not UTF-8 ({e})")
    except ValueError as e:
        return Failed(f"not JSON ({e})")
    if not isinstance(obj, dict):
        return Failed(f"expected a JSON object with a {field!r} field, found {type(obj).__name__}")
    value = obj.get(field)
    if not isinstance(value, str):
        found = "no such field" if field not in obj else f"a {type(value).__name__}"
        return Failed(f"field {field!r}: expected a string, found {found} (--field names the text)")
    return value


def pyarrow_modules():
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise InputError('reading and writing Parquet needs pyarrow, which the ray extra brings: '
                         'pip install -e ".[ray]"') from None
    return pyarrow, pyarrow.parquet


def parquet_file(source: Source):
    """The Parquet file, its text column checked: present and of strings."""
    pa, pq = pyarrow_modules()
    try:
        f = pq.ParquetFile(source.path)
    except (OSError, pa.ArrowException) as e:
        raise InputError(f"{source.path}: not a Parquet file ({e})") from None
    schema = f.schema_arrow
    if source.field not in schema.names:
        raise InputError(f"{source.path}: no column {source.field!r} (--field names the text); columns: "
                         f"{', '.join(schema.names)}")
    kind = schema.field(source.field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise InputError(f"{source.path}: column {source.field!r} holds {kind}, expected strings")
    return f


def parquet_texts(source: Source) -> Iterator[str]:
    """The column's texts, row by row; a null is a blank line."""
    for batch in parquet_file(source).iter_batches(batch_size=PARQUET_BATCH, columns=[source.field]):
        for value in batch.column(0).to_pylist():
            yield "" if value is None else value


# One line's result as a shard records it: its translations (n of them; each a text, or with
# scores [text, score], with token scores [text, score, [log-probs]]; with qe the confidence
# after, [text(, ...), confidence]) or None, and its error or None
LineResult = tuple[list | None, str | None]


def parts(translation: Any, scores: bool | str, qe: bool = False) -> tuple[str, Any, Any, Any]:
    """(text, score, token log-probs, confidence) of one stored translation (None: not asked)."""
    if isinstance(translation, str):
        return translation, None, None, None
    text, rest = translation[0], list(translation[1:])
    score = rest.pop(0) if scores else None
    tokens = rest.pop(0) if scores == "tokens" else None
    return text, score, tokens, (rest.pop(0) if qe and rest else None)


def write(source: Source, target: Path, results: Iterable[LineResult], n: int, scores: bool | str,
          qe: bool = False) -> None:
    """The output of `source` at `target`, written atomically, line for line in the input's format."""
    if source.format == "text":
        with atomic_file(target) as f:
            for translations, error in results:
                for columns in text_columns(translations, error, n, scores, qe):
                    f.write(columns + "\n")
    elif source.format == "jsonl":
        results = iter(results)
        with atomic_file(target) as f, open(source.path, "rb") as original:
            for raw in original:
                ((translations, error),) = take(results, 1, source)
                f.write(jsonl_line(raw, translations, error, n, scores, qe) + "\n")
            ended(results, source)
    else:
        write_parquet(source, target, results, n, scores, qe)


def take(results: Iterator[LineResult], k: int, source: Source) -> list[LineResult]:
    """The next `k` lines' results; fewer: the input has more lines than its shards translated."""
    got = list(islice(results, k))
    if len(got) < k:
        raise changed(source, "it has more lines than its shards translated")
    return got


def ended(results: Iterator[LineResult], source: Source) -> None:
    """No result left over: else the input has fewer lines than its shards translated."""
    if next(results, None) is not None:
        raise changed(source, "it has fewer lines than its shards translated")


def text_columns(translations: list | None, error: str | None, n: int, scores: bool | str,
                 qe: bool = False) -> list[str]:
    """A text output's lines for one input line: `run`'s columns after the source (the translation,
    then with scores the score, with token scores the tokens' log-probabilities, with qe the
    confidence last), n of them."""
    if error is not None or translations is None:
        return [("\t\t" if scores == "tokens" else "\t" if scores else "") + ("\t" if qe else "")] * n
    if not scores and not qe:
        return [str(t) for t in translations]
    lines = []
    for t in translations:
        text, score, per_token, sure = parts(t, scores, qe)
        line = f"{text}\t{score:.4f}" if scores else text
        if scores == "tokens":
            line += "\t" + " ".join(f"{v:.4f}" for v in per_token)
        if qe:
            line += "\t" if sure is None else f"\t{sure:.3f}"
        lines.append(line)
    return lines


def fields(translations: list | None, error: str | None, n: int, scores: bool | str,
           qe: bool = False) -> dict[str, Any]:
    """A JSON line's or a Parquet row's added fields: translation (a list of n with
    --num-return-sequences), score and token_scores with scores, confidence with qe, error (None
    when translated)."""
    got = [parts(t, scores, qe) for t in translations] if translations is not None and error is None else None
    texts = [p[0] for p in got] if got is not None else [""] * n
    out: dict[str, Any] = {"translation": texts[0] if n == 1 else texts}
    for name, k, wanted in (("score", 1, bool(scores)), ("token_scores", 2, scores == "tokens"),
                            ("confidence", 3, qe)):
        if wanted:
            values = [p[k] for p in got] if got is not None else [None] * n
            out[name] = values[0] if n == 1 else values
    out["error"] = error
    return out


def jsonl_line(raw: bytes, translations: list | None, error: str | None, n: int, scores: bool | str,
               qe: bool = False) -> str:
    """The input's JSON object with the translation's fields set (a blank line stays blank; a line
    that is no object gives an object of these fields alone)."""
    if not raw.strip():
        return ""
    try:
        obj = json.loads(raw)
    except ValueError:
        obj = None
    added = fields(translations, error, n, scores, qe)
    if added["error"] is None:
        del added["error"]
    return json.dumps({**obj, **added} if isinstance(obj, dict) else added, ensure_ascii=False)


def write_parquet(source: Source, target: Path, results: Iterable[LineResult], n: int, scores: bool | str,
                  qe: bool = False) -> None:
    """The input table with columns translation, score / token_scores (with scores), confidence
    (with qe) and error added, a row group at a time."""
    pa, pq = pyarrow_modules()
    results = iter(results)
    writer = None
    with atomic_file(target, binary=True) as f:
        try:
            for batch in pq.ParquetFile(source.path).iter_batches(batch_size=PARQUET_BATCH):
                rows = [fields(*result, n, scores, qe) for result in take(results, batch.num_rows, source)]
                table = pa.Table.from_batches([batch])
                for name in rows[0] if rows else ():
                    table = table.append_column(name, pa.array([r[name] for r in rows],
                                                               type=added_type(pa, name, n)))
                if writer is None:
                    writer = pq.ParquetWriter(f, table.schema)
                writer.write_table(table)
            ended(results, source)
            if writer is None:  # no rows: the input's schema and the added columns, empty
                writer = pq.ParquetWriter(f, empty_schema(pa, pq, source, n, scores, qe))
        finally:  # closed before its file, written or given up
            if writer is not None:
                writer.close()


def added_type(pa, name: str, n: int):
    """The Arrow type of an added column."""
    one = {"translation": pa.string(), "score": pa.float64(), "token_scores": pa.list_(pa.float64()),
           "confidence": pa.float64(), "error": pa.string()}[name]
    return one if n == 1 or name == "error" else pa.list_(one)


def empty_schema(pa, pq, source: Source, n: int, scores: bool | str, qe: bool = False):
    schema = pq.ParquetFile(source.path).schema_arrow
    names = ["translation", *(["score"] if scores else []), *(["token_scores"] if scores == "tokens" else []),
             *(["confidence"] if qe else []), "error"]
    for name in names:
        schema = schema.append(pa.field(name, added_type(pa, name, n)))
    return schema
