"""Shared fixtures: tiny random models, exported bundles (session-scoped), the one GPU gate."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from tests.variants import variant_config
from xform.models.checkpoint import save_checkpoint
from xform.models.transformer import Seq2SeqTransformer


def has_cuda_gpu() -> tuple[bool, str]:
    """The one hardware gate, asked of the runtime's one GPU probe (xform.runtime.backends.gpu: cuda-bindings,
    else nvidia-smi): (available, reason when not)."""
    from xform.runtime.backends.gpu import gpu_info
    if gpu_info() is None:
        return False, "needs an NVIDIA GPU (none found by cuda-bindings or nvidia-smi)"
    return True, ""


requires_gpu = pytest.mark.skipif(not has_cuda_gpu()[0], reason=has_cuda_gpu()[1] or "gpu")


def require_gpu_stack() -> None:
    """On a machine with a GPU, the TensorRT backend's dependencies must be there: their absence
    fails the test with the install line instead of skipping it (a GPU machine that silently
    skips the GPU tests proves nothing)."""
    import importlib.util

    from xform.runtime.backends.gpu import TRT_INSTALL_HINT, importable_flavors
    missing = [name for name in ("cuda.bindings",) if importlib.util.find_spec("cuda") is None
               or importlib.util.find_spec(name) is None]
    if missing or not importable_flavors():
        pytest.fail(f"this machine has a GPU but not the TensorRT backend's dependencies "
                    f"({', '.join(missing) or 'tensorrt'} missing): {TRT_INSTALL_HINT}")


def has_triton() -> tuple[bool, str]:
    """The one serving gate: a tritonserver (PATH or nvidia-pytriton) and tritonclient."""
    import importlib.util

    if importlib.util.find_spec("tritonclient") is None:
        return False, "needs tritonclient: pip install -e '.[serve]'"
    if shutil.which("tritonserver") is None and importlib.util.find_spec("pytriton") is None:
        return False, "needs tritonserver: pip install --no-deps nvidia-pytriton==0.7.0"
    return True, ""


requires_triton = pytest.mark.skipif(not has_triton()[0], reason=has_triton()[1] or "serve")


def make_model(name: str = "seed-002", seed: int = 0, **overrides) -> Seq2SeqTransformer:
    """A random-init tiny model with non-trivial biases and norms, so every parameter matters."""
    torch.manual_seed(seed)
    model = Seq2SeqTransformer(variant_config(name, **overrides))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def padded_batch(cfg, lengths, seed=0) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded int64 sources: random non-special ids, eos at each row's end."""
    rng = np.random.default_rng(seed)
    S = max(lengths)
    special = {cfg.pad_id, cfg.bos_id, cfg.eos_id}
    allowed = np.array([i for i in range(cfg.src_vocab_size) if i not in special])
    ids = allowed[rng.integers(0, len(allowed), (len(lengths), S))].astype(np.int64)
    for r, n in enumerate(lengths):
        ids[r, n - 1] = cfg.eos_id
        ids[r, n:] = cfg.pad_id
    return ids, np.array(lengths, np.int64)


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "seed-002"
    save_checkpoint(make_model("seed-002"), path)
    return path


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory, checkpoint_dir):
    from xform.exporter.export import export_bundle

    out = tmp_path_factory.mktemp("bundles") / "tiny"
    export_bundle(checkpoint_dir, out)
    return out


@pytest.fixture(scope="session")
def demo_bundle(tmp_path_factory):
    from xform.exporter.export import export_bundle

    out = tmp_path_factory.mktemp("bundles") / "demo"
    export_bundle("demo", out)
    return out


@pytest.fixture(scope="session")
def marians(tmp_path_factory):
    """The trained test Marian models of tests/marian_fixtures.py: name -> (directory, model, bundle)."""
    pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e '.[dev]')")
    from tests.marian_fixtures import CONFIGS, build_marian
    from xform.exporter.export import export_bundle

    out = {}
    for name in CONFIGS:
        d = tmp_path_factory.mktemp("marian") / name
        model = build_marian(d, name, safe=(name != "gelu-unscaled"))  # one as pytorch_model.bin
        out[name] = (d, model, export_bundle(d, tmp_path_factory.mktemp("bundle") / name).path)
    return out


def pytest_configure(config):
    from tests.ray_cluster import configure_session
    configure_session()


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A real Ray cluster of two nodes on this machine for the session (tests/ray_cluster.py);
    skipped with the reason where Ray is not installed."""
    from tests.ray_cluster import running_cluster
    yield from running_cluster(tmp_path_factory)
