"""The text-level Translator: CTranslate2's names over the session's one request path."""
import numpy as np
import pytest

import xform
from xform.errors import InputError
from xform.runtime.translator import Translator


@pytest.fixture(scope="module")
def demo(demo_bundle):
    return xform.load(demo_bundle, backend="ort")


def test_translate_batch_speaks_ctranslate2s_names(demo):
    t = demo.translator
    assert isinstance(t, Translator)
    out = t.translate_batch(["40512", "7"], beam_size=4, num_hypotheses=2, return_scores=True, max_decoding_length=12)
    want = demo.translate(["40512", "7"], num_beams=4, num_return_sequences=2, max_new_tokens=12)
    assert [r.hypotheses for r in out] == [want[:2], want[2:]]
    _, scores = demo.generate(demo.encode_texts(["40512", "7"]), max_new_tokens=12, num_beams=4, num_return_sequences=2,
                              return_scores=True)
    np.testing.assert_allclose([s for r in out for s in r.scores], scores, rtol=1e-6)
    assert t.translate_batch(["40512"])[0].scores == []
    prefixed = t.translate_batch(["40512", "7"], target_prefix=["forty", None])
    assert [r.hypotheses[0] for r in prefixed] == [demo.translate(["40512"], target_prefix=["forty"])[0],
                                                  demo.translate(["7"])[0]]
    assert t.translate_batch(["123456"], suppress_sequences=["hundred"])[0].hypotheses == demo.translate(
        ["123456"], bad_words_ids=["hundred"])
    sampled = t.translate_batch(["123456"], sampling_topk=5, sampling_temperature=2.0, seed=3)
    assert sampled[0].hypotheses == demo.translate(["123456"], do_sample=True, top_k=5, temperature=2.0, seed=3)
    assert t.translate_batch(["123456"], sampling_topk=1)[0].hypotheses == demo.translate(["123456"])  # greedy


def test_xform_translator_opens_a_bundle_as_ctranslate2_opens_a_model(demo_bundle, demo):
    """xform.Translator(path, device, device_index, compute_type, inter_threads, intra_threads):
    CTranslate2's constructor; what a bundle cannot do is refused by name."""
    from xform.errors import XformError
    t = xform.Translator(demo_bundle, device="cpu", compute_type="float32", intra_threads=1)
    assert xform.Translator(demo_bundle, compute_type="auto", device_index=[0]).translate_batch(["7"])[0].hypotheses \
        == demo.translate(["7"])
    ids = np.array([5, 6], np.int64)
    got = t.prefix_ids([ids, None, "", "forty"])  # ids as given, none, none, text through the target side
    assert got[0] is ids and got[1:3] == [[], []] and got[3] == demo.target_ids("forty")
    assert isinstance(t, Translator) and t.session.bundle.precision == "fp32"
    out = t.translate_batch(["40512", "7"], beam_size=2)
    assert [r.hypotheses[0] for r in out] == demo.translate(["40512", "7"], num_beams=2)
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
        demo.translate(["40512"], bad_words_ids=[""])
    with pytest.raises(InputError, match="a phrase gives no target tokens"):
        demo.translator.translate_batch(["40512"], suppress_sequences=[" "])


def test_iterable_file_scores_and_tokens(demo, tmp_path):
    t = demo.translator
    lines = ["40512", "7", "123456"]
    got = [r.hypotheses[0] for r in t.translate_iterable(iter(lines), max_batch_size=2)]
    assert got == demo.translate(lines)
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
    ids = demo.encode_target(got[0])
    want = demo.score(demo.encode_texts(["40512"]), np.array([ids], np.int64))
    assert scored[0].tokens == ids
    np.testing.assert_allclose(scored[0].log_probs, want["tokens"][0], rtol=1e-6)
    steps = list(t.generate_tokens("40512"))
    assert steps[-1].is_last and [s.step for s in steps] == list(range(len(steps)))
    assert demo.tokenizer.decode([s.token_id for s in steps]) == got[0]
    with pytest.raises(InputError, match="beam_size 1 only"):
        next(t.generate_tokens("40512", beam_size=2))
