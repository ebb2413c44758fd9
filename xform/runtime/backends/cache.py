"""The decoder's K/V caches as one object with the operations decoding needs, on the host or a device.

A decode is a set of rows (docs/design.md "Rows are the unit of work"). Every layer's
self-attention keys and values are a (rows, H, C, Dh) buffer of capacity C, updated in place
(contract.py); the encoder's cross keys and values are (sources, H, S, Dh), one copy per source
however many rows decode it (beams and samples of a source are its rows: the decoder graph treats
them as extra queries). Both are a `RowBuffers`: tensors whose first axis is gathered together.

    cache.write(p)              # the step's new keys / values (cache.new) into position p, or
                                # row r's into p[r] (rows at their own positions)
    cache.grow(capacity, p)     # a longer buffer holding the first p positions
    cache.gather(rows, p)       # row i continues row rows[i]: beam search's reorder, and, when
                                # rows is shorter, finished rows leaving the batch (compaction)
    cache.add(n)                # n empty rows at the end: a request joining a running batch
    rows.add(n, length)         # (cross K/V) n rows at the end, the length axis grown to `length`
    cache.addresses(), cache.shape   # what a backend binds
    cache.release()             # the buffers go (a backend about to allocate the next decode's)

`HostCache` keeps numpy arrays and does all of it in place (a compacted cache is a view of its
first rows; positions never written are zero pages). `DeviceCache` keeps two sets of device
buffers and does the same with strided device copies and a gather run by the backend (the
reorder graph or engine), through a small `DeviceOps` interface, so that ONNX Runtime on CUDA
and TensorRT share it (and a test can run it on host memory). `Rows` and `Cache` are what the host
and device kinds share: what a backend holding either calls. Unwritten positions always hold
zeros: masked positions must be finite, since 0 x NaN is NaN.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np


class HostRows:
    """Tensors (rows, H, L, Dh) in numpy, gathered together along rows, in place."""

    def __init__(self, n: int, shape: tuple[int, int, int, int], dtype):
        self.arrays = [np.zeros(shape, dtype) for _ in range(n)]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.arrays[0].shape

    @property
    def rows(self) -> int:
        return self.shape[0]

    def addresses(self) -> list[int]:
        return [a.ctypes.data for a in self.arrays]

    def gather(self, rows: np.ndarray, p: int | None = None) -> None:
        """Row i becomes row rows[i] (only the first p positions are copied; the rest stay zero);
        fewer rows than before keep the first len(rows) of the buffer: nothing is allocated."""
        n, cut = len(rows), slice(None) if p is None else slice(None, p)
        moved = np.flatnonzero(rows != np.arange(n))  # a beam that continues itself stays where it is
        if len(moved):
            for a in self.arrays:
                a[moved, :, cut] = a[rows[moved], :, cut]  # the right side is a copy: overlaps are safe
        if n < self.rows:
            self.arrays = [a[:n] for a in self.arrays]  # a C-contiguous view of the first rows

    def add(self, n: int, length: int | None = None) -> slice:
        """n zero rows at the end (the length axis, 2, grown to `length` when longer, zeros after
        each row's old end); returns the new rows' slice. A compacted buffer's spare rows are
        reused; a new one has room for as many rows again, so that joins rarely copy."""
        R, H, L, D = self.shape
        length = max(L, length or 0)
        base = self.arrays[0].base if self.arrays[0].base is not None else self.arrays[0]
        if length == L and base.shape[0] >= R + n:
            self.arrays = [(a.base if a.base is not None else a)[:R + n] for a in self.arrays]
            for a in self.arrays:
                a[R:] = 0
        else:
            grown = []
            for a in self.arrays:
                g = np.zeros((2 * (R + n), H, length, D), a.dtype)  # untouched rows are zero pages
                g[:R, :, :L] = a
                grown.append(g[:R + n])
            self.arrays = grown
        return slice(R, R + n)

    def fill(self, rows: slice, new: "HostRows") -> None:
        """Rows `rows` become `new`'s rows (a join's encoded sources), its length axis at the start
        of ours (the rest stays zero)."""
        for a, b in zip(self.arrays, new.arrays):
            a[rows, :, :b.shape[2]] = b

    def release(self) -> None:
        """Drop the arrays (freed unless a view of them lives on); unusable until replaced."""
        self.arrays = []


class HostCache(HostRows):
    """The self-attention cache on the host: numpy arrays, written, grown and gathered in place."""

    def __init__(self, n: int, shape: tuple[int, int, int, int], dtype):
        super().__init__(n, shape, dtype)
        self.new = [np.empty((shape[0], shape[1], 1, shape[3]), dtype) for _ in range(n)]

    @property
    def capacity(self) -> int:
        return self.shape[2]

    def new_addresses(self) -> list[int]:
        return [a.ctypes.data for a in self.new]

    def write(self, p: int | np.ndarray) -> None:
        """The new keys and values into position p (an int), or row r's into p[r] (an array)."""
        if isinstance(p, np.ndarray):
            if len(p) and (p == p[0]).all():
                p = int(p[0])
            else:
                rows = np.arange(len(p))
                for a, n in zip(self.arrays, self.new):
                    a[rows, :, p] = n[:, :, 0]
                return
        for a, n in zip(self.arrays, self.new):
            a[:, :, p] = n[:, :, 0]

    def grow(self, capacity: int, p: int) -> None:
        grown = []
        for a in self.arrays:
            g = np.zeros((a.shape[0], a.shape[1], capacity, a.shape[3]), a.dtype)
            g[:, :, :p] = a[:, :, :p]
            grown.append(g)
        self.arrays = grown

    def gather(self, rows: np.ndarray, p: int | None = None) -> None:
        super().gather(rows, p)
        self.new = [a[:len(rows)] for a in self.new]

    def add(self, n: int, length: int | None = None) -> slice:
        added = super().add(n)
        self.new = [np.empty((self.rows, *a.shape[1:]), a.dtype) for a in self.new]
        return added

    def release(self) -> None:
        super().release()
        self.new = []


def row_bytes(n_layers: int, n_heads: int, head_dim: int, positions: int, itemsize: int) -> int:
    """Bytes of one row's self-attention keys and values at `positions` positions."""
    return 2 * n_layers * n_heads * head_dim * positions * itemsize


def compact_sources(cross: "Rows", rows: np.ndarray, group: int, before: int) -> np.ndarray | None:
    """After a gather from `before` decoder rows to `rows` (`group` rows a source, a source's rows
    together): drop from `cross` every source no remaining row reads, and return the sources kept
    (the caller drops the same from its mask), or None when every source is still read."""
    if len(rows) >= before:
        return None
    sources = rows[::group] // group
    if len(sources) >= cross.rows:
        return None
    cross.gather(sources)
    return sources


def grown_capacity(filled: int, limit: int) -> int:
    """The capacity a full cache grows to before writing position `filled`: double, capped at
    `limit` (the positions a decode may reach), never less than one more position. Both graph
    backends grow by it."""
    return min(2 * filled, max(limit, filled + 1))


class Rows(Protocol):
    """What HostRows and DeviceRows share: tensors (rows, H, L, Dh) gathered together along rows."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def rows(self) -> int: ...

    def addresses(self) -> list[int]: ...

    def gather(self, rows: np.ndarray, p: int | None = None) -> None: ...

    def add(self, n: int, length: int | None = None) -> slice: ...

    def fill(self, rows: slice, new) -> None: ...

    def release(self) -> None: ...


class Cache(Rows, Protocol):
    """What HostCache and DeviceCache share: a self-attention cache, written at positions and grown."""

    @property
    def capacity(self) -> int: ...

    def new_addresses(self) -> list[int]: ...

    def write(self, p: int | np.ndarray) -> None: ...

    def grow(self, capacity: int, p: int) -> None: ...


class DeviceOps(Protocol):
    """What DeviceCache needs from a device: memory, strided copies, and a gather along rows."""

    def alloc(self, nbytes: int) -> int: ...

    def free(self, ptr: int) -> None: ...

    def zero(self, ptr: int, nbytes: int) -> None: ...

    def copy_rows(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, rows: int) -> None: ...

    def gather(self, rows: np.ndarray, src: list[int], dst: list[int], shape: tuple[int, ...]) -> None:
        """dst[i] (len(rows), *shape[1:]) = src[i] (shape) gathered by rows along the first axis."""

    def upload(self, dst: int, array: np.ndarray) -> None:
        """Host to device: a contiguous array's bytes to `dst` (done by the next sync)."""

    def download(self, array: np.ndarray, src: int) -> None:
        """Device to host: `array.nbytes` from `src` into a contiguous array (done by the next sync)."""

    def sync(self) -> None:
        """Every copy and gather issued so far is done."""


class DeviceRows:
    """Tensors (rows, H, L, Dh) on a device, in two buffer sets: a gather reads the current set
    and writes the other, which becomes current. Buffers only grow, and are kept between decodes."""

    def __init__(self, ops: DeviceOps, n: int, item: int):
        self.ops, self.n, self.item = ops, n, item  # item: bytes of one element
        self.sets: list[list[int]] = [[], []]
        self.sizes = [0, 0]
        self.current = 0
        self.shape: tuple[int, int, int, int] = (0, 0, 0, 0)

    @property
    def rows(self) -> int:
        return self.shape[0]

    def nbytes(self, shape) -> int:
        return max(int(np.prod(shape)) * self.item, 256)  # never a null address

    def reserve(self, which: int, shape) -> list[int]:
        """Set `which`, holding at least `shape`."""
        need = self.nbytes(shape)
        if self.sizes[which] < need:
            for ptr in self.sets[which]:
                self.ops.free(ptr)
            self.sets[which] = [self.ops.alloc(need) for _ in range(self.n)]
            self.sizes[which] = need
        return self.sets[which]

    def reset(self, shape: tuple[int, int, int, int], zero: bool = True) -> None:
        """A new decode: `shape`, zeros everywhere (a cache) or whatever the encoder writes (cross)."""
        R, H, L, D = shape  # kept as a tuple, whatever sequence it came as
        self.current, self.shape = 0, (R, H, L, D)
        for ptr in self.reserve(0, shape):
            if zero:
                self.ops.zero(ptr, self.nbytes(shape))

    def addresses(self) -> list[int]:
        return self.sets[self.current]

    def gather(self, rows: np.ndarray, p: int | None = None) -> None:
        shape = (len(rows), *self.shape[1:])
        dst = self.reserve(1 - self.current, shape)
        self.ops.gather(np.ascontiguousarray(rows, dtype=np.int64), self.addresses(), dst, self.shape)
        self.current, self.shape = 1 - self.current, shape

    def add(self, n: int, length: int | None = None) -> slice:
        """n zero rows at the end (the length axis grown to `length` when longer, zeros after each
        row's old end), copied into the other buffer set; returns the new rows' slice."""
        R, H, L, D = self.shape
        length = max(L, length or 0)
        shape, w = (R + n, H, length, D), D * self.item
        dst = self.reserve(1 - self.current, shape)
        for d, s in zip(dst, self.addresses()):
            self.ops.zero(d, self.nbytes(shape))
            if R:
                self.ops.copy_rows(d, length * w, s, L * w, L * w, R * H)
        self.current, self.shape = 1 - self.current, shape
        return slice(R, R + n)

    def fill(self, rows: slice, new: "DeviceRows") -> None:
        """Rows `rows` become `new`'s rows (a join's encoded sources), its length axis at the start
        of ours (the rest stays zero): one strided copy a tensor."""
        _, H, L, D = self.shape
        S, w = new.shape[2], D * self.item
        for dst, src in zip(self.addresses(), new.addresses()):
            self.ops.copy_rows(dst + rows.start * H * L * w, L * w, src, S * w, S * w, (rows.stop - rows.start) * H)

    def release(self) -> None:
        for s in self.sets:
            for ptr in s:
                self.ops.free(ptr)
        self.sets, self.sizes = [[], []], [0, 0]


class DeviceCache(DeviceRows):
    """The self-attention cache on a device: the step's new keys and values are copied in at
    their position, and a full cache into a longer one, by strided copies (B x H rows each)."""

    def __init__(self, ops: DeviceOps, n: int, item: int):
        super().__init__(ops, n, item)
        self.new: list[int] = []
        self.new_size = 0

    @property
    def capacity(self) -> int:
        return self.shape[2]

    def reset(self, shape: tuple[int, int, int, int], zero: bool = True) -> None:
        super().reset(shape, zero)
        self.reserve_new(shape[0])

    def reserve_new(self, rows: int) -> None:
        """The `new` buffers, room for `rows` rows."""
        need = self.nbytes((rows, self.shape[1], 1, self.shape[3]))
        if self.new_size < need:
            for ptr in self.new:
                self.ops.free(ptr)
            self.new, self.new_size = [self.ops.alloc(need) for _ in range(self.n)], need

    def add(self, n: int, length: int | None = None) -> slice:
        added = super().add(n)
        self.reserve_new(self.rows)
        return added

    def new_addresses(self) -> list[int]:
        return self.new

    def position(self) -> int:
        return self.shape[3] * self.item  # bytes of one position of one row

    def write(self, p: int | np.ndarray) -> None:
        """The new keys and values into position p (an int), or row r's into p[r] (an array): one
        strided copy per run of consecutive rows at one position."""
        R, H, C, _ = self.shape
        w = self.position()
        if not isinstance(p, np.ndarray):
            p = np.full(R, p)
        starts = np.flatnonzero(np.r_[True, p[1:] != p[:-1]])
        for first, end in zip(map(int, starts), map(int, np.r_[starts[1:], R])):  # DeviceOps takes Python ints
            at = int(p[first])
            for c, n in zip(self.addresses(), self.new):
                self.ops.copy_rows(c + (first * H * C + at) * w, C * w, n + first * H * w, w, w, (end - first) * H)

    def grow(self, capacity: int, p: int) -> None:
        R, H, C, D = self.shape
        shape, w = (R, H, capacity, D), self.position()
        dst = self.reserve(1 - self.current, shape)
        for d, s in zip(dst, self.addresses()):
            self.ops.zero(d, self.nbytes(shape))
            self.ops.copy_rows(d, capacity * w, s, C * w, p * w, R * H)
        self.current, self.shape = 1 - self.current, shape

    def release(self) -> None:
        super().release()
        for ptr in self.new:
            self.ops.free(ptr)
        self.new, self.new_size = [], 0
