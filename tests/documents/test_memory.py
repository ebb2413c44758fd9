"""The translation memory: a second run decodes nothing (the backend steps not once), a changed
decoding setting or language misses, concurrent writers are safe, a SIGKILL mid-run leaves only
whole entries (and a run after it goes on from them), runs opening a memory not there yet together
all succeed on the one memory, a damaged, truncated or empty memory is replaced with force only, and
a file that is not an xform memory is refused by name and never touched, even with force."""
import json
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
from xform.runtime.documents.door import translate_document
from xform.runtime.documents.layout import plain
from xform.runtime.documents.memory import APPLICATION_ID, FORMAT, TranslationMemory
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
    assert first == [translate_document(translator, t, **SHORT) for _, t in texts]
    steps.clear()
    second, tally = run(translator, texts, tmp_path / "tm.db")
    assert second == first and not steps  # the backend did not step once
    assert tally.decoded == 0 and tally.remembered == tally.distinct


def test_a_repeated_sentence_is_decoded_once_in_a_run(translator, tmp_path, monkeypatch):
    text = "the red cat sleeps. a blue dog.\n\nthe red cat sleeps. the red cat sleeps.\n"
    out, tally = run(translator, [("a", text), ("b", text)], tmp_path / "tm.db")
    assert tally.sentences == 8 and tally.distinct == 2 and tally.decoded == 2
    assert out == [translate_document(translator, text, **SHORT)] * 2


def test_a_changed_setting_misses(translator, tmp_path):
    texts = [("en", PLAIN["en"])]
    run(translator, texts, tmp_path / "tm.db")
    out, tally = run(translator, texts, tmp_path / "tm.db", beam_size=2)
    assert tally.remembered == 0 and tally.decoded == tally.distinct
    assert out == [translate_document(translator, PLAIN["en"], beam_size=2, **SHORT)]
    _, tally = run(translator, texts, tmp_path / "tm.db", max_decoding_length=5)
    assert tally.remembered == 0
    _, tally = run(translator, texts, tmp_path / "tm.db", beam_size=2)
    assert tally.decoded == 0  # both contexts are kept


def test_the_python_door_takes_a_memory_path(translator, tmp_path):
    path = tmp_path / "tm.db"
    out = translate_document(translator, PLAIN["de"], memory=path, **SHORT)
    assert out == translate_document(translator, PLAIN["de"], **SHORT)
    with TranslationMemory(path) as tm:
        entries = dict(tm.db.execute("SELECT source, target FROM entries"))
    assert set(entries) == {s.source for s in plain(PLAIN["de"], None).segments}
    assert all(t == translator.translate_batch([s], **SHORT)[0].hypotheses[0] for s, t in entries.items())


def test_a_foreign_or_damaged_file_is_refused_by_name(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("my notes\n")
    with pytest.raises(InputError, match=r"memory .*notes.txt: expected an xform translation memory \(an SQLite "
                                         r"database\), found another kind of file; nothing in it shows xform wrote it"):
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
    with pytest.raises(InputError, match="expected an xform translation memory of version 1, found one of "
                                         "version 0; force replaces it") as e:
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


OPENER = """
import json, sys
from xform.runtime.documents.memory import TranslationMemory
print("ready", flush=True)
sys.stdin.readline()  # all start at once
with TranslationMemory(sys.argv[1]) as tm:
    context = tm.context({"writer": "test"})
    tm.store(context, {f"shared {j}": f"T{j}" for j in range(30)})
    tm.store(context, {f"{sys.argv[2]} {j}": f"U{j}" for j in range(10)})
    print(json.dumps(tm.lookup(context, [f"shared {j}" for j in range(30)] + ["never stored"]), sort_keys=True))
"""


def test_runs_opening_a_new_memory_together_all_succeed(tmp_path):
    for trial in range(6):
        path = tmp_path / f"tm{trial}.db"
        procs = [subprocess.Popen([sys.executable, "-c", OPENER, str(path), f"w{i}"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(4)]
        try:
            assert [p.stdout.readline() for p in procs] == ["ready\n"] * 4
            for p in procs:  # the four released within a millisecond
                p.stdin.write("go\n")
                p.stdin.flush()
            done = [p.communicate(timeout=60) for p in procs]
        finally:
            for p in procs:
                p.kill()
        assert [p.returncode for p in procs] == [0] * 4, f"trial {trial}: " + " | ".join(err for _, err in done)
        found = {out for out, _ in done}
        assert len(found) == 1 and json.loads(found.pop()) == {f"shared {j}": f"T{j}" for j in range(30)}
        with TranslationMemory(path) as tm:
            assert len(tm) == 30 + 4 * 10


def xform_memory(path, entries: int = 300, mark: bool = True):
    """An xform memory of several pages, closed (its WAL checkpointed into the file); without the
    mark in its header (application_id) as the first version of the memory wrote it."""
    with TranslationMemory(path) as tm:
        context = tm.context({"writer": "test"})
        tm.store(context, {f"a sentence of some length, number {j}": f"ein Satz {j}" for j in range(entries)})
    if not mark:
        db = sqlite3.connect(path)
        db.execute("PRAGMA application_id = 0")
        db.commit()
        db.close()
    assert entries < 300 or path.stat().st_size > 8192


@pytest.mark.parametrize("size, mark", [(100, True), (2048, True), (5000, True), (5000, False)])
def test_force_replaces_a_truncated_xform_memory(tmp_path, size, mark):
    path = tmp_path / "tm.db"
    xform_memory(path, mark=mark)  # unmarked, its first page (the schema) shows it is xform's
    with open(path, "r+b") as f:
        f.truncate(size)
    with pytest.raises(InputError, match=r"memory .*tm.db: expected an xform translation memory \(an SQLite "
                                         r"database\), found a damaged xform translation memory \(.*\); force "
                                         r"replaces it with a new, empty memory") as e:
        TranslationMemory(path)
    assert e.value.settings == ("memory", "force") and path.stat().st_size == size  # refused, untouched
    with TranslationMemory(path, force=True) as tm:
        assert len(tm) == 0 and tm.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        context = tm.context({"writer": "test"})
        tm.store(context, {"a": "b"})
    with TranslationMemory(path) as tm:
        assert tm.lookup(context, ["a"]) == {"a": "b"}
    assert [p.name for p in tmp_path.iterdir() if ".xform-" in p.name] == []  # no temporary left


def test_an_unmarked_memory_cut_inside_its_schema_is_refused(tmp_path):
    path = tmp_path / "tm.db"
    xform_memory(path, mark=False)
    with open(path, "r+b") as f:
        f.truncate(2048)  # the header and half the first page: nothing says whose it is
    with pytest.raises(InputError, match=r"found an SQLite database that cannot be read \(.*\); nothing in it "
                                         r"shows xform wrote it, so it is never replaced, even with force"):
        TranslationMemory(path, force=True)
    assert path.stat().st_size == 2048


def test_force_replaces_an_empty_file(tmp_path):
    path = tmp_path / "tm.db"
    path.write_bytes(b"")  # what a run killed right after creating the file left
    with pytest.raises(InputError, match=r"memory .*tm.db: expected an xform translation memory \(an SQLite "
                                         r"database\), found an empty file .*; force replaces it"):
        TranslationMemory(path)
    assert path.read_bytes() == b""
    with TranslationMemory(path, force=True) as tm:
        assert len(tm) == 0
        assert dict(tm.db.execute("SELECT key, value FROM meta"))["format"] == FORMAT


def test_a_foreign_file_is_refused_even_with_force(tmp_path):
    other = tmp_path / "other.db"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE t (x)")
    db.executemany("INSERT INTO t VALUES (?)", [(f"row {j} " * 10,) for j in range(500)])
    db.commit()
    db.close()
    whole = other.read_bytes()
    for size in (len(whole), len(whole) // 2, 2048, 100):  # whole or cut short, it shows no sign of xform
        other.write_bytes(whole[:size])
        with pytest.raises(InputError, match=r"memory .*other.db: expected an xform translation memory .*; nothing "
                                             r"in it shows xform wrote it, so it is never replaced, even with force"):
            TranslationMemory(other, force=True)
        assert other.read_bytes() == whole[:size]
    binary = tmp_path / "data.bin"
    binary.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(InputError, match="found another kind of file; nothing in it shows xform wrote it"):
        TranslationMemory(binary, force=True)
    assert binary.read_bytes() == bytes(range(256)) * 8


def test_a_memory_without_the_xform_mark_opens_and_is_marked(tmp_path):
    path = tmp_path / "tm.db"
    xform_memory(path, entries=10, mark=False)
    with TranslationMemory(path) as tm:
        assert len(tm) == 10
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    db.close()


def test_a_memory_in_a_missing_directory_is_refused_by_name(tmp_path):
    path = tmp_path / "nowhere" / "tm.db"
    with pytest.raises(InputError, match=r"memory .*nowhere/tm.db: cannot open its lock file .*tm.db.lock \(No such "
                                         r"file or directory\); give a path in a directory that exists"):
        TranslationMemory(path)
