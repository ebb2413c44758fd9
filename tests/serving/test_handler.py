"""What one Triton execute call does, without Triton: responses equal Translator.translate / generate
for each request alone, and a bad request gets an error naming the tensor while the others in
the same call are still answered."""
import json

import numpy as np
import pytest

import xform
from xform.runtime.text.translator import Translator
from xform.serving.handler import ServerFault, execute


@pytest.fixture(scope="module")
def demo(demo_bundle):
    return xform.load(demo_bundle, backend="ort")


def text(*texts):
    return np.array([[t.encode()] for t in texts], dtype=object)


def i32(v):
    return np.array([[v]], np.int32)


def test_a_batch_of_requests_answers_each_as_alone(demo):
    requests = [
        {"text": text("40512")},
        {"text": text("7", "999999")},  # two sources in one request
        {"src_ids": np.array([[5, 6, 7, 2]], np.int64), "max_new_tokens": i32(3)},
        {"text": text("123456"), "num_beams": i32(3)},
        {"src_ids": np.array([[9, 2, 0, 0], [4, 5, 2, 0]], np.int64)},  # right-padded rows
    ]
    out = execute(Translator(demo), requests)
    assert [o["translation"].reshape(-1).tolist() for o in out[:2]] == [
        [t.encode() for t in Translator(demo).translate(["40512"])], [t.encode() for t in Translator(demo).translate(["7", "999999"])]]
    np.testing.assert_array_equal(out[2]["output_ids"], demo.generate(np.array([[5, 6, 7, 2]]), max_new_tokens=3))
    assert out[3]["translation"][0, 0].decode() == Translator(demo).translate(["123456"], num_beams=3)[0]
    np.testing.assert_array_equal(out[4]["output_ids"], demo.generate(np.array([[9, 2, 0, 0], [4, 5, 2, 0]])))
    assert out[2]["output_ids"].shape == (1, 3) and out[0]["output_ids"].dtype == np.int64


@pytest.mark.parametrize("bad, fragment", [
    ({"text": text("1"), "src_ids": np.array([[5, 2]], np.int64)}, "exactly one of the inputs 'text' and 'src_ids' per request; found both"),
    ({}, "found neither"),
    ({"src_ids": np.array([[5, 99, 2]], np.int64)}, "input 'src_ids': src_ids[0, 1] = 99 is outside the source vocabulary"),
    ({"src_ids": np.full((1, 500), 5, np.int64)}, "input 'src_ids': src_ids has src_len 500, longer than the model's max_len"),
    ({"src_ids": np.array([[5, 2]], np.int32)}, "input 'src_ids': expected INT64, found int32"),
    ({"text": np.array([[b"\xff\xfe"]], dtype=object)}, "input 'text': not UTF-8"),
    ({"text": text("1"), "max_new_tokens": i32(0)}, "input 'max_new_tokens': must be at least 1, found 0"),
    ({"text": text("1", "2"), "num_beams": np.array([[2], [3]], np.int32)}, "input 'num_beams': one value per request"),
    ({"text": text("1"), "max_new_tokens": i32(10_000)}, "input 'max_new_tokens': max_new_tokens 10000 exceeds"),
    ({"text": text("1"), "num_return_sequences": i32(3)},
     "input 'num_return_sequences' 3 needs beams (input 'num_beams' >= it), sampling (do_sample) or alternatives "
     "(input 'return_alternatives')"),
    ({"text": text("1"), "num_beams": i32(2), "return_alternatives": np.array([[True]]), "target_prefix": text("a")},
     "input 'return_alternatives' continues each alternative greedily: not with input 'num_beams' 2"),
    ({"text": text("1"), "repetition_penalty": np.array([[-1.0]], np.float32)},
     "input 'repetition_penalty' must be a number > 0"),
    ({"text": text("1"), "no_repeat_ngram_size": i32(-1)}, "input 'no_repeat_ngram_size' must be an integer >= 0"),
    ({"text": text("1"), "suppress_tokens": np.array([[9999]], np.int32)},
     "input 'suppress_tokens': ids [9999] are outside the target vocabulary"),
    ({"text": text("1"), "tgt_lang": text("xx")}, "input 'tgt_lang' xx: this model's tokenizer has no languages"),
    ({"text": text("1"), "src_lang": text("xx")}, "input 'src_lang' xx: this model's tokenizer has no languages"),
    ({"text": text("9" * 40)}, "input 'text': 41 source tokens, more than the model's max_len 32 (send truncate=true"),
    # a value of the wrong type (Triton enforces each input's dtype; a Python caller may not)
    ({"text": text("1"), "num_beams": np.array([[None]], dtype=object)},
     "input 'num_beams': expected TYPE_INT32 values, found object [None]"),
    ({"text": text("1"), "num_beams": text("2")}, "input 'num_beams': expected TYPE_INT32 values, found object ['2']"),
    ({"text": text("1"), "return_scores": text("yes")},
     "input 'return_scores': expected TYPE_BOOL values, found object ['yes']"),
])
def test_a_bad_request_is_answered_with_its_error_and_the_others_are_served(demo, bad, fragment):
    """Each error is the request's (HTTP 400, not a ServerFault's 500) and names the request's
    inputs, never the CLI's flags (the runtime's errors name a setting as their caller asks)."""
    good = {"text": text("40512")}
    out = execute(Translator(demo), [good, bad, good])
    assert isinstance(out[1], str) and fragment in out[1], out[1]
    assert not isinstance(out[1], ServerFault)  # the request's fault: HTTP 400, not 500
    assert "--" not in out[1], out[1]
    assert out[0]["translation"][0, 0] == out[2]["translation"][0, 0] == b"forty thousand five hundred twelve"


def test_a_backend_failure_is_the_servers_fault_and_too_many_rows_the_requests(demo, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("onnxruntime: out of memory")
    assert "max_rows 8" in execute(Translator(demo), [{"text": text("1"), "num_beams": i32(9)}], max_rows=8)[0]
    monkeypatch.setattr(demo.backend, "step", broken)  # requests decode through the Scheduler's loop
    out = execute(Translator(demo), [{"text": text("40512")}])
    assert isinstance(out[0], ServerFault) and "decoding failed: RuntimeError" in out[0]


def test_the_cli_names_its_flags_where_a_request_names_its_inputs(demo):
    """The same runtime errors, read by each door: from Python (str) the keywords, from the CLI
    (cli/flags.py) its flags, as before, from the server (handler.said) its inputs."""
    from xform.cli.flags import said as cli
    from xform.errors import InputError
    from xform.serving.handler import said as server
    with pytest.raises(InputError, match=r"sampling \(do_sample\) or alternatives \(return_alternatives\)") as e:
        demo.generation_config(num_return_sequences=3)
    assert "sampling (--sample) or alternatives (--alternatives)" in cli(e.value)
    assert "input 'num_return_sequences' 3 needs beams (input 'num_beams' >= it)" in server(e.value)
    with pytest.raises(InputError, match=r"repetition_penalty must be a number > 0") as e:
        demo.generation_config(repetition_penalty=-1.0)
    assert "--repetition-penalty must be a number > 0" in cli(e.value)
    with pytest.raises(InputError, match="^tgt_lang xx: this model's tokenizer has no languages$") as e:
        Translator(demo).policy.target_language("xx")
    assert cli(e.value) == "--tgt-lang xx: this model's tokenizer has no languages"
    assert server(e.value) == "input 'tgt_lang' xx: this model's tokenizer has no languages"
    with pytest.raises(InputError, match="^src_lang xx: this model's tokenizer has no languages$") as e:
        Translator(demo).policy.check_src_lang("xx")
    assert cli(e.value) == "--src-lang xx: this model's tokenizer has no languages"


def test_an_engine_error_relayed_keeps_its_kind():
    """The front model reads the kind of the engine's error (Triton 2.51's BLS answers every one
    INTERNAL) from the tag the engine writes for relayed requests; an untagged error, Triton's own
    about the engine, is the server's."""
    from xform.serving.inflight import tagged, untagged
    for kind in ("request", "server", "unavailable"):
        assert untagged(tagged("input 'num_beams': must be at least 1", kind)) == (
            kind, "input 'num_beams': must be at least 1")
    assert untagged("Stub process 'demo-stream_0_0' is not healthy.") == (
        "server", "Stub process 'demo-stream_0_0' is not healthy.")
    assert untagged("input 'text': not UTF-8") == ("server", "input 'text': not UTF-8")


def test_a_bundle_without_tokenizer_takes_ids_only(tiny_bundle):
    session = xform.load(tiny_bundle, backend="ort")
    out = execute(Translator(session), [{"text": text("hello")}, {"src_ids": np.array([[5, 6, 2]], np.int64)}])
    assert "input 'text': this bundle has no tokenizer; send token ids as 'src_ids'" in out[0]
    assert set(out[1]) == {"output_ids"}


def test_decoding_controls_per_request_answer_as_alone(demo):
    """target_prefix, repetition controls, bad words, suppressed ids, scores and truncate as inputs:
    each response equals Translator.translate / generate with those settings for that request alone."""
    f32 = lambda v: np.array([[v]], np.float32)  # noqa: E731
    flag = lambda v: np.array([[v]], bool)  # noqa: E731
    long_text = "9" * 40  # more source tokens than the demo model's max_len
    requests = [
        {"text": text("40512", "7"), "target_prefix": text("forty", "")},
        {"text": text("123456"), "repetition_penalty": f32(2.5), "no_repeat_ngram_size": i32(1)},
        {"text": text("123456"), "bad_words": np.array([[b"hundred"]], dtype=object)},
        {"text": text("40512"), "suppress_tokens": np.array([[5, 6]], np.int32), "return_scores": flag(True)},
        {"text": text(long_text), "truncate": flag(True)},
        {"text": text("40512"), "num_beams": i32(2), "return_scores": flag(True), "target_prefix": text("forty one")},
    ]
    out = execute(Translator(demo), requests)
    assert not any(isinstance(o, str) for o in out), out
    got = [[t.decode() for t in o["translation"].reshape(-1)] for o in out]
    assert got[0] == [Translator(demo).translate(["40512"], target_prefix=["forty"])[0], Translator(demo).translate(["7"])[0]]
    assert got[0][0].startswith("forty")
    assert got[1] == Translator(demo).translate(["123456"], repetition_penalty=2.5, no_repeat_ngram_size=1)
    assert got[2] == Translator(demo).translate(["123456"], bad_words_ids=["hundred"]) and "hundred" not in got[2][0]
    assert got[1] != Translator(demo).translate(["123456"]) and got[2] != Translator(demo).translate(["123456"])
    ids, scores, tokens = demo.generate(Translator(demo).policy.encode_texts(["40512"]), suppress_tokens=[5, 6], return_token_scores=True)
    np.testing.assert_array_equal(out[3]["output_ids"], ids)
    np.testing.assert_allclose(out[3]["scores"], scores[:, None], rtol=1e-6)
    np.testing.assert_allclose(out[3]["token_scores"], tokens, rtol=1e-6)
    assert "scores" not in out[0] and out[3]["scores"].dtype == np.float32
    cut = Translator(demo).policy.truncated(Translator(demo).policy.encode_text(long_text))
    np.testing.assert_array_equal(out[4]["output_ids"], demo.generate(np.array([cut])))
    ids, scores = demo.generate(Translator(demo).policy.encode_texts(["40512"]), num_beams=2, return_scores=True,
                                target_prefix=[Translator(demo).policy.target_ids("forty one")])
    assert got[5][0] == demo.tokenizer.decode(ids[0]) and got[5][0].startswith("forty one")
    np.testing.assert_allclose(out[5]["scores"][:, 0], scores, rtol=1e-6)


@pytest.mark.parametrize("bad, fragment", [
    ({"repetition_penalty": np.array([[0.0]], np.float32)}, "input 'repetition_penalty': invalid generation settings"),
    ({"no_repeat_ngram_size": np.array([[-2]], np.int32)}, "input 'no_repeat_ngram_size'"),
    ({"suppress_tokens": np.array([[9999]], np.int32)}, "input 'suppress_tokens'"),
    ({"target_prefix": text("a", "b")}, "input 'target_prefix': target_prefix has 2 entries for 1 sources"),
    ({"text": text("9" * 40)}, "input 'text'"),
])
def test_bad_control_inputs_fail_alone(demo, bad, fragment):
    good = {"text": text("40512")}
    out = execute(Translator(demo), [good, {"text": text("40512"), **bad}, good])
    assert isinstance(out[1], str) and fragment in out[1], out[1]
    assert out[0]["translation"][0, 0] == out[2]["translation"][0, 0]


def test_replace_unknowns_is_an_input(demo, tmp_path_factory):
    """replace_unknowns on a bundle exported --with-attention answers as translate(replace_unknowns=True);
    on a plain bundle the request fails alone, naming the input."""
    from xform.exporter.export import export_bundle
    aligned = xform.load(export_bundle("demo", tmp_path_factory.mktemp("aligned") / "b", attention_layer=-1).path)
    flag = np.array([[True]], bool)
    out = execute(Translator(aligned), [{"text": text("40512", "7"), "replace_unknowns": flag}, {"text": text("40512")}])
    assert [t.decode() for t in out[0]["translation"].reshape(-1)] == Translator(aligned).translate(["40512", "7"],
                                                                                        replace_unknowns=True)
    assert out[1]["translation"][0, 0].decode() == Translator(aligned).translate(["40512"])[0]
    out = execute(Translator(demo), [{"text": text("40512"), "replace_unknowns": flag}, {"text": text("40512")},
                         {"text": text("40512"), "return_attention": flag}])
    assert isinstance(out[0], str) and "input 'replace_unknowns'" in out[0] and "--with-attention" in out[0]
    assert not isinstance(out[1], str)
    assert isinstance(out[2], str) and "input 'return_attention'" in out[2]
    out = execute(Translator(aligned), [{"text": text("40512", "7"), "return_attention": flag, "num_beams": i32(2)}])
    ids, att = aligned.generate(Translator(aligned).policy.encode_texts(["40512", "7"]), num_beams=2, return_attention=True)
    np.testing.assert_allclose(out[0]["attention"], att[:, :out[0]["attention"].shape[1]], rtol=0, atol=1e-7)
    assert out[0]["attention"].shape[0] == 2 and "attention" not in execute(Translator(aligned), [{"text": text("7")}])[0]


def test_a_vocab_map_restricts_text_requests(tmp_path_factory, demo_bundle):
    """The model's --vocab-map: text requests decode as translate(vocab_map=) does; id requests
    are not restricted; write_model copies the map and refuses a bundle without the restricted decoder."""
    from xform.exporter.export import export_bundle
    from xform.serving.repository import ModelOptions, write_model
    root = tmp_path_factory.mktemp("vmap")
    path = export_bundle("demo", root / "b", vocab_map=True).path
    session = xform.load(path)
    words = sorted(session.tokenizer.target_vocabulary())
    vmap_file = root / "map.txt"
    vmap_file.write_text("\t" + " ".join(w for w in words if w in ("forty", "thousand", "five", "seven")) + "\n")
    vmap = Translator(session).policy.vocab_map(vmap_file)
    ids = np.array([[5, 6, 7, 2]], np.int64)
    out = execute(Translator(session), [{"text": text("40512", "7")}, {"src_ids": ids}], vmap)
    assert [t.decode() for t in out[0]["translation"].reshape(-1)] == Translator(session).translate(["40512", "7"],
                                                                                        vocab_map=vmap)
    assert out[0]["translation"][0, 0].decode() != Translator(session).translate(["40512"])[0]
    np.testing.assert_array_equal(out[1]["output_ids"], session.generate(ids))
    model = write_model(path, root / "repo", ModelOptions(vocab_map=vmap_file))
    assert (model / "1" / "vocab_map.txt").read_text() == vmap_file.read_text()
    assert 'key: "vocab_map" value: { string_value: "vocab_map.txt" }' in (model / "config.pbtxt").read_text()
    with pytest.raises(xform.XformError, match="export it with --with-vocab-map"):
        write_model(demo_bundle, root / "r2", ModelOptions(vocab_map=vmap_file))
    assert not (root / "r2").exists() or not any((root / "r2").iterdir())


def test_n_best_and_alternatives_per_request(demo):
    """num_return_sequences with beams, and return_alternatives after a prefix: each row's best in
    the usual outputs, all k in hypothesis_ids / hypotheses / hypothesis_scores, as generate gives."""
    k = np.array([[3]], np.int32)
    out = execute(Translator(demo), [
        {"text": text("40512", "7"), "num_beams": i32(4), "num_return_sequences": k,
         "return_scores": np.array([[True]], bool)},
        {"text": text("40512"), "target_prefix": text("forty"), "return_alternatives": np.array([[True]], bool),
         "num_return_sequences": k},
        {"text": text("40512"), "num_return_sequences": k},  # greedy has one answer: refused alone
    ])
    src = Translator(demo).policy.encode_texts(["40512", "7"])
    ids, scores = demo.generate(src, num_beams=4, num_return_sequences=3, return_scores=True)
    assert out[0]["hypothesis_ids"].shape[:2] == (2, 3)
    np.testing.assert_array_equal(out[0]["hypothesis_ids"].reshape(6, -1)[:, :ids.shape[1]], ids)
    assert [t.decode() for t in out[0]["hypotheses"].reshape(-1)] == [demo.tokenizer.decode(r) for r in ids]
    np.testing.assert_allclose(out[0]["hypothesis_scores"].reshape(-1), scores, rtol=1e-6)
    np.testing.assert_array_equal(out[0]["output_ids"], ids[::3][:, :out[0]["output_ids"].shape[1]])
    assert [t.decode() for t in out[0]["translation"].reshape(-1)] == Translator(demo).translate(["40512", "7"], num_beams=4)
    alts = Translator(demo).translate(["40512"], target_prefix=["forty"], return_alternatives=True, num_return_sequences=3)
    assert [t.decode() for t in out[1]["hypotheses"].reshape(-1)] == alts and len(set(alts)) == 3
    assert isinstance(out[2], str) and "input 'num_return_sequences'" in out[2]


def test_greedy_requests_of_different_lengths_decode_together_cut_to_their_own(demo):
    """Greedy requests that differ only in max_new_tokens are one batch (decoded to the largest,
    each cut to its own): each answer, scores included, is what decoding it alone gives; beam
    requests keep their own batches."""
    calls = []
    start = demo.backend.start

    def counting(src_ids, *a, **kw):  # the requests decode through the Scheduler: one start a batch
        calls.append(len(src_ids))
        return start(src_ids, *a, **kw)
    demo.backend.start = counting
    try:
        reqs = [{"text": text("123456"), "max_new_tokens": i32(n), "return_scores": np.array([[True]])}
                for n in (3, 12, 6)]
        reqs.append({"text": text("999999"), "max_new_tokens": i32(4), "num_beams": i32(2)})
        out = execute(Translator(demo), reqs)
    finally:
        del demo.backend.start
    assert sorted(calls) == [1, 3], calls  # the three greedy requests in one decode, the beams in their own
    for r, n in zip(out, (3, 12, 6)):
        ids, score, tokens = demo.generate(Translator(demo).policy.encode_texts(["123456"]), max_new_tokens=n, return_token_scores=True)
        np.testing.assert_array_equal(r["output_ids"], ids)
        np.testing.assert_allclose(r["scores"][:, 0], score, rtol=0, atol=1e-5)
        np.testing.assert_allclose(r["token_scores"], tokens[:, :ids.shape[1]], rtol=0, atol=1e-6)
        assert r["translation"][0, 0].decode() == Translator(demo).translate(["123456"], max_new_tokens=n)[0]
    np.testing.assert_array_equal(out[3]["output_ids"],
                                  demo.generate(Translator(demo).policy.encode_texts(["999999"]), max_new_tokens=4, num_beams=2))


def test_forced_eos_greedy_requests_are_not_cut_from_a_longer_decode(demo):
    """With end-of-sentence forced at the last step (Marian's forced_eos), a shorter request is
    not a prefix of a longer decode: such requests keep their own batches and end in </s>."""
    forced = dict(demo.generation_defaults, forced_eos=True)
    saved, demo.generation_defaults = demo.generation_defaults, forced
    try:
        out = execute(Translator(demo), [{"text": text("123456"), "max_new_tokens": i32(n)} for n in (3, 12)])
        for r, n in zip(out, (3, 12)):
            np.testing.assert_array_equal(r["output_ids"], demo.generate(Translator(demo).policy.encode_texts(["123456"]),
                                                                         max_new_tokens=n))
        assert out[0]["output_ids"][0, -1] == demo.eos_id
    finally:
        demo.generation_defaults = saved


@pytest.mark.parametrize("parameters, said", [
    ({"beam_size": 2}, "unknown key 'beam_size' (did you mean 'num_beams'?): no input of this model"),  # CTranslate2's
    ({"max_new_token": 5}, "unknown key 'max_new_token' (did you mean 'max_new_tokens'?)"),  # misspelt
    ({"bad_words_ids": "x"}, "unknown key 'bad_words_ids' (did you mean 'bad_words'?)"),  # the setting's name
    ({"zzz": 1, "num_beam": 2}, "unknown keys 'num_beam' (did you mean 'num_beams'?), 'zzz': no input of this model "
                                "(Triton passed them as request parameters"),
    ({"num_beams": "2"}, "input 'num_beams': expected a TYPE_INT32 tensor (an entry of the body's 'inputs', or a "
                         "key of a generate body), found a request parameter 'num_beams' = '2' (str); send it as "
                         "the tensor"),
])
def test_a_parameter_the_model_does_not_take_is_refused_naming_the_key_and_the_input_meant(parameters, said):
    """Triton 2.51's generate door passes a key that is no input of the model as a request
    parameter (its http_server.cc, ExactMappingInput): each is refused with the input it likely
    means and the model's inputs; one named as an input was sent as a parameter."""
    from xform.errors import InputError
    from xform.serving.parameters import parameters_of, refuse_parameters
    from xform.serving.tensors import inputs
    known = {t.name: t.dtype for t in inputs()}
    with pytest.raises(InputError) as e:
        refuse_parameters(parameters_of(json.dumps(parameters)), known, taken=("xform_relay",))
    assert said in str(e.value), str(e.value)
    assert "--" not in str(e.value)
    if "unknown" in said:
        assert str(e.value).endswith("its inputs: " + ", ".join(sorted(known)))
    # xform's own, the generate body's request id and Triton's own are taken
    refuse_parameters(parameters_of('{"xform_relay": true, "id": "r1", "triton_enable_empty_final_response": true}'),
                      known, taken=("xform_relay",))
    assert parameters_of("") == parameters_of("not json") == parameters_of("[1]") == {}
