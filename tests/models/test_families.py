"""The family table (issue 42 item 4): each Hugging Face model_type is registered once, in
xform/models/families.py; resolve_model reaches a family module only through it (no if-chain of
`is_*_dir` tests), no family module imports another, and a directory's config.json is read once,
by one loader that names the file and what is wrong with it."""
import ast
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from xform.cli import main
from xform.errors import CheckpointError
from xform.models import families
from xform.models.families import FAMILIES, Family, Refused
from xform.models.importers import KNOWN, resolve_model

MODELS = Path(families.__file__).parent
FAMILY_MODULES = ("marian", "bart_family", "t5")


def xform_imports(path: Path) -> set[str]:
    """The xform.models modules a file imports, at the top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            if node.module == "xform.models":
                found |= {f"xform.models.{a.name}" for a in node.names}
    return {n for n in found if n.startswith("xform.models.")}


def test_each_model_type_is_registered_once():
    tree = ast.parse((MODELS / "families.py").read_text())
    call = next(n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "FAMILIES")
    registered = [arg.args[0].value for arg in call.args]  # each record's first argument: its model_type
    assert len(registered) == len(set(registered)), registered
    assert registered == list(FAMILIES)
    assert all(record.model_type == key for key, record in FAMILIES.items())
    assert {"marian", "m2m_100", "mbart", "bart", "t5", "mt5"} == {k for k, r in FAMILIES.items()
                                                                    if isinstance(r, Family)}
    assert {k for k, r in FAMILIES.items() if isinstance(r, Refused)} == {"umt5"}
    with pytest.raises(ValueError, match="model_type 'x' is registered twice"):
        families.table(Refused("x", "one"), Refused("x", "two"))


def test_family_modules_are_reached_only_through_the_table():
    """Only families.py imports a family module; a family module imports no other family module
    (what they share is huggingface.py), nor the table or the resolver above it."""
    modules = {f"xform.models.{m}" for m in FAMILY_MODULES}
    above = modules | {"xform.models.families", "xform.models.importers"}
    for path in sorted(MODELS.parent.rglob("*.py")):
        used = xform_imports(path) & modules
        if path == MODELS / "families.py":
            assert used == modules
        elif path.stem in FAMILY_MODULES:
            assert xform_imports(path) & above == set(), f"{path.name} imports {xform_imports(path) & above}"
        else:
            assert used == set(), f"{path.relative_to(MODELS.parent)} imports {used}: go through families.FAMILIES"


def test_resolve_model_has_no_family_chain():
    """importers.py names no model_type and no family test: the type is looked up in the table."""
    source = (MODELS / "importers.py").read_text()
    strings = {n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert strings & set(FAMILIES) == set()
    assert not re.search(r"\bis_\w+_dir\b", source)
    for module in FAMILY_MODULES:
        assert not re.search(r"^def (is_\w+_dir|load_\w+)\(", (MODELS / f"{module}.py").read_text(), re.M), module


def test_messages_list_what_the_table_imports():
    for record in FAMILIES.values():
        if isinstance(record, Family):
            assert " / ".join(record.names) in KNOWN
    assert "a Hugging Face Marian, M2M100 / NLLB, mBART, BART, T5 / Flan-T5 / MADLAD-400 or mT5 directory" in KNOWN


def write_config(directory: Path, text: str) -> Path:
    directory.mkdir()
    (directory / "config.json").write_text(text)
    return directory


@pytest.mark.parametrize("model_type", ["gpt2", 5, ["marian"]])
def test_an_unknown_model_type_is_refused_with_what_xform_imports(tmp_path, model_type):
    d = write_config(tmp_path / "m", json.dumps({"model_type": model_type}))
    imported = [t for t, r in FAMILIES.items() if isinstance(r, Family)]
    with pytest.raises(CheckpointError) as e:
        resolve_model(d)
    assert str(e.value).startswith(f"{d / 'config.json'}: a Hugging Face config of model_type {model_type!r}; "
                                   "xform imports model_type marian, m2m_100 (M2M100, NLLB), mbart, bart, t5 (T5, "
                                   "Flan-T5, MADLAD-400), mt5 and xform checkpoints")
    assert all(t in str(e.value) for t in imported)


def test_a_refused_model_type_gives_its_reason(tmp_path):
    d = write_config(tmp_path / "m", json.dumps({"model_type": "umt5"}))
    with pytest.raises(CheckpointError, match=re.escape(f"{d / 'config.json'}: model_type 'umt5': UMT5 learns")):
        resolve_model(d)


@pytest.mark.parametrize("text, problem", [
    ('{"model_type": "marian", ', "not valid JSON"),
    ('["model_type", "marian"]', "expected a JSON object, found list"),
    ("", "not valid JSON"),
])
def test_a_corrupt_config_json_is_reported_as_config_json(tmp_path, text, problem):
    d = write_config(tmp_path / "m", text)
    (d / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError) as e:
        resolve_model(d)
    assert str(e.value).startswith(f"{d / 'config.json'}: {problem}"), str(e.value)
    assert "xform checkpoint" not in str(e.value)
    result = CliRunner().invoke(main, ["export", str(d), "-o", str(tmp_path / "out")])
    assert result.exit_code == 1 and f"{d / 'config.json'}: {problem}" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


def test_a_directory_without_config_json_is_told_what_model_is(tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(CheckpointError) as e:
        resolve_model(tmp_path / "m")
    assert str(e.value) == f"{tmp_path / 'm' / 'config.json'}: missing; MODEL is {KNOWN}"


def tiny_models(root: Path) -> dict[str, Path]:
    """One untrained Hugging Face model of each family module, saved by transformers."""
    transformers = pytest.importorskip("transformers", reason="transformers is a test dependency")
    import torch

    torch.manual_seed(0)
    bart_like = dict(vocab_size=47, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                     decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=40,
                     pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    models = {
        "marian": transformers.MarianMTModel(transformers.MarianConfig(**bart_like)),
        "bart": transformers.BartForConditionalGeneration(transformers.BartConfig(**bart_like)),
        "t5": transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=53, d_model=16, d_kv=8, num_heads=2, d_ff=32, num_layers=1, pad_token_id=0, eos_token_id=1,
            decoder_start_token_id=0)),
    }
    for name, model in models.items():
        model.save_pretrained(root / name)
    return {name: root / name for name in models}


def test_config_json_is_read_once_per_import(tmp_path, monkeypatch):
    from xform.models.importers import bundled_path

    directories = {**tiny_models(tmp_path), "xform": bundled_path("demo")}
    reads: list[str] = []
    read_text = Path.read_text

    def counting(self, *args, **kwargs):
        reads.append(self.name)
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting)
    for name, directory in directories.items():
        reads.clear()
        loaded = resolve_model(directory)
        assert reads.count("config.json") == 1, (name, reads)
        assert reads.count("generation_config.json") == (name != "xform"), (name, reads)
        assert loaded.source["kind"] == ("xform-checkpoint" if name == "xform" else f"huggingface-{name}")
