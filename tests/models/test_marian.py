"""Marian / OPUS-MT: directories made by transformers export and decode exactly as transformers does."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import xform
from tests.marian_fixtures import CONFIGS, build_text_marian, marian_config, sources
from tests.test_tokenizer_spec import assert_round_trip
from xform.errors import CheckpointError, ConfigError
from xform.exporter.export import export_bundle

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e '.[dev]')")


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("lengths", [[7, 3, 5, 9], [4], [8, 8, 2]])
def test_greedy_tokens_identical_to_transformers(marians, name, lengths):
    d, model, bundle = marians[name]
    src, mask = sources(model.config, lengths, seed=len(lengths))
    with torch.no_grad():
        hf = model.generate(src, attention_mask=mask, num_beams=1, do_sample=False, max_new_tokens=12)[:, 1:]
    got = xform.load(bundle, backend="ort").generate(src.numpy(), max_new_tokens=12)
    np.testing.assert_array_equal(got, hf.numpy())
    if len(lengths) > 1:
        assert len({tuple(r) for r in hf.tolist()}) > 1, "outputs do not depend on the input"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_within_fp32_tolerance_of_transformers(marians, name):
    d, model, bundle = marians[name]
    session = xform.load(bundle, backend="ort")
    src, mask = sources(model.config, [9, 4, 6, 2], seed=11)
    tokens = session.generate(src.numpy(), max_new_tokens=10)
    start = torch.full((4, 1), model.config.decoder_start_token_id)
    with torch.no_grad():
        hf = model(input_ids=src, attention_mask=mask,
                   decoder_input_ids=torch.cat([start, torch.from_numpy(tokens[:, :-1])], 1)).logits.numpy()
    _, ours = session.teacher_forced(src.numpy(), None, tokens)
    ended = np.cumsum(tokens == 0, axis=1)
    active = (ended == 0) | ((ended == 1) & (tokens == 0))
    err = np.abs(ours[active] - hf[active]).max()
    assert err < 1e-4, err


def test_manifest_records_the_source(marians):
    d, _, bundle = marians["gelu-unscaled"]
    m = json.loads((bundle / "manifest.json").read_text())
    src = m["model"]["source"]
    assert src["kind"] == "huggingface-marian" and src["weights"] == "pytorch_model.bin"
    cfg = m["model"]["config"]
    assert cfg["activation"] == "gelu" and cfg["scale_embedding"] is False and cfg["positions"] == "sinusoidal_split"
    assert cfg["n_encoder_layers"] == 3 and cfg["n_decoder_layers"] == 1 and cfg["decoder_start_id"] == cfg["pad_id"]


def test_generation_config_defaults_are_recorded_and_used(marians, tmp_path):
    """A model that ships num_beams 4, a length penalty, max_length and forced_eos_token_id decodes
    by default exactly as transformers' generate() does from the same directory."""
    import shutil

    from transformers import MarianMTModel
    d, _, _ = marians["swish-scaled"]
    target = tmp_path / "m"
    shutil.copytree(d, target)
    gen = json.loads((target / "generation_config.json").read_text())
    gen.update(num_beams=4, length_penalty=0.8, max_length=11, forced_eos_token_id=0, early_stopping=True)
    (target / "generation_config.json").write_text(json.dumps(gen))
    bundle = export_bundle(target, tmp_path / "b").path
    m = json.loads((bundle / "manifest.json").read_text())["generation"]
    assert (m["num_beams"], m["length_penalty"], m["max_length"], m["forced_eos"], m["early_stopping"]) == (
        4, 0.8, 11, True, True)
    model = MarianMTModel.from_pretrained(target).eval()
    src, mask = sources(model.config, [9, 4, 12, 6], seed=2)
    with torch.no_grad():
        want = model.generate(src, attention_mask=mask)[:, 1:].numpy()  # its generation_config's defaults
    session = xform.load(bundle, backend="ort")
    np.testing.assert_array_equal(session.generate(src.numpy()), want)
    # forced end-of-sentence at the limit: 4 tokens are too few for these reversals, yet every row ends
    greedy = session.generate(src.numpy(), num_beams=1, max_new_tokens=4)
    assert greedy.shape == (4, 4) and (greedy[:, -1] == 0).all() and (greedy[:, :-1] != 0).all()


def test_refuses_what_it_cannot_express_with_every_reason(tmp_path):
    cfg = marian_config(**CONFIGS["swish-scaled"]).to_dict()
    cfg.update(decoder_attention_heads=2, decoder_ffn_dim=64, activation_function="mish",
               bad_words_ids=[[5, 6]], normalize_before=True)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as e:
        export_bundle(tmp_path / "m", tmp_path / "out")  # -o beside the model: inside it is refused
    msg = str(e.value)
    for fragment in ("decoder_attention_heads (2)", "decoder_ffn_dim (64)", "'mish'", "multi-token", "normalize_before"):
        assert fragment in msg
    assert not (tmp_path / "out").exists()


def test_missing_and_untied_weights_are_named(marians, tmp_path):
    from safetensors.torch import load_file, save_file
    d, _, _ = marians["swish-scaled"]
    state = load_file(str(d / "model.safetensors"))
    del state["model.decoder.layers.2.fc1.bias"]
    state["lm_head.weight"] = state["model.shared.weight"] + 1.0
    target = tmp_path / "m"
    target.mkdir()
    save_file(state, str(target / "model.safetensors"))
    for f in ("config.json", "generation_config.json"):
        (target / f).write_text((d / f).read_text())
    with pytest.raises(CheckpointError) as e:
        export_bundle(target, tmp_path / "out")
    assert "missing model.decoder.layers.2.fc1.bias" in str(e.value)
    assert "lm_head.weight should be tied to model.shared.weight but differs" in str(e.value)


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    from transformers import MarianTokenizer
    d = tmp_path_factory.mktemp("marian-text")
    model = build_text_marian(d, 1, 120, encoder_layers=2, decoder_layers=2, activation_function="swish",
                              scale_embedding=True)
    tok = MarianTokenizer(str(d / "source.spm"), str(d / "target.spm"), str(d / "vocab.json"))
    return d, model, tok, export_bundle(d, tmp_path_factory.mktemp("bundle") / "text").path


TEXTS = ["the red cat sleeps", "a blue dog zzz runs fast", ">>fr<< my old bird is here", "one green cat"]


def test_tokenizer_matches_marian_tokenizer(text_model):
    d, _, tok, bundle = text_model
    session = xform.load(bundle, backend="ort")
    assert [session.tokenizer.encode(t) for t in TEXTS] == tok(TEXTS).input_ids
    ids = [[5, 9, 14, 3, 0, 51, 51], [7, 1, 2, 0]]
    assert [session.tokenizer.decode(r) for r in ids] == tok.batch_decode(ids, skip_special_tokens=True)


def test_the_bundles_tokenizer_json_is_its_spec(text_model):
    """tokenizer.json as the importer wrote it before the spec (a dict in marian.py), read back and
    written by tokenizer_spec: the same bytes."""
    _, _, _, bundle = text_model
    assert assert_round_trip(bundle).to_json() == {
        "kind": "marian-spm", "files": ["source.spm", "target.spm", "vocab.json", "tokenizer_config.json"],
        "separate_vocabs": False, "unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>"}


def test_translate_text_equals_transformers(text_model):
    d, model, tok, bundle = text_model
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        hf = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=16)
    expected = tok.batch_decode(hf, skip_special_tokens=True)
    assert xform.Translator(bundle, backend="ort").translate(TEXTS, max_new_tokens=16) == expected
    assert any(expected)


def test_text_translation_offline_without_transformers(text_model):
    """Text in and out with neither transformers nor torch imported, offline: the same translation
    as transformers' generate and MarianTokenizer give in this process."""
    _, model, tok, bundle = text_model
    code = f"""
import sys, xform
print(xform.Translator({str(bundle)!r}, backend="ort").translate(["the red cat sleeps"], max_new_tokens=8)[0])
assert "transformers" not in sys.modules and "torch" not in sys.modules
"""
    r = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                       env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    with torch.no_grad():
        hf = model.generate(**tok(["the red cat sleeps"], return_tensors="pt"), num_beams=1, do_sample=False,
                            max_new_tokens=8)
    want = tok.batch_decode(hf, skip_special_tokens=True)[0]
    assert r.stdout.splitlines() == [want] and want


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_score_equals_transformers_loss(marians, name):
    """Session.score's per-token log-probabilities are transformers' on the same pairs (labels, its
    loss the mean of their negatives), for given translations: the model's own and reference ones."""
    d, model, bundle = marians[name]
    session = xform.load(bundle, backend="ort")
    src, mask = sources(model.config, [9, 4, 6, 2], seed=5)
    pad = model.config.pad_token_id
    own = session.generate(src.numpy(), max_new_tokens=10)
    rng = np.random.default_rng(0)
    other = own.copy()  # a different translation: some tokens replaced, the end kept
    other[:, 0] = rng.integers(3, min(model.config.vocab_size, 40), len(other))
    for tgt in (own, other):
        got = session.score(src.numpy(), tgt)
        labels = torch.from_numpy(np.where(tgt == pad, -100, tgt))
        with torch.no_grad():
            out = model(input_ids=src, attention_mask=mask, labels=labels)
        lp = torch.log_softmax(out.logits.float(), -1).numpy()
        want = np.where(tgt != pad, np.take_along_axis(lp, tgt[:, :, None], 2)[:, :, 0], 0.0)
        np.testing.assert_allclose(got["tokens"], want, atol=1e-4, rtol=0)
        n = (tgt != pad).sum()
        assert abs(-got["total"].sum() / n - float(out.loss)) < 1e-4
        np.testing.assert_allclose(got["normalized"], got["total"] / got["lengths"], rtol=1e-6)
    assert (session.score(src.numpy(), own)["total"] > session.score(src.numpy(), other)["total"]).mean() >= 0.75


def test_cli_score_equals_transformers_on_text(text_model, tmp_path):
    """`xform score --source --target`: each pair's log-likelihood, as transformers computes it on
    MarianTokenizer's ids (text_target for the reference)."""
    from click.testing import CliRunner

    from xform.cli import main
    d, model, tok, bundle = text_model
    targets = ["the cat", "a dog runs", "my bird", "one green cat"]
    (tmp_path / "s.txt").write_text("\n".join(TEXTS) + "\n")
    (tmp_path / "t.txt").write_text("\n".join(targets) + "\n")
    r = CliRunner().invoke(main, ["score", str(bundle), "--source", str(tmp_path / "s.txt"),
                                  "--target", str(tmp_path / "t.txt"), "--batch-size", "3"])
    assert r.exit_code == 0, r.output
    rows = [line.split("\t") for line in r.output.splitlines()]
    batch = tok(TEXTS, text_target=targets, return_tensors="pt", padding=True)
    labels = batch["labels"]
    with torch.no_grad():
        lp = torch.log_softmax(model(**batch).logits, -1)
    valid = labels != tok.pad_token_id
    want = torch.where(valid, lp.gather(2, labels.clamp(min=0)[..., None])[..., 0], 0.0).sum(1)
    assert [row[3:] for row in rows] == [[s, t] for s, t in zip(TEXTS, targets)]
    np.testing.assert_allclose([float(row[0]) for row in rows], want.numpy(), atol=2e-4)
    assert [int(row[2]) for row in rows] == valid.sum(1).tolist()
    (tmp_path / "short.txt").write_text("x\n")
    r = CliRunner().invoke(main, ["score", str(bundle), "--source", str(tmp_path / "s.txt"),
                                  "--target", str(tmp_path / "short.txt")])
    assert r.exit_code == 1 and "has 4 lines" in r.output and "1: expected one translation a source" in r.output
