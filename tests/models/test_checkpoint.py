import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import make_model
from xform.errors import CheckpointError
from xform.models.checkpoint import WEIGHTS_FILE, load_checkpoint, save_checkpoint


@pytest.mark.parametrize("variant", ["seed-000", "marian"])
def test_round_trip(tmp_path, variant):
    model = make_model(variant)
    save_checkpoint(model, tmp_path)
    loaded = load_checkpoint(tmp_path)
    assert loaded.cfg == model.cfg
    for (n1, p1), (n2, p2) in zip(model.named_parameters(), loaded.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)
    if variant == "marian":  # shared and tied: stored once, tied again after loading
        assert len(load_file(str(tmp_path / WEIGHTS_FILE))) == len(list(model.named_parameters()))
        assert loaded.lm_head.weight is loaded.src_embed.weight


def test_missing_unexpected_and_misshapen_keys_all_reported(tmp_path):
    save_checkpoint(make_model("seed-002"), tmp_path)
    state = load_file(str(tmp_path / WEIGHTS_FILE))
    del state["encoder_layers.0.ffn.fc1.bias"]
    state["extra.weight"] = torch.zeros(2)
    state["lm_head.weight"] = torch.zeros(5, 48)
    save_file(state, str(tmp_path / WEIGHTS_FILE))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(tmp_path)
    msg = str(e.value)
    assert "missing keys ['encoder_layers.0.ffn.fc1.bias']" in msg
    assert "unexpected keys ['extra.weight']" in msg
    assert "lm_head.weight: expected (41, 48), found (5, 48)" in msg


def test_corrupt_and_missing_files(tmp_path):
    save_checkpoint(make_model("seed-002"), tmp_path)
    (tmp_path / WEIGHTS_FILE).write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{broken")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="missing"):
        load_checkpoint(tmp_path / "nowhere")


def test_saving_is_byte_deterministic_across_processes(tmp_path):
    """The sha256 of a checkpoint is recorded in manifests: identical weights must give identical bytes
    (safetensors orders a multi-key metadata map differently in every process)."""
    import hashlib
    import subprocess
    import sys
    save_checkpoint(make_model("seed-001"), tmp_path / "src")
    digests = set()
    for i in range(3):
        code = (f"from xform.models.checkpoint import load_checkpoint, save_checkpoint; "
                f"save_checkpoint(load_checkpoint({str(tmp_path / 'src')!r}), {str(tmp_path / str(i))!r})")
        subprocess.run([sys.executable, "-c", code], check=True)
        digests.add(hashlib.sha256((tmp_path / str(i) / WEIGHTS_FILE).read_bytes()).hexdigest())
    assert len(digests) == 1
