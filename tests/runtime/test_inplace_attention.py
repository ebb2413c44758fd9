"""The premise of the in-place cache measurement (docs/design.md, "The in-place cache (issue 30 item
2)"): ONNX Runtime's GroupQueryAttention over the cache bound as past and present, with seqlens_k
= the rows' positions, is the decoder's self-attention step exactly (rows at their own positions,
a joining row at 0, noise past each row's filled positions), so scripts/bench_inplace_cache.py
compares like with like; and attending one position too many is caught. When a newer
onnxruntime is installed, this and the script are what decide whether to build it."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
bench = pytest.importorskip("bench_inplace_cache")

from xform.config import TransformerConfig  # noqa: E402
from xform.models.layers import Attention  # noqa: E402
from xform.runtime.backends.cache import HostCache  # noqa: E402


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab_size=8, tgt_vocab_size=8, n_encoder_layers=1, n_decoder_layers=1)
    attn = Attention(cfg).eval()
    tmp = tmp_path_factory.mktemp("inplace")
    bench.standard_graph(attn, tmp / "std.onnx")
    bench.fused_graph(attn, tmp / "gqa.onnx", projections=True)
    return bench.session(tmp / "std.onnx"), bench.session(tmp / "gqa.onnx")


def run_inplace(gqa, x, positions, cache):
    """The GQA graph with `cache` (key, value) bound as past and present; returns its output."""
    out = np.empty_like(x)
    b = gqa.io_binding()
    bench.bind(b, "input", "x", x)
    bench.bind(b, "input", "positions", positions)
    for name, a in zip(("cache_key", "cache_value"), cache):
        bench.bind(b, "input", name, a)
    bench.bind(b, "output", "out", out)
    for name, a in zip(("present_key", "present_value"), cache):
        bench.bind(b, "output", name, a)
    gqa.run_with_iobinding(b)
    return out


def test_inplace_equals_the_standard_step_and_its_write(sessions):
    std, gqa = sessions
    rng = np.random.default_rng(0)
    positions = np.array([0, 3, 5, 1], np.int64)  # a row joining at 0 beside rows further on
    x = rng.standard_normal((4, 1, bench.D)).astype(np.float32)
    noise = [rng.standard_normal((4, bench.H, 8, bench.DH)).astype(np.float32) for _ in range(2)]
    host = HostCache(2, noise[0].shape, np.float32)
    host.arrays = [a.copy() for a in noise]  # noise past each row's positions: masked, whatever it holds
    out, new_k, new_v = std.run(None, {"x": x, "positions": positions, "cache_key": noise[0], "cache_value": noise[1]})
    host.new = [new_k, new_v]
    host.write(positions)
    cache = [a.copy() for a in noise]
    np.testing.assert_allclose(run_inplace(gqa, x, positions, cache), out, atol=2e-6)
    for written, expected in zip(cache, host.arrays):  # the new position written, nothing else touched
        np.testing.assert_allclose(written, expected, atol=1e-6)


def test_attending_one_position_too_many_is_caught(sessions):
    std, gqa = sessions
    rng = np.random.default_rng(1)
    positions = np.array([2, 4], np.int64)
    x = rng.standard_normal((2, 1, bench.D)).astype(np.float32)
    noise = [rng.standard_normal((2, bench.H, 8, bench.DH)).astype(np.float32) for _ in range(2)]
    out = std.run(None, {"x": x, "positions": positions, "cache_key": noise[0], "cache_value": noise[1]})[0]
    wrong = run_inplace(gqa, x, positions + 1, [a.copy() for a in noise])  # one noise position attended
    assert np.abs(wrong - out).max() > 1e-2
