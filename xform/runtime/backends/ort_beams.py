"""The ort backend's beam operations: a beam step through the fused graph (only each row's k best
leave the session), the candidates graph over logits where they are, and the row gather (beam
search's reorder and finished rows leaving, with the sources no row reads) in place on the host
or through the reorder graph on a device. A mixin of OrtBackend (ort_backend.py): it reads and
writes the backend's state named below.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from xform.contract import CANDIDATES, DECODER_BEAM, REORDER
from xform.runtime.backends.cache import Cache, Rows, compact_sources
from xform.runtime.backends.cuda import CudaOps
from xform.runtime.backends.cuda_graphs import LayoutBinding
from xform.runtime.backends.ort_files import bind_host
from xform.runtime.backends.step_inputs import StepInputs


class BeamOps:
    """beam_step, run_candidates, gather and run_reorder (OrtBackend's)."""

    ops: CudaOps | None
    cache: Cache
    cross: Rows
    mask: np.ndarray
    group: int
    inputs: StepInputs
    bound: dict[tuple, Any]
    forget: Callable[[str], None]
    cand_bufs: tuple[np.ndarray, np.ndarray] | None
    num_candidates: np.ndarray
    ids_buf: np.ndarray
    positions: np.ndarray
    min_new: np.ndarray
    logits: np.ndarray | None
    device_logits: int | None
    ort_device: str
    vocab: int
    reorder: Any
    capture_reorder: bool
    captured_options: Callable[[str, LayoutBinding], Any]
    cache_names: list[str]
    reordered_names: list[str]
    step_binding: Callable[[str], Any]
    graph_session: Callable[[str], Any]
    bind_rows: Callable[[], None]
    bind_tensors: Callable[..., None]
    run_step: Callable[..., None]

    @property
    def rows(self) -> int:
        return self.cache.shape[0]

    def beam_step(self, k: int) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """A beam step through the fused graph (decoder + candidates): only each row's k best
        log-probs and ids come back, (rows, k) each; the (rows, vocab) logits never leave the
        session run. The next ids are the best candidates (the suppressed argmax)."""
        R = self.rows
        if self.cand_bufs is None or self.cand_bufs[0].shape[1] != k or len(self.cand_bufs[0]) < R:
            n = max(R, len(self.ids_buf))
            self.cand_bufs = np.empty((n, k), np.float32), np.empty((n, k), np.int64)
            self.num_candidates = np.array([k], np.int64)
            self.forget(DECODER_BEAM)
        dec = self.step_binding(DECODER_BEAM)
        self.inputs.refresh()
        if self.ops is not None:
            self.ops.sync()  # the cache copies ran on the default stream: done before the graph reads
            dec.synchronize_inputs()
        self.run_step(self.graph_session(DECODER_BEAM), DECODER_BEAM, dec)
        self.cache.write(self.positions)
        self.positions += 1
        lp, ids = self.cand_bufs[0][:R].copy(), self.cand_bufs[1][:R].copy()
        return ids[:, 0].copy(), (lp, ids)

    def run_candidates(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The candidates graph over the logits where they are; only (R, k) values come back."""
        cb = self.graph_session(CANDIDATES).io_binding()
        if self.logits is not None:  # on the host (the CPU), else on the device
            bind_host(cb, "input", "logits", self.logits)
        else:
            cb.bind_input("logits", self.ort_device, 0, np.float32, [self.rows, self.vocab], self.device_logits)
        cb.bind_cpu_input("num_candidates", np.array([k], np.int64))
        bind_host(cb, "input", "min_new_tokens", self.min_new)
        bind_host(cb, "input", "positions", self.positions)
        lp, ids = np.empty((self.rows, k), np.float32), np.empty((self.rows, k), np.int64)
        bind_host(cb, "output", "cand_logprobs", lp)
        bind_host(cb, "output", "cand_ids", ids)
        self.graph_session(CANDIDATES).run_with_iobinding(cb)
        cb.synchronize_outputs()
        return lp, ids

    def gather(self, rows: np.ndarray) -> None:
        """Row i continues row rows[i] (and its position); fewer rows than before drop the others,
        and with them every source none of the remaining rows reads (its cross K/V and mask)."""
        before, g = self.rows, self.group
        if self.ops is not None:
            self.ops.sync()  # the last step's cache writes (default stream) land before the reorder reads
        self.positions[:len(rows)] = self.positions[rows]
        self.cache.gather(rows, int(self.positions[:len(rows)].max()) if len(rows) else 0)
        sources = compact_sources(self.cross, rows, g, before)
        if sources is not None:
            self.mask = np.ascontiguousarray(self.mask[sources])
        # fewer rows: new views and bindings; a reorder keeps every address on the host, and on a
        # device the step's binding follows the buffer set the cache moved to (step_binding)
        if len(rows) < before:
            self.bind_rows()

    def run_reorder(self, rows: np.ndarray, src: list[int], dst: list[int], shape) -> None:
        """DeviceOps.gather on CUDA: the reorder graph from one buffer set into the other. A beam
        decode alternates between two such bindings (one a direction), kept like the step's
        (`bound`, dropped by bind_rows); beam_idx is a device buffer written before each run, since
        a host input would be copied once, when bound."""
        assert self.ops is not None
        idx = self.inputs.address("beam_idx", rows.nbytes)
        key = ("reorder", src[0], dst[0], tuple(shape), len(rows), idx)
        rb = self.bound.get(key)
        if rb is None:
            rb = self.reorder.io_binding()
            rb = self.bound[key] = LayoutBinding(rb) if self.capture_reorder else rb  # its layout: its graph id
            rb.bind_input("beam_idx", self.ort_device, 0, np.int64, [len(rows)], idx)
            self.bind_tensors(rb, "input", self.cache_names, src, shape)
            self.bind_tensors(rb, "output", self.reordered_names, dst, (len(rows), *shape[1:]))
        self.ops.upload(idx, rows)
        self.ops.sync()  # the indices on the device before the graph reads them
        if isinstance(rb, LayoutBinding):  # captured: replayed as its layout's graph id
            self.reorder.run_with_iobinding(rb, self.captured_options(REORDER, rb))
        else:
            self.reorder.run_with_iobinding(rb)
        rb.synchronize_outputs()
