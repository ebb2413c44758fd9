import pytest

from tests.variants import TINY, VARIANTS, variant_config
from xform.config import TransformerConfig, preset
from xform.errors import ConfigError


def test_every_seed_variant_is_a_valid_config():
    for name in VARIANTS:
        cfg = variant_config(name)
        assert TransformerConfig.from_dict(cfg.to_dict()) == cfg


def test_config_is_frozen():
    cfg = variant_config("seed-000")
    with pytest.raises(Exception):
        cfg.d_model = 64


def test_all_problems_reported_at_once():
    with pytest.raises(ConfigError) as e:
        TransformerConfig(**{**TINY, "d_model": 50, "activation": "tanh", "norm_position": "middle",
                             "pad_id": 99})
    msg = str(e.value)
    for part in ("divisible by n_heads", "activation", "norm_position", "pad_id is 99"):
        assert part in msg


@pytest.mark.parametrize("change, fragment", [
    (dict(share_embeddings=True), "share_embeddings needs"),
    (dict(eos_id=0), "eos_id and pad_id must differ"),
    (dict(positions="rotary"), "positions must be one of"),
    (dict(layer_norm_eps=0.0), "layer_norm_eps"),
    (dict(n_decoder_layers=0), r"n_decoder_layers is 0, expected an integer in \[1, 1024\]"),
])
def test_invalid_configs(change, fragment):
    with pytest.raises(ConfigError, match=fragment):
        TransformerConfig(**{**TINY, **change})


def test_from_dict_rejects_unknown_and_missing_keys():
    with pytest.raises(ConfigError, match="unknown TransformerConfig keys"):
        TransformerConfig.from_dict({**TINY, "n_layers": 2})
    with pytest.raises(ConfigError, match="tgt_vocab_size"):
        TransformerConfig.from_dict({"src_vocab_size": 10})


def test_presets_by_exact_name():
    assert preset("tiny").d_model == 48
    with pytest.raises(ConfigError, match="unknown preset"):
        preset("Tiny")


def test_config_needs_no_torch():
    import subprocess
    import sys
    code = "import sys; from xform.config import TransformerConfig; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
