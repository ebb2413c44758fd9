"""Fixtures of the documents tests: a small M2M100 (random weights, so each sentence's translation
depends on it; any of its 100 codes into another; max_len 64) and the demo (numbers; one pair)."""
import pytest

pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e '.[dev]')")


@pytest.fixture(scope="session")
def m2m(tmp_path_factory):
    from tests.models.test_multilingual_text import make_model, make_tokenizer
    from xform.exporter.export import export_bundle

    d = tmp_path_factory.mktemp("m2m-documents")
    tok = make_tokenizer("m2m100", d)
    model = make_model("m2m100", len(tok.encoder) + len(tok.lang_token_to_id) + tok.num_madeup_words)
    model.save_pretrained(d / "hf")
    tok.save_pretrained(d / "hf")
    return export_bundle(d / "hf", d / "bundle").path


@pytest.fixture(scope="session")
def text_marian(tmp_path_factory):
    """A text Marian (tests/marian_fixtures.py: its tokenizer knows CORPUS's words), briefly trained
    to reverse its input: each sentence's translation depends on it."""
    from tests.marian_fixtures import text_marian_bundle
    return text_marian_bundle(tmp_path_factory, "documents", 1, 60, d_model=32, encoder_layers=1, decoder_layers=1,
                              encoder_ffn_dim=48, decoder_ffn_dim=48)
