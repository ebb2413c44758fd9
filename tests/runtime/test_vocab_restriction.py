"""Vocabulary restriction: a bundle exported --with-vocab-map decodes over a per-batch subset of
target ids through the restricted decoder (the output projection over those rows only). Its tokens
are the full model's with every other id's logit masked (suppress_tokens = the complement), for
greedy, beams and prefixes; scores within SCORE_ATOL. A vocabulary map (CTranslate2's format)
chooses the subset from the sources' n-grams.
"""
import numpy as np
import pytest
from click.testing import CliRunner

import xform
from tests.marian_fixtures import sources
from xform.cli import main
from xform.errors import InputError
from xform.exporter.export import export_bundle
from xform.runtime.text.translator import Translator
from xform.runtime.text.vocab_map import VocabMap

SCORE_ATOL = 1e-4
MAX_NEW = 12
LENGTHS = [7, 3, 9, 5]


@pytest.fixture(scope="module")
def restrictable(marians, tmp_path_factory):
    d, model, _ = marians["swish-scaled"]
    return model, xform.load(export_bundle(d, tmp_path_factory.mktemp("vmap") / "b", vocab_map=True).path)


def masked(session, src, allowed, max_new_tokens=MAX_NEW, **kw):
    """The full model with every logit outside `allowed` (and the always-needed ids: end-of-sentence,
    prefixes) set to -inf before anything reads it: the reference a restriction must equal."""
    keep = np.zeros(session.config.tgt_vocab_size, bool)
    keep[list(set(allowed) | {session.eos_id} | {i for p in kw.get("target_prefix") or [] for i in p})] = True
    step = session.backend.step

    def masked_step(*args, **kwargs):
        nxt, logits = step(*args, **kwargs)
        return nxt, np.where(keep, logits, -np.inf).astype(np.float32)
    session.backend.step = masked_step
    try:  # suppressing the (never generated) pad id makes every strategy read the host's logits
        return session.generate(src, max_new_tokens=max_new_tokens, suppress_tokens=[session.pad_id], **kw)
    finally:
        session.backend.step = step


@pytest.mark.parametrize("settings", [dict(), dict(num_beams=4, num_return_sequences=2), dict(num_beams=3,
                                      length_penalty=0.5), dict(target_prefix=[[5], [], [9, 10], [3]]),
                                      dict(min_new_tokens=MAX_NEW - 2), dict(num_beams=3, min_new_tokens=MAX_NEW - 3)])
def test_restricted_tokens_are_the_masked_full_models(restrictable, settings):
    model, session = restrictable
    src, _ = sources(model.config, LENGTHS, seed=2)
    src = src.numpy()
    full = session.generate(src, max_new_tokens=MAX_NEW, **settings)
    allowed = sorted(set(full.reshape(-1).tolist()) - {session.pad_id})[:-3] + [7, 11, 19, 23, 29]
    want = masked(session, src, allowed, return_scores=True, **settings)
    got = session.generate(src, max_new_tokens=MAX_NEW, vocabulary=allowed, return_scores=True, **settings)
    n = settings.get("num_return_sequences", 1)
    if n == 1:
        np.testing.assert_array_equal(got[0], want[0])
    else:  # a source's hypotheses as a set: two within float noise of each other may trade places
        for i in range(len(LENGTHS)):
            rows = slice(i * n, (i + 1) * n)
            assert {tuple(r) for r in got[0][rows]} == {tuple(r) for r in want[0][rows]}
        got, want = (got[0], np.sort(got[1].reshape(-1, n), 1)), (want[0], np.sort(want[1].reshape(-1, n), 1))
    np.testing.assert_allclose(got[1], want[1], rtol=0, atol=SCORE_ATOL)
    assert got[0].shape != full.shape or (got[0] != full).any()  # the restriction changed the output
    assert set(got[0].reshape(-1).tolist()) <= set(allowed) | {session.eos_id, session.pad_id} | {
        i for p in settings.get("target_prefix", []) for i in p}


def test_the_restricted_decoder_is_verified_and_shares_the_decoders_weights(restrictable):
    _, session = restrictable
    m = session.bundle.manifest
    assert "decoder_restricted" in m.graphs and m.output_table == "output.safetensors"
    figures = m.verification
    assert any(k.startswith("restricted_") for k in figures) and all(
        v <= 1e-4 for k, v in figures.items() if k.startswith("restricted_"))
    shared = [w.graphs for w in m.shared_weights]
    assert all("decoder" in g for g in shared)


def test_the_full_vocabulary_comes_back_after_a_restriction(restrictable):
    model, session = restrictable
    src = sources(model.config, LENGTHS, seed=3)[0].numpy()
    before = session.generate(src, max_new_tokens=MAX_NEW, num_beams=2)
    session.generate(src, max_new_tokens=MAX_NEW, vocabulary=[4, 5, 6])
    np.testing.assert_array_equal(session.generate(src, max_new_tokens=MAX_NEW, num_beams=2), before)


def test_a_bundle_without_the_restricted_decoder_refuses(marians):
    _, model, bundle = marians["swish-scaled"]
    src = sources(model.config, LENGTHS)[0].numpy()
    with pytest.raises(InputError, match="xform export MODEL -o BUNDLE --with-vocab-map"):
        xform.load(bundle).generate(src, vocabulary=[3, 4])
    with pytest.raises(InputError, match="on the ort backend"):
        xform.load(bundle, backend="torch").generate(src, vocabulary=[3, 4])


def test_vocabulary_ids_outside_are_refused(restrictable):
    model, session = restrictable
    src = sources(model.config, LENGTHS)[0].numpy()
    with pytest.raises(InputError, match="vocabulary: ids outside the target vocabulary of 53"):
        session.generate(src, vocabulary=[3, 99])


def test_vocab_map_rules_and_refusals(tmp_path):
    vocab = {"a": 1, "b": 2, "c": 3, "x": 7, "y": 8}
    f = tmp_path / "map.txt"
    f.write_text("\ta b\nfoo\tc\nfoo bar\tx\nbaz\ty c\n")
    vmap = VocabMap.load(f, vocab)
    assert vmap.ids_for([["foo", "qux"]]).tolist() == [1, 2, 3]
    assert vmap.ids_for([["foo", "bar"], ["baz"]], extra=[0]).tolist() == [0, 1, 2, 3, 7, 8]
    f.write_text("foo\tc nope\n")
    with pytest.raises(InputError, match=r"map.txt:1: target token 'nope' is not in the model's target vocabulary"):
        VocabMap.load(f, vocab)
    f.write_text("\ta\nfoo c\n")
    with pytest.raises(InputError, match=r"map.txt:2: expected '<source n-gram> TAB <target tokens>'"):
        VocabMap.load(f, vocab)


def test_run_with_a_vocab_map_equals_the_masked_model(text_restrictable, tmp_path):
    """run --vocab-map: each batch over the ids its sources' n-grams allow; the same lines as the
    Python API with that map, and as the full model masked to those ids."""
    session, bundle = text_restrictable
    target = session.tokenizer.target_vocabulary()
    pieces = [p for p in target if p.startswith("\u2581")][:6]
    f = tmp_path / "map.txt"
    texts = ["the red cat sleeps", "a blue dog runs fast"]
    sp = session.tokenizer.source_pieces(texts[0])  # a 1-gram and a 2-gram of the first source
    f.write_text(f"\t{' '.join(pieces[:2])}\n{sp[2]}\t{pieces[2]}\n{sp[0]} {sp[1]}\t{' '.join(pieces[3:6])}\n"
                 "\u2581never_seen\tc\n".replace("\tc\n", f"\t{pieces[0]}\n"))
    r = CliRunner().invoke(main, ["run", str(bundle), "--vocab-map", str(f), "--max-new-tokens", "8",
                                  *[a for t in texts for a in ("--text", t)]])
    assert r.exit_code == 0, r.output
    got = [line.split("\t")[1] for line in r.output.splitlines()]
    assert got == Translator(session).translate(texts, max_new_tokens=8, vocab_map=f)
    vmap = VocabMap.load(f, target)
    allowed = vmap.ids_for([session.tokenizer.source_pieces(t) for t in texts])
    assert {target[p] for p in pieces[:2] + pieces[3:6]} <= set(allowed.tolist())  # always, and the 2-gram's
    assert target[pieces[0]] in allowed and len(allowed) < 10
    unk = session.tokenizer.target_unk_id
    ids = masked(session, Translator(session).policy.encode_texts(texts), list(allowed) + [unk], max_new_tokens=8)
    assert got == [session.tokenizer.decode(r) for r in ids]
    f.write_text("\t\u2581nope_not_a_piece\n")
    r = CliRunner().invoke(main, ["run", str(bundle), "--vocab-map", str(f), "--text", "the red cat"])
    assert r.exit_code == 1 and "map.txt:1: target token" in r.output, r.output


@pytest.fixture(scope="module")
def text_restrictable(tmp_path_factory):
    from tests.marian_fixtures import build_text_marian
    d = tmp_path_factory.mktemp("marian-text-vmap")
    build_text_marian(d, 2, 40, encoder_layers=1, decoder_layers=1, activation_function="gelu", scale_embedding=True)
    bundle = export_bundle(d, tmp_path_factory.mktemp("bundle") / "t", vocab_map=True).path
    return xform.load(bundle), bundle
