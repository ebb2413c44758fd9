"""The few CUDA runtime calls the GPU backends make, through cuda-bindings, every status checked.

The K/V cache of a decode lives on the device as one (B, H, C, Dh) buffer per layer, key and value
(contract.py); a step's new keys and values, (B, H, 1, Dh), are written into it at one position,
and a growing cache is copied into a longer one. Both are one strided copy (`cudaMemcpy2DAsync`):
B x H rows, each `Dh` (or `C x Dh`) elements wide. Used by the TensorRT backend and by the ONNX
Runtime backend on CUDA; imported only by them.
"""
from __future__ import annotations

from xform.errors import BackendUnavailableError, XformError


def import_cudart():
    try:
        from cuda.bindings import runtime as cudart
    except ImportError as e:
        raise BackendUnavailableError(f"the GPU backends need cuda-bindings: pip install cuda-bindings ({e})") from None
    return cudart


def cuda_check(cudart, result, what: str):
    """cuda-bindings calls return (error, *values): raise on error, return the values."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        _, name = cudart.cudaGetErrorName(err)
        raise XformError(f"CUDA error in {what}: {name.decode() if isinstance(name, bytes) else name}")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


def copy_rows(cudart, dst: int, dst_row: int, src: int, src_row: int, width: int, rows: int, stream, what: str
              ) -> None:
    """Device to device: `rows` rows of `width` bytes, from rows `src_row` bytes apart to rows
    `dst_row` bytes apart (a cache position into a cache, or a cache into a longer one)."""
    cuda_check(cudart, cudart.cudaMemcpy2DAsync(dst, dst_row, src, src_row, width, rows,
                                                cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice, stream), what)


def device_ops(gather) -> "CudaOps":
    """DeviceOps on device 0's default stream, its gather run by `gather` (a backend's reorder)."""
    return CudaOps(import_cudart(), 0, gather)


def zero(cudart, ptr: int, nbytes: int, stream, what: str) -> None:
    cuda_check(cudart, cudart.cudaMemsetAsync(ptr, 0, nbytes, stream), what)


class CudaOps:
    """runtime.cache.DeviceOps over the CUDA runtime: memory, strided copies and uploads on
    `stream`, and a gather along rows run by the backend's reorder graph or engine."""

    def __init__(self, cudart, stream, gather):
        self.cudart, self.stream, self.run_gather = cudart, stream, gather

    def alloc(self, nbytes: int) -> int:
        return int(cuda_check(self.cudart, self.cudart.cudaMalloc(nbytes), f"cudaMalloc({nbytes})"))

    def free(self, ptr: int) -> None:
        self.cudart.cudaFree(ptr)  # at teardown too: an error here has nowhere better to go

    def zero(self, ptr: int, nbytes: int) -> None:
        zero(self.cudart, ptr, nbytes, self.stream, "zeroing the K/V cache")

    def copy_rows(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, rows: int) -> None:
        copy_rows(self.cudart, dst, dst_pitch, src, src_pitch, width, rows, self.stream, "a K/V cache copy")

    def gather(self, rows, src, dst, shape) -> None:
        self.run_gather(rows, src, dst, shape)

    def upload(self, dst: int, array) -> None:
        """A host array to the device on the stream; the array must stay as it is until sync()."""
        cuda_check(self.cudart, self.cudart.cudaMemcpyAsync(dst, array.ctypes.data, array.nbytes,
                                                            self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice,
                                                            self.stream), "a step input's copy to the device")

    def download(self, array, src: int) -> None:
        """Device to host: `array.nbytes` from `src` into a contiguous array (done by the next sync)."""
        cuda_check(self.cudart, self.cudart.cudaMemcpyAsync(array.ctypes.data, src, array.nbytes,
                                                            self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                                                            self.stream), "a step output's copy to the host")

    def sync(self) -> None:
        cuda_check(self.cudart, self.cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
