"""The one cache object (runtime/backends/cache.py): the device implementation against the host one, and
finished rows leaving the batch.

DeviceCache runs here on `HeapOps`, a DeviceOps over one numpy byte array with addresses as
offsets, doing exactly what the CUDA calls do (cudaMemsetAsync, cudaMemcpy2DAsync, the reorder
graph's gather): so its address arithmetic, pitches, growth and buffer-set swaps are tested on
the CPU, op for op against HostCache. On a GPU the same tests run on CudaOps over real device
memory (skipped without one, failing on a GPU machine without cuda-bindings).
"""
import numpy as np
import pytest

import xform
from tests.conftest import requires_gpu
from tests.marian_fixtures import sources
from xform.runtime.backends.cache import DeviceCache, DeviceRows, HostCache, HostRows
from xform.runtime.text.translator import Translator


class HeapOps:
    """Device memory as a numpy byte heap; a pointer is an offset (from 256, never null)."""

    def __init__(self, nbytes: int = 1 << 22, dtype=np.float32):
        self.heap = np.full(nbytes, 0xFF, np.uint8)  # never-written memory reads as NaN in float32
        self.top, self.dtype, self.live = 256, np.dtype(dtype), set()

    def alloc(self, nbytes: int) -> int:
        ptr, self.top = self.top, self.top + (nbytes + 255) // 256 * 256
        assert self.top <= len(self.heap), "heap exhausted"
        self.live.add(ptr)
        return ptr

    def free(self, ptr: int) -> None:
        self.live.remove(ptr)

    def zero(self, ptr: int, nbytes: int) -> None:
        self.heap[ptr:ptr + nbytes] = 0

    def copy_rows(self, dst, dst_pitch, src, src_pitch, width, rows) -> None:  # cudaMemcpy2D
        for r in range(rows):
            self.heap[dst + r * dst_pitch:dst + r * dst_pitch + width] = \
                self.heap[src + r * src_pitch:src + r * src_pitch + width].copy()

    def view(self, ptr: int, shape) -> np.ndarray:
        n = int(np.prod(shape)) * self.dtype.itemsize
        return self.heap[ptr:ptr + n].view(self.dtype).reshape(shape)

    def gather(self, rows, src, dst, shape) -> None:  # the reorder graph
        for s, d in zip(src, dst):
            self.view(d, (len(rows), *shape[1:]))[:] = self.view(s, shape)[rows]

    def put(self, ptr: int, array: np.ndarray) -> None:
        self.view(ptr, array.shape)[:] = array

    def get(self, ptr: int, shape) -> np.ndarray:
        return self.view(ptr, shape).copy()


def cuda_ops():
    """xform.runtime.backends.cuda.CudaOps on device 0's default stream, with the test's own host copies in
    and out (put / get) and a gather through the host (the reorder graph's semantics; the graph
    itself is tested on ORT-CUDA decoding). On a GPU without cuda-bindings the test fails with the
    install line: a GPU machine that skips it proves nothing."""
    from xform.runtime.backends.cuda import CudaOps, cuda_check
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        pytest.fail("this machine has a GPU but no cuda-bindings: pip install 'cuda-bindings>=12.6'")

    class TestCudaOps(CudaOps):
        live: set = set()

        def alloc(self, nbytes):
            ptr = super().alloc(nbytes)
            cuda_check(cudart, cudart.cudaMemset(ptr, 0xFF, nbytes), "cudaMemset")  # never-written: NaN
            self.live.add(ptr)
            return ptr

        def free(self, ptr):
            self.live.discard(ptr)
            super().free(ptr)

        def put(self, ptr, array):
            a = np.ascontiguousarray(array, np.float32)
            self.sync()
            cuda_check(cudart, cudart.cudaMemcpy(ptr, a.ctypes.data, a.nbytes,
                                                 cudart.cudaMemcpyKind.cudaMemcpyHostToDevice), "put")

        def get(self, ptr, shape):
            out = np.empty(shape, np.float32)
            self.sync()
            cuda_check(cudart, cudart.cudaMemcpy(out.ctypes.data, ptr, out.nbytes,
                                                 cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost), "get")
            return out

    def gather(rows, src, dst, shape):
        for s_ptr, d_ptr in zip(src, dst):
            ops.put(d_ptr, ops.get(s_ptr, shape)[rows])

    ops = TestCudaOps(cudart, 0, gather)
    return ops


def device_arrays(ops, cache) -> list[np.ndarray]:
    return [ops.get(p, cache.shape) for p in cache.addresses()]


@pytest.mark.parametrize("memory", ["heap", pytest.param("cuda", marks=requires_gpu)])
def test_device_cache_equals_host_cache_op_for_op(memory):
    """A decode's life, written, grown, reordered and compacted, on both implementations: every
    buffer equal after every operation, unwritten positions zero (never the heap's NaN). On the
    CPU over HeapOps; on a GPU over real CUDA memory and copies (CudaOps)."""
    rng = np.random.default_rng(0)
    ops = HeapOps() if memory == "heap" else cuda_ops()
    n, (R, H, C, D) = 4, (6, 3, 2, 5)
    host = HostCache(n, (R, H, C, D), np.float32)
    dev = DeviceCache(ops, n, 4)
    dev.reset((R, H, C, D))
    p = 0

    def write():
        nonlocal p
        rows = host.shape[0]
        for a, ptr in zip(host.new, dev.new_addresses()):
            a[...] = rng.normal(size=a.shape)
            ops.put(ptr, a[:rows])
        if p == host.capacity:
            host.grow(2 * p, p)
            dev.grow(2 * p, p)
        host.write(p)
        dev.write(p)
        p += 1

    plan = [write, write, write, lambda: (host.gather(np.array([2, 2, 0, 5, 1, 3]), p),
                                          dev.gather(np.array([2, 2, 0, 5, 1, 3]), p)),
            write, lambda: (host.gather(np.array([4, 1, 0]), p), dev.gather(np.array([4, 1, 0]), p)),
            write, write, lambda: (host.gather(np.array([2]), p), dev.gather(np.array([2]), p)), write]
    for op in plan:
        op()
        assert dev.shape == host.shape
        for h, d in zip(host.arrays, device_arrays(ops, dev)):
            np.testing.assert_array_equal(d, h)
            assert not h[:, :, p:].any()  # positions never written are zeros on both
    assert host.shape == (1, H, 8, D) and p == 7  # grown 2 -> 4 -> 8, compacted 6 -> 3 -> 1 rows
    dev.release()
    assert not ops.live


@pytest.mark.parametrize("memory", ["heap", pytest.param("cuda", marks=requires_gpu)])
def test_device_join_and_per_row_writes_equal_the_host(memory):
    """In-flight batching on a device: rows added to a running cache (zeros), cross K/V widened to
    a longer source (the old rows' positions kept, the rest zero), and each row's new keys written
    at its own position, equal to the host implementation op for op."""
    rng = np.random.default_rng(1)
    ops = HeapOps() if memory == "heap" else cuda_ops()
    n, (R, H, C, D) = 2, (3, 2, 4, 3)
    host, dev = HostCache(n, (R, H, C, D), np.float32), DeviceCache(ops, n, 4)
    dev.reset((R, H, C, D))

    def write(p):
        for a, ptr in zip(host.new, dev.new_addresses()):
            a[...] = rng.normal(size=a.shape)
            ops.put(ptr, a)
        host.write(p)
        dev.write(p)
        for h, d in zip(host.arrays, device_arrays(ops, dev)):
            np.testing.assert_array_equal(d, h)
    write(0)
    write(np.array([1, 1, 1]))
    host.gather(np.array([2, 0]), 2)
    dev.gather(np.array([2, 0]), 2)
    assert host.add(3) == dev.add(3) == slice(2, 5)
    assert dev.shape == host.shape == (5, H, C, D)
    write(np.array([2, 2, 0, 0, 0]))
    write(np.array([3, 3, 1, 1, 1]))
    write(np.array([0, 3, 2, 1, 2]))  # no run of equal positions: row by row
    cross, hc = DeviceRows(ops, 2, 4), HostRows(2, (2, H, 3, D), np.float32)
    cross.reset((2, H, 3, D), zero=False)
    for a, ptr in zip(hc.arrays, cross.addresses()):
        a[...] = rng.normal(size=a.shape)
        ops.put(ptr, a)
    assert hc.add(2, 5) == cross.add(2, 5) == slice(2, 4)
    for h, d in zip(hc.arrays, device_arrays(ops, cross)):
        np.testing.assert_array_equal(d, h)
        assert not h[:2, :, 3:].any() and not h[2:].any()
    dev.release()
    cross.release()
    assert not ops.live


@pytest.mark.parametrize("memory", ["heap", pytest.param("cuda", marks=requires_gpu)])
def test_rows_gather_and_buffers_only_grow(memory):
    ops = HeapOps() if memory == "heap" else cuda_ops()
    rows = DeviceRows(ops, 2, 4)
    rows.reset((4, 2, 3, 2), zero=False)
    host = HostRows(2, (4, 2, 3, 2), np.float32)
    for a, ptr in zip(host.arrays, rows.addresses()):
        a[...] = np.arange(a.size).reshape(a.shape)
        ops.put(ptr, a)
    host.gather(np.array([3, 1]))
    rows.gather(np.array([3, 1]))
    for h, d in zip(host.arrays, device_arrays(ops, rows)):
        np.testing.assert_array_equal(d, h)
    first = list(rows.sets[0])
    rows.reset((2, 2, 3, 2), zero=False)  # a smaller decode reuses the buffers
    assert rows.sets[0] == first
    rows.release()
    assert not ops.live


def rows_per_step(session):
    """Wrap the backend's step to record how many rows it runs at each step."""
    seen, step = [], session.backend.step

    def counting(input_ids, *args, **kw):
        seen.append(len(input_ids))
        return step(input_ids, *args, **kw)
    session.backend.step = counting
    return seen


@pytest.mark.parametrize("backend", ["ort", "torch"])
def test_finished_rows_leave_and_the_rest_decode_as_alone(demo_bundle, backend):
    """'7' ends after one word, '999999' runs long: the rows the backend runs fall as rows end,
    and every row's tokens equal its decoding alone."""
    session = xform.load(demo_bundle, backend=backend)
    texts = ["7", "999999", "40", "123456", "5"]
    src = Translator(session).policy.encode_texts(texts)
    seen = rows_per_step(session)
    got = session.generate(src, max_new_tokens=20)
    assert seen[0] == 5 and seen[-1] < 5 and seen == sorted(seen, reverse=True)
    assert sum(seen) < 5 * len(seen)  # rows really left: fewer row-steps than a full batch
    for r, text in enumerate(texts):
        alone = session.generate(Translator(session).policy.encode_texts([text]), max_new_tokens=20)
        np.testing.assert_array_equal(got[r, :alone.shape[1]], alone[0])
        assert (got[r, alone.shape[1]:] == session.pad_id).all()


@pytest.mark.parametrize("backend", ["ort", "torch"])
def test_beams_of_a_finished_source_leave_together(marians, backend):
    """Beam search drops a source's beams once its hypotheses are final: rows fall in multiples
    of num_beams, and tokens and scores stay those of the same sources searched one by one."""
    _, model, bundle = marians["swish-scaled"]
    src, _ = sources(model.config, [7, 3, 9, 5, 2], seed=4)
    session = xform.load(bundle, backend=backend)
    seen = rows_per_step(session)
    got, scores = session.generate(src.numpy(), max_new_tokens=14, num_beams=3, early_stopping=True,
                                   return_scores=True)
    assert seen[0] == 15 and seen[-1] < 15 and all(n % 3 == 0 for n in seen), seen
    for r in range(len(src)):
        row = src[r:r + 1].numpy()
        row = row[:, :int((row != session.pad_id).sum())]
        alone, s = session.generate(row, max_new_tokens=14, num_beams=3, early_stopping=True, return_scores=True)
        np.testing.assert_array_equal(got[r, :alone.shape[1]], alone[0])
        np.testing.assert_allclose(scores[r], s[0], rtol=0, atol=1e-5)


def test_samples_of_a_source_leave_together(demo_bundle):
    """num_return_sequences samples are a source's rows: the same tokens as without compaction
    (one random draw a row per step either way), and rows leave only when all its samples end."""
    session = xform.load(demo_bundle, backend="ort")
    src = Translator(session).policy.encode_texts(["7", "999999", "31"])
    seen = rows_per_step(session)
    got = session.generate(src, max_new_tokens=20, do_sample=True, num_return_sequences=2, seed=5, temperature=2.0)
    assert seen[0] == 6 and seen[-1] < 6 and all(n % 2 == 0 for n in seen), seen
    again = session.generate(src, max_new_tokens=20, do_sample=True, num_return_sequences=2, seed=5, temperature=2.0)
    np.testing.assert_array_equal(got, again)


def test_other_onnxruntime_sessions_in_the_process_still_work(demo_bundle):
    """xform's sessions keep to their own thread pools: a user's (or Optimum's) plain
    InferenceSession created after an xform backend, in the same process, still loads and runs
    (ONNX Runtime's process-wide pool would refuse it)."""
    import onnxruntime

    session = xform.load(demo_bundle, backend="ort")
    session.generate(Translator(session).policy.encode_texts(["7"]), max_new_tokens=3, num_beams=2)
    plain = onnxruntime.InferenceSession(str(demo_bundle / "reorder.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in plain.get_inputs()][0] == "beam_idx"
