"""The text-level Translator: CTranslate2's names over the session's one request path."""
import numpy as np
import pytest

import xform
from xform.errors import InputError
from xform.runtime.text.translator import Translator


@pytest.fixture(scope="module")
def demo(demo_bundle):
    return xform.load(demo_bundle, backend="ort")


def test_translate_batch_speaks_ctranslate2s_names(demo):
    t = Translator(demo)
    assert isinstance(t, Translator)
    out = t.translate_batch(["40512", "7"], beam_size=4, num_hypotheses=2, return_scores=True, max_decoding_length=12)
    want = Translator(demo).translate(["40512", "7"], num_beams=4, num_return_sequences=2, max_new_tokens=12)
    assert [r.hypotheses for r in out] == [want[:2], want[2:]]
    _, scores = demo.generate(Translator(demo).policy.encode_texts(["40512", "7"]), max_new_tokens=12, num_beams=4, num_return_sequences=2,
                              return_scores=True)
    np.testing.assert_allclose([s for r in out for s in r.scores], scores, rtol=1e-6)
    assert t.translate_batch(["40512"])[0].scores == []
    prefixed = t.translate_batch(["40512", "7"], target_prefix=["forty", None])
    assert [r.hypotheses[0] for r in prefixed] == [Translator(demo).translate(["40512"], target_prefix=["forty"])[0],
                                                  Translator(demo).translate(["7"])[0]]
    assert t.translate_batch(["123456"], suppress_sequences=["hundred"])[0].hypotheses == Translator(demo).translate(
        ["123456"], bad_words_ids=["hundred"])
    sampled = t.translate_batch(["123456"], sampling_topk=5, sampling_temperature=2.0, seed=3)
    assert sampled[0].hypotheses == Translator(demo).translate(["123456"], do_sample=True, top_k=5, temperature=2.0, seed=3)
    assert t.translate_batch(["123456"], sampling_topk=1)[0].hypotheses == Translator(demo).translate(["123456"])  # greedy


def test_xform_translator_opens_a_bundle_as_ctranslate2_opens_a_model(demo_bundle, demo):
    """xform.Translator(path, device, device_index, compute_type, inter_threads, intra_threads):
    CTranslate2's constructor; what a bundle cannot do is refused by name."""
    from xform.errors import XformError
    t = xform.Translator(demo_bundle, device="cpu", compute_type="float32", intra_threads=1)
    assert xform.Translator(demo_bundle, compute_type="auto", device_index=[0]).translate_batch(["7"])[0].hypotheses \
        == Translator(demo).translate(["7"])
    ids = np.array([5, 6], np.int64)
    got = t.policy.prefix_ids([ids, None, "", "forty"])  # ids as given, none, none, text through the target side
    assert got[0] is ids and got[1:3] == [[], []] and got[3] == Translator(demo).policy.target_ids("forty")
    assert isinstance(t, Translator) and t.session.bundle.precision == "fp32"
    out = t.translate_batch(["40512", "7"], beam_size=2)
    assert [r.hypotheses[0] for r in out] == Translator(demo).translate(["40512", "7"], num_beams=2)
    for kw, fragment in ((dict(compute_type="int8"), "compute_type int8: "),
                         (dict(device_index=1), "CUDA_VISIBLE_DEVICES"),
                         (dict(inter_threads=2), "inter_threads 2"),
                         (dict(device="tpu"), "unknown device 'tpu'")):
        with pytest.raises(XformError, match=fragment):
            xform.Translator(demo_bundle, **kw)
    with pytest.raises(XformError, match="compute_type default or float32"):
        xform.Translator(demo_bundle, compute_type="float16")


def test_bad_words_from_text_are_checked_at_every_door(demo):
    with pytest.raises(InputError, match="a phrase gives no target tokens"):
        Translator(demo).translate(["40512"], bad_words_ids=[""])
    with pytest.raises(InputError, match="a phrase gives no target tokens"):
        Translator(demo).translate_batch(["40512"], suppress_sequences=[" "])


def test_iterable_file_scores_and_tokens(demo, tmp_path):
    t = Translator(demo)
    lines = ["40512", "7", "123456"]
    got = [r.hypotheses[0] for r in t.translate_iterable(iter(lines), max_batch_size=2)]
    assert got == Translator(demo).translate(lines)
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.txt"
    out.write_text("old\n")
    assert t.translate_file(src, out).num_examples == 3  # CTranslate2's ExecutionStats
    assert out.read_text().splitlines() == got
    assert not [p for p in tmp_path.iterdir() if p.name not in ("in.txt", "out.txt")]  # no temporary left
    (tmp_path / "bad.txt").write_bytes(b"40512\n\xff\n")
    with pytest.raises(InputError, match="line 1: not UTF-8"):
        t.translate_file(tmp_path / "bad.txt", out)
    assert out.read_text().splitlines() == got  # nothing half-written
    scored = t.score_batch(["40512"], got[:1])
    ids = Translator(demo).policy.encode_target(got[0])
    want = demo.score(Translator(demo).policy.encode_texts(["40512"]), np.array([ids], np.int64))
    assert scored[0].tokens == ids
    np.testing.assert_allclose(scored[0].log_probs, want["tokens"][0], rtol=1e-6)
    steps = list(t.generate_tokens("40512"))
    assert steps[-1].is_last and [s.step for s in steps] == list(range(len(steps)))
    assert demo.tokenizer.decode([s.token_id for s in steps]) == got[0]
    with pytest.raises(InputError, match="beam_size 1 only"):
        next(t.generate_tokens("40512", beam_size=2))


# -- the Python door as CTranslate2 users write it (issue 42 item 6) -------------------------------
def test_a_string_where_a_list_belongs_is_refused_in_one_sentence(demo):
    t = Translator(demo)
    for call in (lambda: t.translate_batch("40512"), lambda: list(t.translate_iterable("40512")),
                 lambda: t.translate_batch(["40512"], target_prefix="forty")):
        with pytest.raises(InputError, match=r"got a str \(it would translate each character\)"):
            call()
    with pytest.raises(InputError, match=r"source\[1\]: expected a text"):
        t.translate_batch(["7", 7])


def test_a_token_list_is_ids_through_the_vocabulary_never_text(demo, marian_text):
    """CTranslate2's token list is what the encoder reads (issue 54): its pieces' ids, "</s>" the
    end token (never the characters '<', '/', 's', '>'), nothing added; the hypotheses are token
    lists. The text's own ids, given as their pieces, decode as the text does."""
    t = Translator(marian_text)
    text = "the cat sleeps"
    ids = t.policy.encode_text(text)
    pieces = [t.policy.text.source_piece(i) for i in ids]
    assert pieces[-1] == "</s>" and t.policy.vocabularies.source_ids(pieces, "x") == ids
    assert t.policy.vocabularies.source_ids(["\u2581zzz-not-a-piece"], "x") == [t.policy.vocabularies.source["<unk>"]]
    got = t.translate_batch([pieces], beam_size=1, max_decoding_length=20, min_decoding_length=0)[0].hypotheses[0]
    want = t.session.generate(np.array([ids]), max_new_tokens=20)[0]
    want = [int(i) for i in want]
    want = want[:want.index(t.policy.eos_id)] if t.policy.eos_id in want else want
    assert got == t.policy.vocabularies.pieces(want) and all(isinstance(p, str) for p in got)
    assert t.translate_batch([pieces[:-1] + ["</", "s>"]], beam_size=1)[0].hypotheses != [got]  # text is not the token
    demo_t = Translator(demo)
    assert demo_t.translate_batch([[demo_t.policy.text.source_piece(i) for i in demo_t.policy.encode_text("40512")]])[0].hypotheses[0]
    with pytest.raises(InputError, match="a text among token lists"):
        t.translate_batch([pieces, "the cat"])


@pytest.fixture(scope="module")
def marian_text(tmp_path_factory):
    pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e '.[dev]')")
    from tests.marian_fixtures import text_marian_bundle
    return xform.load(text_marian_bundle(tmp_path_factory, "spm", 2, 5, encoder_layers=1, decoder_layers=1,
                                         activation_function="relu", scale_embedding=True))


@pytest.mark.parametrize("batch_type,size", [("examples", 2), ("tokens", 9)])
def test_translate_batch_takes_max_batch_size_and_batch_type(demo, batch_type, size):
    texts = ["40512", "7", "123456", "88", "999999"]
    want = Translator(demo).translate_batch(texts, beam_size=2, return_scores=True)
    got = Translator(demo).translate_batch(texts, beam_size=2, return_scores=True, max_batch_size=size,
                                          batch_type=batch_type)
    assert [r.hypotheses for r in got] == [r.hypotheses for r in want]
    np.testing.assert_allclose([r.scores for r in got], [r.scores for r in want], rtol=1e-5)


def test_a_misspelt_option_is_named_with_the_nearest_at_every_python_door(demo, tmp_path):
    t = Translator(demo)
    (tmp_path / "in.txt").write_text("7\n")
    for call in (lambda: t.translate_batch(["7"], beam_sise=2), lambda: list(t.translate_iterable(["7"], beam_sise=2)),
                 lambda: t.translate_file(tmp_path / "in.txt", tmp_path / "out.txt", beam_sise=2),
                 lambda: demo.generate(Translator(demo).policy.encode_texts(["7"]), num_beam=2)):
        with pytest.raises(InputError, match=r"did you mean 'num_beams'\?|did you mean 'beam_size'\?"):
            call()


def test_max_input_length_cuts_sources_as_ctranslate2_does(demo, tmp_path):
    """CTranslate2's max_input_length (it was refused as a misspelt max_decoding_length, issue 55):
    N cuts each source to its first N tokens, end-of-sentence last; 0 is no limit but max_len's;
    the methods that do not take it refuse it by its name."""
    t = Translator(demo)
    long = "9" * 40  # 41 tokens with end-of-sentence, over the demo's max_len 32
    assert len(t.policy.encode_text(long)) == 41
    cut = t.translate_batch([long, "12"], max_input_length=10, max_batch_size=1, batch_type="tokens")
    assert [r.hypotheses for r in cut] == [t.translate_batch(["9" * 9])[0].hypotheses, ["twelve"]]
    assert t.translate_batch(["12"], max_input_length=0)[0].hypotheses == ["twelve"]
    with pytest.raises(InputError, match="more than the model's max_len 32 .truncate to cut it"):
        t.translate_batch([long], max_input_length=0)
    for bad in (-1, "10", True):
        with pytest.raises(InputError, match="^max_input_length must be an integer >= 0"):
            t.translate_batch([long], max_input_length=bad)
    with pytest.raises(InputError, match="^max_input_length: CTranslate2's option .* translate_batch only"):
        list(t.translate_iterable(["12"], max_input_length=10))


def test_zero_new_tokens_is_refused_alike_at_every_door(demo, demo_bundle, tmp_path):
    """max_decoding_length / max_new_tokens 0 decoded nothing in one door, the cap of 256 in others
    and crashed beams with an IndexError: refused alike now."""
    from click.testing import CliRunner

    from xform.cli import main
    from xform.serving.handler import execute
    t = Translator(demo)
    (tmp_path / "in.txt").write_text("7\n")
    for name, call in (("max_decoding_length", lambda: t.translate_batch(["7"], max_decoding_length=0)),
                       ("max_decoding_length", lambda: t.translate_batch(["7"], max_decoding_length=0, beam_size=3)),
                       ("max_decoding_length", lambda: list(t.translate_iterable(["7"], max_decoding_length=0))),
                       ("max_decoding_length", lambda: t.translate_file(tmp_path / "in.txt", tmp_path / "out.txt",
                                                                        max_decoding_length=0)),
                       ("max_new_tokens", lambda: Translator(demo).translate(["7"], max_new_tokens=0))):
        with pytest.raises(InputError, match=f"{name} must be an integer >= 1, got 0"):  # as the caller named it
            call()
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--text", "7", "--max-new-tokens", "0"])
    assert r.exit_code == 2 and "--max-new-tokens" in r.output
    served = execute(Translator(demo), [{"text": np.array([[b"7"]], dtype=object), "max_new_tokens": np.array([[0]], np.int32)}])
    assert isinstance(served[0], str) and "max_new_tokens" in served[0]


def test_an_empty_source_is_an_empty_translation_at_every_door(demo, demo_bundle, tmp_path):
    from click.testing import CliRunner

    from xform.cli import main
    from xform.serving.handler import execute
    t = Translator(demo)
    got = t.translate_batch(["7", "", "40512"], return_scores=True)
    assert got[1].hypotheses == [""] and got[1].scores == [0.0] and got[0].hypotheses == Translator(demo).translate(["7"])
    assert [r.hypotheses for r in t.translate_iterable(["", "7"])] == [[""], Translator(demo).translate(["7"])]
    assert t.translate_batch([""], beam_size=2, num_hypotheses=2)[0].hypotheses == ["", ""]
    r = CliRunner().invoke(main, ["run", str(demo_bundle), "--text", "", "--text", "7"])
    assert r.exit_code == 0 and r.output.splitlines()[0] == "\t", r.output
    served = execute(Translator(demo), [{"text": np.array([[b""], [b"7"]], dtype=object)}])[0]
    assert served["translation"].reshape(-1).tolist() == [b"", Translator(demo).translate(["7"])[0].encode()]


def test_generate_tokens_gives_pieces_that_join_back_into_the_text(marian_text):
    """CTranslate2's generate_tokens yields the vocabulary's tokens: SentencePiece pieces keep their
    word-start mark (the text of each token alone lost it, and with it the spaces), so joined they
    spell the translation."""
    t = Translator(marian_text)
    vocab = marian_text.tokenizer.target_vocabulary()
    marked = [i for p, i in vocab.items() if p.startswith("\u2581") and len(p) > 1]
    assert marked and all(t.piece(i).startswith("\u2581") for i in marked)
    kw = dict(max_decoding_length=12, min_decoding_length=8)
    steps = list(t.generate_tokens("the cat sleeps", **kw))
    assert [s.token for s in steps] == [t.piece(s.token_id) for s in steps]
    text = "".join(s.token for s in steps if s.token_id != marian_text.eos_id).replace("\u2581", " ").strip()
    assert text == t.translate_batch(["the cat sleeps"], beam_size=1, **kw)[0].hypotheses[0]


def test_ctranslate2s_translator_properties_and_model_residency(demo_bundle):
    """CTranslate2's Translator properties, unload_model / load_model / model_is_loaded, and
    compute_type as a dict by device (issue 54): a call on an unloaded model is refused saying how
    to load it, and after load_model it translates as before."""
    from xform.errors import XformError
    t = xform.Translator(demo_bundle, compute_type={"cuda": "float16", "cpu": "float32"})
    assert (t.device, t.device_index, t.compute_type, t.num_translators, t.num_queued_batches,
            t.num_active_batches) == ("cpu", [0], "float32", 1, 0, 0)
    before = t.translate_batch(["40512"])[0].hypotheses
    assert t.model_is_loaded
    t.unload_model()
    assert not t.model_is_loaded
    with pytest.raises(XformError, match="unloaded: call load_model"):
        t.translate_batch(["40512"])
    t.load_model()
    assert t.model_is_loaded and t.translate_batch(["40512"])[0].hypotheses == before
    with pytest.raises(XformError, match="compute_type float16"):
        xform.Translator(demo_bundle, compute_type={"cpu": "float16"})
    with pytest.raises(XformError, match="a name .* or a dict"):
        xform.Translator(demo_bundle, compute_type=16)


# -- CTranslate2's surface, complete (issue 54 item 2) ----------------------------------------------
def test_a_callback_hears_each_token_of_a_text_as_it_is_decoded(demo):
    """translate_batch's callback on texts: the target pieces of each example, batch_id its index
    in the call, the last one is_last; the call's beams must be 1 (the bundle's default beams are
    refused, naming beam_size); True ends an example after its token."""
    t = Translator(demo)
    texts = ["40512", "", "7"]
    steps = []
    got = t.translate_batch(texts, beam_size=1, max_batch_size=1, return_scores=True, callback=steps.append)
    assert {s.batch_id for s in steps} == {0, 2} and all(s.log_prob is not None for s in steps)
    for i in (0, 2):
        mine = sorted((s for s in steps if s.batch_id == i), key=lambda s: s.step)
        assert [s.step for s in mine] == list(range(len(mine))) and mine[-1].is_last
        assert not any(s.is_last for s in mine[:-1])
        assert demo.tokenizer.decode([s.token_id for s in mine]) == got[i].hypotheses[0]
        np.testing.assert_allclose(sum(s.log_prob for s in mine), got[i].scores[0], atol=1e-5)
    first = t.translate_batch(["40512"], beam_size=1, callback=lambda s: True)[0].hypotheses[0]
    assert first and len(first.split()) == 1
    with pytest.raises(InputError, match="callback function is not compatible with beam_size > 1"):
        t.translate_batch(["40512"], beam_size=3, callback=lambda s: None)


def test_use_vmap_on_a_bundle_without_a_vmap_is_ignored(demo_bundle):
    """CTranslate2 ignores use_vmap where the model has no vmap.txt; a bundle too."""
    t = xform.Translator(demo_bundle)
    assert t.translate_batch(["40512"], use_vmap=True) == t.translate_batch(["40512"])


def test_translate_file_and_score_file_over_texts(demo, tmp_path):
    """A file of texts (no SentencePiece mark, no </s>): xform's addition, translated and scored
    with the bundle's tokenizer; CTranslate2's output formats and ExecutionStats."""
    t = Translator(demo)
    src, tgt = tmp_path / "in.txt", tmp_path / "tgt.txt"
    src.write_text("40512\n\n7\n")
    stats = t.translate_file(src, tmp_path / "out.txt", with_scores=True, beam_size=2, num_hypotheses=2)
    want = t.translate_batch(["40512", "", "7"], beam_size=2, num_hypotheses=2, return_scores=True)
    assert (tmp_path / "out.txt").read_text().splitlines() == [f"{s:g} ||| {h}" for r in want
                                                               for h, s in zip(r.hypotheses, r.scores)]
    assert stats.num_examples == 3 and stats.num_tokens == sum(len(t.policy.target_ids(r.hypotheses[0]))
                                                               for r in want if r.hypotheses[0])
    tgt.write_text("forty thousand five hundred twelve\n\nseven\n")
    scored = t.score_file(src, tgt, tmp_path / "scores.txt", with_tokens_score=True)
    lines = (tmp_path / "scores.txt").read_text().splitlines()
    results = t.score_batch(["40512", "", "7"], ["forty thousand five hundred twelve", "", "seven"])
    assert lines[1] == "0 |||  |||" and lines[2].split(" ||| ")[1] == "seven"
    np.testing.assert_allclose(float(lines[0].split(" ||| ")[0]), np.mean(results[0].log_probs), atol=1e-5)
    assert (scored.num_examples, scored.num_tokens) == (3, sum(len(r.log_probs) for r in results))
    with pytest.raises(InputError, match="^tokenized: True"):
        t.translate_file(src, tmp_path / "out.txt", tokenized="yes")
    with pytest.raises(InputError, match="^return_scores: translate_file writes the scores with with_scores"):
        t.translate_file(src, tmp_path / "out.txt", return_scores=True)


@pytest.fixture(scope="module")
def fleet_dir(demo_bundle, tmp_path_factory):
    import shutil
    root = tmp_path_factory.mktemp("fleet") / "bundles"
    shutil.copytree(demo_bundle, root / "numbers")
    return root


def test_a_directory_offers_every_text_method_of_one_bundle_or_refuses_it_by_name(fleet_dir):
    """xform.Translator(DIR): each public name of a one-bundle xform.Translator is a FleetTranslator
    method routed as translate_batch routes, or refused by name with the reason (an XformError,
    never an AttributeError)."""
    from xform.errors import XformError
    from xform.runtime.fleet.local import FleetTranslator
    fleet = xform.Translator(fleet_dir)
    assert isinstance(fleet, FleetTranslator)
    names = sorted(n for n in dir(xform.Translator) if not n.startswith("_"))
    offered, refused = [], []
    for name in names:
        if name in vars(FleetTranslator) or any(name in vars(k) for k in FleetTranslator.__mro__):
            offered.append(name)
            continue
        with pytest.raises(XformError, match=f"^{name}: ") as e:
            getattr(fleet, name)
        assert not isinstance(e.value, AttributeError) and "xform.Translator(PATH)" in str(e.value)
        refused.append(name)
    assert {"translate_batch", "translate_iterable", "translate_file", "score_batch", "score_iterable", "score_file",
            "generate_tokens", "translate_document", "translate_documents", "translate"} <= set(offered)
    assert {"device", "unload_model", "steps", "translate_lines"} <= set(refused)
    with pytest.raises(AttributeError):
        fleet.no_such_name  # noqa: B018 - a name a one-bundle Translator lacks too is Python's AttributeError


def test_a_directorys_text_methods_equal_its_bundle_alone(fleet_dir, tmp_path):
    fleet, alone = xform.Translator(fleet_dir), xform.Translator(fleet_dir / "numbers")
    texts = ["40512", "7", "123456"]
    kw = dict(model="numbers")
    hyps = [r.hypotheses for r in alone.translate_batch(texts)]
    assert [r.hypotheses for r in fleet.translate_iterable(iter(texts), max_batch_size=2, **kw)] == hyps
    assert fleet.translate(texts, **kw) == [h[0] for h in hyps]
    src, tgt = tmp_path / "in.txt", tmp_path / "tgt.txt"
    src.write_text("40512\n7\n")
    tgt.write_text("forty\nseven\n")
    for method, args in (("translate_file", (src,)), ("score_file", (src, tgt))):
        a = getattr(fleet, method)(*args, tmp_path / "a.txt", **kw)
        b = getattr(alone, method)(*args, tmp_path / "b.txt")
        assert (tmp_path / "a.txt").read_text() == (tmp_path / "b.txt").read_text() and a.num_examples == b.num_examples
    assert fleet.score_batch(["7"], ["seven"], **kw) == alone.score_batch(["7"], ["seven"])
    assert list(fleet.score_iterable(["7"], ["seven"], **kw)) == alone.score_batch(["7"], ["seven"])
    assert [s.token for s in fleet.generate_tokens("7", **kw)] == [s.token for s in alone.generate_tokens("7")]
    assert fleet.translate_document("7. 12.", **kw) == alone.translate_document("7. 12.")
    for call, name in ((lambda: fleet.translate_batch(texts, asynchronous=True, **kw), "asynchronous"),
                       (lambda: fleet.translate_batch([["7"]], **kw), "token lists"),
                       (lambda: fleet.translate_file(src, tmp_path / "a.txt", tokenized=True, **kw), "tokenized"),
                       (lambda: fleet.score_batch([["7"]], [["seven"]], **kw), "token list")):
        with pytest.raises(InputError, match=name):
            call()


WRONG = {"max_batch_size": ["2", -1, 2.5], "batch_type": [3, "x"], "beam_size": ["2", 0, 2.5],
         "num_hypotheses": ["2", 0], "max_decoding_length": ["5", -1], "min_decoding_length": ["1", -1],
         "length_penalty": ["x", [1]],
         "sampling_topk": ["5", -1], "sampling_topp": ["x"], "sampling_temperature": ["x"], "repetition_penalty": ["x"],
         "no_repeat_ngram_size": ["2", -1], "callback": [5], "max_input_length": ["3", -1], "target_prefix": [5, [5]],
         "suppress_sequences": [5, [5]], "src_lang": [5], "tgt_lang": [5], "read_batch_size": ["x"], "offset": ["x"],
         "asynchronous": ["x"], "source_tokenize_fn": [5], "tokenized": ["x"], "return_scores": ["yes"],
         "use_vmap": ["x"], "num_beams": ["x"], "seed": ["x"]}
SOURCES = [5, None, [5], [[5]], [["a", 5]], [None], {}, [[]], "x"]


def ct2_calls(t, tmp_path, extra):
    """Each CTranslate2-named method of `t` as (name, call with options, call with one source)."""
    (tmp_path / "in.txt").write_text("7\n")
    files = tmp_path / "in.txt", tmp_path / "out.txt"
    yield "translate_batch", lambda **o: t.translate_batch(["7"], **o, **extra), lambda s: t.translate_batch(s, **extra)
    yield ("translate_iterable", lambda **o: list(t.translate_iterable(["7"], **o, **extra)),
           lambda s: list(t.translate_iterable(s, **extra)))
    yield ("translate_file", lambda **o: t.translate_file(*files, **o, **extra),
           lambda s: t.translate_file(s, files[1], **extra))
    yield ("score_batch", lambda **o: t.score_batch(["7"], ["seven"], **o, **extra),
           lambda s: t.score_batch(s, s, **extra))
    yield ("score_iterable", lambda **o: list(t.score_iterable(["7"], ["seven"], **o, **extra)),
           lambda s: list(t.score_iterable(s, s, **extra)))
    yield ("score_file", lambda **o: t.score_file(files[0], files[0], files[1], **o, **extra),
           lambda s: t.score_file(s, s, files[1], **extra))
    yield ("generate_tokens", lambda **o: list(t.generate_tokens("7", **o, **extra)),
           lambda s: list(t.generate_tokens(s, **extra)))


@pytest.mark.parametrize("door", ["bundle", "directory"])
def test_wrong_types_get_an_xform_error_never_a_raw_one(demo_bundle, fleet_dir, tmp_path, door):
    """Every CTranslate2-named method, given wrong-typed or out-of-range arguments, raises an
    XformError subclass naming the problem, never a raw TypeError / AttributeError / AssertionError
    (CTranslate2's pybind11 answers TypeError)."""
    from xform.errors import XformError
    t = xform.Translator(demo_bundle) if door == "bundle" else xform.Translator(fleet_dir)
    extra = {} if door == "bundle" else {"model": "numbers"}
    raw = []
    for name, with_options, with_source in ct2_calls(t, tmp_path, extra):
        tries = [(f"{k}={v!r}", lambda k=k, v=v: with_options(**{k: v})) for k, vs in WRONG.items() for v in vs]
        tries += [(f"source={s!r}", lambda s=s: with_source(s)) for s in SOURCES]
        for what, call in tries:
            try:
                got = call()
                if isinstance(got, list) and got and hasattr(got[0], "result"):  # asynchronous: the result raises
                    [g.result() for g in got]
            except XformError:
                pass
            except Exception as e:  # noqa: BLE001 - the point: nothing else comes out
                raw.append(f"{name}({what}): {type(e).__name__}: {e}")
    assert raw == []


def test_ctranslate2s_constructor_options_and_wrong_types_are_refused_by_name(demo_bundle, fleet_dir):
    """CTranslate2's constructor options xform does not build are accepted where off and refused
    by name otherwise; wrong types raise XformError, for a bundle and a directory alike."""
    from xform.errors import XformError
    for path in (demo_bundle, fleet_dir):
        xform.Translator(path, max_queued_batches=-1, flash_attention=False, tensor_parallel=False, files=None)
        for kw in (dict(max_queued_batches=4), dict(flash_attention=True), dict(tensor_parallel=True),
                   dict(files={}), dict(intra_threads="2"), dict(max_queued_batches="0")):
            with pytest.raises(XformError, match=f"^{next(iter(kw))}"):
                xform.Translator(path, **kw)
    for bad in (5, None, [demo_bundle, 5]):
        with pytest.raises(XformError, match="^model_path: a bundle directory"):
            xform.Translator(bad)
    for kw in (dict(max_loaded="x"), dict(pinned=5), dict(load_timeout=None)):
        with pytest.raises(XformError, match=next(iter(kw))):
            xform.Translator(fleet_dir, **kw)
