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
def text_marian_dir(tmp_path_factory):
    """A text Marian (tests/marian_fixtures.py: its tokenizer knows CORPUS's words) trained to write
    its input in upper case, word for word: each sentence's translation depends on it, and its
    attention follows the words. Its Hugging Face directory."""
    from tests.marian_fixtures import build_upper_marian
    d = tmp_path_factory.mktemp("documents") / "marian"
    d.mkdir()
    build_upper_marian(d)
    return d


@pytest.fixture(scope="session")
def text_marian(text_marian_dir, tmp_path_factory):
    from xform.exporter.export import export_bundle
    return export_bundle(text_marian_dir, tmp_path_factory.mktemp("documents") / "bundle").path


@pytest.fixture(scope="session")
def attention_marian(text_marian_dir, tmp_path_factory):
    """The same model exported --with-attention: its translations come with word alignments."""
    from xform.exporter.export import export_bundle
    return export_bundle(text_marian_dir, tmp_path_factory.mktemp("documents") / "aligned", attention_layer=-1).path
