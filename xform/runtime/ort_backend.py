"""The ONNX Runtime backend: runs the bundle's encoder and decoder graphs on the CPU or CUDA.

Its memory is laid out so that nothing is held twice and no step allocates (measured in
docs/benchmarks.md, "Where Marian-base fp32 memory goes"):

- The self-attention cache is one buffer per layer, key and value, owned here: numpy arrays on
  the CPU, device buffers on CUDA. The decoder graph reads it where it is (bound, never copied)
  and returns only the new token's keys and values, which are written in at the step's position
  (contract.py). Its capacity starts at INITIAL_CAPACITY positions and doubles when full, so a
  short decode attends over a short cache; on the CPU, positions not yet written are zero pages
  that cost no memory. Beam search reorders it in place (CPU) or through the reorder graph (CUDA).
- A weight both graphs hold (a shared embedding table) is mapped once from the bundle and given
  to both sessions (`SessionOptions.add_initializer`), instead of each session paging in its own
  copy (the manifest's `shared_weights`, found at export).
- The previous decode's buffers are released before the next encoder runs.

Everything runs through IO binding: the encoder's outputs stay OrtValues bound straight into the
decoder; the ids, the logits and the new keys and values land in preallocated, bound buffers.
onnxruntime is imported when a backend is made, never at `import xform`; `onnxruntime` and
`onnxruntime-gpu` install the same module, and the CUDA provider exists only in the latter.
"""
from __future__ import annotations

import mmap

import numpy as np

from xform.contract import DECODER, ENCODER, REORDER, kv_names
from xform.errors import BackendUnavailableError, BundleError, XformError
from xform.runtime.backend import INITIAL_CAPACITY
from xform.runtime.bundle import Bundle, drop_cached
from xform.runtime.cuda import copy_rows, cuda_check, import_cudart, zero


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
        ort = self.ort = import_onnxruntime()
        providers = providers_for(device)
        self.ort_device = "cuda" if device == "cuda" else "cpu"
        # weights shared by the graphs: one read-only mapping of the bundle's file, kept alive here
        self.shared = [SharedWeight(ort, bundle, w) for w in bundle.shared_weights()]
        sessions = {}
        for graph in (DECODER, ENCODER, REORDER):  # the decoder first: its prepacking is what pages tables in
            opts = ort.SessionOptions()
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            if threads:
                opts.intra_op_num_threads = threads
                opts.inter_op_num_threads = 1
            for w in self.shared:
                if graph in w.graphs:
                    opts.add_initializer(w.graphs[graph], w.value)
            sessions[graph] = session(ort, bundle.graph_file(graph), opts, providers)
            if graph == DECODER and self.ort_device == "cpu":
                for w in self.shared:
                    w.page_out()
        self.encoder, self.decoder, self.reorder = sessions[ENCODER], sessions[DECODER], sessions[REORDER]
        spec = bundle.graph_spec(DECODER)
        n = bundle.config["n_decoder_layers"]
        self.cache_names, self.new_names = kv_names("cache", n), kv_names("new", n)
        self.reordered_names = kv_names("reordered", n)
        first = spec.input(self.cache_names[0])
        self.kv_dtype = np.dtype(first.dtype)
        self.kv_heads, self.head_dim = first.shape[1], first.shape[3]
        self.vocab = bundle.config["tgt_vocab_size"]
        self.max_len = bundle.config["max_len"]
        self.enc_names = [o.name for o in self.encoder.get_outputs()]
        self.cudart = None
        if self.ort_device == "cuda":
            self.cudart = import_cudart()
        self.binding = self.cache = None

    def start(self, src_ids: np.ndarray, src_lengths: np.ndarray) -> None:
        self.binding = self.cache = None  # the last decode's buffers go before the encoder allocates
        enc = self.encoder.io_binding()
        enc.bind_cpu_input("src_ids", np.ascontiguousarray(src_ids))
        enc.bind_cpu_input("src_lengths", np.ascontiguousarray(src_lengths))
        for name in self.enc_names:
            enc.bind_output(name, self.ort_device)
        self.encoder.run_with_iobinding(enc)
        B = self.B = src_ids.shape[0]
        self.binding = dec = self.decoder.io_binding()
        for name, value in zip(self.enc_names, enc.get_outputs()):
            dec.bind_ortvalue_input(name, value)  # cross K/V and mask, bound once, never copied
        self.ids = np.empty((B, 1), np.int64)
        self.min_new = np.zeros(1, np.int64)
        self.past_len = np.zeros(1, np.int64)
        self.next_ids = np.empty(B, np.int64)
        self.logits = np.empty((B, self.vocab), np.float32)
        dec.bind_cpu_input("input_ids", self.ids)
        dec.bind_cpu_input("min_new_tokens", self.min_new)
        dec.bind_cpu_input("past_len", self.past_len)
        self.host_output("next_ids", self.next_ids)
        self.host_output("logits", self.logits)
        cache_cls = HostCache if self.ort_device == "cpu" else DeviceCache
        self.cache = cache_cls(self, (B, self.kv_heads, INITIAL_CAPACITY, self.head_dim))
        self.cache.bind_new(dec)
        self.cache.bind(dec)
        self.steps = 0

    def host_output(self, name: str, array: np.ndarray) -> None:
        self.binding.bind_output(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)

    def step(self, input_ids, min_new_tokens, want_logits=False, beam_idx=None):
        dec, p = self.binding, self.steps
        if beam_idx is not None:
            self.cache.reorder(np.ascontiguousarray(beam_idx, dtype=np.int64), p)
            self.cache.bind(dec)
        if p == self.cache.capacity:
            self.cache.grow(min(2 * p, max(self.max_len, p + 1)), p)
            self.cache.bind(dec)
        self.ids[:, 0] = input_ids
        self.min_new[0] = min_new_tokens
        self.past_len[0] = p
        dec.synchronize_inputs()
        self.decoder.run_with_iobinding(dec)
        dec.synchronize_outputs()
        self.cache.write(p)
        self.steps += 1
        return self.next_ids.copy(), (self.logits.copy() if want_logits else None)


class HostCache:
    """The cache as numpy arrays (B, H, C, Dh) on the CPU: zeros from the allocator, so positions
    not yet written are pages never made resident; writes and reorders are numpy in place."""

    def __init__(self, backend: OrtBackend, shape: tuple[int, int, int, int]):
        self.backend, self.capacity = backend, shape[2]
        self.keys = backend.cache_names
        self.arrays = [np.zeros(shape, backend.kv_dtype) for _ in self.keys]
        self.new = [np.empty((shape[0], shape[1], 1, shape[3]), backend.kv_dtype) for _ in self.keys]

    def bind(self, binding) -> None:
        for name, a in zip(self.keys, self.arrays):
            binding.bind_input(name, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)

    def bind_new(self, binding) -> None:
        for name, a in zip(self.backend.new_names, self.new):
            binding.bind_output(name, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)

    def write(self, p: int) -> None:
        for a, n in zip(self.arrays, self.new):
            a[:, :, p] = n[:, :, 0]

    def grow(self, capacity: int, p: int) -> None:
        grown = []
        for a in self.arrays:
            g = np.zeros((*a.shape[:2], capacity, a.shape[3]), a.dtype)
            g[:, :, :p] = a[:, :, :p]
            grown.append(g)
        self.arrays, self.capacity = grown, capacity

    def reorder(self, beam_idx: np.ndarray, p: int) -> None:
        for a in self.arrays:
            a[:, :, :p] = a[beam_idx, :, :p]  # only the written positions: the rest stay zero pages


class DeviceCache:
    """The cache as ONNX Runtime device buffers on CUDA: new keys and values are copied in at the
    step's position, and a full cache into a longer one, by strided device copies (xform.runtime.cuda);
    beam search reorders through the reorder graph, which writes a reordered copy."""

    def __init__(self, backend: OrtBackend, shape: tuple[int, int, int, int]):
        self.backend, self.capacity = backend, shape[2]
        self.keys = backend.cache_names
        self.values = [self.zeros(shape) for _ in self.keys]
        self.new = [self.zeros((shape[0], shape[1], 1, shape[3])) for _ in self.keys]

    def zeros(self, shape):
        b = self.backend
        value = b.ort.OrtValue.ortvalue_from_shape_and_type(list(shape), b.kv_dtype, "cuda", 0)
        zero(b.cudart, value.data_ptr(), int(np.prod(shape)) * b.kv_dtype.itemsize, 0, "zeroing the K/V cache")
        return value

    def bind(self, binding) -> None:
        for name, v in zip(self.keys, self.values):
            binding.bind_ortvalue_input(name, v)

    def bind_new(self, binding) -> None:
        for name, v in zip(self.backend.new_names, self.new):
            binding.bind_ortvalue_output(name, v)

    def copy(self, dst, dst_pos: int, dst_len: int, src, src_len: int, positions: int, what: str) -> None:
        b = self.backend
        item = b.head_dim * b.kv_dtype.itemsize  # one position of one row
        copy_rows(b.cudart, dst.data_ptr() + dst_pos * item, dst_len * item, src.data_ptr(), src_len * item,
                  positions * item, b.B * b.kv_heads, 0, what)

    def write(self, p: int) -> None:
        for c, n in zip(self.values, self.new):
            self.copy(c, p, self.capacity, n, 1, 1, f"writing position {p} of the K/V cache")
        self.sync()

    def grow(self, capacity: int, p: int) -> None:
        b = self.backend
        grown = [self.zeros((b.B, b.kv_heads, capacity, b.head_dim)) for _ in self.values]
        for g, c in zip(grown, self.values):
            self.copy(g, 0, capacity, c, self.capacity, p, f"growing the K/V cache to {capacity}")
        self.sync()
        self.values, self.capacity = grown, capacity

    def sync(self) -> None:
        """The copies ran on the default stream; they finish before the next graph reads the cache."""
        cuda_check(self.backend.cudart, self.backend.cudart.cudaStreamSynchronize(0), "cudaStreamSynchronize")

    def reorder(self, beam_idx: np.ndarray, p: int) -> None:
        b = self.backend
        rb = b.reorder.io_binding()
        rb.bind_cpu_input("beam_idx", beam_idx)
        for name, value in zip(self.keys, self.values):
            rb.bind_ortvalue_input(name, value)
        for name in b.reordered_names:
            rb.bind_output(name, "cuda")
        b.reorder.run_with_iobinding(rb)
        self.values = rb.get_outputs()


class SharedWeight:
    """One manifest `shared_weights` entry (validated by Bundle.validate), mapped read-only from
    the bundle's file once for every session that holds it."""

    def __init__(self, ort, bundle: Bundle, entry: dict):
        self.path = bundle.file(entry["file"])
        self.offset, self.nbytes = entry["offset"], entry["nbytes"]
        start = self.offset - self.offset % mmap.ALLOCATIONGRANULARITY
        with open(self.path, "rb") as f:
            self.map = mmap.mmap(f.fileno(), self.offset + self.nbytes - start, access=mmap.ACCESS_READ, offset=start)
        self.array = np.frombuffer(self.map, entry["dtype"], offset=self.offset - start,
                                   count=int(np.prod(entry["shape"]))).reshape(entry["shape"])
        self.value = ort.OrtValue.ortvalue_from_numpy(self.array)  # the sessions read this memory
        self.graphs = entry["graphs"]

    def page_out(self) -> None:
        """Drop the pages that loading made resident (ONNX Runtime reads a table whole to prepack
        the output projection from it) and let lookups page in only the rows they touch: no
        read-ahead, and the file's cached pages of this range evicted so that a fault maps one
        page, not the 16 around it. Linux only; elsewhere the pages simply stay."""
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        self.map.madvise(mmap.MADV_DONTNEED)
        self.map.madvise(mmap.MADV_RANDOM)
        drop_cached(self.path, self.offset, self.nbytes)
