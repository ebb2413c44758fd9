"""Language-aware text for NLLB, mBART-50 and M2M100: token ids equal transformers' own
tokenizers (NllbTokenizer, MBart50Tokenizer, M2M100Tokenizer) on sentences with punctuation,
digits, accents and characters outside the vocabulary, for several language pairs, from small
tokenizer files built here; `run --text --src-lang --tgt-lang` equals transformers' generate
with the target language forced, decoded by the same tokenizer. No torch or transformers at run
time: sentencepiece and the ids the bundle records.
"""
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import xform
from tests.test_tokenizer_spec import assert_round_trip
from xform.cli import main
from xform.exporter.export import export_bundle
from xform.runtime.text.translator import Translator

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e '.[dev]')")
spm = pytest.importorskip("sentencepiece")

CORPUS = ["The quick brown fox jumps over the lazy dog.", "Élodie a mangé 3 pommes, déjà!",
          "Der Hund läuft schnell über die Straße.", "numbers 12345 and 6789; (brackets) & symbols",
          "¿Dónde está la biblioteca?", "naïve café résumé", "ŋ漢字 outside the vocabulary ✓", "  spaced   out  ",
          "UPPER lower MiXeD", "a"]
PAIRS = {"nllb": [("fra_Latn", "eng_Latn"), ("deu_Latn", "spa_Latn"), ("eng_Latn", "fra_Latn")],
         "mbart50": [("fr_XX", "en_XX"), ("de_DE", "es_XX")],
         "m2m100": [("fr", "en"), ("de", "es")]}


def spm_file(path):
    buf = io.BytesIO()
    lines = [s for s in CORPUS[:6]] * 40
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=110,
                                   model_type="bpe", hard_vocab_limit=False, minloglevel=2, character_coverage=0.99)
    path.write_bytes(buf.getvalue())
    return path


def make_tokenizer(kind, d):
    model = spm_file(d / "sp.model")
    if kind == "nllb":
        # as the published NLLB tokenizer_config.json: spaces before punctuation cleaned up on decode
        return transformers.NllbTokenizer(vocab_file=str(model), src_lang="fra_Latn", tgt_lang="eng_Latn",
                                          clean_up_tokenization_spaces=True)
    if kind == "mbart50":
        return transformers.MBart50Tokenizer(vocab_file=str(model), src_lang="fr_XX", tgt_lang="en_XX")
    proc = spm.SentencePieceProcessor(model_file=str(model))
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for i in range(proc.GetPieceSize()):
        vocab.setdefault(proc.IdToPiece(i), len(vocab))
    (d / "vocab.json").write_text(json.dumps(vocab))
    return transformers.M2M100Tokenizer(vocab_file=str(d / "vocab.json"), spm_file=str(model), src_lang="fr",
                                        tgt_lang="en")


def make_model(kind, vocab):
    common = dict(vocab_size=vocab, d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
                  decoder_attention_heads=2, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64,
                  pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, scale_embedding=True)
    if kind == "mbart50":
        model = transformers.MBartForConditionalGeneration(transformers.MBartConfig(**common))
    else:
        model = transformers.M2M100ForConditionalGeneration(transformers.M2M100Config(**common))
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5) if p.dim() > 1 else p.normal_(0, 0.1)
    return model.eval()


def reference_decode(tok, ids):
    """transformers' decode, skipping special tokens. A fresh M2M100Tokenizer does not register its
    language tokens as special (the published models' tokenizer files list them, so their decode
    drops them, as xform does): they are taken out here."""
    langs = set(getattr(tok, "lang_token_to_id", {}).values())
    return tok.decode([i for i in ids if i not in langs], skip_special_tokens=True)


@pytest.fixture(scope="module", params=list(PAIRS))
def exported(request, tmp_path_factory):
    kind = request.param
    d = tmp_path_factory.mktemp(kind)
    tok = make_tokenizer(kind, d)
    # M2M100's vocabulary: its pieces, then 100 language tokens and 8 made-up words (len(tok) omits them)
    vocab = len(tok) if kind != "m2m100" else len(tok.encoder) + len(tok.lang_token_to_id) + tok.num_madeup_words
    model = make_model(kind, vocab)
    model.save_pretrained(d / "hf")
    tok.save_pretrained(d / "hf")
    return kind, tok, model, export_bundle(d / "hf", d / "bundle").path


def test_source_ids_equal_transformers_tokenizer(exported):
    kind, tok, _, bundle = exported
    session = xform.load(bundle)
    for src_lang, _ in PAIRS[kind]:
        tok.src_lang = src_lang
        for text in CORPUS:
            assert Translator(session).policy.encode_text(text, src_lang) == tok(text).input_ids, (kind, src_lang, text)


def test_decoding_equals_transformers_tokenizer(exported):
    kind, tok, _, bundle = exported
    session = xform.load(bundle)
    rng = np.random.default_rng(0)
    special = set(tok.all_special_ids)
    plain = [i for i in range(len(tok)) if i not in special]
    for n in range(30):
        ids = [int(i) for i in rng.choice(plain, int(rng.integers(1, 12)))]
        codes = tok.additional_special_tokens or list(tok.lang_token_to_id)  # M2M100 does not list its own
        lang = tok.convert_tokens_to_ids(codes[n % 5])
        row = [lang] + ids + [2, 1, 1]  # generated: the forced language, text, end-of-sentence, pads
        assert session.tokenizer.decode(np.array(row)) == reference_decode(tok, row), (kind, row)


def test_run_translates_with_the_languages(exported):
    kind, tok, model, bundle = exported
    src_lang, tgt_lang = PAIRS[kind][1]
    texts = CORPUS[:4]
    r = CliRunner().invoke(main, ["run", str(bundle), "--src-lang", src_lang, "--tgt-lang", tgt_lang,
                                  "--max-new-tokens", "10", *[a for t in texts for a in ("--text", t)]])
    assert r.exit_code == 0, r.output
    tok.src_lang = src_lang
    batch = tok(texts, return_tensors="pt", padding=True)
    forced = tok.convert_tokens_to_ids(tok.get_lang_token(tgt_lang) if kind == "m2m100" else tgt_lang)
    out = model.generate(**batch, forced_bos_token_id=forced, max_new_tokens=10, num_beams=1, do_sample=False)
    want = [f"{t}\t{reference_decode(tok, o.tolist())}" for t, o in zip(texts, out)]
    assert r.output.splitlines() == want
    assert len(set(want)) > 1


def test_the_bundles_tokenizer_json_is_its_spec(exported):
    """tokenizer.json as bart_family.py wrote it before the spec (a dict), read back and written by
    tokenizer_spec: the same bytes; its languages and their ids transformers' tokenizer's."""
    kind, tok, _, bundle = exported
    spec = assert_round_trip(bundle)
    assert spec.KIND == "fairseq-spm" and spec.tokenizer_class == type(tok).__name__
    assert spec.vocab == ("vocab.json" if kind == "m2m100" else None) and spec.offset == 1
    assert spec.src_lang == PAIRS[kind][0][0] and spec.source == ("lang", "text", "eos")
    assert {t: spec.special[t] for t in spec.languages} == {t: tok.convert_tokens_to_ids(t) for t in spec.languages}


def test_unknown_languages_are_refused_with_the_known_ones(exported):
    kind, _, _, bundle = exported
    r = CliRunner().invoke(main, ["run", str(bundle), "--src-lang", "xx_Fake", "--text", "hello"])
    assert r.exit_code == 2 and "--src-lang 'xx_Fake': not a language of this model; known:" in r.output, r.output
    r = CliRunner().invoke(main, ["run", str(bundle), "--tgt-lang", "yy", "--text", "hello"])
    assert r.exit_code == 2 and "--tgt-lang 'yy': not a language of this model; known:" in r.output, r.output
    # the known ones as users type them (M2M100's "fr", not its token "__fr__")
    known = " ".join(r.output.split()).split("known: ", 1)[1].split(", ")
    assert {lang for pair in PAIRS[kind] for lang in pair} <= set(known), known
    assert not [k for k in known if k.startswith("__")], known


def test_triton_handler_takes_the_languages_per_request(exported):
    """Requests with different languages in one Triton call: each answered as translate() alone."""
    from xform.serving.handler import execute
    kind, _, _, bundle = exported
    session = xform.load(bundle)
    (s1, t1), (s2, t2) = PAIRS[kind][:2]

    def request(text, src, tgt):
        return {"text": np.array([[text.encode()]], dtype=object), "src_lang": np.array([[src.encode()]], dtype=object),
                "tgt_lang": np.array([[tgt.encode()]], dtype=object), "max_new_tokens": np.array([[8]], np.int32)}

    out = execute(Translator(session), [request(CORPUS[0], s1, t1), request(CORPUS[1], s2, t2), request(CORPUS[2], s1, "zz_Bad")])
    assert out[0]["translation"][0, 0].decode() == Translator(session).translate([CORPUS[0]], 8, src_lang=s1, tgt_lang=t1)[0]
    assert out[1]["translation"][0, 0].decode() == Translator(session).translate([CORPUS[1]], 8, src_lang=s2, tgt_lang=t2)[0]
    assert out[2].startswith("input 'tgt_lang' 'zz_Bad': not a language of this model"), out[2]  # no CLI flag


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    """A BART directory with its byte-level BPE tokenizer (trained here) and random weights."""
    from tokenizers import ByteLevelBPETokenizer
    d = tmp_path_factory.mktemp("bart")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS[:6] * 20, vocab_size=400, show_progress=False,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(str(d))
    tok = transformers.BartTokenizer(vocab_file=str(d / "vocab.json"), merges_file=str(d / "merges.txt"))
    cfg = transformers.BartConfig(vocab_size=len(tok), d_model=32, encoder_layers=1, decoder_layers=2,
                                  encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=48,
                                  decoder_ffn_dim=48, max_position_embeddings=64, forced_bos_token_id=0)
    torch.manual_seed(0)
    model = transformers.BartForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5) if p.dim() > 1 else p.normal_(0, 0.1)
    model.save_pretrained(d / "hf")
    tok.save_pretrained(d / "hf")
    return tok, model, export_bundle(d / "hf", d / "bundle").path


def test_bart_text_equals_transformers(bart):
    tok, model, bundle = bart
    session = xform.load(bundle)
    for text in CORPUS:
        assert Translator(session).policy.encode_text(text) == tok(text).input_ids, text
    rng = np.random.default_rng(1)
    plain = [i for i in range(len(tok)) if i not in tok.all_special_ids]
    for _ in range(30):
        row = [0] + [int(i) for i in rng.choice(plain, int(rng.integers(1, 12)))] + [2, 1]
        assert session.tokenizer.decode(np.array(row)) == tok.decode(row, skip_special_tokens=True), row
    texts = CORPUS[:3]
    r = CliRunner().invoke(main, ["run", str(bundle), "--max-new-tokens", "10", *[a for t in texts for a in ("--text", t)]])
    assert r.exit_code == 0, r.output
    out = model.generate(**tok(texts, return_tensors="pt", padding=True), max_new_tokens=10, num_beams=1, do_sample=False)
    assert r.output.splitlines() == [f"{t}\t{tok.decode(o, skip_special_tokens=True)}" for t, o in zip(texts, out)]
    r = CliRunner().invoke(main, ["run", str(bundle), "--src-lang", "fr", "--text", "x"])
    assert r.exit_code == 2 and "this model's tokenizer has no languages" in r.output, r.output


def test_the_bart_bundles_tokenizer_json_is_its_spec(bart):
    tok, _, bundle = bart
    assert assert_round_trip(bundle).to_json() == {
        "kind": "byte-bpe", "vocab": "vocab.json", "merges": "merges.txt", "add_prefix_space": False,
        "clean_up_tokenization_spaces": bool(tok.clean_up_tokenization_spaces),
        "special": {t: tok.convert_tokens_to_ids(t) for t in ("<s>", "</s>", "<pad>", "<unk>", "<mask>")},
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def test_tgt_lang_and_forced_bos_id_together_are_refused(exported):
    kind, _, _, bundle = exported
    r = CliRunner().invoke(main, ["run", str(bundle), "--tgt-lang", PAIRS[kind][0][1], "--forced-bos-id", "5",
                                  "--text", "x"])
    assert r.exit_code == 2 and "--tgt-lang and --forced-bos-id both name the first token" in r.output, r.output


def test_a_bart_directory_without_tokenizer_class_gets_its_model_types_tokenizer(bart, tmp_path):
    """transformers' AutoTokenizer falls back on the model type; so does export."""
    tok, _, bundle = bart
    src = Path(json.loads((bundle / "manifest.json").read_text())["model"]["source"]["path"])
    d = tmp_path / "hf"
    d.mkdir()
    for f in src.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    del cfg["tokenizer_class"]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    session = xform.load(export_bundle(d, tmp_path / "b").path)
    assert Translator(session).policy.encode_text(CORPUS[1]) == tok(CORPUS[1]).input_ids


def test_cli_score_equals_transformers_loss_with_languages(exported, tmp_path):
    """`xform score --src-lang --tgt-lang`: each pair's log-likelihood as transformers computes it
    on its tokenizer's ids (text_target: the target language first, end-of-sentence last), per
    token with --tokens."""
    kind, tok, model, bundle = exported
    src_lang, tgt_lang = PAIRS[kind][0]
    sources, targets = CORPUS[:4], CORPUS[4:8]
    (tmp_path / "s.txt").write_text("\n".join(sources) + "\n")
    (tmp_path / "t.txt").write_text("\n".join(targets) + "\n")
    r = CliRunner().invoke(main, ["score", str(bundle), "--source", str(tmp_path / "s.txt"), "--target",
                                  str(tmp_path / "t.txt"), "--src-lang", src_lang, "--tgt-lang", tgt_lang,
                                  "--tokens", "--batch-size", "3"])
    assert r.exit_code == 0, r.output
    rows = [line.split("\t") for line in r.output.splitlines()]
    tok.src_lang, tok.tgt_lang = src_lang, tgt_lang
    batch = tok(sources, text_target=targets, return_tensors="pt", padding=True)
    labels = batch["labels"]
    with torch.no_grad():
        lp = torch.log_softmax(model(**batch).logits, -1)
    valid = labels != tok.pad_token_id
    per = torch.where(valid, lp.gather(2, labels.clamp(min=0)[..., None])[..., 0], 0.0)
    np.testing.assert_allclose([float(row[0]) for row in rows], per.sum(1).numpy(), atol=2e-4)
    assert [int(row[2]) for row in rows] == valid.sum(1).tolist()
    for row, want, n in zip(rows, per, valid.sum(1)):
        np.testing.assert_allclose([float(v) for v in row[5].split()], want[:n].numpy(), atol=2e-4)
    r = CliRunner().invoke(main, ["score", str(bundle), "--source", str(tmp_path / "s.txt"), "--target",
                                  str(tmp_path / "t.txt"), "--tgt-lang", "xx_Nope"])
    assert r.exit_code == 2 and "xx_Nope" in r.output


def test_target_prefix_text_follows_the_target_language(exported):
    """translate(target_prefix=text): the language token, then the prefix's pieces, then what
    transformers generates from decoder_input_ids = [start, language, prefix...]."""
    kind, tok, model, bundle = exported
    src_lang, tgt_lang = PAIRS[kind][1]
    session = xform.load(bundle)
    text, prefix = CORPUS[1], "The quick"
    got = session.generate(Translator(session).policy.encode_texts([text], src_lang), max_new_tokens=8,
                           forced_bos_token_id=Translator(session).policy.target_language(tgt_lang),
                           target_prefix=[Translator(session).policy.target_ids(prefix)])
    tok.src_lang = src_lang
    forced = tok.convert_tokens_to_ids(tok.get_lang_token(tgt_lang) if kind == "m2m100" else tgt_lang)
    dec = torch.tensor([[2, forced] + Translator(session).policy.target_ids(prefix)])
    with torch.no_grad():
        want = model.generate(**tok([text], return_tensors="pt"), decoder_input_ids=dec, max_new_tokens=8,
                              num_beams=1, do_sample=False)
    np.testing.assert_array_equal(got[0][:want.shape[1] - 1], want[0, 1:].numpy())
    assert Translator(session).translate([text], max_new_tokens=8, src_lang=src_lang, tgt_lang=tgt_lang,
                             target_prefix=[prefix]) == [session.tokenizer.decode(got[0])]


@pytest.mark.parametrize("field, value, fragment", [
    ("languages", [["en_XX"]], "tokenizer field 'languages' is malformed; expected a list of strings, found [[\"en_XX\"]]"),
    ("unk_token", ["<unk>"], "tokenizer field 'unk_token' is malformed; expected a string, found [\"<unk>\"]"),
    ("languages", ["xx_YY"], "languages must list tokens of special"),
    ("unk_token", "<nope>", "no id for the unknown token '<nope>'"),
])
def test_a_malformed_fairseq_tokenizer_is_refused_by_name(exported, field, value, fragment):
    """Values of the wrong JSON type (lists where strings belong) are refused as the bundle's
    error naming the field (tokenizer_spec.parse), not a TypeError (unhashable) from the lookups
    they feed; values of the right type that do not fit are refused by the tokenizer."""
    from xform.errors import BundleError
    from xform.runtime.text.tokenizers import load_tokenizer
    _, _, _, bundle = exported
    path = bundle / "tokenizer.json"
    data = json.loads(path.read_text())
    if data.get("kind") != "fairseq-spm":
        pytest.skip(f"a {data.get('kind')} tokenizer")
    data[field] = value
    broken = bundle.parent / "broken"
    broken.mkdir(exist_ok=True)
    (broken / "tokenizer").mkdir(exist_ok=True)
    for f in (bundle / "tokenizer").iterdir():
        (broken / "tokenizer" / f.name).write_bytes(f.read_bytes())
    (broken / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match=re.escape(fragment)):
        load_tokenizer(broken / "tokenizer.json", xform.load(bundle).config)


def test_token_lists_carry_their_languages_as_ctranslate2s_do(exported):
    """CTranslate2's token lists for NLLB, mBART-50 and M2M100 (issue 54): the source's language
    token and "</s>" are ids through the vocabulary (tokenizer.convert_ids_to_tokens(tokenizer.encode
    (text)), as CTranslate2's docs write it), the target language is target_prefix's token; the
    hypothesis starts with it and its tokens are transformers' generate with that language forced.
    Read as text, '__de__' was a word and the prefix's language never reached the model."""
    kind, tok, model, bundle = exported
    t = xform.Translator(bundle)
    src_lang, tgt_lang = PAIRS[kind][1]
    tok.src_lang = src_lang
    lang = tok.get_lang_token(tgt_lang) if kind == "m2m100" else tgt_lang
    forced = tok.convert_tokens_to_ids(lang)
    for text in CORPUS[:4]:
        ids = tok(text).input_ids
        pieces = tok.convert_ids_to_tokens(ids)
        assert t.policy.vocabularies.source_ids(pieces, "source") == ids, (kind, pieces)
        got = t.translate_batch([pieces], target_prefix=[[lang]], beam_size=1, max_decoding_length=10)[0]
        out = model.generate(torch.tensor([ids]), forced_bos_token_id=forced, max_new_tokens=10, num_beams=1,
                             do_sample=False, forced_eos_token_id=None)[0].tolist()
        want = [i for i in out[1:] if i != tok.pad_token_id]  # the decoder start left out
        want = want[:want.index(tok.eos_token_id)] if tok.eos_token_id in want else want
        assert got.hypotheses[0] == tok.convert_ids_to_tokens(want), (kind, text)
        assert got.hypotheses[0][0] == lang
