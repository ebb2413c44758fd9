"""Decoding controls against transformers' generate on the trained test Marian models: repetition
penalty, n-gram blocking, multi-token bad words, suppressed tokens (alone and combined; greedy,
beams, sampling), target prefixes, per-token scores and alternatives.

Tokens compare exactly; scores within SCORE_ATOL (a sum of up to 14 float32 log-probs whose logits
differ from transformers' by under 1e-5). Each control is also shown to change the output on
these inputs, so a parity that ignored it would fail.
"""
import numpy as np
import pytest
import torch

import xform
from tests.marian_fixtures import CONFIGS, sources
from xform.errors import InputError

pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e '.[dev]')")
SCORE_ATOL = 1e-4
MAX_NEW = 14
LENGTHS = [7, 3, 9, 5]


def hf_generate(model, src, mask, **kw):
    """transformers' generate with the model's own bad words ([[pad]]) kept beside any given."""
    pad = model.config.pad_token_id
    if "bad_words_ids" in kw:
        kw["bad_words_ids"] = [[pad]] + [list(w) for w in kw["bad_words_ids"]]
    vocab = model.config.vocab_size  # beam search reshapes by vocab_size: say the decoder's
    model.config.vocab_size = model.config.decoder_vocab_size or vocab
    try:
        with torch.no_grad():
            return model.generate(src, attention_mask=mask, max_new_tokens=kw.pop("max_new_tokens", MAX_NEW),
                                  output_scores=True, return_dict_in_generate=True, **kw)
    finally:
        model.config.vocab_size = vocab


CONTROLS = {  # each alone, and combined
    "repetition": dict(repetition_penalty=1.8),
    "below-one": dict(repetition_penalty=0.6),
    "ngram": dict(no_repeat_ngram_size=2),
    "unigram": dict(no_repeat_ngram_size=1),
    "suppress": dict(suppress_tokens=[5, 9, 17, 23]),
    "combined": dict(repetition_penalty=1.3, no_repeat_ngram_size=3, suppress_tokens=[11]),
}


def control_settings(session, src, control: str) -> dict:
    """generate()'s keywords for a control of CONTROLS, or "bad-words" (taken from the model's output)."""
    kw = dict(CONTROLS.get(control, {}))
    if control == "bad-words":
        kw["bad_words_ids"] = bad_words(session, src)
    return kw


def bad_words(session, src):
    """Multi-token bad words taken from the model's own unrestricted output, so they bite."""
    free = session.generate(src.numpy(), max_new_tokens=MAX_NEW)
    row = [int(i) for i in free[0] if i != session.pad_id]
    return [row[1:3], row[3:6], [int(free[1][0]), int(free[1][1])]]


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("control", sorted(CONTROLS) + ["bad-words"])
@pytest.mark.parametrize("beams", [1, 4])
def test_controls_equal_transformers(marians, name, control, beams):
    _, model, bundle = marians[name]
    session = xform.load(bundle, backend="ort")
    src, mask = sources(model.config, LENGTHS, seed=11)
    kw = control_settings(session, src, control)
    out = hf_generate(model, src, mask, num_beams=beams, do_sample=False, **kw)
    got, scores = session.generate(src.numpy(), max_new_tokens=MAX_NEW, num_beams=beams, return_scores=True, **kw)
    np.testing.assert_array_equal(got, out.sequences[:, 1:].numpy())
    if beams > 1:
        np.testing.assert_allclose(scores, out.sequences_scores.numpy(), rtol=0, atol=SCORE_ATOL)


@pytest.mark.parametrize("control", sorted(CONTROLS) + ["bad-words"])
def test_each_control_changes_the_output(marians, control):
    """The parity above is not vacuous: on these sources, every control changes some translation."""
    changed = 0
    for name in CONFIGS:
        _, model, bundle = marians[name]
        session = xform.load(bundle, backend="ort")
        src, _ = sources(model.config, LENGTHS, seed=11)
        kw = control_settings(session, src, control)
        for beams in (1, 4):
            plain = session.generate(src.numpy(), max_new_tokens=MAX_NEW, num_beams=beams)
            ruled = session.generate(src.numpy(), max_new_tokens=MAX_NEW, num_beams=beams, **kw)
            changed += plain.shape != ruled.shape or bool((plain != ruled).any())
    assert changed


def test_controls_hold_while_sampling(marians):
    """Sampling with the controls never makes what they forbid; with top_k 1 it is greedy's answer."""
    _, model, bundle = marians["swish-scaled"]
    session = xform.load(bundle, backend="ort")
    src, _ = sources(model.config, LENGTHS, seed=4)
    kw = dict(no_repeat_ngram_size=2, suppress_tokens=[3, 4, 5], repetition_penalty=1.2)
    ids = session.generate(src.numpy(), max_new_tokens=MAX_NEW, do_sample=True, seed=3, num_return_sequences=5,
                           temperature=1.5, **kw)
    for row in ids:
        row = [session.start_id] + [int(i) for i in row if i != session.pad_id]
        assert not {3, 4, 5} & set(row)
        pairs = list(zip(row, row[1:]))
        assert len(pairs) == len(set(pairs)), row
    greedy = session.generate(src.numpy(), max_new_tokens=MAX_NEW, **kw)
    np.testing.assert_array_equal(
        session.generate(src.numpy(), max_new_tokens=MAX_NEW, do_sample=True, top_k=1, seed=1, **kw), greedy)


@pytest.mark.parametrize("beams", [1, 3])
@pytest.mark.parametrize("prefix_len", [0, 1, 4, 12])
def test_target_prefix_equals_transformers_decoder_input_ids(marians, beams, prefix_len):
    """Prefixes of length 0, 1, 4 and 12 (longer than some rows' own output): the ids begin with
    the prefix and continue as transformers' generate(decoder_input_ids=[start] + prefix)."""
    _, model, bundle = marians["gelu-unscaled"]
    session = xform.load(bundle, backend="ort")
    src, mask = sources(model.config, LENGTHS, seed=2)
    rng = np.random.default_rng(prefix_len)
    prefix = rng.integers(2, 40, (len(LENGTHS), prefix_len)).tolist()
    start = torch.full((len(LENGTHS), 1), session.start_id)
    out = hf_generate(model, src, mask, num_beams=beams, do_sample=False, min_new_tokens=2,
                      decoder_input_ids=torch.cat([start, torch.tensor(prefix, dtype=torch.long).reshape(
                          len(LENGTHS), prefix_len)], 1))
    got, scores = session.generate(src.numpy(), max_new_tokens=MAX_NEW, num_beams=beams, min_new_tokens=2,
                                   target_prefix=prefix, return_scores=True)
    want = out.sequences[:, 1:].numpy()
    np.testing.assert_array_equal(got, want)
    assert all(list(row[:prefix_len]) == p for row, p in zip(got, prefix))
    if beams > 1:
        np.testing.assert_allclose(scores, out.sequences_scores.numpy(), rtol=0, atol=SCORE_ATOL)


@pytest.mark.parametrize("beams", [1, 3])
def test_prefixes_of_different_lengths_in_one_batch(marians, beams):
    """One batch, prefixes of 0, 1, 3 and 6 ids (min_new_tokens counted per row): each row as
    transformers decodes it alone with its prefix."""
    _, model, bundle = marians["relu-separate-vocab"]
    session = xform.load(bundle, backend="ort")
    src, mask = sources(model.config, LENGTHS, seed=8)
    prefix = [[], [7], [12, 5, 30], [3, 3, 9, 14, 21, 8]]
    kw = dict(num_beams=beams, min_new_tokens=3, repetition_penalty=1.4)
    got, scores = session.generate(src.numpy(), max_new_tokens=MAX_NEW, target_prefix=prefix, return_scores=True,
                                   **kw)
    for i, p in enumerate(prefix):
        n = int(mask[i].sum())
        dec = torch.tensor([[session.start_id] + p])
        out = hf_generate(model, src[i:i + 1, :n], mask[i:i + 1, :n], do_sample=False, decoder_input_ids=dec, **kw)
        want = out.sequences[0, 1:].numpy()
        np.testing.assert_array_equal(got[i, :len(want)], want)
        assert (got[i, len(want):] == session.pad_id).all()
        if beams > 1:
            assert scores[i] == pytest.approx(float(out.sequences_scores[0]), abs=SCORE_ATOL)


@pytest.mark.parametrize("beams", [1, 4])
def test_token_scores_equal_transformers_transition_scores(marians, beams):
    _, model, bundle = marians["swish-scaled"]
    session = xform.load(bundle, backend="ort")
    src, mask = sources(model.config, LENGTHS, seed=6)
    kw = dict(num_beams=beams, num_return_sequences=min(beams, 2), repetition_penalty=1.1)
    out = hf_generate(model, src, mask, do_sample=False, **kw)
    want = model.compute_transition_scores(out.sequences, out.scores, getattr(out, "beam_indices", None),
                                           normalize_logits=beams == 1).numpy()
    ids, scores, tokens = session.generate(src.numpy(), max_new_tokens=MAX_NEW, return_token_scores=True, **kw)
    valid = ids != session.pad_id
    np.testing.assert_allclose(tokens[valid], want[:, :ids.shape[1]][valid], rtol=0, atol=SCORE_ATOL)
    assert (tokens[~valid] == 0).all()
    if beams == 1:
        np.testing.assert_allclose(scores, tokens.sum(1), rtol=0, atol=1e-5)
    else:  # the sequence score is the tokens' sum over the length penalty (1.0 here)
        np.testing.assert_allclose(scores, tokens.sum(1) / valid.sum(1), rtol=0, atol=1e-5)


def test_alternatives_are_the_best_first_tokens_continued_greedily(marians):
    _, model, bundle = marians["gelu-unscaled"]
    session = xform.load(bundle, backend="ort")
    src, _ = sources(model.config, LENGTHS, seed=5)
    prefix = [[4, 9], [], [17], [8, 8, 2]]
    n = 3
    alts, scores, tokens = session.generate(src.numpy(), max_new_tokens=MAX_NEW, target_prefix=prefix,
                                            return_alternatives=True, num_return_sequences=n,
                                            return_token_scores=True)
    assert alts.shape[0] == len(LENGTHS) * n
    _, logits = session.teacher_forced(src.numpy(), None, np.array([p + [0] * (4 - len(p)) for p in prefix]))
    for i, p in enumerate(prefix):
        lg = logits[i, len(p)].astype(np.float64)
        lg[session.pad_id] = -np.inf
        best = np.argsort(-lg, kind="stable")[:n]
        for j in range(n):
            row = alts[i * n + j]
            assert list(row[:len(p)]) == p and row[len(p)] == best[j]
            alone = session.generate(src.numpy()[i:i + 1], max_new_tokens=MAX_NEW, target_prefix=[p + [int(best[j])]])
            # the alternative continues greedily: as a decode with the alternative in its prefix
            np.testing.assert_array_equal(row[:alone.shape[1]], alone[0][:len(row)])
        # alternatives come best first
        firsts = tokens[i * n:(i + 1) * n, len(p)]
        assert (np.diff(firsts) <= 0).all()


@pytest.mark.parametrize("settings, fragment", [
    (dict(repetition_penalty=0.0), r"repetition_penalty must be a number > 0"),
    (dict(repetition_penalty=-1.5), r"repetition_penalty must be a number > 0"),
    (dict(no_repeat_ngram_size=-1), r"no_repeat_ngram_size must be an integer >= 0"),
    (dict(bad_words_ids=[[3], []]), r"bad_words_ids must be a list of id sequences"),
    (dict(bad_words_ids=[[3, 999]]), r"bad_words_ids: ids \[999\] are outside the target vocab"),
    (dict(suppress_tokens=[-2]), r"suppress_tokens must be a list of ids"),
    (dict(suppress_tokens=[400]), r"suppress_tokens: ids \[400\] are outside"),
    (dict(target_prefix=[[1], [999], [], []]), r"target_prefix\[1\]: id 999 is outside the target vocabulary"),
    (dict(target_prefix=[[1]]), r"target_prefix has 1 entries for 4 sources"),
    (dict(target_prefix=[[1] * 64, [], [], []]), r"target_prefix of 64 tokens leaves no room in the model's max_len"),
    (dict(return_alternatives=True, num_return_sequences=2, num_beams=2), r"continues each alternative greedily"),
])
def test_bad_settings_are_refused_by_name(marians, settings, fragment):
    _, model, bundle = marians["swish-scaled"]
    src, _ = sources(model.config, LENGTHS, seed=1)
    with pytest.raises(InputError, match=fragment):
        xform.load(bundle, backend="ort").generate(src.numpy(), max_new_tokens=MAX_NEW, **settings)


@pytest.mark.parametrize("backend", ["ort", "torch"])
def test_controls_on_every_cpu_backend(marians, backend):
    _, model, bundle = marians["relu-separate-vocab"]
    src, mask = sources(model.config, LENGTHS, seed=3)
    kw = dict(num_beams=3, repetition_penalty=1.5, no_repeat_ngram_size=2)
    out = hf_generate(model, src, mask, do_sample=False, **kw)
    got = xform.load(bundle, backend=backend).generate(src.numpy(), max_new_tokens=MAX_NEW, target_prefix=None, **kw)
    np.testing.assert_array_equal(got, out.sequences[:, 1:].numpy())


def test_a_long_prefix_leaves_what_remains_of_the_position_table(marians):
    _, model, bundle = marians["swish-scaled"]
    session = xform.load(bundle, backend="ort")
    src, _ = sources(model.config, LENGTHS, seed=1)
    prefix = [[7] * 60, [], [3], []]
    got = session.generate(src.numpy(), max_new_tokens=MAX_NEW, target_prefix=prefix, min_new_tokens=8)
    assert got.shape[1] <= session.config.max_len and list(got[0, :60]) == [7] * 60
    assert (got[0, 60:] != session.pad_id).sum() == 4  # min_new_tokens cut with it: no end-of-sentence before
