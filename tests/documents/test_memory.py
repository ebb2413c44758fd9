"""The translation memory: a second run decodes nothing (the backend steps not once), a changed
decoding setting or language misses, concurrent writers are safe, a SIGKILL mid-run leaves only
whole entries (and a run after it goes on from them), and a file that is not an xform memory is
refused by name and never touched."""
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

import xform
from tests.documents.texts import PLAIN
from xform.errors import InputError
from xform.runtime.documents.layout import plain
from xform.runtime.documents.memory import FORMAT, TranslationMemory
from xform.runtime.documents.translate import DocumentTranslator
from xform.runtime.text.translator import Translator

pytest.importorskip("sentencex", reason="documents need the documents extra (pip install -e '.[dev]')")
SHORT = {"max_decoding_length": 12}


@pytest.fixture
def translator(text_marian):
    return Translator(xform.load(text_marian))


def counting_steps(translator, monkeypatch) -> list:
    steps: list = []
    real = translator.session.backend.step
    monkeypatch.setattr(translator.session.backend, "step", lambda *a, **k: steps.append(1) or real(*a, **k))
    return steps


def run(translator, texts, memory, **options):
    gen = translator.generation(None, {**SHORT, **options})
    with TranslationMemory(memory) as tm:
        documents = DocumentTranslator(translator, gen, memory=tm)
        return [r.text for r in documents.translate(texts)], documents.tally


def test_a_second_run_decodes_nothing(translator, tmp_path, monkeypatch):
    texts = [(name, text) for name, text in PLAIN.items()]
    steps = counting_steps(translator, monkeypatch)
    first, tally = run(translator, texts, tmp_path / "tm.db")
    assert steps and tally.decoded == tally.distinct and tally.remembered == 0
    assert first == [translator.translate_document(t, **SHORT) for _, t in texts]
    steps.clear()
    second, tally = run(translator, texts, tmp_path / "tm.db")
    assert second == first and not steps  # the backend did not step once
    assert tally.decoded == 0 and tally.remembered == tally.distinct


def test_a_repeated_sentence_is_decoded_once_in_a_run(translator, tmp_path, monkeypatch):
    text = "the red cat sleeps. a blue dog.\n\nthe red cat sleeps. the red cat sleeps.\n"
    out, tally = run(translator, [("a", text), ("b", text)], tmp_path / "tm.db")
    assert tally.sentences == 8 and tally.distinct == 2 and tally.decoded == 2
    assert out == [translator.translate_document(text, **SHORT)] * 2


def test_a_changed_setting_misses(translator, tmp_path):
    texts = [("en", PLAIN["en"])]
    run(translator, texts, tmp_path / "tm.db")
    out, tally = run(translator, texts, tmp_path / "tm.db", beam_size=2)
    assert tally.remembered == 0 and tally.decoded == tally.distinct
    assert out == [translator.translate_document(PLAIN["en"], beam_size=2, **SHORT)]
    _, tally = run(translator, texts, tmp_path / "tm.db", max_decoding_length=5)
    assert tally.remembered == 0
    _, tally = run(translator, texts, tmp_path / "tm.db", beam_size=2)
    assert tally.decoded == 0  # both contexts are kept


def test_the_python_door_takes_a_memory_path(translator, tmp_path):
    path = tmp_path / "tm.db"
    out = translator.translate_document(PLAIN["de"], memory=path, **SHORT)
    assert out == translator.translate_document(PLAIN["de"], **SHORT)
    with TranslationMemory(path) as tm:
        entries = dict(tm.db.execute("SELECT source, target FROM entries"))
    assert set(entries) == {s.source for s in plain(PLAIN["de"], None).segments}
    assert all(t == translator.translate_batch([s], **SHORT)[0].hypotheses[0] for s, t in entries.items())


def test_a_foreign_or_damaged_file_is_refused_by_name(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("my notes\n")
    with pytest.raises(InputError, match=r"memory .*notes.txt: expected an xform translation memory \(an SQLite "
                                         r"database\), found another kind of file; it is not one xform wrote"):
        TranslationMemory(text, force=True)
    assert text.read_text() == "my notes\n"  # never touched, even with force
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(InputError, match="an SQLite database that is not an xform translation memory"):
        TranslationMemory(other, force=True)
    ours = tmp_path / "ours.db"
    TranslationMemory(ours).close()
    db = sqlite3.connect(ours)
    db.execute("UPDATE meta SET value = '0' WHERE key = 'version'")
    db.commit()
    db.close()
    with pytest.raises(InputError, match="of version 0, expected 1; force replaces it") as e:
        TranslationMemory(ours)
    assert e.value.settings == ("memory", "force")
    with TranslationMemory(ours, force=True) as tm:
        assert len(tm) == 0
        assert dict(tm.db.execute("SELECT key, value FROM meta"))["format"] == FORMAT


WRITER = """
import sys
from xform.runtime.documents.memory import TranslationMemory
with TranslationMemory(sys.argv[1]) as tm:
    context = tm.context({"writer": "test"})
    for k in range(40):
        tm.store(context, {f"{sys.argv[2]} {k} {j}": f"T{j}" for j in range(25)})
"""


def test_concurrent_writers_are_safe(tmp_path):
    path = tmp_path / "tm.db"
    TranslationMemory(path).close()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), f"w{i}"]) for i in range(3)]
    try:
        assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    finally:
        for p in procs:
            p.kill()
    with TranslationMemory(path) as tm:
        assert len(tm) == 3 * 40 * 25


SLOW_RUN = """
import sys
import xform
from xform.runtime.documents import translate
translate.STORE_EVERY = 4  # commits often, so a kill lands between and inside transactions
print(xform.Translator(sys.argv[1]).translate_document(open(sys.argv[2]).read(), memory=sys.argv[3],
                                                       max_batch_size=2, max_decoding_length=12))
"""


def test_a_sigkill_mid_run_leaves_only_whole_entries(translator, text_marian, tmp_path):
    words = ["the red", "a blue", "one green", "my old"]
    nouns = ["cat", "dog", "bird"]
    verbs = ["sleeps", "runs fast", "is here", "eats bread"]
    sentences = [f"{a} {n} {v} {a} {m} {w}." for a in words for n in nouns for v in verbs for m in nouns for w in verbs]
    doc = tmp_path / "doc.txt"
    doc.write_text(" ".join(sentences[:600]) + "\n")
    path = tmp_path / "tm.db"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_RUN, str(text_marian), str(doc), str(path)],
                            stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if path.exists() and count(path) >= 20:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be killed: make the document longer"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    with TranslationMemory(path) as tm:  # it opens: the file is whole
        assert tm.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        entries = dict(tm.db.execute("SELECT source, target FROM entries"))
    assert 20 <= len(entries) < 600 and len(entries) % 4 == 0  # whole transactions only
    sample = list(entries.items())[:6]
    assert [t for _, t in sample] == [translator.translate_batch([s], max_decoding_length=12)[0].hypotheses[0]
                                      for s, _ in sample]


def count(path) -> int:
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
        try:
            return db.execute("SELECT count(*) FROM entries").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error:
        return 0
