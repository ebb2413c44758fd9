"""Terminology at the Triton door (issue 56), without Triton: a request's `glossary` (TSV or TBX
text) and `keep` are enforced as Translator.translate_batch enforces them, `qe` answers a
`confidence` and a terminology the `unmet` terms; the model's --glossary (ModelOptions.glossary,
copied into the model and read by its initialize) applies to requests without their own; a bad
glossary is the request's error (400) naming the input; the router passes them to the last hop."""
from __future__ import annotations

import importlib.util
import json
import sys
import types

import numpy as np
import pytest

import xform
from xform.runtime.text.glossary import Glossary
from xform.runtime.text.translator import Translator
from xform.serving.handler import ServerFault, execute
from xform.serving.repository import ModelOptions, write_model

GLOSSARY = "7\tseven eleven\n"


@pytest.fixture(scope="module")
def demo(demo_bundle):
    return xform.load(demo_bundle, backend="ort")


def text(*texts):
    return np.array([[t.encode()] for t in texts], dtype=object)


def rows(value: str, n: int = 1):
    return np.array([[value.encode()]] * n, dtype=object)


def flag(n: int = 1):
    return np.array([[True]] * n)


def translations(out) -> list[str]:
    return [t.decode() for t in out["translation"].reshape(-1)]


def test_a_request_s_glossary_and_qe_answer_as_translate_batch(demo):
    t = Translator(demo)
    out = execute(t, [{"text": text("7", "12", ""), "glossary": rows(GLOSSARY, 3), "qe": flag(3)},
                      {"text": text("7")},  # the glossary is the request's alone
                      {"text": text("7 40512"), "glossary": rows(GLOSSARY), "num_beams": np.array([[3]], np.int32),
                       "qe": flag()}])
    want = t.translate_batch(["7", "12"], glossary={"7": "seven eleven"}, qe=True)
    assert translations(out[0]) == [w.hypotheses[0] for w in want] + [""]
    assert translations(out[0])[0] == "seven eleven" and translations(out[1]) == ["seven"]
    sure = out[0]["confidence"]
    assert sure.shape == (3, 1) and sure.dtype == np.float32
    np.testing.assert_allclose(sure[:2, 0], [w.confidence[0] for w in want], rtol=1e-6)
    assert sure[2, 0] == 1.0 and all(0.0 <= c <= 1.0 for c in sure[:, 0])  # a blank row: nothing to doubt
    assert out[0]["unmet"].tolist() == [[b""], [b""], [b""]] and "confidence" not in out[1] and "unmet" not in out[1]
    assert translations(out[2])[0].startswith("seven eleven") and 0 <= out[2]["confidence"][0, 0] <= 1


def test_keep_and_an_unplaceable_term_are_answered_as_unmet(demo):
    out = execute(Translator(demo), [
        {"text": text("7", "12"), "glossary": rows("7\tbanana\n", 2)},  # not in the demo's target vocabulary
        {"text": text("<dnt>seven</dnt> 7"), "keep": np.array([[b"eleven", b"\\d{9}"]], dtype=object)},
        {"text": text("7"), "glossary": rows("")},  # blank: no glossary at all
    ])
    assert out[0]["unmet"].tolist() == [[b"banana"], [b""]] and translations(out[0]) == ["seven", "twelve"]
    assert "seven" in translations(out[1])[0].split() and out[1]["unmet"].tolist() == [[b""]]  # kept, tags gone
    assert translations(out[2]) == ["seven"] and "unmet" not in out[2]


def test_a_tbx_glossary_is_read_too(demo):
    tbx = ('<?xml version="1.0"?><tbx xmlns="urn:iso:std:iso:30042:ed-2" type="TBX-Basic" xml:lang="num">'
           '<text><body><conceptEntry id="c1"><langSec xml:lang="num"><termSec><term>7</term></termSec></langSec>'
           '<langSec xml:lang="en"><termSec><term>seven eleven</term></termSec></langSec></conceptEntry>'
           '</body></text></tbx>')
    out = execute(Translator(demo), [{"text": text("7"), "glossary": rows(tbx)}])
    assert translations(out[0]) == ["seven eleven"], out[0]


@pytest.mark.parametrize("bad, fragment", [
    ({"glossary": rows("7\tseven\tx\n")}, "input 'glossary' (TSV), line 1: 3 tab-separated columns"),
    ({"glossary": rows("7\tseven\n7\teight\n")}, "input 'glossary' (TSV), lines 1 and 2: the source term '7' has two"),
    ({"glossary": rows("<tbx><text>")}, "input 'glossary' (TBX), line 1: not well-formed XML"),
    ({"glossary": np.array([[b"7\t\xff"]], dtype=object)}, "input 'glossary': not UTF-8"),
    ({"keep": np.array([[b"("]], dtype=object)}, "input 'keep' pattern '(' is not a regular expression"),
    ({"text": text("7 <dnt>1"), "glossary": rows(GLOSSARY)}, "a <dnt> never closed"),
])
def test_a_bad_glossary_is_the_request_s_error_naming_the_input(demo, bad, fragment):
    good = {"text": text("40512")}
    out = execute(Translator(demo), [good, {"text": text("7"), **bad}, good])
    assert isinstance(out[1], str) and not isinstance(out[1], ServerFault), out[1]  # HTTP 400
    assert fragment in out[1], out[1]
    assert translations(out[0]) == translations(out[2]) == ["forty thousand five hundred twelve"]


def test_ids_take_no_glossary_and_keep_the_model_s_away(demo):
    ids = np.array([[5, 6, 2]], np.int64)
    out = execute(Translator(demo, glossary=Glossary.of({"7": "seven eleven"})),
                  [{"src_ids": ids, "glossary": rows(GLOSSARY)}, {"src_ids": ids}, {"src_ids": ids, "qe": flag()}])
    assert "input 'glossary': finds its terms in text: send the sources as 'text'" in out[0]
    assert set(out[1]) == {"output_ids", "translation"} and 0 <= out[2]["confidence"][0, 0] <= 1


def test_the_model_s_glossary_applies_to_requests_without_their_own(demo):
    model = Translator(demo, glossary=Glossary.of({"12": "seven"}))
    out = execute(model, [{"text": text("12")}, {"text": text("12"), "glossary": rows(GLOSSARY)},
                          {"text": text("12"), "glossary": rows("")}])
    assert "seven" in translations(out[0])[0] and out[0]["unmet"].tolist() == [[b""]]
    assert translations(out[1]) == translations(out[2]) == ["twelve"]


def test_documents_take_the_glossary_and_translate_no(demo):
    out = execute(Translator(demo), [
        {"text": text('<p>7 <i translate="no">7</i></p>'), "glossary": rows(GLOSSARY),
         "document_format": rows("html")},
        {"text": text("7"), "glossary": rows(GLOSSARY), "document_format": rows("text"), "qe": flag()},
    ])
    assert translations(out[0]) == ['<p>seven eleven <i translate="no">7</i></p>']
    assert "input 'qe': goes with lines, not with 'document_format'" in out[1]


class FakeTriton(types.ModuleType):
    """What triton_model.py's initialize takes of triton_python_backend_utils."""

    class TritonModelException(Exception):
        pass

    class Logger:
        @staticmethod
        def log_info(message):
            pass

        log_warn = log_error = log_info

    TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


def loaded_model(path, monkeypatch):
    """The model.py of a written model, initialized as Triton would."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", FakeTriton("triton_python_backend_utils"))
    spec = importlib.util.spec_from_file_location("xform_model_under_test", path / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    config = (path / "config.pbtxt").read_text()
    params = dict(__import__("re").findall(r'key: "(\w+)" value: \{ string_value: "([^"]*)" \}', config))
    model.initialize({"model_config": json.dumps({"name": path.name, "parameters": {
        k: {"string_value": v} for k, v in params.items()}, "input": [], "output": []}),
        "model_repository": str(path), "model_version": "1", "model_instance_name": path.name})
    return model


def test_a_model_s_glossary_is_copied_in_and_read_at_its_load(demo_bundle, tmp_path, monkeypatch):
    glossary = tmp_path / "terms.tsv"
    glossary.write_text("12\tseven\n")
    path = write_model(demo_bundle, tmp_path / "repo", ModelOptions(scheduling="dynamic", glossary=glossary),
                       reference=True)
    config = (path / "config.pbtxt").read_text()
    assert 'parameters { key: "glossary" value: { string_value: "glossary.tsv" } }' in config
    for line in ('{ name: "glossary" data_type: TYPE_STRING dims: [ 1 ] optional: true }',
                 '{ name: "keep" data_type: TYPE_STRING dims: [ -1 ] optional: true }',
                 '{ name: "qe" data_type: TYPE_BOOL dims: [ 1 ] optional: true }',
                 '{ name: "confidence" data_type: TYPE_FP32 dims: [ 1 ] }',
                 '{ name: "unmet" data_type: TYPE_STRING dims: [ 1 ] }'):
        assert line in config, line
    assert (path / "1" / "glossary.tsv").read_text() == "12\tseven\n"
    glossary.write_text("12\teight\n")  # the model holds its own copy
    model = loaded_model(path, monkeypatch)
    assert isinstance(model.translator.glossary, Glossary)
    out = execute(model.translator, [{"text": text("12")}])
    assert "seven" in translations(out[0])[0]

    plain = write_model(demo_bundle, tmp_path / "repo2", ModelOptions(scheduling="dynamic"), reference=True)
    assert 'key: "glossary" value: { string_value: "" }' in (plain / "config.pbtxt").read_text()
    assert loaded_model(plain, monkeypatch).translator.glossary is None


def test_a_bad_model_glossary_is_refused_before_anything_is_written(demo_bundle, tmp_path):
    from click.testing import CliRunner

    from xform.cli import main
    bad = tmp_path / "bad.tsv"
    bad.write_text("7\tseven\n12\n")
    r = CliRunner().invoke(main, ["triton", str(demo_bundle), "-o", str(tmp_path / "repo"), "--glossary", str(bad)])
    assert r.exit_code == 1 and f"--glossary {bad}, line 2: 1 tab-separated column" in r.output, r.output
    assert not (tmp_path / "repo" / "demo").exists()
    r = CliRunner().invoke(main, ["triton", str(demo_bundle), "-o", str(tmp_path / "repo"), "--glossary",
                                  str(tmp_path / "none.tsv")])
    assert r.exit_code == 1 and "--glossary" in r.output and "no such file" in r.output, r.output


def test_the_router_passes_terms_on_and_answers_the_last_hop_s():
    from tests.serving.test_router import ask, router

    def answer(engine, tensors):
        n = tensors["text"].shape[0]
        return {"translation": tensors["text"], "confidence": np.full((n, 1), 0.5, np.float32),
                "unmet": np.array([[b""]] * n, dtype=object)}
    r, sent = router(answer=answer)
    _, route, out = ask(r, ["7"], "num", "en", glossary=rows(GLOSSARY), qe=flag())
    assert sent[-1][1]["glossary"] == [[GLOSSARY.encode()]] and sent[-1][1]["qe"] == [[True]]
    assert out["confidence"].tolist() == [[0.5]] and out["unmet"].tolist() == [[b""]]
    _, route, _ = ask(r, ["7"], "num", "fr", keep=np.array([[b"\\d+"]], dtype=object), qe=flag())
    assert route == "num>en numbers; en>fr en-multi"
    assert "qe" not in sent[-2][1] and sent[-1][1]["qe"] == [[True]] and "keep" in sent[-2][1]
    with pytest.raises(Exception) as e:
        ask(r, ["7"], "num", "fr", glossary=rows(GLOSSARY))
    assert "input 'glossary': the route num>en numbers; en>fr en-multi goes through a pivot" in str(e.value)
