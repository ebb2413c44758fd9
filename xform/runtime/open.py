"""A Session over a bundle on a backend: what `xform.load` and a Triton model call.

The runtime's own backends (`ort`: ONNX Runtime, `trt`: TensorRT) are imported when asked for; the
eager `torch` backend lives in xform.models (the runtime never imports torch), so a caller above
both (xform.api, the exporter's check) passes its factory in.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from xform.errors import XformError
from xform.runtime.backends.backend import INITIAL_CAPACITY
from xform.runtime.bundle import Bundle
from xform.runtime.session import Session
from xform.runtime.text.tokenizers import load_tokenizer

BACKENDS = ("torch", "ort", "trt")
DEVICES = ("cpu", "cuda")


def default_device(backend: str) -> str:
    return "cuda" if backend == "trt" else "cpu"


def open_backend(bundle: Bundle, backend: str, device: str | None = None, threads: int | None = None,
                 torch_factory: Callable | None = None, cache_capacity: int | None = None,
                 allow_tf32: bool = False, cuda_graph: bool | None = None):
    """The backend object; `torch_factory(bundle, device, threads)` makes the eager one;
    `cache_capacity` the graph backends' first cache capacity (None: ONNX Runtime on the CPU starts
    greedy rows at 16 and beams at the batch's longest source's (backend.source_capacity), a device
    at INITIAL_CAPACITY);
    `allow_tf32` lets ONNX Runtime on CUDA run fp32 matmuls in TF32 (off: fp32 is fp32);
    `cuda_graph` False runs ONNX Runtime's decoder step on CUDA uncaptured (None: captured as a
    CUDA graph, runtime/backends/cuda_graphs.py)."""
    if cache_capacity is not None and cache_capacity < 1:
        raise XformError(f"cache_capacity must be at least 1, got {cache_capacity}")
    device = device or default_device(backend)
    if device not in DEVICES:
        raise XformError(f"unknown device {device!r}; choose from {DEVICES}")
    if allow_tf32 and backend != "ort":
        raise XformError(f"{{allow_tf32}} is ONNX Runtime's: the {backend} backend " + (
            "fixes TF32 when its engines are built (xform build-engine BUNDLE --tf32)" if backend == "trt"
            else "is the fp32 reference and never uses TF32")).naming("allow_tf32")
    if cuda_graph and backend != "ort":
        raise XformError(f"{{cuda_graph}} is ONNX Runtime's on CUDA; the {backend} backend has none").naming(
            "cuda_graph")
    if backend == "ort":
        from xform.runtime.backends.ort_backend import OrtBackend
        return OrtBackend(bundle, device, threads, initial_capacity=cache_capacity, tf32=allow_tf32,
                          cuda_graph=cuda_graph)
    if backend == "trt":
        from xform.runtime.backends.trt_backend import TrtBackend
        return TrtBackend(bundle, device, initial_capacity=INITIAL_CAPACITY if cache_capacity is None
                          else cache_capacity)
    if backend == "torch" and torch_factory is not None:
        return torch_factory(bundle, device, threads)
    if backend == "torch":
        raise XformError("the torch backend is xform.load's (it imports torch); here: ort or trt")
    raise XformError(f"unknown backend {backend!r}; choose from {BACKENDS}")


def session_over(bundle: Bundle, backend) -> Session:
    """A Session over an opened (already verified) bundle and a backend object."""
    tok = bundle.tokenizer_file
    tokenizer = load_tokenizer(tok, bundle.config) if tok else None
    return Session(backend, bundle.config, tokenizer, bundle)


def open_session(bundle: str | Path | Bundle, backend: str = "ort", device: str | None = None,
                 threads: int | None = None, torch_factory: Callable | None = None,
                 cache_capacity: int | None = None, allow_tf32: bool = False,
                 cuda_graph: bool | None = None) -> Session:
    """Open (and verify) a bundle directory, or take an opened Bundle, and make its Session."""
    if not isinstance(bundle, Bundle):
        bundle = Bundle.open(bundle)
    return session_over(bundle, open_backend(bundle, backend, device, threads, torch_factory, cache_capacity,
                                             allow_tf32, cuda_graph))
