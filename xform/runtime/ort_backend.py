"""The ONNX Runtime backend: runs the bundle's encoder and decoder graphs on the CPU or CUDA.

onnxruntime is imported when a backend is made, never at `import xform`. `onnxruntime` and
`onnxruntime-gpu` install the same module; the CUDA provider exists only in the latter.
"""
from __future__ import annotations

import numpy as np

from xform.contract import DECODER, ENCODER, kv_names
from xform.errors import BackendUnavailableError, XformError
from xform.runtime.bundle import Bundle


def import_onnxruntime():
    try:
        import onnxruntime
    except ImportError as e:
        raise BackendUnavailableError(f"the ort backend needs onnxruntime: pip install onnxruntime ({e})") from None
    return onnxruntime


def providers_for(device: str) -> list[str]:
    ort = import_onnxruntime()
    available = ort.get_available_providers()
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device == "cuda":
        if "CUDAExecutionProvider" not in available:
            raise BackendUnavailableError(
                f"--device cuda needs onnxruntime-gpu with a CUDA GPU; this onnxruntime offers {available}. "
                "Install it with: pip uninstall -y onnxruntime && pip install onnxruntime-gpu")
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    raise XformError(f"unknown device {device!r}; expected cpu or cuda")


class OrtBackend:
    name = "ort"

    def __init__(self, bundle: Bundle, device: str = "cpu", threads: int | None = None):
        ort = import_onnxruntime()
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
        providers = providers_for(device)
        self.encoder = ort.InferenceSession(str(bundle.graph_file(ENCODER)), opts, providers=providers)
        self.decoder = ort.InferenceSession(str(bundle.graph_file(DECODER)), opts, providers=providers)
        spec = bundle.graph_spec(DECODER)
        n = bundle.config["n_decoder_layers"]
        self.past_names = kv_names("past", n)
        self.cross_names = kv_names("cross", n)
        self.present_names = kv_names("present", n)
        first_past = spec.input(self.past_names[0])
        self.kv_dtype = np.dtype(first_past.dtype)
        self.kv_heads, self.head_dim = first_past.shape[1], first_past.shape[3]
        self.feeds: dict[str, np.ndarray] = {}

    def start(self, src_ids: np.ndarray, src_lengths: np.ndarray) -> None:
        out = self.encoder.run(None, {"src_ids": src_ids, "src_lengths": src_lengths})
        B = src_ids.shape[0]
        empty = np.zeros((B, self.kv_heads, 0, self.head_dim), self.kv_dtype)
        self.feeds = {**dict(zip(self.cross_names, out[:-1])), "src_mask": out[-1],
                      **{n: empty for n in self.past_names}}

    def step(self, input_ids, min_new_tokens, want_logits=False):
        self.feeds["input_ids"] = input_ids.reshape(-1, 1)
        self.feeds["min_new_tokens"] = np.array([min_new_tokens], np.int64)
        names = ["next_ids", *self.present_names] + (["logits"] if want_logits else [])
        out = self.decoder.run(names, self.feeds)
        self.feeds.update(zip(self.past_names, out[1:1 + len(self.present_names)]))
        return out[0], (out[-1] if want_logits else None)
