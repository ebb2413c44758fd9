"""The decoder step's small inputs (the ids, positions and min_new_tokens of each row, the source
mask, the candidates' count, a restriction's rows of the output table), where the session reads
them at each run.

ONNX Runtime's IOBinding copies a host input bound for a CUDA session to the device when it is
bound, not at each run; on the CPU it reads the bound memory at each run, since host memory is
the session's own. A binding reused step after step over host inputs therefore decodes step 0's
ids again and again on CUDA while the CPU is right (docs/gpu.md, "The first run"). So inputs are
bound in the memory of the session's device: on the CPU the backend's numpy arrays themselves,
updated in place between runs; on a device, one device buffer an input, written from the host
array when bound, or, for the inputs that change each step, before every run (`refresh`, then
the ops' sync). Neither relies on ONNX Runtime copying host memory at a run.

A device buffer only grows; it is reallocated only at a binding over more rows, and every binding
is dropped whenever the rows change (OrtBackend.bind_rows), so no binding keeps a freed address (a
beam reorder's two buffer sets keep one binding each: OrtBackend.step_binding).

A session captured as a CUDA graph (cuda_graphs.py) takes no host memory at all: its outputs too
(the chosen ids, the candidates, the attention) are device buffers here, fetched into the
backend's host arrays after each run (`fetch`).
"""
from __future__ import annotations

import numpy as np

from xform.runtime.backends.cache import DeviceOps
from xform.runtime.backends.ort_files import bind_host


class StepInputs:
    """The inputs of the decoder-step graphs' bindings, on `device` ("cpu", or the session's
    device with `ops` its memory and copies)."""

    def __init__(self, ops: DeviceOps | None, device: str):
        self.ops, self.device = ops, device
        self.buffers: dict[str, tuple[int, int]] = {}  # name -> (device address, bytes)
        self.each_step: dict[str, np.ndarray] = {}  # name -> the host array refreshed before each run
        self.held: dict[str, np.ndarray] = {}  # name -> the host array last copied from

    def bind(self, binding, name: str, array: np.ndarray, each_step: bool = False) -> None:
        """Bind input `name` to `array`'s values: in place on the CPU; on a device, copied into its
        buffer now, or with `each_step` at every refresh() (which comes before every run: a copy at
        the binding too would be the same bytes twice)."""
        if self.ops is None:
            bind_host(binding, "input", name, array)
            return
        if each_step:  # refreshed from this very array: the backend's view, updated in place
            assert array.flags.c_contiguous, name
            self.each_step[name] = array
        else:
            array = self.held[name] = np.ascontiguousarray(array)  # unchanged until the copy's sync
        ptr = self.address(name, array.nbytes)
        if not each_step:
            self.ops.upload(ptr, array)
        binding.bind_input(name, self.device, 0, array.dtype, list(array.shape), ptr)

    def bind_output(self, binding, name: str, array: np.ndarray) -> None:
        """Bind output `name` to a device buffer whose values fetch(binding) copies into `array`
        (a C-contiguous host array the backend reads) after each run."""
        assert self.ops is not None and array.flags.c_contiguous, name
        ptr = self.address(name, array.nbytes)
        binding.bind_output(name, self.device, 0, array.dtype, list(array.shape), ptr)
        binding.fetched = [*getattr(binding, "fetched", []), (array, ptr)]

    def fetch(self, binding) -> None:
        """After a run: the outputs bound by bind_output copied into their host arrays."""
        if self.ops is None:
            return
        for array, ptr in getattr(binding, "fetched", []):
            self.ops.download(array, ptr)
        self.ops.sync()

    def address(self, name: str, nbytes: int) -> int:
        """The device buffer of `name`, at least `nbytes` long (never a null address)."""
        assert self.ops is not None
        ptr, size = self.buffers.get(name, (0, 0))
        if size < nbytes:
            if ptr:
                self.ops.sync()  # a copy still pending into the old buffer must land before it goes
                self.ops.free(ptr)
            size = max(nbytes, 256)
            ptr = self.ops.alloc(size)
            self.buffers[name] = (ptr, size)
        return ptr

    def refresh(self) -> None:
        """Before a run: the inputs that change each step copied to the device again (the host
        arrays bound as views are updated in place by the backend). Nothing to do on the CPU."""
        if self.ops is None:
            return
        for name, array in self.each_step.items():
            self.ops.upload(self.buffers[name][0], array)

    def release(self) -> None:
        if self.ops is not None:
            for ptr, _ in self.buffers.values():
                self.ops.free(ptr)
        self.buffers, self.each_step, self.held = {}, {}, {}
