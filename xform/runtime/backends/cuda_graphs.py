"""The decoder step captured as a CUDA graph on ONNX Runtime's CUDA provider (issue 41 item 4).

On an H100 the Marian-base decoder step was bound by its launches, about 2.6 µs for each of the
graph's 1,124 nodes whatever the rows (docs/gpu.md). A session opened with the CUDA provider's
`enable_cuda_graph` runs a graph id's first runs as usual, then captures one run and from then on
replays it: one launch. A replay reads and writes the addresses it was captured with, whatever the
binding handed to it, and ONNX Runtime does not check them ("the runtime must": a captured id run
with other addresses or shapes silently decodes stale memory). So:

- every input and output of a captured session is device memory (StepInputs: the ids, positions,
  min_new_tokens and the mask in device buffers; the chosen ids and candidates written to device
  buffers and fetched after the run), and
- each distinct binding layout (every tensor's name, device, type, shape and address, as
  `LayoutBinding` records them while the backend binds) is its own `gpu_graph_id`. The cache's
  buffers only grow and are kept between decodes, so a decode's layouts recur: a capacity, a row
  count after compaction, each of the two buffer sets beams alternate between.

A session keeps at most LIMIT captured graphs; a layout beyond them runs uncaptured (id -1).

The decoder graph is captured, and with CAPTURE_REORDER the beam reorder graph (its Gathers over
device buffers: the cache's two sets and beam_idx, written before each run). ONNX Runtime 1.31
refuses to capture the fused beam graph
(decoder + candidates): its TopK reads k from the CPU, which puts Memcpy nodes in the graph (the
H100, 2026-11-26).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from xform.errors import XformError

CAPTURE = True  # OrtBackend's default on CUDA (cuda_graph=None): 2.3-3x the tokens/s on the H100
# the beam reorder graph captured too, one graph id a layout (a capacity, a row count, a direction between
# the cache's two buffer sets): its 2 x layers Gathers one launch instead of an uncaptured session run (0.61
# of a 4.48 ms beam step at 32 sources on the H100, docs/benchmarks.md). Off until a GPU measures it
# (scripts/gpu_session.sh variants: bench_gpu's "xform-graph-reorder"); verified on the CUDA double
CAPTURE_REORDER = False
LIMIT = 64  # captured graphs a session keeps; past them a layout runs as before (gpu_graph_id -1)
UNCAPTURED = "-1"  # ONNX Runtime's gpu_graph_id for a run neither captured nor replayed


def capture_wanted(device: str, capture: bool, by_default: bool) -> bool:
    """Whether a backend on `device` captures its decoder step: on CUDA as asked; elsewhere never,
    and asking for it (not `by_default`) is refused by name."""
    if capture and device != "cuda" and not by_default:
        raise XformError(f"{{cuda_graph}} captures the decoder step on CUDA; this backend runs on {device}"
                         ).naming("cuda_graph")
    return capture and device == "cuda"


def capture_providers(tf32: bool) -> list:
    """The providers of a captured session: the CUDA provider alone (ONNX Runtime refuses capture
    when it places a node on the CPU provider, as it does shape computations next to it)."""
    return [("CUDAExecutionProvider", {"use_tf32": "1" if tf32 else "0", "enable_cuda_graph": "1"})]


class LayoutBinding:
    """An IOBinding that records every tensor bound (name, device, dtype, shape, address): the
    layout a captured graph bakes in. Anything else is the binding's own (ONNX Runtime's
    run_with_iobinding reads its `_iobinding`)."""

    def __init__(self, binding):
        self.binding = binding
        self.layout: list[tuple] = []

    def bind_input(self, name, device_type, device_id, dtype, shape, ptr) -> None:
        self.layout.append(("in", name, device_type, np.dtype(dtype).str, tuple(shape), int(ptr)))
        self.binding.bind_input(name, device_type, device_id, dtype, shape, ptr)

    def bind_output(self, name, device_type, device_id, dtype, shape, ptr) -> None:
        self.layout.append(("out", name, device_type, np.dtype(dtype).str, tuple(shape), int(ptr)))
        self.binding.bind_output(name, device_type, device_id, dtype, shape, ptr)

    def bind_ortvalue_output(self, name, value) -> None:
        self.layout.append(("out", name, "value", tuple(value.shape()), int(value.data_ptr())))
        self.binding.bind_ortvalue_output(name, value)

    def bind_ortvalue_input(self, name, value) -> None:
        self.layout.append(("in", name, "value", tuple(value.shape()), int(value.data_ptr())))
        self.binding.bind_ortvalue_input(name, value)

    def bind_cpu_input(self, name, array) -> None:
        raise AssertionError(f"{name}: a captured graph's inputs are device memory (StepInputs)")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.binding, name)


class CapturedGraphs:
    """One captured session's graph ids: one per binding layout, at most LIMIT."""

    def __init__(self, ort, limit: int = LIMIT):
        self.ort, self.limit = ort, limit
        self.ids: dict[tuple, Any] = {}  # layout -> its RunOptions
        self.uncaptured = self.run_options(UNCAPTURED)

    def run_options(self, graph_id: str):
        options = self.ort.RunOptions()
        options.add_run_config_entry("gpu_graph_id", graph_id)
        return options

    def options(self, binding: LayoutBinding):
        """The RunOptions of `binding`'s layout: its own graph id (1, 2, ...; 0 is ONNX Runtime's),
        or uncaptured once LIMIT layouts have one."""
        key = tuple(binding.layout)
        options = self.ids.get(key)
        if options is None:
            if len(self.ids) >= self.limit:
                return self.uncaptured
            options = self.ids[key] = self.run_options(str(len(self.ids) + 1))
        return options
