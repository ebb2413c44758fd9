"""The Python API: `xform.load` makes a Session on a backend; `xform.check` compares it with eager.

Backends are imported when asked for: `ort` needs onnxruntime only, `torch` needs torch and the
model (the reference), `trt` needs TensorRT and a GPU.
"""
from __future__ import annotations

from pathlib import Path

from xform.runtime.open import BACKENDS, DEVICES, default_device, open_session
from xform.runtime.session import Session

__all__ = ["BACKENDS", "DEVICES", "default_device", "load", "check"]


def torch_backend(bundle, device: str, threads: int | None):
    from xform.models.backend import TorchBackend
    return TorchBackend.for_bundle(bundle, device, threads)


def load(bundle_dir: str | Path, backend: str = "ort", device: str | None = None,
         threads: int | None = None, cache_capacity: int | None = None) -> Session:
    """device: cpu or cuda; by default cpu for torch and ort, cuda for trt. `cache_capacity`:
    the positions the graph backends' self-attention cache starts with (doubled when full;
    default backend.INITIAL_CAPACITY)."""
    return open_session(bundle_dir, backend, device, threads, torch_factory=torch_backend,
                        cache_capacity=cache_capacity)


def check(bundle_dir: str | Path, backend: str = "ort", device: str | None = None, **kw):
    """xform.exporter.check.check: the backend against eager PyTorch (a CheckReport)."""
    from xform.exporter.check import check as run_check
    return run_check(bundle_dir, backend, device, **kw)
