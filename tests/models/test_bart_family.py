"""The BART family (M2M100 / NLLB, mBART, BART) imported from directories transformers itself
saves: tiny models trained briefly on a task whose output depends on the source and on the
target language, which `forced_bos_token_id` picks. Batched, padded decoding on ONNX Runtime
equals transformers' `generate(forced_bos_token_id=...)` token for token (greedy, beams 2 and
4); teacher-forced logits agree within the fp32 tolerance; each mapping, mutated, breaks that.
"""
import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

import xform
from xform.cli import main
from xform.errors import ConfigError
from xform.exporter.export import export_bundle
from xform.models.importers import resolve_model
from xform.runtime.compare import tolerance_for

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e '.[dev]')")

V, PAD, START, EOS = 47, 1, 2, 2  # </s> starts the decoder, as in all three families
LANGS = (4, 5)  # target-language tokens: 4 reverses the source, 5 keeps its order
FIRST = 6  # content ids from here
MAX_NEW = 12
COMMON = dict(vocab_size=V, d_model=48, encoder_layers=2, decoder_layers=3, encoder_attention_heads=3,
              decoder_attention_heads=3, encoder_ffn_dim=72, decoder_ffn_dim=72, max_position_embeddings=40,
              pad_token_id=PAD, bos_token_id=0, eos_token_id=EOS, decoder_start_token_id=START, dropout=0.0,
              attention_dropout=0.0, activation_dropout=0.0, scale_embedding=True, init_std=0.1)
FAMILIES = {
    "m2m_100": ("M2M100Config", "M2M100ForConditionalGeneration", dict(activation_function="relu")),
    "mbart": ("MBartConfig", "MBartForConditionalGeneration", dict(activation_function="gelu")),
    "bart": ("BartConfig", "BartForConditionalGeneration", dict(activation_function="gelu", scale_embedding=False)),
}


def target(src_row, lang):
    mapped = [FIRST + (3 * (s - FIRST) + 1) % (V - FIRST) for s in src_row]
    return [lang] + (mapped[::-1] if lang == LANGS[0] else mapped) + [EOS]


def train(model, steps=400, seed=0):
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        n = int(rng.integers(2, 7))
        src = rng.integers(FIRST, V, (24, n))
        langs = rng.choice(LANGS, 24)
        tgt = np.array([target(list(r), lang) for r, lang in zip(src, langs)])  # lang, y..., eos
        dec_in = np.concatenate([np.full((24, 1), START), tgt[:, :-1]], 1)
        src = np.concatenate([src, np.full((24, 1), EOS)], 1)
        logits = model(input_ids=torch.from_numpy(src), decoder_input_ids=torch.from_numpy(dec_in)).logits
        loss = F.cross_entropy(logits.reshape(-1, V), torch.from_numpy(tgt).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def make(family, seed=0):
    cfg_name, model_name, extra = FAMILIES[family]
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(getattr(transformers, cfg_name)(**{**COMMON, **extra}))
    with torch.no_grad():
        if getattr(model, "final_logits_bias", None) is not None:  # trained models have one; make it matter
            model.final_logits_bias.normal_(0, 0.5)
    return train(model)


def sources(seed=3):
    """A right-padded batch of 4 sources of different lengths, eos-terminated."""
    rng = np.random.default_rng(seed)
    lengths = [6, 3, 5, 2]
    src = np.full((len(lengths), max(lengths) + 1), PAD, np.int64)
    for i, n in enumerate(lengths):
        src[i, :n] = rng.integers(FIRST, V, n)
        src[i, n] = EOS
    return src


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """family -> (transformers model, its directory, fp32 bundle)."""
    out = {}
    for name in FAMILIES:
        d = tmp_path_factory.mktemp(name)
        model = make(name)
        model.save_pretrained(d / "hf")
        out[name] = (model, d / "hf", export_bundle(d / "hf", d / "fp32").path)
    return out


def copy_dir(src, dst):
    shutil.copytree(src, dst)
    return dst


def hf_generate(model, src, **kw):
    """transformers' ids without its decoder start, pad after end-of-sentence, MAX_NEW wide."""
    out = model.generate(torch.from_numpy(src), attention_mask=torch.from_numpy((src != PAD).astype(np.int64)),
                         max_new_tokens=MAX_NEW, do_sample=False, **kw)[:, 1:].numpy()
    full = np.full((out.shape[0], MAX_NEW), PAD, np.int64)
    full[:, :out.shape[1]] = out
    return full


@pytest.mark.parametrize("name", list(FAMILIES))
def test_ort_decoding_equals_transformers_generate(family, name):
    model, _, bundle = family[name]
    session = xform.load(bundle, backend="ort")
    src = sources()
    by_lang = {}
    for lang in LANGS:
        for beams in (1, 2, 4):
            kw = dict(num_beams=beams, forced_bos_token_id=lang, early_stopping=True, length_penalty=1.0)
            want = hf_generate(model, src, **kw)
            got = session.generate(src, max_new_tokens=MAX_NEW, **kw)
            full = np.full_like(want, PAD)
            full[:, :got.shape[1]] = got
            np.testing.assert_array_equal(full, want, err_msg=f"{name} lang {lang} beams {beams}")
            assert (got[:, 0] == lang).all()
        by_lang[lang] = want
    # the task was learned: the language changes the translation, and the source does
    assert (by_lang[LANGS[0]][:, 1:] != by_lang[LANGS[1]][:, 1:]).any(axis=1).sum() >= 3
    assert len({tuple(r) for r in by_lang[LANGS[0]]}) == len(src)
    right = total = 0  # briefly trained: most target tokens right, for both languages
    for lang in LANGS:
        for row, out in zip(src, by_lang[lang]):
            want = target([int(t) for t in row if t not in (PAD, EOS)], lang)
            right += sum(int(a == b) for a, b in zip(out, want))
            total += len(want)
    assert right / total >= 0.6, f"the model did not learn the task ({right} of {total} tokens right)"


def eager_logits(model, src, dec_in):
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy((src != PAD).astype(np.int64)),
                     decoder_input_ids=torch.from_numpy(dec_in)).logits.numpy()


def excess(got, ref, tol, tokens):
    """Worst |got - ref| beyond atol + rtol x the step's scale, over the steps up to and including
    each row's end-of-sentence in `tokens` (after it, transformers' M2M100 gives pads their own
    position): <= 0 passes."""
    ended = np.cumsum(tokens == EOS, axis=1)
    active = (ended == 0) | ((ended == 1) & (tokens == EOS))
    scale = np.abs(ref).max(-1, keepdims=True)
    return float((np.abs(got - ref) - (tol.atol + tol.rtol * scale))[active].max())


def teacher_forced_logits(m, src, dec_in):
    """xform's eager model, teacher-forced: logits after each prefix of dec_in, (B, T, V)."""
    with torch.no_grad():
        s = torch.from_numpy(src)
        logits, _ = m.decode(torch.from_numpy(dec_in), m.encode(s, (s != PAD).sum(1)))
    return logits.numpy()


def teacher_forced(session, src, dec_in):
    _, logits = session.teacher_forced(src, None, dec_in[:, 1:])
    return logits


@pytest.mark.parametrize("name", list(FAMILIES))
def test_teacher_forced_logits_within_fp32_tolerance(family, name):
    model, _, bundle = family[name]
    src = sources()
    dec_in = np.concatenate([np.full((len(src), 1), START), hf_generate(model, src, forced_bos_token_id=LANGS[0])], 1)
    ref = eager_logits(model, src, dec_in)[:, :-1]
    got = teacher_forced(xform.load(bundle, backend="ort"), src, dec_in)
    assert excess(got, ref, tolerance_for("fp32"), dec_in[:, 1:]) <= 0


def mutate_embedding_norm(m):
    m.src_embed_norm = m.tgt_embed_norm = None


def mutate_positions(m):  # positions without the offset: the table as transformers stores it
    with torch.no_grad():
        for pos in (m.src_pos, m.tgt_pos):
            pos.weight.copy_(torch.cat([torch.zeros_like(pos.weight[:2]), pos.weight[:-2]]))


def mutate_output_bias(m):
    m.output_bias = None


MUTATIONS = {
    "m2m_100": {"positions": mutate_positions},
    "mbart": {"embedding norm": mutate_embedding_norm, "positions": mutate_positions,
              "final_logits_bias": mutate_output_bias},
    "bart": {"embedding norm": mutate_embedding_norm, "positions": mutate_positions,
             "final_logits_bias": mutate_output_bias},
}


@pytest.mark.parametrize("name, change", [(n, c) for n, ms in MUTATIONS.items() for c in ms])
def test_a_mutated_mapping_breaks_parity(family, name, change):
    """The imported eager model matches transformers' logits; each mapping, undone, does not."""
    model, path, _ = family[name]
    src = sources()
    dec_in = np.concatenate([np.full((len(src), 1), START), hf_generate(model, src, forced_bos_token_id=LANGS[1])], 1)
    ref = eager_logits(model, src, dec_in)
    ours = resolve_model(path).model.eval()
    tol = tolerance_for("fp32")
    tokens = np.concatenate([dec_in[:, 1:], np.full((len(src), 1), PAD)], 1)  # what each step predicts
    assert excess(teacher_forced_logits(ours, src, dec_in), ref, tol, tokens) <= 0
    MUTATIONS[name][change](ours)
    assert excess(teacher_forced_logits(ours, src, dec_in), ref, tol, tokens) > 0, f"{name}: {change} undone passes"


def test_the_wrong_decoder_start_changes_the_translation(family):
    model, path, bundle = family["mbart"]
    assert json.loads((bundle / "manifest.json").read_text())["model"]["config"]["decoder_start_id"] == START
    src = sources()
    dec_in = np.concatenate([np.full((len(src), 1), START), hf_generate(model, src, forced_bos_token_id=LANGS[0])], 1)
    wrong = dec_in.copy()
    wrong[:, 0] = PAD  # Marian's start
    assert excess(eager_logits(model, src, wrong)[:, :-1], eager_logits(model, src, dec_in)[:, :-1],
                  tolerance_for("fp32"), dec_in[:, 1:]) > 0


@pytest.mark.parametrize("name", ["m2m_100", "bart"])
def test_fp16_and_int8_exports_verify(family, name, tmp_path):
    _, path, _ = family[name]
    for precision in ("fp16", "int8"):
        result = export_bundle(path, tmp_path / precision, precision=precision)
        assert result.manifest.verification["check"]["passed"], precision


def test_cli_export_recognises_the_family_and_records_forced_bos(family, tmp_path):
    model, path, _ = family["m2m_100"]
    gen = json.loads((path / "generation_config.json").read_text())
    gen["forced_bos_token_id"] = LANGS[1]
    copy_dir(path, path.parent / "forced")
    (path.parent / "forced" / "generation_config.json").write_text(json.dumps(gen))
    r = CliRunner().invoke(main, ["export", str(path.parent / "forced"), "-o", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    assert "model: huggingface-m2m_100" in r.output
    session = xform.load(tmp_path / "b")
    assert session.generation_defaults["forced_bos_token_id"] == LANGS[1]
    src = sources()
    got = session.generate(src, max_new_tokens=MAX_NEW)  # the recorded default, as transformers' generate
    want = hf_generate(model, src, forced_bos_token_id=LANGS[1])
    np.testing.assert_array_equal(got, want[:, :got.shape[1]])


def test_generation_settings_xform_cannot_reproduce_are_refused_by_name(family, tmp_path):
    _, path, _ = family["bart"]
    d = copy_dir(path, tmp_path / "groups")
    gen = json.loads((d / "generation_config.json").read_text())
    gen.update(num_beam_groups=2, diversity_penalty=0.5)
    (d / "generation_config.json").write_text(json.dumps(gen))
    with pytest.raises(ConfigError, match=r"num_beam_groups 2: xform does not reproduce it.*\n.*"
                                          r"diversity_penalty 0.5"):
        resolve_model(d)


def test_repetition_controls_of_the_generation_config_are_the_bundles_defaults(family, tmp_path):
    """A config with BART-large-CNN's n-gram blocking, a repetition penalty and a multi-token bad
    word exports, and decodes by default as transformers' generate does with that config."""
    model, path, _ = family["bart"]
    d = copy_dir(path, tmp_path / "ngram")
    gen = json.loads((d / "generation_config.json").read_text())
    gen.update(no_repeat_ngram_size=1, repetition_penalty=1.3, bad_words_ids=[[7, 9]], num_beams=3)
    (d / "generation_config.json").write_text(json.dumps(gen))
    bundle = export_bundle(d, tmp_path / "b").path
    session = xform.load(bundle)
    assert session.generation_defaults["no_repeat_ngram_size"] == 1
    assert session.generation_defaults["bad_words_ids"] == [[7, 9]]
    src = sources()
    got = session.generate(src, max_new_tokens=MAX_NEW)
    want = hf_generate(model, src, no_repeat_ngram_size=1, repetition_penalty=1.3, bad_words_ids=[[7, 9]],
                       num_beams=3)
    np.testing.assert_array_equal(got, want[:, :got.shape[1]])
    free = session.generate(src, max_new_tokens=MAX_NEW, no_repeat_ngram_size=0, repetition_penalty=1.0,
                            bad_words_ids=[])
    assert free.shape != got.shape or (free != got).any()


def test_check_and_sampling_honour_the_forced_token(family):
    """--check compares with eager PyTorch decoding under the same forced token; samples start with it."""
    _, _, bundle = family["mbart"]
    r = CliRunner().invoke(main, ["run", str(bundle), "--check", "--forced-bos-id", str(LANGS[1]), "--num-beams", "2"])
    assert r.exit_code == 0 and "check passed" in r.output, r.output
    session = xform.load(bundle)
    ids = session.generate(sources(), do_sample=True, seed=3, num_return_sequences=3, forced_bos_token_id=LANGS[0])
    assert (ids[:, 0] == LANGS[0]).all()
    with pytest.raises(xform.XformError, match="forced_bos_token_id 99 is outside the target vocabulary of 47"):
        session.generate(sources(), forced_bos_token_id=99)


def test_min_length_becomes_min_new_tokens(family, tmp_path):
    """transformers suppresses end-of-sentence until min_length (counting the decoder start)."""
    model, path, _ = family["bart"]
    d = copy_dir(path, tmp_path / "hf")
    gen = json.loads((d / "generation_config.json").read_text())
    gen["min_length"] = 9
    (d / "generation_config.json").write_text(json.dumps(gen))
    session = xform.load(export_bundle(d, tmp_path / "b").path)
    assert session.generation_defaults["min_new_tokens"] == 8
    src = sources()
    model.generation_config.min_length = 9
    try:
        want = hf_generate(model, src, forced_bos_token_id=LANGS[0])
    finally:
        model.generation_config.min_length = 0
    got = session.generate(src, max_new_tokens=MAX_NEW, forced_bos_token_id=LANGS[0])
    np.testing.assert_array_equal(got, want[:, :got.shape[1]])
    assert (got[:, :8] != EOS).all()
