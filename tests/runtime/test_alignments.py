"""Alignments: a bundle exported --with-attention returns, for each generated token, one decoder
layer's cross-attention averaged over heads; equal to transformers' output_attentions on the same
layer within ATOL (probabilities from logits that differ by under 1e-5). --replace-unknowns copies
the source word of the piece an unknown target token attends to most.
"""
import numpy as np
import pytest
import torch

import xform
from tests.marian_fixtures import sources
from xform.errors import InputError
from xform.exporter.export import export_bundle
from xform.runtime.decoding.request import TextOptions
from xform.runtime.text.translator import Translator

pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e '.[dev]')")
ATOL = 1e-5
MAX_NEW = 12
LENGTHS = [7, 3, 9, 5]


@pytest.fixture(scope="module")
def aligned(marians, tmp_path_factory):
    """name -> (transformers model, {layer: bundle exported with that layer's attention})."""
    out = {}
    for name, layers in (("gelu-unscaled", [-1]), ("swish-scaled", [0, 2])):
        d, model, _ = marians[name]
        root = tmp_path_factory.mktemp(f"aligned-{name}")
        out[name] = model, {layer: export_bundle(d, root / f"layer{layer}", attention_layer=layer).path
                            for layer in layers}
    return out


def hf_attention(model, src, mask, layer, **kw):
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")  # sdpa returns no attention weights
    try:
        with torch.no_grad():
            out = model.generate(src, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, num_beams=1,
                                 output_attentions=True, return_dict_in_generate=True, **kw)
    finally:
        model.set_attn_implementation(before)
    # per step, per layer (batch, heads, 1, src_len): this layer, heads averaged
    att = torch.stack([step[layer][:, :, -1].mean(1) for step in out.cross_attentions], 1)
    return out.sequences[:, 1:].numpy(), att.numpy()


@pytest.mark.parametrize("name, layer", [("gelu-unscaled", -1), ("swish-scaled", 0), ("swish-scaled", 2)])
def test_greedy_attention_equals_transformers_output_attentions(aligned, name, layer):
    model, bundles = aligned[name]
    src, mask = sources(model.config, LENGTHS, seed=4)
    want_ids, want = hf_attention(model, src, mask, layer)
    session = xform.load(bundles[layer], backend="ort")
    ids, att = session.generate(src.numpy(), max_new_tokens=MAX_NEW, return_attention=True)
    np.testing.assert_array_equal(ids, want_ids)
    assert att.shape == (len(LENGTHS), ids.shape[1], src.shape[1])
    valid = ids != session.pad_id
    np.testing.assert_allclose(att[valid], want[:, :ids.shape[1]][valid], rtol=0, atol=ATOL)
    assert (att[~valid] == 0).all()
    np.testing.assert_allclose(att[valid].sum(-1), 1.0, atol=1e-5)  # a distribution over the source
    for i, n in enumerate(LENGTHS):  # nothing on the padding
        assert (att[i, :, n:] == 0).all()


def test_other_layers_attend_otherwise(aligned):
    """The layer choice matters: layer 0 and layer 2 of one model differ (a test that mixed them up fails)."""
    model, bundles = aligned["swish-scaled"]
    src, _ = sources(model.config, LENGTHS, seed=4)
    first = xform.load(bundles[0]).generate(src.numpy(), max_new_tokens=MAX_NEW, return_attention=True)[1]
    last = xform.load(bundles[2]).generate(src.numpy(), max_new_tokens=MAX_NEW, return_attention=True)[1]
    assert np.abs(first - last).max() > 0.05


@pytest.mark.parametrize("backend, settings", [("ort", {}), ("torch", {}),
                                               ("ort", dict(length_penalty=2.0, early_stopping="never"))])
def test_beam_attention_follows_each_hypothesis(aligned, backend, settings):
    """A beam hypothesis' attention is the attention of decoding its own tokens: what a decode
    forced through it as a target prefix returns (every beam reorder applied to the attention too)."""
    model, bundles = aligned["gelu-unscaled"]
    src, _ = sources(model.config, LENGTHS, seed=6)
    session = xform.load(bundles[-1], backend=backend)
    ids, att = session.generate(src.numpy(), max_new_tokens=MAX_NEW, num_beams=4, num_return_sequences=2,
                                return_attention=True, **settings)
    for r, row in enumerate(ids):
        n = int((row != session.pad_id).sum())
        i = r // 2
        forced, f_att = session.generate(src.numpy()[i:i + 1], max_new_tokens=1, target_prefix=[row[:n].tolist()],
                                         return_attention=True)
        np.testing.assert_array_equal(forced[0, :n], row[:n])
        np.testing.assert_allclose(att[r, :n], f_att[0, :n], rtol=0, atol=ATOL)
    # the hypotheses checked include ones greedy decoding never takes (each source's second one at
    # least), so the attention followed beam reorders, not one greedy path
    greedy = session.generate(src.numpy(), max_new_tokens=MAX_NEW)
    width = max(ids.shape[1], greedy.shape[1])
    pad = lambda a: np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=session.pad_id)  # noqa: E731
    assert (pad(ids) != np.repeat(pad(greedy), 2, axis=0)).any(axis=1).sum() >= len(greedy)


def test_default_bundles_have_no_attention_output(marians):
    _, model, bundle = marians["gelu-unscaled"]
    session = xform.load(bundle)
    assert "attention" not in session.bundle.graph_spec("decoder").output_names
    src, _ = sources(model.config, LENGTHS)
    with pytest.raises(InputError, match="xform export MODEL -o BUNDLE --with-attention"):
        session.generate(src.numpy(), return_attention=True)


def test_a_layer_outside_the_decoder_is_refused(marians, tmp_path):
    d, _, _ = marians["gelu-unscaled"]  # one decoder layer
    with pytest.raises(xform.XformError, match="--attention-layer 1: this model has 1 decoder layers"):
        export_bundle(d, tmp_path / "b", attention_layer=1)
    assert not (tmp_path / "b").exists()


def test_replace_unknowns_copies_the_attended_source_word(text_model_aligned):
    """An unknown target token becomes the source word (as written, all its pieces) of the piece it
    attends to most; without the flag it is dropped, as transformers' decode skips <unk>."""
    session = text_model_aligned
    text = "a blue dog zzz runs fast"
    unk = session.tokenizer.target_unk_id
    src = Translator(session).policy.encode_texts([text])
    ids, att = session.generate(src, max_new_tokens=MAX_NEW, target_prefix=[[unk]], return_attention=True)
    pieces = session.tokenizer.source_pieces(text)
    body = [j for j, i in enumerate(src[0]) if i not in (session.eos_id, session.pad_id)]
    j = max(body, key=lambda j: att[0, 0, j])
    start = max(k for k in range(j + 1) if pieces[k].startswith("\u2581"))
    end = min([k for k in range(j + 1, len(pieces)) if pieces[k].startswith("\u2581") or not pieces[k]])
    want = session.tokenizer.decode(ids[0], {0: "".join(pieces[start:end])})
    assert Translator(session).translate([text], target_prefix=[[unk]], replace_unknowns=True) == [want]
    assert want.startswith("".join(pieces[start:end]).replace("\u2581", " ").strip())
    assert Translator(session).translate([text], target_prefix=[[unk]]) == [session.tokenizer.decode(ids[0])] != [want]
    lines = list(Translator(session).translate_lines([(text, None)], session.generation_config(MAX_NEW),
                                         text=TextOptions(replace_unknowns=True)))
    assert lines[0].hypotheses == Translator(session).translate([text], max_new_tokens=MAX_NEW, replace_unknowns=True)


@pytest.mark.parametrize("word", ["dog", "469"])
def test_replace_unknowns_copies_the_whole_word_once_spaced_as_words(text_model_aligned, word):
    """Unknowns aligned to a piece inside a word of several pieces ("\u2581 d o g", "\u2581 469")
    copy the whole word, once for unknowns in a row, after a target's lone "\u2581" piece with one
    space, not two."""
    session = text_model_aligned
    text = "the dog 469 runs"
    src = Translator(session).policy.encode_text(text)
    pieces = session.tokenizer.source_pieces(text)
    starts = [k for k, p in enumerate(pieces) if p.startswith("\u2581")] + [len(pieces) - 1]
    spans = {"".join(pieces[a:b]): (a, b) for a, b in zip(starts, starts[1:])}
    start, end = spans["\u2581" + word]
    assert end - start > 1  # a word of several pieces
    j = end - 1  # its last piece, the one attended to
    vocab = session.tokenizer.target_vocabulary()
    unk = session.tokenizer.target_unk_id
    ids = np.array([vocab["\u2581B"], vocab["\u2581"], unk, unk, session.eos_id])
    attention = np.zeros((1, len(ids), len(src)), np.float32)
    attention[0, :, j] = 1.0
    assert Translator(session).policy.decode_rows(ids[None], 1, [src], [text], attention) == [f"B {word}"]
    # without the source text: the vocabulary's pieces of the same word (an unknown one is <unk>)
    want = "B dog" if word == "dog" else "B <unk>"
    assert Translator(session).policy.decode_rows(ids[None], 1, [src], None, attention) == [want]


@pytest.fixture(scope="module")
def text_model_aligned(tmp_path_factory):
    from tests.marian_fixtures import build_text_marian
    d = tmp_path_factory.mktemp("marian-text-aligned")
    build_text_marian(d, 1, 60, encoder_layers=1, decoder_layers=2, activation_function="relu", scale_embedding=True)
    return xform.load(export_bundle(d, tmp_path_factory.mktemp("bundle") / "t", attention_layer=-1).path)
