"""T5 text: token ids equal to transformers' T5Tokenizer (spiece.model) and T5TokenizerFast
(tokenizer.json) without transformers at run time, and MADLAD-400's target language written into
the source as its `<2xx>` token, through the Python API, the CLI and the Triton handler's parsing.

The sentencepiece model is trained here (unigram, T5's ids: pad 0, eos 1, unk 2, no bos), with
MADLAD's language tokens as user-defined pieces where a test needs them; the model is an untrained
tiny T5 of the tokenizer's size (text, not translations, is under test).
"""
import io
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import xform
from tests.test_tokenizer_spec import assert_round_trip
from xform.cli import main
from xform.errors import InputError
from xform.exporter.export import export_bundle
from xform.runtime.text.translator import Translator

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e '.[dev]')")
spm = pytest.importorskip("sentencepiece")

EXTRA_IDS = 3
LANGUAGES = ("<2de>", "<2pt>", "<2zh_Latn>")
CORPUS = [f"{a} {b} {c}" for a in ("the red", "a blue", "one green", "my old", "das alte", "um café") for b in
          ("cat", "dog", "bird", "Haus", "pão") for c in ("sleeps 12", "runs fast", "is here", "eats 3 bread")]
SENTENCES = ["The cat sleeps 12 hours.", "Um café, 3 pães e 1.5 kg de açúcar!", "naïve façade über 2024",
             "日本語 and ☃ snow €5", "  spaced   out  ", "x", "<2pt> the dog runs fast", "eats 3 bread. \u00e9\u0301"]


def write_model(directory, languages=()):
    """A tiny T5 with spiece.model (and the tokenizer files T5Tokenizer saves) in `directory`."""
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=buf, vocab_size=36 + len(languages),
                                   model_type="unigram", character_coverage=0.98, pad_id=0, eos_id=1, unk_id=2,
                                   bos_id=-1, user_defined_symbols=list(languages), minloglevel=2)
    directory.mkdir(parents=True)
    (directory / "spiece.model").write_bytes(buf.getvalue())
    tok = transformers.T5Tokenizer(str(directory / "spiece.model"), extra_ids=EXTRA_IDS, legacy=True)
    tok.save_pretrained(directory)
    cfg = transformers.T5Config(vocab_size=len(tok), d_model=16, d_kv=4, num_heads=2, d_ff=24, num_layers=1,
                                num_decoder_layers=1, relative_attention_num_buckets=8,
                                relative_attention_max_distance=16, decoder_start_token_id=0)
    torch.manual_seed(0)
    transformers.T5ForConditionalGeneration(cfg).save_pretrained(directory)
    return tok


def write_tokenizer_json(spiece, path):
    """A T5 fast tokenizer's file as transformers' converter lays it out (Unigram over the pieces and
    their scores, Metaspace, `$A </s>`), built with `tokenizers` here: the converter itself needs a
    protobuf this environment's sentencepiece cannot load. Its normalizer is left out."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    proc = spm.SentencePieceProcessor(model_file=str(spiece))
    vocab = [(proc.IdToPiece(i), proc.GetScore(i)) for i in range(proc.GetPieceSize())]
    vocab += [(f"<extra_id_{i}>", 0.0) for i in reversed(range(EXTRA_IDS))]
    tok = Tokenizer(models.Unigram(vocab, unk_id=2, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tok.add_special_tokens(["<pad>", "</s>", "<unk>"] + [f"<extra_id_{i}>" for i in range(EXTRA_IDS)])
    tok.save(str(path))


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """name -> (reference tokenizer, bundle): T5 from spiece.model, MADLAD from spiece.model with
    language pieces, and T5 from tokenizer.json alone (the fast tokenizer's file)."""
    root = tmp_path_factory.mktemp("t5text")
    out = {}
    slow = write_model(root / "t5")
    out["t5"] = (slow, export_bundle(root / "t5", root / "t5.bundle").path)
    out["madlad"] = (write_model(root / "madlad", LANGUAGES), None)
    out["madlad"] = (out["madlad"][0], export_bundle(root / "madlad", root / "madlad.bundle").path)
    fast_dir = root / "fast"
    fast_dir.mkdir()
    write_tokenizer_json(root / "t5" / "spiece.model", fast_dir / "tokenizer.json")
    fast = transformers.T5TokenizerFast(tokenizer_file=str(fast_dir / "tokenizer.json"), extra_ids=0)
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        (fast_dir / name).write_bytes((root / "t5" / name).read_bytes())
    out["fast"] = (fast, export_bundle(fast_dir, root / "fast.bundle").path)
    return out


@pytest.mark.parametrize("name", ["t5", "madlad", "fast"])
def test_token_ids_equal_transformers(bundles, name):
    reference, bundle = bundles[name]
    session = xform.load(bundle, backend="ort")
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert json.loads((bundle / "tokenizer.json").read_text())["kind"] == "t5" and manifest["tokenizer"]
    unk = 0
    for text in SENTENCES:
        want = reference(text).input_ids
        assert Translator(session).policy.encode_text(text) == want, text
        unk += want.count(reference.unk_token_id)
        ids = want[:-1] + [5, 7]
        assert session.tokenizer.decode(ids) == reference.decode(ids, skip_special_tokens=True), ids
    assert unk >= 2  # unknown characters were among the sentences


@pytest.mark.parametrize("name", ["t5", "madlad", "fast"])
def test_the_bundles_tokenizer_json_is_its_spec(bundles, name):
    """tokenizer.json as t5.py wrote it before the spec (a dict), read back and written by
    tokenizer_spec: the same bytes; languages only for MADLAD, model or fast as the directory held."""
    reference, bundle = bundles[name]
    slow = name != "fast"  # the fast directory has no tokenizer_config.json: the defaults
    text = {"model": "spiece.model"} if slow else {"fast": "tokenizer.json"}
    assert assert_round_trip(bundle).to_json() == {
        "kind": "t5", "unk_token": "<unk>", "extra_ids": EXTRA_IDS if slow else 100,
        "clean_up_tokenization_spaces": slow and bool(reference.clean_up_tokenization_spaces), **text,
        **({"languages": list(LANGUAGES)} if name == "madlad" else {})}


def test_madlad_target_language_is_the_source_token(bundles):
    reference, bundle = bundles["madlad"]
    session = xform.load(bundle, backend="ort")
    assert session.tokenizer.codes == ["de", "pt", "zh_Latn"]
    text = "the dog runs fast"
    want = reference(f"<2pt> {text}").input_ids
    assert Translator(session).policy.encode_text(text, tgt_lang="pt") == want
    assert Translator(session).policy.encode_text(text, tgt_lang="<2pt>") == want  # the token itself names it too
    assert reference.convert_ids_to_tokens(want).count("<2pt>") == 1
    # translate: the token goes into the source, no first target token is forced
    out = Translator(session).translate([text], max_new_tokens=4, tgt_lang="pt")
    src = np.array([want])
    assert out == [session.tokenizer.decode(session.generate(src, max_new_tokens=4)[0])]
    assert Translator(session).policy.target_language("pt") is None
    with pytest.raises(InputError, match="^tgt_lang 'xx': not a language of this model; known: de, pt, zh_Latn"):
        Translator(session).translate([text], tgt_lang="xx")
    with pytest.raises(InputError, match="takes no source language"):
        Translator(session).translate([text], src_lang="en")


def test_t5_takes_no_language(bundles):
    _, bundle = bundles["t5"]
    session = xform.load(bundle, backend="ort")
    with pytest.raises(InputError, match="^tgt_lang de: this model's tokenizer has no languages"):
        Translator(session).translate(["the cat"], tgt_lang="de")


def test_cli_run_tgt_lang(bundles, tmp_path):
    _, madlad = bundles["madlad"]
    runner = CliRunner()
    ok = runner.invoke(main, ["run", str(madlad), "--text", "the dog runs fast", "--tgt-lang", "de",
                              "--max-new-tokens", "3", "--json", str(tmp_path / "r.json")])
    assert ok.exit_code == 0, ok.output
    bad = runner.invoke(main, ["run", str(madlad), "--text", "the dog", "--tgt-lang", "xx"])
    assert bad.exit_code != 0 and "known: de, pt, zh_Latn" in bad.output
    t5 = runner.invoke(main, ["run", str(bundles["t5"][1]), "--text", "the dog", "--tgt-lang", "de"])
    assert t5.exit_code != 0 and "has no languages" in t5.output


def test_triton_tgt_lang_writes_the_source_token(bundles):
    from xform.serving.handler import parse
    reference, bundle = bundles["madlad"]
    session = xform.load(bundle, backend="ort")
    text = np.array([b"the dog runs fast"], dtype=object)
    job = parse(Translator(session), 0, {"text": text, "tgt_lang": np.array([b"pt"], dtype=object)})
    assert job.rows[0] == reference("<2pt> the dog runs fast").input_ids
    with pytest.raises(InputError, match="known: de, pt, zh_Latn"):
        parse(Translator(session), 0, {"text": text, "tgt_lang": np.array([b"xx"], dtype=object)})


def test_eval_tgt_lang_writes_the_source_token(bundles, tmp_path):
    """`xform eval --tgt-lang` decodes as `run --tgt-lang` does: run's translations as the reference
    score 100 BLEU; those of another language's token do not."""
    import json
    _, madlad = bundles["madlad"]
    texts = ["the dog runs fast", "a cat sleeps", "I love pizza"]
    (tmp_path / "src.txt").write_text("\n".join(texts) + "\n")
    runner = CliRunner()
    for lang in ("de", "pt"):
        r = runner.invoke(main, ["run", str(madlad), "--input-file", str(tmp_path / "src.txt"), "--tgt-lang", lang,
                                 "--max-new-tokens", "6", "--output", str(tmp_path / f"{lang}.txt")])
        assert r.exit_code == 0, r.output
    assert (tmp_path / "de.txt").read_text() != (tmp_path / "pt.txt").read_text()  # the token changes the output
    r = runner.invoke(main, ["eval", str(madlad), "--source", str(tmp_path / "src.txt"), "--reference",
                             str(tmp_path / "de.txt"), "--tgt-lang", "de", "--max-new-tokens", "6",
                             "--json", str(tmp_path / "e.json")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "e.json").read_text())["systems"][0]["chrf"] == 100.0
