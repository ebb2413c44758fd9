"""`xform run --documents`: each --text and the --input-file translated as a document (sentences
split and rejoined with the layout, Markdown's markup left alone, repeats from a translation
memory, paragraph languages detected): runtime/documents/."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import click
from rich.markup import escape

from xform.cli import err
from xform.cli.flags import flag, said
from xform.cli.groups import option_group
from xform.errors import InputError, XformError


def document_options(fn):
    """The flags of translating documents (run, corpus), as DocumentFlags `documents`."""
    return option_group("documents", DocumentFlags, [
        click.option("--documents", is_flag=True,
                     help="Translate each --text and the whole --input-file as a document: paragraphs split into "
                          "sentences (sentencex, by --src-lang's rules), decoded together, rejoined with the "
                          "original whitespace, line and paragraph breaks."),
        click.option("--format", "markup", type=click.Choice(["text", "markdown", "html"]), default=None,
                     help="A document's markup (implies --documents; default text): markdown leaves code blocks, "
                          "inline code, URLs, link targets and HTML tags untouched; html translates text only, "
                          "tags, attributes, scripts, styles and code as written."),
        click.option("--memory", type=click.Path(path_type=Path), default=None,
                     help="A translation memory (SQLite, created when missing): a sentence translated before with "
                          "this bundle and these settings is not decoded again (implies --documents)."),
        click.option("--skip-target-language", is_flag=True,
                     help="Leave paragraphs already in --tgt-lang as they are (identified by py3langid; implies "
                          "--documents)."),
    ])(fn)


@dataclasses.dataclass(frozen=True)
class DocumentFlags:
    """The documents flags as given: --documents, --format (`markup`), --memory,
    --skip-target-language; `wanted` when any asks for documents."""
    documents: bool = False
    markup: str | None = None
    memory: Path | None = None
    skip_target_language: bool = False

    @property
    def wanted(self) -> bool:
        return bool(self.documents or self.markup or self.memory or self.skip_target_language)


def check_document_flags(given: bool, refused: dict[str, bool]) -> None:
    """--documents' usage errors: its inputs (`given`: --text / --input-file), and the line flags
    that have no meaning for a document."""
    if not given:
        raise click.UsageError("--documents translates --text / --input-file: give one")
    refuse_line_flags(refused)


def refuse_line_flags(given: dict[str, bool]) -> None:
    """A usage error naming the first line flag given: it has no meaning for a document."""
    for name, on in given.items():
        if on:
            raise click.UsageError(f"{name} goes with lines, not --documents (a document's translation is one text)")


def read_documents(texts: tuple[str, ...], input_file: Path | None) -> list[tuple[str, str]]:
    """(name, text) of each --text and of --input-file (UTF-8; `-`: standard input)."""
    docs = [(f"--text {i}", t) for i, t in enumerate(texts, 1)]
    if input_file is not None:
        name = "<stdin>" if str(input_file) == "-" else str(input_file)
        data = sys.stdin.buffer.read() if name == "<stdin>" else input_file.read_bytes()
        try:
            docs.append((name, data.decode("utf-8")))
        except UnicodeDecodeError as e:
            line = data[:e.start].count(b"\n") + 1
            raise XformError(f"--input-file {name}:{line}: not UTF-8 ({e.reason} at byte {e.start})") from None
    return docs


def translate_documents(translator, docs: list[tuple[str, str]], gen, batching, text, flags: DocumentFlags,
                        force: bool, on_batch=None):
    """The documents translated (DocumentResults) and the run's tally; the summary on stderr."""
    from xform.runtime.documents.memory import TranslationMemory
    from xform.runtime.documents.translate import DocumentTranslator

    memory, memory_path = None, flags.memory
    try:
        memory = TranslationMemory(memory_path, force=force) if memory_path is not None else None
        documents = DocumentTranslator(translator, gen, batching, text, markup=flags.markup or "text",
                                       memory=memory, skip_target_language=flags.skip_target_language,
                                       on_batch=on_batch, on_total=on_batch.grow if on_batch else None)
        results = documents.translate(docs)
    except InputError as e:
        raise click.UsageError(said(e)) from None
    finally:
        if memory is not None:
            memory.close()
    report(results, documents.tally, memory_path)
    return results, documents.tally


def counted(n: int, noun: str) -> str:
    """`1 sentence`, `2 sentences`."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def report(results, tally, memory_path: Path | None) -> None:
    """What was done, on stderr: sentences, distinct ones (and the pieces they were cut into, where
    a sentence over max_len was cut at its clauses), the memory's hits, those decoded; per
    document, its paragraphs by language and those kept in the target language."""
    line = f"documents: {tally.documents}, {counted(tally.sentences, 'sentence')}, {tally.distinct:,} distinct"
    if tally.pieces != tally.distinct:  # the memory's hits and those decoded are pieces
        line += f", translated as {counted(tally.pieces, 'piece')} (each sentence over max_len cut at its clauses)"
    if memory_path is not None:
        line += f", {tally.remembered:,} from the memory {memory_path}"
    err.print(escape(line + f", {tally.decoded:,} decoded"))
    for r in results:
        parts = []
        if r.languages:
            parts.append("paragraphs by language: " + ", ".join(f"{k} {v}" for k, v in sorted(r.languages.items())))
        if r.kept_paragraphs or r.kept:
            translated = r.paragraphs - r.kept_paragraphs
            target = f" ({r.target})" if r.target else ""
            parts.append(f"{counted(translated, 'paragraph')} translated, {counted(r.kept_paragraphs, 'paragraph')} "
                         f"({counted(r.kept, 'sentence')}) already in the target language{target}, kept")
        if parts:
            err.print(escape(f"{r.name}: " + "; ".join(parts)))


def run_documents(translator, sources, output: Path | None, gen, batching, text, flags: DocumentFlags,
                  force: bool) -> dict:
    """`xform run --documents` of `sources` (decode.Sources: --text, --input-file): a document's
    translation on stdout as its bytes are (several: one after another, each ending in a line
    break), or the one document's into --output, written atomically; what --json records."""
    from xform.cli.options import progress_bar
    from xform.files import atomic_file

    if gen.num_return_sequences > 1:
        raise click.UsageError(f"--documents writes one translation a document, not {flag('num_return_sequences')} "
                               f"{gen.num_return_sequences}")
    docs = read_documents(sources.texts, sources.input_file)
    if output is not None and len(docs) > 1:
        raise click.UsageError(f"--output holds one document, given {len(docs)} (--text and --input-file): give one")
    with progress_bar(sources.input_file is not None, "sentences", "translated", lambda: None) as on_batch:
        results, tally = translate_documents(translator, docs, gen, batching, text, flags, force, on_batch)
    record = {"documents": [{"name": r.name, "sentences": r.sentences, "kept": r.kept, "languages": r.languages,
                             **({"scored": [{"line": n, "source": s, "target": t, "confidence": c}
                                            for n, s, t, c in r.scored]} if text.qe else {}),
                             "paragraphs": r.paragraphs, "kept_paragraphs": r.kept_paragraphs} for r in results],
              "tally": vars(tally)}
    if output is not None:
        try:
            with atomic_file(output) as f:
                f.write(results[0].text)
        except OSError as e:
            raise XformError(f"--output {output}: {e.strerror or e}") from None
        return record
    if len(results) == 1:  # the document as its bytes are, no line break added
        click.echo(results[0].text, nl=False)
        return record
    for r in results:
        click.echo(r.text, nl=not r.text.endswith("\n"))
    return record


def corpus_documents(flags: DocumentFlags, scores: bool, prefix_column: bool, force: bool):
    """`xform corpus --documents`: each record a document, as DocumentOptions (None: lines). The
    memory is opened here first, so that a foreign file is refused (and a damaged one of xform's
    replaced with --force) before a worker starts; the workers share it (SQLite, WAL)."""
    from xform.runtime.documents.memory import TranslationMemory
    from xform.runtime.documents.translate import DocumentOptions

    if not flags.wanted:
        return None
    memory = flags.memory
    refuse_line_flags({"--scores / --token-scores": scores, "--prefix-column": prefix_column})
    if memory is not None:
        try:
            TranslationMemory(memory, force=force).close()
        except InputError as e:
            raise click.UsageError(said(e)) from None
    return DocumentOptions(flags.markup or "text", str(memory.absolute()) if memory is not None else None,
                           flags.skip_target_language)
