"""What the ort backend opens before it decodes: onnxruntime itself, the execution providers of a
device, the CPU arena its sessions share, and the weights several graphs share, mapped once from
the bundle's file."""
from __future__ import annotations

import mmap

import numpy as np

from xform.errors import BackendUnavailableError, BundleError, XformError
from xform.files import drop_cached
from xform.manifest import SharedWeight as SharedEntry
from xform.runtime.bundle import Bundle


def import_onnxruntime():
    try:
        import onnxruntime
    except ImportError as e:
        raise BackendUnavailableError(f"the ort backend needs onnxruntime: pip install onnxruntime ({e})") from None
    return onnxruntime


# a session config entry: the session allocates from the environment's CPU arena (one_cpu_arena)
SHARED_ARENA = "session.use_env_allocators"
_arena_registered = False


def one_cpu_arena(ort, opts) -> None:
    """Have a CPU session allocate its tensors from one arena for the process instead of an arena
    of its own. Each session's arena keeps the largest batch it met, so the encoder's kept its
    activations (about 57 MiB at a 2,048-token batch, Marian-base) through every decoder step;
    shared, the decoder's steps reuse them. The arena is ONNX Runtime's own (BFC, growing in
    powers of two, its default), registered in its environment once a process; only sessions that
    opt in use it (a user's own sessions keep theirs). Measured: docs/design.md, "One CPU arena"."""
    global _arena_registered
    if not _arena_registered:
        cpu = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(cpu, ort.OrtArenaCfg({"arena_extend_strategy": 0}))
        _arena_registered = True
    opts.add_session_config_entry(SHARED_ARENA, "1")


def providers_for(ort, device: str, tf32: bool = False) -> list:
    """The execution providers of `device`. On CUDA, fp32 is fp32: ONNX Runtime's default TF32
    (matmul inputs rounded to 10 mantissa bits) moves fp32 logits by about 1e-3, ten times fp32's
    check tolerance, so it is off unless `tf32` (--allow-tf32) asks for it."""
    if tf32 and device != "cuda":
        raise XformError(f"{{allow_tf32}} is a CUDA math mode; this backend runs on {device}").naming("allow_tf32")
    available = ort.get_available_providers()
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device == "cuda":
        if "CUDAExecutionProvider" not in available:
            raise BackendUnavailableError(
                f"{{device}} cuda needs onnxruntime-gpu with a CUDA GPU; this onnxruntime offers {available}. "
                "Install it with: pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu").naming(
                    "device")
        return [("CUDAExecutionProvider", {"use_tf32": "1" if tf32 else "0"}), "CPUExecutionProvider"]
    raise XformError(f"unknown device {device!r}; expected cpu or cuda")


class SharedWeight:
    """One manifest `shared_weights` entry (validated by Manifest.from_json and Bundle.validate), mapped read-only from
    the bundle's file once for every session that holds it."""

    def __init__(self, ort, bundle: Bundle, entry: SharedEntry):
        self.path = bundle.file(entry.file)
        self.offset, self.nbytes = entry.offset, entry.nbytes
        start = self.offset - self.offset % mmap.ALLOCATIONGRANULARITY
        with open(self.path, "rb") as f:
            self.map = mmap.mmap(f.fileno(), self.offset + self.nbytes - start, access=mmap.ACCESS_READ, offset=start)
        self.array = np.frombuffer(self.map, entry.dtype, offset=self.offset - start,
                                   count=int(np.prod(entry.shape))).reshape(entry.shape)
        self.value = ort.OrtValue.ortvalue_from_numpy(self.array)  # the sessions read this memory
        self.graphs = entry.graphs

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


def shared_weights(ort, bundle: Bundle, device: str) -> list[SharedWeight]:
    """The weights several graphs share, each one read-only mapping of the bundle's file, for
    sessions on `device`: on the CPU only (a CUDA session places its weights on the device and
    refuses host ones, with a warning each, loading them from the graph's own file instead)."""
    return [SharedWeight(ort, bundle, w) for w in bundle.manifest.shared_weights] if device == "cpu" else []


def session(ort, path, opts, providers):
    """An InferenceSession; a graph ONNX Runtime refuses (corrupt, or external data outside the
    bundle) is a BundleError naming the file."""
    try:
        return ort.InferenceSession(str(path), opts, providers=providers)
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own exception types
        if type(e).__module__.startswith("onnxruntime"):
            raise BundleError(f"{path}: ONNX Runtime refuses it: {e}") from None
        raise


def bind_host(binding, kind: str, name: str, array: np.ndarray) -> None:
    """Bind a contiguous numpy array in place (ONNX Runtime reads or writes its memory)."""
    bind = binding.bind_input if kind == "input" else binding.bind_output
    bind(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
