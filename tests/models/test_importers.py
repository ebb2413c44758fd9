"""Recognising a state dict's layout, finding a user's own modules, and every refusal naming what
it could not place."""
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from tests import seed_modules as sm
from tests import torch_nn_modules as tn
from tests.conftest import make_model
from xform.cli import main
from xform.errors import CheckpointError, ConfigError
from xform.models.backend import TorchBackend
from xform.models.checkpoint import canonical_state
from xform.models.importers import detect_arch, resolve_model
from xform.runtime.session import Session

NN = dict(n_heads=3, bos_id=2, eos_id=3)
MODULES = {
    "seed-000": lambda: sm.Transformer000(37, 41, 0, 48, 2, 3, 72),
    "seed-001": lambda: sm.Transformer001(37, 41, 48, 3, 72, 2),
    "seed-002": lambda: sm.Transformer002(37, 41, 48, 3, 2, 3, 72),
    "seed-003": lambda: sm.Transformer003(37, 41, 48, 12, 3, 72, 2, 3),
    "seed-004": lambda: sm.Transformer004(sm.Config004(37, 64, 2, 3, 48)),
    "torch-nn-transformer": lambda: tn.Seq2SeqTransformer(2, 3, 48, 3, 37, 41, 72, 0.0),
}


def tutorial(seed=0, **kw):
    torch.manual_seed(seed)
    return tn.Seq2SeqTransformer(2, 3, 48, 3, 37, 41, 72, 0.0, **kw).eval()


class LearnedPositions(nn.Module):
    """A trained position table, as users write instead of the tutorial's sinusoids (batch-first)."""

    def __init__(self, max_len, d):
        super().__init__()
        self.table = nn.Embedding(max_len, d)

    def forward(self, x):
        return x + self.table.weight[: x.shape[1]]


def same_greedy(model, loaded, rows=((5, 9, 11, 30), (7, 8), (20, 21, 22, 23, 24, 25))):
    """The imported model (torch backend, batched and padded) decodes as the tutorial's loop."""
    src = np.full((len(rows), max(map(len, rows))), 1, np.int64)
    for i, r in enumerate(rows):
        src[i, :len(r)] = r
    got = Session(TorchBackend(loaded.model), loaded.model.cfg).generate(src, max_new_tokens=6)
    for i, r in enumerate(rows):
        want, _ = tn.tutorial_greedy(model, list(r), 2, 3, 1, 6)
        assert got[i, :len(want)].tolist() == want


@pytest.mark.parametrize("arch", sorted(MODULES))
def test_each_layout_is_recognised_from_its_keys(arch):
    torch.manual_seed(0)
    assert detect_arch(MODULES[arch]().state_dict(), "m.pt") == arch


def test_unknown_layouts_name_the_keys_they_could_not_place(tmp_path):
    state = {**MODULES["seed-002"]().state_dict(), "adapter.gate.weight": torch.zeros(4, 4)}
    with pytest.raises(CheckpointError, match=r"Closest: seed-002, which cannot place 1 of .*adapter.gate.weight"):
        detect_arch(state, "m.pt")
    with pytest.raises(CheckpointError, match="unsure which model this is: its keys fit seed-000, seed-001, seed-003"):
        detect_arch({"encoder.embedding.weight": torch.zeros(5, 4), "decoder.embedding.weight": torch.zeros(5, 4)}, "m.pt")
    with pytest.raises(CheckpointError, match="empty state dict"):
        detect_arch({}, "m.pt")
    torch.save({k: v for k, v in canonical_state(make_model("seed-002")).items()}, tmp_path / "x.pt")
    with pytest.raises(CheckpointError, match="xform's own parameter names"):
        resolve_model(tmp_path / "x.pt", None, NN)


def test_user_named_modules_are_found_by_shape_and_role_or_named(tmp_path):
    model = tutorial()
    renamed = {k.replace("src_tok_emb", "emb_a").replace("tgt_tok_emb", "emb_b").replace("generator", "to_vocab"): v
               for k, v in model.state_dict().items()}
    torch.save(renamed, tmp_path / "m.pt")
    # the output Linear has a bias: found; the two tables have no src / tgt in their names
    with pytest.raises(CheckpointError, match=r"source and target embedding tables among emb_a.embedding.weight "
                                              r"\(37, 48\), emb_b.embedding.weight \(41, 48\).*--src-embedding KEY"):
        resolve_model(tmp_path / "m.pt", None, NN)
    loaded = resolve_model(tmp_path / "m.pt", None, {**NN, "src_embedding": "emb_a", "tgt_embedding": "emb_b"})
    assert loaded.source["roles"]["generator"] == "to_vocab.weight"
    same_greedy(model, loaded)
    with pytest.raises(CheckpointError, match="--src-embedding 'emb_c' names no tensor"):
        resolve_model(tmp_path / "m.pt", None, {**NN, "src_embedding": "emb_c", "tgt_embedding": "emb_b"})


def test_learned_positions_and_unsaved_sinusoids(tmp_path):
    model = tutorial(1, batch_first=True)
    model.positional_encoding = LearnedPositions(64, 48)
    torch.save(model.state_dict(), tmp_path / "m.pt")
    same_greedy(model, resolve_model(tmp_path / "m.pt", None, NN))
    # a PositionalEncoding that does not save its table
    model = tutorial(2)
    model.positional_encoding._non_persistent_buffers_set.add("pos_embedding")
    torch.save(model.state_dict(), tmp_path / "n.pt")
    with pytest.raises(CheckpointError, match="no position table found.*--positions sinusoidal"):
        resolve_model(tmp_path / "n.pt", None, NN)
    same_greedy(model, resolve_model(tmp_path / "n.pt", None, {**NN, "positions": "sinusoidal"}))


def test_layouts_xform_cannot_express_are_refused_with_the_reason(tmp_path):
    state = tutorial().state_dict()
    torch.save({k: v for k, v in state.items() if not k.startswith("transformer.decoder.norm.")}, tmp_path / "a.pt")
    with pytest.raises(ConfigError, match="only the encoder stack has a final LayerNorm"):
        resolve_model(tmp_path / "a.pt", None, NN)
    s3 = MODULES["seed-003"]().state_dict()
    s3["encoder.blks.block0.addnorm1.ln.weight"] = torch.ones(10, 48)
    torch.save(s3, tmp_path / "b.pt")
    with pytest.raises(ConfigError, match=r"normalizes over \(10, 48\).*normalized_shape must be \[d_model\]"):
        resolve_model(tmp_path / "b.pt", None, dict(n_heads=3, bos_id=1, eos_id=2))
    torch.save(MODULES["seed-003"]().state_dict(), tmp_path / "c.pt")
    with pytest.raises(ConfigError, match="attention width 36 is not divisible by --n-heads 5"):
        resolve_model(tmp_path / "c.pt", None, dict(n_heads=5, bos_id=1, eos_id=2))
    torch.save(MODULES["seed-002"]().state_dict(), tmp_path / "d.pt")
    with pytest.raises(CheckpointError, match="--norm-first only go with --arch torch-nn-transformer; .* a seed-002"):
        resolve_model(tmp_path / "d.pt", None, dict(n_heads=3, bos_id=1, eos_id=2, norm_first=True))


def test_cli_export_says_what_it_recognised_and_assumed(tmp_path):
    torch.save({"model_state_dict": tutorial().state_dict()}, tmp_path / "ckpt.pth")
    r = CliRunner().invoke(main, ["export", str(tmp_path / "ckpt.pth"), "-o", str(tmp_path / "b"), "--n-heads", "3",
                                  "--bos-id", "2", "--eos-id", "3", "--max-len", "32"])
    assert r.exit_code == 0, r.output
    assert "model: torch-nn-transformer state dict, recognised from its keys" in r.output
    assert "assumed (not recorded in the weights): norm_first=False, activation=relu" in r.output
    assert "generator generator.weight" in r.output
    r = CliRunner().invoke(main, ["export", str(tmp_path / "ckpt.pth"), "-o", str(tmp_path / "c")])
    assert r.exit_code == 1 and "pass --n-heads" in r.output and "pass --bos-id" in r.output
    assert not (tmp_path / "c").exists()
    r = CliRunner().invoke(main, ["export", "demo", "-o", str(tmp_path / "d"), "--arch", "auto"])
    assert r.exit_code == 0 and "model: bundled:demo" in r.output
