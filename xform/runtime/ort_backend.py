"""The ONNX Runtime backend: runs the bundle's encoder and decoder graphs on the CPU or CUDA.

Decoding runs through IO binding on the session's device: the encoder's outputs stay OrtValues
bound straight into the decoder, and each step's present K/V (allocated by ONNX Runtime) is bound
as the next step's past, so no K/V byte passes through Python or numpy. Only the next ids (and the
logits when asked) are written to host buffers.
onnxruntime is imported when a backend is made, never at `import xform`; `onnxruntime` and
`onnxruntime-gpu` install the same module, and the CUDA provider exists only in the latter.
"""
from __future__ import annotations

import numpy as np

from xform.contract import DECODER, ENCODER, REORDER, kv_names
from xform.errors import BackendUnavailableError, BundleError, XformError
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
                "Install it with: pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu")
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    raise XformError(f"unknown device {device!r}; expected cpu or cuda")


def session(ort, path, opts, providers):
    """An InferenceSession; a graph ONNX Runtime refuses (corrupt, or external data outside the
    bundle) is a BundleError naming the file."""
    try:
        return ort.InferenceSession(str(path), opts, providers=providers)
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own exception types
        if type(e).__module__.startswith("onnxruntime"):
            raise BundleError(f"{path}: ONNX Runtime refuses it: {e}") from None
        raise


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
        self.ort_device = "cuda" if device == "cuda" else "cpu"
        self.encoder = session(ort, bundle.graph_file(ENCODER), opts, providers)
        self.decoder = session(ort, bundle.graph_file(DECODER), opts, providers)
        spec = bundle.graph_spec(DECODER)
        n = bundle.config["n_decoder_layers"]
        self.past_names = kv_names("past", n)
        self.cross_names = kv_names("cross", n)
        self.present_names = kv_names("present", n)
        first_past = spec.input(self.past_names[0])
        self.kv_dtype = np.dtype(first_past.dtype)
        self.kv_heads, self.head_dim = first_past.shape[1], first_past.shape[3]
        self.vocab = bundle.config["tgt_vocab_size"]
        self.enc_names = [o.name for o in self.encoder.get_outputs()]
        # beam search's cache reorder; bundles exported before beam search have no such graph
        self.reorder = (session(ort, bundle.graph_file(REORDER), opts, providers)
                        if REORDER in bundle.manifest["graphs"] else None)
        self.reordered_names = kv_names("reordered", n)
        self.bundle_path = bundle.path
        self.binding = None

    def start(self, src_ids: np.ndarray, src_lengths: np.ndarray) -> None:
        enc = self.encoder.io_binding()
        enc.bind_cpu_input("src_ids", np.ascontiguousarray(src_ids))
        enc.bind_cpu_input("src_lengths", np.ascontiguousarray(src_lengths))
        for name in self.enc_names:
            enc.bind_output(name, self.ort_device)
        self.encoder.run_with_iobinding(enc)
        B = src_ids.shape[0]
        self.binding = dec = self.decoder.io_binding()
        for name, value in zip(self.enc_names, enc.get_outputs()):
            dec.bind_ortvalue_input(name, value)  # cross K/V and mask, bound once, never copied
        ort = import_onnxruntime()
        empty = ort.OrtValue.ortvalue_from_numpy(
            np.zeros((B, self.kv_heads, 0, self.head_dim), self.kv_dtype), self.ort_device)
        self.past = [empty] * len(self.past_names)  # the first step: a zero-length past
        self.ids = np.empty((B, 1), np.int64)
        self.min_new = np.zeros(1, np.int64)
        self.next_ids = np.empty(B, np.int64)
        self.logits = np.empty((B, self.vocab), np.float32)
        dec.bind_cpu_input("input_ids", self.ids)
        dec.bind_cpu_input("min_new_tokens", self.min_new)

    def host_output(self, name: str, array: np.ndarray) -> None:
        self.binding.bind_output(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)

    def reorder_cache(self, beam_idx: np.ndarray) -> None:
        """Gather every layer's cache by beam_idx where it lives (the reorder graph, IO-bound)."""
        if self.reorder is None:
            raise BundleError(f"{self.bundle_path}: exported before beam search (no reorder graph); re-export it "
                              "with this xform (xform export ... --force) to decode with beams")
        rb = self.reorder.io_binding()
        rb.bind_cpu_input("beam_idx", np.ascontiguousarray(beam_idx, dtype=np.int64))
        for name, value in zip(self.past_names, self.past):
            rb.bind_ortvalue_input(name, value)
        for name in self.reordered_names:
            rb.bind_output(name, self.ort_device)
        self.reorder.run_with_iobinding(rb)
        self.past = rb.get_outputs()

    def step(self, input_ids, min_new_tokens, want_logits=False, beam_idx=None):
        dec = self.binding
        self.ids[:, 0] = input_ids
        self.min_new[0] = min_new_tokens
        if beam_idx is not None:
            self.reorder_cache(beam_idx)
        for name, value in zip(self.past_names, self.past):
            dec.bind_ortvalue_input(name, value)
        for name in self.present_names:
            dec.bind_output(name, self.ort_device)  # allocated by ORT, re-bound as the next past
        self.host_output("next_ids", self.next_ids)
        if want_logits:
            self.host_output("logits", self.logits)
        dec.synchronize_inputs()
        self.decoder.run_with_iobinding(dec)
        dec.synchronize_outputs()
        self.past = dec.get_outputs()[: len(self.present_names)]
        dec.clear_binding_outputs()
        return self.next_ids.copy(), (self.logits.copy() if want_logits else None)
