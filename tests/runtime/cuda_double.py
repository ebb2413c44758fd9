"""ONNX Runtime's CUDA provider and the CUDA runtime as the ort backend sees them, on the CPU.

The ort backend's device branch (OrtBackend with `device="cuda"`: DeviceCache, device step
inputs, logits left on the device, the reorder graph as the gather) runs here end to end on the
CPU provider, through doubles that keep the semantics in which a device differs from the host:

- `CudaOrt` stands for the `onnxruntime` module of onnxruntime-gpu: it offers the CUDA provider,
  records the provider options a session is opened with, and runs every graph on the CPU provider.
- `CudaBinding` is IOBinding as it behaves for a CUDA session (the H100's first run, issue 41):
  an input bound in *device* memory (`bind_input(..., "cuda", ...)`, a device OrtValue) is read at
  each run; an input bound in *host* memory (`bind_input(..., "cpu", ...)`, `bind_cpu_input`, a
  host OrtValue) is copied to the device when it is bound, so changing the host array afterwards
  changes nothing the session sees. Outputs bound in host memory are copied back after each run,
  as ONNX Runtime does.
- `CudaSession` opened with `enable_cuda_graph` captures a graph id's third run and replays it
  after, at the addresses it was captured with (ONNX Runtime checks nothing), and refuses host
  memory in a captured run.
- `StreamOps` is runtime.cache.DeviceOps over CUDA's semantics: "device" memory is host memory
  ONNX Runtime's CPU kernels can read and write (real addresses), never-written and freed memory
  reads as NaN, every access is checked to lie inside one live allocation (a CUDA fault), and
  copies, memsets and uploads are queued on a stream that runs only at `sync()` (or a free, which
  synchronises the device), as cudaMemcpy2DAsync / cudaMemsetAsync / cudaMemcpyAsync on stream 0
  are asynchronous to ONNX Runtime's own stream; an upload's host bytes are taken when it is issued.
"""
from __future__ import annotations

import bisect
import ctypes

import numpy as np


def host_bytes(ptr: int, nbytes: int) -> np.ndarray:
    """A uint8 view of `nbytes` at host address `ptr`."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr)) if nbytes else np.empty(0, np.uint8)


class StreamOps:
    """DeviceOps with CUDA's semantics over host memory (see the module's docstring)."""

    def __init__(self, gather):
        self.run_gather = gather
        self.blocks: dict[int, np.ndarray] = {}  # start address -> its bytes (live and freed)
        self.live: set[int] = set()
        self.starts: list[int] = []
        self.queue: list = []
        self.uploads = 0

    # -- memory --------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> int:
        block = np.full(max(nbytes, 1), 0xFF, np.uint8)  # never written: NaN in float32
        ptr = block.ctypes.data
        self.blocks[ptr] = block
        self.live.add(ptr)
        bisect.insort(self.starts, ptr)
        return ptr

    def free(self, ptr: int) -> None:
        self.sync()  # cudaFree synchronises the device
        assert ptr in self.live, f"cudaFree of {ptr:#x}: not a live allocation"
        self.live.remove(ptr)
        self.blocks[ptr][:] = 0xFF  # kept, so that a stale binding reads NaN instead of faulting

    def region(self, ptr: int, nbytes: int) -> np.ndarray:
        """The bytes [ptr, ptr + nbytes) of one live allocation: anything else is a device fault."""
        i = bisect.bisect_right(self.starts, ptr) - 1
        start = self.starts[i] if i >= 0 else None
        assert start is not None and start in self.live, f"device address {ptr:#x} is in no live allocation"
        block = self.blocks[start]
        assert ptr + nbytes <= start + len(block), f"device access [{ptr:#x}, +{nbytes}) runs past its allocation"
        return block[ptr - start:ptr - start + nbytes]

    # -- the stream ------------------------------------------------------------------------------
    def zero(self, ptr: int, nbytes: int) -> None:
        self.region(ptr, nbytes)
        self.queue.append(lambda: self.region(ptr, nbytes).fill(0))

    def copy_rows(self, dst, dst_pitch, src, src_pitch, width, rows) -> None:
        for r in range(rows):
            self.region(dst + r * dst_pitch, width)
            self.region(src + r * src_pitch, width)

        def run():
            for r in range(rows):
                self.region(dst + r * dst_pitch, width)[:] = self.region(src + r * src_pitch, width).copy()
        self.queue.append(run)

    def upload(self, dst: int, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array).view(np.uint8).reshape(-1).copy()  # pageable memory: staged now
        self.region(dst, data.nbytes)
        self.uploads += 1
        self.queue.append(lambda: self.region(dst, data.nbytes).__setitem__(slice(None), data))

    def download(self, array: np.ndarray, src: int) -> None:
        out = array.view(np.uint8).reshape(-1)  # the host array is written when the stream runs
        self.region(src, out.nbytes)
        self.queue.append(lambda: out.__setitem__(slice(None), self.region(src, out.nbytes)))

    def gather(self, rows, src, dst, shape) -> None:
        self.run_gather(rows, src, dst, shape)  # the reorder graph, on ONNX Runtime's stream

    def sync(self) -> None:
        queue, self.queue = self.queue, []
        for op in queue:
            op()


class DeviceValue:
    """An OrtValue made on "cuda": its numpy() is a copy to the host, never a view."""

    def __init__(self, value):
        self.value = value

    def data_ptr(self) -> int:
        return self.value.data_ptr()

    def numpy(self) -> np.ndarray:
        return np.array(self.value.numpy(), copy=True)

    def shape(self) -> list[int]:
        return self.value.shape()


class CudaBinding:
    """IOBinding as for a CUDA session (see the module's docstring)."""

    def __init__(self, real, ort: "CudaOrt"):
        self.real, self.ort = real, ort
        self.copies: dict[str, np.ndarray] = {}  # host inputs as copied when bound
        self.host: set[str] = set()  # the names bound in host memory, inputs and outputs

    def host_copy(self, name: str, array: np.ndarray) -> None:
        self.host.add(name)
        copy = self.copies[name] = np.array(array, copy=True, order="C")
        self.real.bind_input(name, "cpu", 0, copy.dtype, list(copy.shape), copy.ctypes.data)

    def bind_input(self, name, device_type, device_id, dtype, shape, ptr) -> None:
        dtype = np.dtype(dtype)
        if device_type == "cuda":  # device memory: read by the session at each run
            self.ort.check_device(ptr, int(np.prod(shape)) * dtype.itemsize)
            self.real.bind_input(name, "cpu", 0, dtype, shape, ptr)
        else:  # host memory: copied to the device now, never read again
            n = int(np.prod(shape))
            self.host_copy(name, host_bytes(ptr, n * dtype.itemsize).view(dtype).reshape(shape))

    def bind_cpu_input(self, name, array) -> None:
        self.host_copy(name, np.asarray(array))

    def bind_ortvalue_input(self, name, value) -> None:
        if isinstance(value, DeviceValue):
            self.real.bind_ortvalue_input(name, value.value)
        else:
            self.host_copy(name, value.numpy())

    def bind_output(self, name, device_type, device_id, dtype, shape, ptr) -> None:
        if device_type == "cuda":
            self.ort.check_device(ptr, int(np.prod(shape)) * np.dtype(dtype).itemsize)
        else:
            self.host.add(name)
        self.real.bind_output(name, "cpu", 0, dtype, shape, ptr)  # host outputs: copied back each run

    def bind_ortvalue_output(self, name, value) -> None:
        if not isinstance(value, DeviceValue):
            self.host.add(name)
        self.real.bind_ortvalue_output(name, value.value if isinstance(value, DeviceValue) else value)

    def synchronize_inputs(self) -> None:
        self.real.synchronize_inputs()

    def synchronize_outputs(self) -> None:
        self.real.synchronize_outputs()


class CudaSession:
    """A session on the CUDA provider. Opened with `enable_cuda_graph`, it does what ONNX Runtime
    does with a run's `gpu_graph_id` (0 without RunOptions; -1: neither captured nor replayed):
    REGULAR_RUNS regular runs of an id, then one captured, then replays of the captured run, which
    read and write the addresses bound when it was captured whatever binding a replay is handed
    (ONNX Runtime checks nothing: a replay with other addresses decodes stale memory). A captured
    run's inputs and outputs must all be device memory."""
    REGULAR_RUNS = 2

    def __init__(self, real, ort: "CudaOrt", capture: bool = False):
        self.real, self.ort, self.capture = real, ort, capture
        self.counts: dict[str, int] = {}
        self.captured: dict[str, CudaBinding] = {}  # gpu_graph_id -> the binding it was captured with

    def io_binding(self) -> CudaBinding:
        return CudaBinding(self.real.io_binding(), self.ort)

    def run_with_iobinding(self, binding, run_options=None) -> None:
        self.ort.runs += 1
        graph_id = "0" if run_options is None else (run_options.get_run_config_entry("gpu_graph_id") or "0")
        if not self.capture or graph_id == "-1":
            self.real.run_with_iobinding(binding.real, run_options)
            return
        assert not binding.host, f"a captured graph's tensors must be device memory: {sorted(binding.host)} are not"
        if graph_id in self.captured:  # a replay: the captured addresses, not this binding's
            self.ort.replays += 1
            self.real.run_with_iobinding(self.captured[graph_id].real, run_options)
            return
        self.counts[graph_id] = self.counts.get(graph_id, 0) + 1
        if self.counts[graph_id] > self.REGULAR_RUNS:
            self.captured[graph_id] = binding
        self.real.run_with_iobinding(binding.real, run_options)

    def __getattr__(self, name):
        return getattr(self.real, name)


class CudaOrt:
    """The `onnxruntime` module of onnxruntime-gpu, as the ort backend uses it (see the docstring)."""

    def __init__(self):
        import onnxruntime
        self.real = onnxruntime
        self.SessionOptions = onnxruntime.SessionOptions
        self.GraphOptimizationLevel = onnxruntime.GraphOptimizationLevel
        self.providers: list = []  # each session's providers, as asked for
        self.ops: StreamOps | None = None
        self.runs = self.replays = 0
        self.RunOptions = onnxruntime.RunOptions

        class OrtValue:
            ortvalue_from_numpy = staticmethod(onnxruntime.OrtValue.ortvalue_from_numpy)

            @staticmethod
            def ortvalue_from_shape_and_type(shape, dtype, device, device_id=0):
                value = onnxruntime.OrtValue.ortvalue_from_shape_and_type(shape, dtype, "cpu", 0)
                return DeviceValue(value) if device == "cuda" else value
        self.OrtValue = OrtValue

    def get_available_providers(self) -> list[str]:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]

    def InferenceSession(self, path, opts=None, providers=None):  # noqa: N802 - onnxruntime's name
        """A session on the CUDA provider is the double; a CPU one is onnxruntime's own."""
        real = self.real.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        if not any((p[0] if isinstance(p, tuple) else p) == "CUDAExecutionProvider" for p in providers or []):
            return real
        self.providers.append(providers)
        cuda = next((p for p in providers if isinstance(p, tuple) and p[0] == "CUDAExecutionProvider"), ("", {}))
        return CudaSession(real, self, capture=cuda[1].get("enable_cuda_graph") == "1")

    def check_device(self, ptr: int, nbytes: int) -> None:
        """A device address bound for a run lies in a live allocation of the device's ops."""
        if self.ops is not None:
            self.ops.region(ptr, nbytes)


def emulate_cuda(monkeypatch) -> CudaOrt:
    """Make OrtBackend(device="cuda") run on these doubles; returns the module double (its `ops`
    is the last backend's StreamOps)."""
    import xform.runtime.backends.ort_backend as ob

    ort = CudaOrt()

    def device_ops(gather):
        ort.ops = StreamOps(gather)
        return ort.ops
    monkeypatch.setattr(ob, "import_onnxruntime", lambda: ort)
    monkeypatch.setattr(ob, "device_ops", device_ops)
    return ort
