"""The TensorRT backend: the bundle's engines on an NVIDIA GPU, through cuda-bindings.

Device buffers are allocated once, at the engines' profile maximum. The encoder writes the cross
K/V (one copy a source, whatever its beams) and the source mask straight into the buffers the
decoder reads. The self-attention cache is runtime/backends/cache.py's DeviceCache, the same object ONNX
Runtime uses on CUDA: the decoder reads it in place and writes only the new token's keys and
values, which one strided device copy puts at the step's position; its capacity starts at
INITIAL_CAPACITY and doubles when full; beam search's reorder and finished rows leaving the batch
are one gather by the reorder engine into the second buffer set. Each step copies the input ids
in (8 bytes a row) and only the next ids out, plus the logits when asked (--check). Every CUDA
and TensorRT status is checked. Works with `tensorrt` and `tensorrt_rtx` alike.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from xform.contract import DECODER, ENCODER, REORDER, Capabilities, GraphSpec, TensorSpec, kv_names
from xform.errors import BackendUnavailableError, BundleError, InputError, JoinRefused, XformError
from xform.manifest import EngineEntry
from xform.runtime.backends.backend import INITIAL_CAPACITY
from xform.runtime.backends.cache import DeviceCache, DeviceRows, compact_sources, grown_capacity
from xform.runtime.backends.cuda import CudaOps, cuda_check, import_cudart
from xform.runtime.backends.gpu import TRT_FLAVORS as FLAVORS
from xform.runtime.backends.gpu import TRT_INSTALL_HINT, gpu_info, importable_flavors
from xform.runtime.bundle import Bundle

log = logging.getLogger(__name__)


def pick_engines(bundle: Bundle, flavor: str, installed: list[str] | tuple[str, ...] = FLAVORS
                 ) -> tuple[str, EngineEntry, EngineEntry, EngineEntry]:
    """The (flavor, encoder, decoder, reorder entries) to run, of a flavour that is installed; the
    engines must come from this ONNX."""
    engines = bundle.manifest.engines
    built = [f for f in FLAVORS if f"{ENCODER}.{f}" in engines and f"{DECODER}.{f}" in engines]
    if flavor != "auto":
        built = [f for f in built if f == flavor]
    if not built:
        raise BundleError(f"{bundle.path}: no TensorRT engines{'' if flavor == 'auto' else ' for ' + flavor}; "
                          f"build them with: xform build-engine {bundle.path}")
    flavors = [f for f in built if f in installed]
    if not flavors:
        raise BackendUnavailableError(f"{bundle.path}: has {' and '.join(built)} engines, but this Python has only "
                                      f"{' and '.join(installed)}: install {built[0]}, or build engines for "
                                      f"{installed[0]} with: xform build-engine {bundle.path} --flavor {installed[0]}")
    chosen = flavors[0]
    enc, dec = engines[f"{ENCODER}.{chosen}"], engines[f"{DECODER}.{chosen}"]
    files = bundle.manifest.files
    if f"{REORDER}.{chosen}" not in engines:
        raise BundleError(f"{bundle.path}: no {chosen} engine for the reorder graph; rebuild with: "
                          f"xform build-engine {bundle.path} --force")
    for entry in (enc, dec, engines[f"{REORDER}.{chosen}"]):
        for name, recorded in ((entry.onnx, entry.onnx_sha256), (f"{entry.onnx}.data", entry.onnx_data_sha256)):
            if recorded != files.get(name):
                have = (files.get(name) or "none")[:16]
                raise BundleError(f"{bundle.path / entry.file}: built from another {name} "
                                  f"(sha256 {(recorded or 'none')[:16]}..., the bundle's is {have}...); "
                                  f"rebuild with: xform build-engine {bundle.path} --force")
    return chosen, enc, dec, engines[f"{REORDER}.{chosen}"]


@dataclass
class DeviceBuffer:
    ptr: int
    nbytes: int


class TrtBackend:
    name = "trt"

    def __init__(self, bundle: Bundle, device: str = "cuda", flavor: str = "auto",
                 initial_capacity: int = INITIAL_CAPACITY):
        self.initial_capacity = initial_capacity  # the cache's positions at a start; doubled when full
        if device != "cuda":
            raise XformError(f"the trt backend runs on an NVIDIA GPU: use {{device}} cuda, not {device!r}").naming(
                "device")
        installed = importable_flavors()
        if not installed:  # the first thing missing, before engines or a GPU
            raise BackendUnavailableError(f"the trt backend needs TensorRT, and none is installed (use {{backend}} "
                                          f"ort, or install it: {TRT_INSTALL_HINT})").naming("backend")
        self.flavor, enc_entry, dec_entry, reorder_entry = pick_engines(bundle, flavor, installed)
        self.tf32 = bool(dec_entry.details.get("tf32"))  # built --tf32: the check judges fp32 as TF32
        if gpu_info() is None:
            raise BackendUnavailableError("the trt backend needs an NVIDIA GPU with a CUDA driver; none was found "
                                          "(use {backend} ort on this machine)").naming("backend")
        import importlib
        self.trt = trt = importlib.import_module(self.flavor)
        self.cudart = cudart = import_cudart()
        self.buffers: list[DeviceBuffer] = []
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        self.enc_spec, self.dec_spec = bundle.graph_spec(ENCODER), bundle.graph_spec(DECODER)
        self.encoder = self.deserialize(bundle, enc_entry, self.enc_spec)
        self.decoder = self.deserialize(bundle, dec_entry, self.dec_spec)
        self.enc_ctx = self.encoder.create_execution_context()
        self.dec_ctx = self.decoder.create_execution_context()
        self.reorder_spec = bundle.graph_spec(REORDER)
        self.reorder = self.deserialize(bundle, reorder_entry, self.reorder_spec)  # gathers rows: beams, compaction
        self.reorder_ctx = self.reorder.create_execution_context()
        if self.enc_ctx is None or self.dec_ctx is None or self.reorder_ctx is None:
            raise XformError("TensorRT could not create an execution context (out of GPU memory?)")
        self.stream = cuda_check(cudart, cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking),
                                 "cudaStreamCreateWithFlags")
        prof = dec_entry.profile
        self.max_batch, self.max_src = prof["batch"][2], prof["src_len"][2]
        self.max_sources = prof.get("src_batch", prof["batch"])[2]
        self.max_steps = prof["cache_len"][2]
        cfg = bundle.config
        self.n_layers, self.vocab = cfg.n_decoder_layers, cfg.tgt_vocab_size
        self.allocate()

    # -- setup -------------------------------------------------------------------------------
    def deserialize(self, bundle: Bundle, entry: EngineEntry, spec: GraphSpec):
        engine = self.runtime.deserialize_cuda_engine(bundle.file(entry.file).read_bytes())
        if engine is None:
            raise XformError(f"{bundle.file(entry.file)}: {self.flavor} {self.trt.__version__} cannot deserialize "
                             f"it (built with {entry.tensorrt_version} for {entry.target}); rebuild it here")
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        want = spec.input_names + spec.output_names
        if sorted(names) != sorted(want):
            raise BundleError(f"{bundle.file(entry.file)}: engine tensors {names} differ from the contract's {want}")
        for t in (*spec.inputs, *spec.outputs):
            got = np.dtype(self.trt.nptype(engine.get_tensor_dtype(t.name)))
            if got != np.dtype(t.dtype):
                raise BundleError(f"{bundle.file(entry.file)}: tensor {t.name} is {got} in the engine, "
                                  f"{t.dtype} in the contract")
        return engine

    def alloc(self, spec: TensorSpec, **axes: int) -> DeviceBuffer:
        """A device buffer for `spec` at the given axis sizes (cudaMalloc is 256-byte aligned)."""
        shape = [axes[a] if isinstance(a, str) else a for a in spec.shape]
        nbytes = max(int(np.prod(shape)) * np.dtype(spec.dtype).itemsize, 256)  # never a null address
        ptr = cuda_check(self.cudart, self.cudart.cudaMalloc(nbytes), f"cudaMalloc({spec.name}, {nbytes})")
        buf = DeviceBuffer(int(ptr), nbytes)
        self.buffers.append(buf)
        return buf

    def allocate(self) -> None:
        """Everything at the profile's maximum, once: no decode allocates device memory."""
        R, Bs, S, P = self.max_batch, self.max_sources, self.max_src, self.max_steps
        self.enc_bufs = {t.name: self.alloc(t, batch=Bs, src_len=S) for t in self.enc_spec.inputs}
        self.enc_bufs["src_mask"] = self.alloc(self.enc_spec.output("src_mask"), batch=Bs, src_len=S)
        dec = {t.name: t for t in (*self.dec_spec.inputs, *self.dec_spec.outputs)}
        self.dec_bufs = {n: self.alloc(dec[n], batch=R) for n in ("input_ids", "min_new_tokens", "positions", "logits",
                                                                  "next_ids")}
        self.has_attention = "attention" in dec  # a bundle exported --with-attention
        if self.has_attention:
            self.dec_bufs["attention"] = self.alloc(dec["attention"], batch=R, src_len=S)
        self.last_attention: np.ndarray | None = None
        self.cache_names, self.new_names = kv_names("cache", self.n_layers), kv_names("new", self.n_layers)
        self.cross_names = kv_names("cross", self.n_layers)
        self.kv_spec = dec[self.cache_names[0]]
        self.kv_heads, self.head_dim = self.kv_spec.fixed(1), self.kv_spec.fixed(3)
        H, D, item = self.kv_heads, self.head_dim, np.dtype(self.kv_spec.dtype).itemsize
        self.ops = CudaOps(self.cudart, self.stream, self.run_reorder)
        # one cache and one cross object (runtime/backends/cache.py), both buffer sets reserved at the maximum
        self.cache = DeviceCache(self.ops, len(self.cache_names), item)
        self.cross = DeviceRows(self.ops, len(self.cross_names), item)
        for which in (0, 1):
            self.cache.reserve(which, (R, H, P, D))
            self.cross.reserve(which, (Bs, H, S, D))
        self.cache.reset((R, H, 1, D))  # the `new` buffers, at the most rows
        self.beam_buf = self.alloc(self.reorder_spec.input("beam_idx"), batch=R)
        self.mask_shape = (0, 0)

    # -- helpers -------------------------------------------------------------------------------
    def h2d(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        assert array.nbytes <= buf.nbytes  # sizes are checked against the profile before this
        cuda_check(self.cudart, self.cudart.cudaMemcpyAsync(
            buf.ptr, array.ctypes.data, array.nbytes, self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice,
            self.stream), "cudaMemcpyAsync host to device")
        self.cuda_sync()  # the host array may be freed when we return

    def d2h(self, buf: DeviceBuffer, shape: tuple[int, ...], dtype) -> np.ndarray:
        out = np.empty(shape, dtype)
        cuda_check(self.cudart, self.cudart.cudaMemcpyAsync(
            out.ctypes.data, buf.ptr, out.nbytes, self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost,
            self.stream), "cudaMemcpyAsync device to host")
        return out

    def cuda_sync(self) -> None:
        cuda_check(self.cudart, self.cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")

    def bind(self, ctx, name: str, ptr: int, shape: tuple[int, ...] | None = None) -> None:
        if shape is not None and not ctx.set_input_shape(name, shape):
            raise XformError(f"TensorRT rejected shape {shape} for {name} (outside the engine's profile?)")
        if not ctx.set_tensor_address(name, ptr):
            raise XformError(f"TensorRT rejected the address of {name}")

    def execute(self, ctx, what: str) -> None:
        # tensorrt has both properties, tensorrt_rtx only the first
        if (not getattr(ctx, "all_binding_shapes_specified", True)
                or not getattr(ctx, "all_shape_inputs_specified", True)):
            raise XformError(f"TensorRT {what}: not every input shape is set")
        if not ctx.execute_async_v3(int(self.stream)):
            raise XformError(f"TensorRT {what}: execute_async_v3 failed: see the TensorRT log above")

    # -- the backend interface -------------------------------------------------------------------
    def start(self, src_ids: np.ndarray, src_lengths: np.ndarray, group: int = 1) -> None:
        Bs, S = src_ids.shape
        R = Bs * group
        if R > self.max_batch or Bs > self.max_sources:
            raise InputError(f"{Bs} sources x {group} rows each = {R} rows exceed the engines' profile "
                             f"({self.max_sources} sources, {self.max_batch} rows); rebuild them with a larger one "
                             "(xform build-engine BUNDLE --force --max-batch N --max-beams N)")
        if S > self.max_src:
            raise InputError(f"src_len {S} exceeds the engines' longest source, {self.max_src} tokens; rebuild them "
                             "with a larger one (xform build-engine BUNDLE --force --max-src-len N)")
        H, D = self.kv_heads, self.head_dim
        self.group, self.steps = group, 0
        self.cross.reset((Bs, H, S, D), zero=False)  # the encoder writes it whole
        self.cache.reset((R, H, min(self.initial_capacity, self.max_steps), D))  # masked positions hold zeros
        self.h2d(self.enc_bufs["src_ids"], src_ids)
        self.h2d(self.enc_bufs["src_lengths"], src_lengths)
        self.bind(self.enc_ctx, "src_ids", self.enc_bufs["src_ids"].ptr, (Bs, S))
        self.bind(self.enc_ctx, "src_lengths", self.enc_bufs["src_lengths"].ptr, (Bs,))
        for name, ptr in zip(self.cross_names, self.cross.addresses()):
            self.bind(self.enc_ctx, name, ptr)
        self.bind(self.enc_ctx, "src_mask", self.enc_bufs["src_mask"].ptr)
        self.execute(self.enc_ctx, "encoder")
        self.mask_shape = (Bs, S)

    @property
    def max_rows(self) -> int:
        return self.max_batch

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(attention=self.has_attention, max_rows=self.max_batch)

    def join(self, src_ids: np.ndarray, src_lengths: np.ndarray, group: int = 1) -> None:
        raise JoinRefused("the TensorRT backend cannot add rows to a running batch (capabilities.join)")

    @property
    def rows(self) -> int:
        return self.cache.rows

    def run_reorder(self, rows: np.ndarray, src: list[int], dst: list[int], shape) -> None:
        """DeviceOps.gather: the reorder engine reads one buffer set and writes the other. Only the
        row index (8 bytes a row) crosses the bus."""
        self.h2d(self.beam_buf, rows)
        self.bind(self.reorder_ctx, "beam_idx", self.beam_buf.ptr, (len(rows),))
        for name, ptr in zip(self.cache_names, src):
            self.bind(self.reorder_ctx, name, ptr, tuple(shape))
        for name, ptr in zip(kv_names("reordered", self.n_layers), dst):
            self.bind(self.reorder_ctx, name, ptr)
        self.execute(self.reorder_ctx, f"row gather before step {self.steps}")

    def gather(self, rows: np.ndarray) -> None:
        """Row i continues row rows[i] (before the next step); fewer rows drop the others, and every
        source none of the remaining rows reads (its cross K/V on the device, its mask through the
        host: a few bytes)."""
        before, g = self.rows, self.group
        self.cache.gather(rows, self.steps)
        sources = compact_sources(self.cross, rows, g, before)
        if sources is not None:
            mask = self.d2h(self.enc_bufs["src_mask"], self.mask_shape, np.float32)
            self.cuda_sync()
            self.h2d(self.enc_bufs["src_mask"], mask[sources])
            self.mask_shape = (len(sources), self.mask_shape[1])

    def step(self, input_ids, min_new_tokens, want_logits=False, beam_idx=None, candidates: int = 0):
        # candidates: capabilities.candidates is False, so the loop never asks for them
        if self.steps >= self.max_steps:
            raise InputError(f"step {self.steps + 1} exceeds the engines' longest decode, {self.max_steps} steps; "
                             "rebuild them with a larger one (xform build-engine BUNDLE --force --max-new-tokens N)")
        p = self.steps
        if beam_idx is not None:
            self.gather(np.ascontiguousarray(beam_idx, dtype=np.int64))
        if p == self.cache.capacity:
            self.cache.grow(grown_capacity(p, self.max_steps), p)
        R = self.rows
        self.h2d(self.dec_bufs["input_ids"], input_ids.astype(np.int64, copy=False).reshape(R, 1))
        # every row at step p: a TensorRT decode starts all its rows together (no join)
        self.h2d(self.dec_bufs["min_new_tokens"], np.broadcast_to(np.asarray(min_new_tokens, np.int64), (R,)).copy())
        self.h2d(self.dec_bufs["positions"], np.full(R, p, np.int64))
        self.bind(self.dec_ctx, "input_ids", self.dec_bufs["input_ids"].ptr, (R, 1))
        self.bind(self.dec_ctx, "min_new_tokens", self.dec_bufs["min_new_tokens"].ptr, (R,))
        self.bind(self.dec_ctx, "positions", self.dec_bufs["positions"].ptr, (R,))
        for name, ptr in zip(self.cache_names, self.cache.addresses()):
            self.bind(self.dec_ctx, name, ptr, self.cache.shape)
        for name, ptr in zip(self.cross_names, self.cross.addresses()):
            self.bind(self.dec_ctx, name, ptr, self.cross.shape)
        self.bind(self.dec_ctx, "src_mask", self.enc_bufs["src_mask"].ptr, self.mask_shape)
        for name, ptr in zip(self.new_names, self.cache.new_addresses()):
            self.bind(self.dec_ctx, name, ptr)
        self.bind(self.dec_ctx, "logits", self.dec_bufs["logits"].ptr)
        self.bind(self.dec_ctx, "next_ids", self.dec_bufs["next_ids"].ptr)
        if self.has_attention:
            self.bind(self.dec_ctx, "attention", self.dec_bufs["attention"].ptr)
        self.execute(self.dec_ctx, f"decoder step {p}")
        self.cache.write(p)  # the new position into the cache, in place
        next_ids = self.d2h(self.dec_bufs["next_ids"], (R,), np.int64)
        logits = self.d2h(self.dec_bufs["logits"], (R, self.vocab), np.float32) if want_logits else None
        if self.has_attention:
            self.last_attention = self.d2h(self.dec_bufs["attention"], (R, self.mask_shape[1]), np.float32)
        self.cuda_sync()
        self.steps += 1
        return next_ids, logits

    def attention(self) -> np.ndarray:
        """The last step's attention output (rows, src_len), for a bundle exported --with-attention."""
        if self.last_attention is None:
            raise XformError("no attention to return: the bundle was exported without the decoder's attention "
                             "(xform export MODEL -o BUNDLE --with-attention), or no step ran")
        return self.last_attention.copy()

    def close(self) -> None:
        for obj in (getattr(self, "cache", None), getattr(self, "cross", None)):
            if obj is not None:
                obj.release()
        for buf in self.buffers:
            self.cudart.cudaFree(buf.ptr)
        self.buffers = []
        if getattr(self, "stream", None) is not None:
            self.cudart.cudaStreamDestroy(self.stream)
            self.stream = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing left to free into
            pass
