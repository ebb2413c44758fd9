"""`xform run --documents` and `xform corpus --documents`: the file translated as the Python door
translates it, written atomically to --output or printed; the memory's hits reported on a second
run; line flags and foreign memories refused with the flag named and exit 2; each JSON-lines
record a document in a corpus, a bad one failing alone."""
import json
import re

import pytest
from click.testing import CliRunner

import xform
from tests.documents.texts import MARKDOWN, PLAIN
from xform.cli import main
from xform.runtime.documents.door import translate_document, translate_documents

pytest.importorskip("sentencex", reason="documents need the documents extra (pip install -e '.[dev]')")
SHORT = ["--max-new-tokens", "12"]


def run(*args):
    return CliRunner().invoke(main, ["run", *map(str, args)])


@pytest.fixture(scope="module")
def translator(text_marian):
    return xform.Translator(text_marian)


def test_run_translates_a_file_as_a_document(text_marian, translator, tmp_path):
    src = tmp_path / "doc.md"
    src.write_text(MARKDOWN)
    memory = tmp_path / "tm.db"
    r = run(text_marian, "--input-file", src, "--format", "markdown", "--memory", memory, "--output",
            tmp_path / "out.md", *SHORT)
    assert r.exit_code == 0, r.output
    expected = translate_document(translator, MARKDOWN, format="markdown", max_decoding_length=12)
    assert (tmp_path / "out.md").read_text() == expected
    assert "0 from the memory" in r.stderr and " decoded" in r.stderr
    again = run(text_marian, "--input-file", src, "--format", "markdown", "--memory", memory, *SHORT)
    assert again.exit_code == 0, again.output
    assert again.stdout == expected  # byte for byte, as --output writes it (issue 55)
    assert ", 0 decoded" in again.stderr


def test_each_text_is_a_document(text_marian, translator):
    r = run(text_marian, "--documents", "--text", PLAIN["en"], "--text", "a blue dog. my old cat", *SHORT)
    assert r.exit_code == 0, r.output
    assert r.stdout == "".join(t if t.endswith("\n") else t + "\n" for t in translate_documents(translator,
        [PLAIN["en"], "a blue dog. my old cat"], max_decoding_length=12))


@pytest.mark.parametrize("flags, named", [(["--scores"], "--scores"), (["--prefix-column"], "--prefix-column"),
                                          (["--num-hypotheses", "2", "--num-beams", "2"], "--num-hypotheses"),
                                          (["--src-lang", "auto"], "--src-lang auto")])
def test_line_flags_and_bad_settings_are_refused(text_marian, tmp_path, flags, named):
    src = tmp_path / "doc.txt"
    src.write_text("a blue dog.\n")
    r = run(text_marian, "--documents", "--input-file", src, *flags)
    assert r.exit_code == 2 and named in r.output, r.output


def test_skipping_the_target_language_needs_to_know_it(demo_bundle):
    r = run(demo_bundle, "--text", "12", "--skip-target-language")
    assert r.exit_code == 2 and "--skip-target-language: name the target language (--tgt-lang)" in r.output


def test_the_summary_counts_sentences_and_the_pieces_a_long_one_is_cut_into(text_marian, translator):
    """One sentence over max_len cut at its commas: the summary says 1 sentence, translated as N
    pieces (it said "1 sentences, N distinct", issue 55); without a cut, sentences as before."""
    n = translator.session.config.max_len
    clause = "the red cat sleeps"
    sentence = ", ".join([clause] * (2 * n // len(translator.policy.encode_text(clause)) + 1)) + "."
    r = run(text_marian, "--documents", "--text", sentence, *SHORT)
    assert r.exit_code == 0, r.output
    pieces = re.search(r"documents: 1, 1 sentence, 1 distinct, translated as (\d+) pieces \(each sentence over "
                       r"max_len cut at its clauses\), (\d+) decoded", r.stderr)
    assert pieces is not None and int(pieces[1]) > 1 and pieces[1] == pieces[2], r.stderr
    r = run(text_marian, "--documents", "--text", "a blue dog. a blue dog. my old cat", *SHORT)
    assert r.exit_code == 0 and "documents: 1, 3 sentences, 2 distinct, 2 decoded" in r.stderr, r.stderr


def test_the_summary_counts_the_paragraphs_kept_in_the_target_language(text_marian, tmp_path):
    """--skip-target-language: the summary counts the paragraphs it translated and those it kept
    (it left the kept paragraphs out, issue 55); the JSON report holds them too."""
    text = "the red cat sleeps and the blue dog runs fast.\n\nle chat rouge dort et le chien bleu court.\n"
    r = run(text_marian, "--documents", "--skip-target-language", "--text", text, "--json", tmp_path / "r.json",
            *SHORT)
    assert r.exit_code == 0, r.output
    assert ("--text 1: 1 paragraph translated, 1 paragraph (1 sentence) already in the target language (en), kept"
            in r.stderr), r.stderr
    document, = json.loads((tmp_path / "r.json").read_text())["documents"]
    assert document["paragraphs"] == 2 and document["kept_paragraphs"] == 1 and document["kept"] == 1


def test_a_foreign_memory_and_a_file_not_utf8(text_marian, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    r = run(text_marian, "--text", "a blue dog.", "--memory", notes)
    assert r.exit_code == 2 and f"--memory {notes}: expected an xform translation memory" in r.output
    assert notes.read_text() == "mine\n"
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"a blue dog.\n\nmy \xff cat\n")
    r = run(text_marian, "--documents", "--input-file", bad)
    assert r.exit_code == 1 and f"--input-file {bad}:3: not UTF-8" in r.output


def test_corpus_records_are_documents(text_marian, translator, tmp_path):
    src = tmp_path / "in.jsonl"
    records = [{"id": 1, "text": PLAIN["en"]}, {"id": 2, "text": MARKDOWN}, {"id": 3, "text": ""},
               {"id": 4, "text": " ".join(["the red cat sleeps"] * 40) + "."}]
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    memory = tmp_path / "tm.db"
    r = CliRunner().invoke(main, ["corpus", str(text_marian), str(src), "--output-dir", str(tmp_path / "o"),
                                  "--documents", "--memory", str(memory), "--shard-lines", "2", *SHORT])
    assert r.exit_code == 1, r.output  # the fourth record is too long: it fails alone
    got = [json.loads(line) for line in (tmp_path / "o" / "in.jsonl").read_text().splitlines()]
    assert [g["translation"] for g in got[:3]] == translate_documents(translator,
        [PLAIN["en"], MARKDOWN, ""], max_decoding_length=12)
    assert "more than the model's max_len" in got[3]["error"] and "--truncate" in got[3]["error"]
    assert got[3]["error"].startswith("line 1: a sentence of") and f"{src}:4: line 1: a sentence" in r.output
    with xform_memory(memory) as tm:
        assert len(tm) > 10
    r = CliRunner().invoke(main, ["corpus", str(text_marian), str(src), "--output-dir", str(tmp_path / "o2"),
                                  "--documents", "--memory", str(memory), "--shard-lines", "2", "--truncate",
                                  *SHORT])
    assert r.exit_code == 0, r.output


def xform_memory(path):
    from xform.runtime.documents.memory import TranslationMemory
    return TranslationMemory(path)


@pytest.mark.parametrize("text", ["a blue dog. my old cat", "a blue dog.\n\nmy old cat\n\n", ""])
def test_a_document_on_stdout_is_its_bytes(text_marian, translator, tmp_path, text):
    """One document printed gains nothing its input lacks: no line break after a last line without
    one, nothing for an empty file (issue 55); --output writes the same bytes."""
    src = tmp_path / "doc.txt"
    src.write_bytes(text.encode())
    r = run(text_marian, "--documents", "--input-file", src, "--output", tmp_path / "out.txt", *SHORT)
    printed = run(text_marian, "--documents", "--input-file", src, *SHORT)
    assert r.exit_code == 0 and printed.exit_code == 0, (r.output, printed.output)
    assert printed.stdout_bytes == (tmp_path / "out.txt").read_bytes()
    assert printed.stdout == translate_document(translator, text, max_decoding_length=12)
    assert printed.stdout.endswith("\n") == text.endswith("\n") and (text != "" or printed.stdout == "")


def test_the_progress_total_is_the_sentences_to_decode(text_marian):
    """The bar's total grows by the sentences each language decodes, known before decoding, so it
    shows N/M and the time left rather than N/? (issue 55); the memory's hits are not counted."""
    import rich.progress as rp

    from xform.cli.options import Advance
    from xform.runtime.documents.translate import DocumentTranslator

    with rp.Progress(disable=True) as progress:
        advance = Advance(progress, progress.add_task("translated", total=None, rate=0.0))
        told: list[int] = []

        def grow(n: int) -> None:
            told.append(n)
            advance.grow(n)
        translator = xform.Translator(text_marian)
        docs = DocumentTranslator(translator, translator.generation(None, {"max_new_tokens": 12}), on_batch=advance,
                                  on_total=grow)
        docs.translate([("a", "a blue dog. my old cat. a blue dog."), ("b", "the red cat.")])
        task = progress.tasks[0]
        assert told == [3] and task.total == 3 == task.completed == docs.tally.decoded, (told, task)
