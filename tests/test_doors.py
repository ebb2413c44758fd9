"""One request path: the CLI's flags, the Python keywords and Triton's tensors parse into one
Request and give the same tokens and text; a control added to the generation config and the
controls' table alone is reachable from all three doors."""
import dataclasses
import importlib
import re

import numpy as np
import pytest
from click.testing import CliRunner

import xform
from xform.runtime import session as session_module
from xform.runtime.decoding import controls, generation
from xform.runtime.text.translator import Translator
from xform.serving import tensors
from xform.serving.handler import execute


def text(*texts):
    return np.array([[t.encode()] for t in texts], dtype=object)


def i32(*v):
    return np.array([list(v)], np.int32)


def f32(v):
    return np.array([[v]], np.float32)


def flag():
    return np.array([[True]], bool)


# (Python keywords, CLI flags, Triton inputs); None: a control the server does not take
# (runtime/decoding/controls.py: sampling and the beam search's stop rules stay the bundle's there)
REQUESTS = [
    ({}, [], {}),
    ({"max_new_tokens": 3}, ["--max-new-tokens", "3"], {"max_new_tokens": i32(3)}),
    ({"num_beams": 3}, ["--num-beams", "3"], {"num_beams": i32(3)}),
    ({"num_beams": 4, "num_return_sequences": 3}, ["--num-beams", "4", "--num-return-sequences", "3"],
     {"num_beams": i32(4), "num_return_sequences": i32(3)}),
    ({"repetition_penalty": 2.5}, ["--repetition-penalty", "2.5"], {"repetition_penalty": f32(2.5)}),
    ({"no_repeat_ngram_size": 1}, ["--no-repeat-ngram-size", "1"], {"no_repeat_ngram_size": i32(1)}),
    ({"suppress_tokens": [5, 6]}, ["--suppress-tokens", "5,6"], {"suppress_tokens": i32(5, 6)}),
    ({"bad_words_ids": ["hundred"]}, ["--bad-words", "hundred"],
     {"bad_words": np.array([[b"hundred"]], dtype=object)}),
    ({"target_prefix": ["forty one"]}, ["--target-prefix", "forty one"], {"target_prefix": text("forty one")}),
    ({"target_prefix": ["forty"], "return_alternatives": True, "num_return_sequences": 3},
     ["--target-prefix", "forty", "--alternatives", "--num-return-sequences", "3"],
     {"target_prefix": text("forty"), "return_alternatives": flag(), "num_return_sequences": i32(3)}),
    ({"min_new_tokens": 6}, ["--min-new-tokens", "6"], None),
    ({"num_beams": 3, "length_penalty": 0.5, "early_stopping": True},
     ["--num-beams", "3", "--length-penalty", "0.5", "--early-stopping", "true"], None),
    ({"do_sample": True, "seed": 3, "temperature": 2.0, "top_k": 5, "top_p": 0.9},
     ["--sample", "--seed", "3", "--temperature", "2.0", "--top-k", "5", "--top-p", "0.9"], None),
    ({"forced_bos_token_id": 7}, ["--forced-bos-id", "7"], None),
    ({"bad_words_ids": [[7, 8]]}, ["--bad-word-ids", "7,8"], None),
]
SOURCE = "40512"


def test_the_requests_cover_every_control():
    covered = {k for kw, _, _ in REQUESTS for k in kw}
    assert {c.name for c in controls.CONTROLS} <= covered
    served = {c.name for c in controls.CONTROLS if c.tensor} | {"target_prefix", "bad_words_ids"}
    assert served <= {k for kw, _, inputs in REQUESTS if inputs is not None for k in kw}


@pytest.fixture(scope="module")
def demo(demo_bundle):
    return xform.load(demo_bundle, backend="ort")


@pytest.mark.parametrize("kw, flags, inputs", REQUESTS, ids=[",".join(r[0]) or "defaults" for r in REQUESTS])
def test_three_doors_give_the_same_tokens_and_text(demo, demo_bundle, kw, flags, inputs):
    from xform.cli import main
    python = Translator(demo).translate([SOURCE], **kw)
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--text", SOURCE, *flags])
    assert r.exit_code == 0, r.output
    cli = [line.split("\t")[1] for line in r.stdout.splitlines()]
    assert cli == python
    if inputs is None:
        return
    out = execute(Translator(demo), [{"text": text(SOURCE), **inputs}])[0]
    assert not isinstance(out, str), out
    served = out["hypotheses"] if "hypotheses" in out else out["translation"]
    assert [t.decode() for t in served.reshape(-1)] == python
    ids_kw = {**kw}
    if "target_prefix" in ids_kw:
        ids_kw["target_prefix"] = [Translator(demo).policy.target_ids(p) for p in ids_kw["target_prefix"]]
    if "bad_words_ids" in ids_kw:
        ids_kw["bad_words_ids"] = [Translator(demo).policy.target_ids(w) for w in ids_kw["bad_words_ids"]]
    ids = demo.generate(Translator(demo).policy.encode_texts([SOURCE]), **ids_kw)
    got = out["hypothesis_ids"].reshape(len(ids), -1) if "hypothesis_ids" in out else out["output_ids"]
    np.testing.assert_array_equal(got[:, :ids.shape[1]], ids)
    assert (got[:, ids.shape[1]:] == demo.pad_id).all()


LONG = "12345678" * 5  # 41 source tokens with end-of-sentence: over the demo's max_len 32


@pytest.mark.parametrize("beams", [1, 3])
def test_text_controls_truncate_and_scores_through_three_doors(demo, demo_bundle, beams):
    """The text-level settings: truncation of a source over max_len and the scores, alike at the
    CLI (--truncate, --scores), in Python (truncate=True; CTranslate2's return_scores) and on
    Triton (truncate, return_scores); refused alike without truncation."""
    from xform.cli import main
    from xform.errors import InputError
    python = Translator(demo).translate_batch([LONG, SOURCE], truncate=True, return_scores=True, beam_size=beams)
    want = [(r.hypotheses[0], r.scores[0]) for r in python]
    assert want[0][0] == Translator(demo).translate([LONG[:31]], num_beams=beams)[0]  # cut to max_len
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--text", LONG, "--text", SOURCE, "--truncate", "--scores",
                                  "--num-beams", str(beams)])
    assert r.exit_code == 0, r.output
    cli = [(line.split("\t")[1], float(line.split("\t")[2])) for line in r.stdout.splitlines()]
    out = execute(Translator(demo), [{"text": text(t), "truncate": flag(), "return_scores": flag(), "num_beams": i32(beams)}
                         for t in (LONG, SOURCE)])
    served = [(o["translation"][0, 0].decode(), float(o["scores"].reshape(-1)[0])) for o in out]
    for got in (cli, served):
        assert [t for t, _ in got] == [t for t, _ in want]
        np.testing.assert_allclose([s for _, s in got], [s for _, s in want], rtol=0, atol=1e-4)  # CLI prints 4 places
    with pytest.raises(InputError, match="41 source tokens, more than the model's max_len 32"):
        Translator(demo).translate_batch([LONG])
    assert "more than the model's max_len 32" in execute(Translator(demo), [{"text": text(LONG)}])[0]
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--text", LONG])
    assert r.exit_code == 1 and "more than the model's max_len 32" in r.output, r.output


def test_a_control_in_the_config_and_the_table_reaches_every_door(demo, demo_bundle, monkeypatch):
    """A fake control: a field of GenerationConfig and a row of the controls' table, nothing else.
    The CLI's flag (--fake-control, by cli/flags.py's rule), the Python keyword and the Triton input
    each bring its value to the strategy; config.pbtxt and the docs' table list the input."""
    import xform.cli.decode
    from xform.serving.repository import ModelOptions, config_pbtxt
    fake = dataclasses.make_dataclass("FakeGenerationConfig", [("fake_control", int, 0)],
                                      bases=(generation.GenerationConfig,), frozen=True)
    monkeypatch.setattr(session_module, "GenerationConfig", fake)
    monkeypatch.setattr(controls, "CONTROLS", [*controls.CONTROLS, controls.Control(
        "fake_control", "int", "A control of this test.", tensor="fake_control", least=1)])
    seen = []
    make = session_module.make_strategy

    def spy(batch, gen, *args):
        seen.append(gen.fake_control)
        return make(batch, gen, *args)
    monkeypatch.setattr(session_module, "make_strategy", spy)
    try:
        importlib.reload(xform.cli.decode)  # `run`'s options are made from the table when it registers
        r = CliRunner().invoke(xform.cli.main, ["run", str(demo_bundle), "--text", SOURCE, "--fake-control", "7"])
        assert r.exit_code == 0, r.output
        assert seen == [7]
        demo.generate(Translator(demo).policy.encode_texts([SOURCE]), fake_control=8)
        Translator(demo).translate([SOURCE], fake_control=9)
        out = execute(Translator(demo), [{"text": text(SOURCE), "fake_control": i32(10)},
                             {"text": text(SOURCE), "fake_control": i32(0)}])
        assert seen == [7, 8, 9, 10], seen
        assert out[1] == "input 'fake_control': must be at least 1, found 0"
        config = config_pbtxt("demo", "bundle", ModelOptions(), True)
        assert '{ name: "fake_control" data_type: TYPE_INT32 dims: [ 1 ] optional: true }' in config
        assert "| `fake_control` | in | TYPE_INT32 | [1] |" in tensors.markdown()
    finally:
        monkeypatch.undo()
        importlib.reload(xform.cli.decode)


def test_the_docs_tensor_table_is_the_tables():
    """docs/serving.md's tensor table is serving/tensors.py's, as markdown() writes it."""
    from pathlib import Path
    doc = (Path(__file__).parents[1] / "docs" / "serving.md").read_text()
    start, end = "<!-- tensors: xform/serving/tensors.py markdown() -->\n", "<!-- /tensors -->"
    assert start in doc and end in doc
    assert doc[doc.index(start) + len(start):doc.index(end)] == tensors.markdown()


def test_one_runtime_error_about_a_setting_reads_in_each_doors_words(demo, demo_bundle):
    """The runtime refuses a setting once, naming it by its marker (xform/errors.py); each door
    words it its own way (issue 42): Python by its keyword, the CLI by its flag (cli/flags.py), the
    server by its input. A source language this model lacks, then a generation setting, then bad
    words given as text (the CLI's --bad-words, the server's bad_words, Python's bad_words_ids)."""
    from xform.cli import main
    from xform.errors import InputError
    from xform.serving.handler import said
    lacks = "xx: this model's tokenizer has no languages"
    with pytest.raises(InputError, match=f"^src_lang {lacks}$"):
        xform.Translator(demo_bundle).translate_batch([SOURCE], src_lang="xx")
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--text", SOURCE, "--src-lang", "xx"])
    assert r.exit_code == 2 and f"--src-lang {lacks}" in r.output, r.output
    assert execute(Translator(demo), [{"text": text(SOURCE), "src_lang": text("xx")}]) == [f"input 'src_lang' {lacks}"]

    with pytest.raises(InputError) as e:
        Translator(demo).translate(["7"], num_return_sequences=3)
    assert "num_return_sequences 3 needs beams (num_beams >= it), sampling (do_sample) or alternatives " \
           "(return_alternatives)" in str(e.value)
    assert "input 'num_return_sequences' 3 needs beams (input 'num_beams' >= it)" in said(e.value)
    with pytest.raises(InputError) as e:  # CTranslate2's door: the name its caller wrote
        Translator(demo).translate_batch([SOURCE], num_hypotheses=3)
    assert "num_hypotheses 3 needs beams (num_beams >= it), sampling (do_sample) or alternatives " \
           "(return_alternatives)" in str(e.value)
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--text", SOURCE, "--num-return-sequences", "3"])
    assert r.exit_code == 2 and "--num-return-sequences 3 needs beams (--num-beams >= it), sampling (--sample) or " \
                                "alternatives (--alternatives)" in r.output, r.output

    empty = ": a phrase gives no target tokens ([' '])"
    with pytest.raises(InputError, match=re.escape(f"bad_words_ids{empty}")):
        Translator(demo).translate([SOURCE], bad_words_ids=[" "])
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--text", SOURCE, "--bad-words", " "])
    assert r.exit_code == 2 and f"--bad-words{empty}" in r.output, r.output
    out = execute(Translator(demo), [{"text": text(SOURCE), "bad_words": np.array([[b" "]], dtype=object)}])
    assert out == [f"input 'bad_words'{empty}"]
