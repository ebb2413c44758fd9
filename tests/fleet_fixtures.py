"""Bundles of several families with distinct language pairs, for the many-bundle tests
(tests/runtime/test_fleet_translator.py, tests/serving/test_fleet_*.py), and each bundle's own
Translator to compare with: the demo (numbers to English words, `export --languages num:en`),
random Marians declaring their pair in tokenizer_config.json (their source directory is named
after another pair, so the config is what says it), an M2M100 (any of its codes to another)."""
import json
from pathlib import Path

from click.testing import CliRunner

import xform

# a Marian bundle's name -> (seed, src, tgt); distinct seeds: distinct translations
MARIANS = {"en-de": (5, "en", "de"), "en-fr": (6, "en", "fr"), "de-en": (7, "de", "en"), "fr-de": (8, "fr", "de")}
WORDS = ["the red cat sleeps", "a blue dog runs fast"]
# (src, tgt, texts, the bundle the route takes, how that bundle alone is asked)
PAIRS = [("num", "en", ["40512", "7"], "numbers", {}), ("en", "de", WORDS, "en-de", {}),
         ("en", "fr", WORDS, "en-fr", {}), ("fr", "es", ["le chat", "un chien"], "m2m", {"src_lang": "fr",
                                                                                        "tgt_lang": "es"}),
         ("de", "en", ["der rote Hund", "ein Haus"], "de-en", {}), ("fr", "de", ["le chat", "un chien"], "fr-de", {})]


def random_marian(directory: Path, seed: int, src: str, tgt: str) -> None:
    """A Marian with the test tokenizer and random weights large enough that its translations
    differ from text to text (briefly trained ones say nothing yet), declaring src>tgt in its
    tokenizer_config.json, saved in `directory`."""
    import torch
    from transformers import MarianMTModel

    from tests.marian_fixtures import marian_config, write_tokenizer
    directory.mkdir(parents=True)
    vocab = write_tokenizer(directory)
    torch.manual_seed(seed)
    model = MarianMTModel(marian_config(vocab_size=vocab, encoder_layers=1, decoder_layers=1))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:  # not the sinusoidal positions
                p.normal_(0, 0.25)
    model.save_pretrained(directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "source_lang": src, "target_lang": tgt}))


def export_bundles(root: Path, names: tuple[str, ...]) -> Path:
    """`root`/bundles holding the bundles `names` (numbers, m2m, and MARIANS' names), exported
    from sources written under `root`."""
    from tests.models.test_multilingual_text import make_model, make_tokenizer
    from xform.cli import main
    from xform.exporter.export import export_bundle
    out = root / "bundles"
    for name in names:
        if name == "numbers":
            r = CliRunner().invoke(main, ["export", "demo", "-o", str(out / "numbers"), "--languages", "num:en"])
            assert r.exit_code == 0, r.output
        elif name == "m2m":
            tok = make_tokenizer("m2m100", root)
            size = len(tok.encoder) + len(tok.lang_token_to_id) + tok.num_madeup_words
            make_model("m2m100", size).save_pretrained(root / "m2m")
            tok.save_pretrained(root / "m2m")
            export_bundle(root / "m2m", out / "m2m")
        else:
            seed, src, tgt = MARIANS[name]
            source = root / f"opus-mt-{tgt}-{src}"  # named after the other direction: the config says the pair
            random_marian(source, seed, src, tgt)
            export_bundle(source, out / name)
    return out


def alone(bundles: Path) -> dict:
    """name -> that bundle's own xform.Translator."""
    return {p.name: xform.Translator(p) for p in sorted(bundles.iterdir()) if p.is_dir()}
