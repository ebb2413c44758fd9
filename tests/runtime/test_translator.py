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
    assert t.translate_file(src, out) == 3
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
