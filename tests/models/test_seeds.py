"""State dicts of the seed tutorials' model classes import with greedy parity to their own decoding."""
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import xform
from tests.seed_modules import Transformer000, Transformer001, Transformer002, tutorial_greedy
from xform.cli import main
from xform.errors import CheckpointError, ConfigError
from xform.exporter.export import export_bundle

# distinct sizes: vocab 37 / 41, d_model 48, 3 heads, d_ff 72
SEEDS = {
    "seed-000": (lambda: Transformer000(37, 41, 0, 48, 2, 3, 72), dict(n_heads=3, bos_id=1, eos_id=2)),
    "seed-001": (lambda: Transformer001(37, 41, 48, 3, 72, 2), dict(n_heads=3, bos_id=2, eos_id=3, max_len=64)),
    "seed-002": (lambda: Transformer002(37, 41, 48, 3, 2, 3, 72), dict(n_heads=3, bos_id=1, eos_id=2)),
}
PAD = {"seed-000": 0, "seed-001": 1, "seed-002": 0}


def build(arch, seed=0):
    torch.manual_seed(seed)
    model = SEEDS[arch][0]().eval()
    with torch.no_grad():  # make norms and biases matter, and outputs depend on the input
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.2)
            elif "embedding" in name:
                p.mul_(2.0)
    return model


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = {}
    for arch, (_, hparams) in SEEDS.items():
        d = tmp_path_factory.mktemp(arch)
        model = build(arch)
        torch.save(model.state_dict(), d / "model.pt")
        out[arch] = (model, export_bundle(d / "model.pt", d / "bundle", arch=arch, hparams=hparams).path)
    return out


def rows(arch, lengths, seed):
    rng = np.random.default_rng(seed)
    hp = SEEDS[arch][1]
    special = {PAD[arch], hp["bos_id"], hp["eos_id"]}
    allowed = [i for i in range(37) if i not in special]
    return [list(rng.choice(allowed, n)) for n in lengths]


@pytest.mark.parametrize("arch", sorted(SEEDS))
def test_greedy_parity_with_the_tutorial_module(imported, arch):
    model, bundle = imported[arch]
    hp = SEEDS[arch][1]
    session = xform.load(bundle, backend="ort")
    src_rows = rows(arch, [7, 3, 9, 5, 1], seed=4)
    src = np.full((len(src_rows), 9), PAD[arch], np.int64)
    for i, r in enumerate(src_rows):
        src[i, :len(r)] = r
    got = session.generate(src, max_new_tokens=12)
    tokens = np.full(got.shape, PAD[arch], np.int64)
    max_err = 0.0
    _, ours = session.teacher_forced(src, None, got)
    for i, r in enumerate(src_rows):
        ref, ref_logits = tutorial_greedy(model, [int(x) for x in r], hp["bos_id"], hp["eos_id"], PAD[arch], 12)
        tokens[i, :len(ref)] = ref
        max_err = max(max_err, float(np.abs(ours[i, :len(ref)] - ref_logits.numpy()).max()))
    np.testing.assert_array_equal(got, tokens)
    assert max_err < 1e-4, max_err
    assert len({tuple(t) for t in tokens.tolist()}) > 1, "outputs do not depend on the input"


def test_what_each_seed_maps_to(imported):
    cfgs = {a: json.loads((b / "manifest.json").read_text())["model"]["config"] for a, (_, b) in imported.items()}
    assert cfgs["seed-000"]["attn_bias"] is False and cfgs["seed-000"]["ffn_bias"] is False
    assert cfgs["seed-000"]["output_bias"] and cfgs["seed-000"]["max_len"] == 512
    assert cfgs["seed-001"]["norm_position"] == "pre" and cfgs["seed-001"]["final_norm"] is False
    assert cfgs["seed-001"]["layer_norm_eps"] == 1e-10 and cfgs["seed-001"]["activation"] == "gelu"
    assert cfgs["seed-001"]["pad_id"] == 1 and cfgs["seed-001"]["max_len"] == 64
    assert cfgs["seed-002"]["scale_embedding"] and cfgs["seed-002"]["n_decoder_layers"] == 3
    assert cfgs["seed-002"]["max_len"] == 5000


def test_missing_and_wrong_hyper_parameters_all_reported(tmp_path):
    torch.save(build("seed-002").state_dict(), tmp_path / "m.pt")
    with pytest.raises(ConfigError) as e:
        export_bundle(tmp_path / "m.pt", tmp_path / "b", arch="seed-002", hparams={"d_model": 64})
    msg = str(e.value)
    for fragment in ("pass --n-heads", "pass --bos-id", "pass --eos-id", "d_model is 64 as given, but the weights say 48"):
        assert fragment in msg
    assert not (tmp_path / "b").exists()


def test_wrong_arch_names_the_foreign_parameters(tmp_path):
    torch.save(build("seed-002").state_dict(), tmp_path / "m.pt")
    with pytest.raises(CheckpointError, match="parameters not of a seed-000 model: .*encoder_embedding.weight"):
        export_bundle(tmp_path / "m.pt", tmp_path / "b", arch="seed-000", hparams=SEEDS["seed-000"][1])


@pytest.mark.parametrize("state", [{0: torch.zeros(2)}, {"w": [1.0, 2.0]}], ids=["int-key", "list-value"])
def test_a_state_dict_that_is_not_names_to_tensors_is_refused(tmp_path, state):
    torch.save(state, tmp_path / "m.pt")
    with pytest.raises(CheckpointError, match="expected a dict of parameter names to tensors"):
        export_bundle(tmp_path / "m.pt", tmp_path / "b", arch="seed-002", hparams=SEEDS["seed-002"][1])
    assert not (tmp_path / "b").exists()


def test_training_checkpoint_wrapper_and_cli(tmp_path):
    model = build("seed-000", seed=3)
    torch.save({"epoch": 3, "model_state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}},
               tmp_path / "ckpt.pth")
    r = CliRunner().invoke(main, ["export", str(tmp_path / "ckpt.pth"), "-o", str(tmp_path / "b"), "--arch", "seed-000",
                                  "--n-heads", "3", "--bos-id", "1", "--eos-id", "2", "--n-layers", "2", "--max-len", "40"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["run", str(tmp_path / "b"), "--check"])
    assert r.exit_code == 0 and "check passed" in r.output
    r = CliRunner().invoke(main, ["export", "demo", "-o", str(tmp_path / "c"), "--n-heads", "3"])
    assert r.exit_code == 2 and "only go with a state dict file" in r.output
    r = CliRunner().invoke(main, ["export", str(tmp_path / "ckpt.pth"), "-o", str(tmp_path / "c"), "--arch", "seed-000",
                                  "--n-heads", "3", "--bos-id", "1", "--eos-id", "2", "--n-layers", "4"])
    assert r.exit_code == 1 and "n_encoder_layers is 4 as given, but the weights say 2" in r.output
