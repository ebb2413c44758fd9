"""The ONNX Runtime backend: runs the bundle's encoder and decoder graphs on the CPU or CUDA.

Its memory is laid out so that nothing is held twice and no step allocates (measured in
docs/benchmarks.md, "Where Marian-base fp32 memory goes"):

- The self-attention cache is one buffer per layer, key and value, owned here: numpy arrays on
  the CPU, device buffers on CUDA. The decoder graph reads it where it is (bound, never copied)
  and returns only the new token's keys and values, which are written in at the step's position
  (contract.py). Its capacity doubles when full. On the CPU beams start at the batch's longest
  source plus 8, rounded up to 16, greedy rows at 16 (backend.source_capacity: a translation is
  about as long as its source, and greedy rows leave the batch as they end), since the decoder
  reads every position at every step and a read makes even a never-written zero page resident;
  on a device at INITIAL_CAPACITY. Beam search reorders it in
  place (CPU) or through the reorder graph (CUDA).
- A weight several graphs hold (a shared embedding table, the restricted decoder's layers) is
  mapped once from the bundle and given
  to both sessions (`SessionOptions.add_initializer`), instead of each session paging in its own
  copy (the manifest's `shared_weights`, found at export).
- The previous decode's buffers are released before the next encoder runs.
- On the CPU every session allocates from one ONNX Runtime arena (ort_files.one_cpu_arena): the
  decoder's steps reuse what the encoder's run grew, instead of each arena keeping its own peak.

Everything runs through IO binding: the encoder's outputs stay OrtValues bound straight into the
decoder; the ids, the logits and the new keys and values land in preallocated, bound buffers.
onnxruntime is imported when a backend is made, never at `import xform`; `onnxruntime` and
`onnxruntime-gpu` install the same module, and the CUDA provider exists only in the latter.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from xform.contract import (
    CANDIDATES,
    DECODER,
    DECODER_BEAM,
    ENCODER,
    MASK_VALUE,
    REORDER,
    RESTRICTED,
    Capabilities,
    kv_names,
)
from xform.errors import InputError, JoinRefused, XformError
from xform.runtime.backends.backend import INITIAL_CAPACITY, source_capacity
from xform.runtime.backends.cache import (
    Cache,
    DeviceCache,
    DeviceRows,
    HostCache,
    HostRows,
    Rows,
    grown_capacity,
)
from xform.runtime.backends.cuda import CudaOps, device_ops
from xform.runtime.backends.cuda_graphs import (
    CAPTURE,
    CAPTURE_REORDER,
    CapturedGraphs,
    LayoutBinding,
    capture_providers,
    capture_wanted,
)
from xform.runtime.backends.ort_beams import BeamOps
from xform.runtime.backends.ort_files import (
    bind_host,
    import_onnxruntime,
    one_cpu_arena,
    providers_for,
    session,
    shared_weights,
)
from xform.runtime.backends.ort_restriction import Restriction
from xform.runtime.backends.step_inputs import StepInputs
from xform.runtime.bundle import Bundle


class OrtBackend(Restriction, BeamOps):
    """Sessions and their bindings, the rows' buffers and the step; vocabulary restriction is
    ort_restriction.py's, the beam operations ort_beams.py's."""
    name = "ort"

    def __init__(self, bundle: Bundle, device: str = "cpu", threads: int | None = None,
                 initial_capacity: int | None = None, tf32: bool = False, cuda_graph: bool | None = None):
        # the cache's positions at a start, doubled when full; None: on the host by the rows a
        # source and the batch's longest source (backend.source_capacity), INITIAL_CAPACITY on a device
        self.initial_capacity = initial_capacity
        ort = self.ort = import_onnxruntime()
        providers = providers_for(ort, device, tf32)
        self.tf32 = tf32  # fp32 matmuls in TF32 on CUDA (--allow-tf32): the check judges them as such
        self.ort_device = "cuda" if device == "cuda" else "cpu"
        # the decoder step captured as a CUDA graph (cuda_graphs.py): its graph ids by binding layout
        self.capture = capture_wanted(device, CAPTURE if cuda_graph is None else cuda_graph, cuda_graph is None)
        self.capture_reorder = self.capture and CAPTURE_REORDER  # the beam reorder graph too (cuda_graphs.py)
        self.graphs: dict[str, CapturedGraphs] = {}
        self.shared = shared_weights(ort, bundle, self.ort_device)  # kept alive here: the sessions read them
        self.bundle, self.threads, self.providers = bundle, threads, providers
        # beam steps through the fused graph (decoder + candidates, exporter/beam_graph.py) when the bundle has
        # it, unless the decoder step is captured: ONNX Runtime cannot capture the fused graph, and the captured
        # decoder + the candidates graph beat it (1.1-3x on the H100, docs/gpu.md)
        self.fused_beams = bundle.has_graph(DECODER_BEAM) and not self.capture
        # a decoder-step graph's session prepacks its own copy of the decoder's weights, so each one
        # opens at its first use: a beam search never opens the plain decoder, a greedy decode never
        # the fused one. The one the bundle's own defaults decode with opens now, first (its
        # prepacking pages tables in: graph_session pages them out again)
        self.sessions: dict[str, Any] = {}
        beams = int(bundle.manifest.generation.get("num_beams") or 1) > 1
        # a guess, settled by the first decoder step (settle): released if that step runs another graph
        self.guess: str | None = DECODER_BEAM if beams and self.fused_beams else DECODER
        for graph in (self.guess, ENCODER, REORDER):
            self.graph_session(graph)
        self.encoder, self.reorder = self.sessions[ENCODER], self.sessions[REORDER]
        spec = bundle.graph_spec(DECODER)
        n = bundle.config.n_decoder_layers
        self.cache_names, self.new_names = kv_names("cache", n), kv_names("new", n)
        self.cross_names, self.reordered_names = kv_names("cross", n), kv_names("reordered", n)
        first = spec.input(self.cache_names[0])
        self.kv_dtype = np.dtype(first.dtype)
        self.kv_heads, self.head_dim = first.fixed(1), first.fixed(3)
        self.has_attention = "attention" in spec.output_names  # a bundle exported --with-attention
        self.vocab = bundle.config.tgt_vocab_size
        self.max_len = bundle.config.max_len
        self.ops: CudaOps | None = None
        self.cache: Cache
        self.cross: Rows
        self.row_buffers()
        self.inputs = StepInputs(self.ops, self.ort_device)
        self.live = False  # a decode is running: from a start() that succeeded on
        # the decoder-step graphs' IOBindings over the current rows, by graph and buffers (step_binding)
        self.bound: dict[tuple, Any] = {}
        self.cand_bufs: tuple[np.ndarray, np.ndarray] | None = None  # the fused step's outputs, (rows, K)
        # vocabulary restriction (a bundle exported --with-vocab-map): the restricted decoder and
        # the output table, loaded at the first restriction; the ids of the current one
        self.restricted: Any | None = None
        self.table: dict[str, np.ndarray] | None = None
        self.subset: npt.NDArray[np.int64] | None = None
        # the logits (rows, vocab): in a host buffer on the CPU and with a subset (buffers()), else
        # an OrtValue on the device
        self.logits_buf: npt.NDArray[np.float32] | None = None
        self.logits: npt.NDArray[np.float32] | None = None
        self.device_logits: int | None = None
        self.has_restriction = bundle.has_graph(RESTRICTED)

    def row_buffers(self) -> None:
        """The self-attention cache and the cross K/V: on the device with its ops, or on the host
        (no rows until start())."""
        if self.ort_device == "cuda":
            self.ops = device_ops(self.run_reorder)
            self.cache = DeviceCache(self.ops, len(self.cache_names), self.kv_dtype.itemsize)
            self.cross = DeviceRows(self.ops, len(self.cross_names), self.kv_dtype.itemsize)
        else:
            self.cache = HostCache(len(self.cache_names), (0, self.kv_heads, 0, self.head_dim), self.kv_dtype)
            self.cross = HostRows(len(self.cross_names), (0, self.kv_heads, 0, self.head_dim), self.kv_dtype)

    @property
    def decoder(self):
        """The decoder graph's session (opened at its first use)."""
        return self.graph_session(DECODER)

    @property
    def candidates(self):
        """The candidates graph's session: beams of bundles without the fused graph, or with it off."""
        return self.graph_session(CANDIDATES)

    def graph_session(self, graph: str):
        """The session of `graph`, opened at its first use; after a decoder-step graph's prepacking
        read the shared tables whole, their pages are dropped again (SharedWeight.page_out)."""
        if graph not in self.sessions:
            self.sessions[graph] = self.open_session(graph)
            if graph in (DECODER, DECODER_BEAM) and self.ort_device == "cpu":
                for w in self.shared:
                    if graph in w.graphs:
                        w.page_out()
        return self.sessions[graph]

    def open_session(self, graph: str):
        ort = self.ort
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if self.threads:
            opts.intra_op_num_threads = self.threads
            opts.inter_op_num_threads = 1
        if graph not in (DECODER, RESTRICTED, DECODER_BEAM):
            # a pool per session (ONNX Runtime's global pool would fail every other session in
            # the process that does not opt into it: docs/design.md, "Thread pools"). Graphs run
            # between decoder steps, or once: their pool's threads must not spin after their
            # work and take the cores the decoder's next step needs
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        for w in self.shared:
            if graph in w.graphs:
                opts.add_initializer(w.graphs[graph], w.value)
        if self.ort_device == "cpu":
            one_cpu_arena(ort, opts)
        # DECODER_BEAM's TopK reads k on the CPU: refused
        captured = self.capture and graph == DECODER or self.capture_reorder and graph == REORDER
        return session(ort, self.bundle.graph_file(graph), opts,
                       capture_providers(self.tf32) if captured else self.providers)

    # -- the backend interface -------------------------------------------------------------------
    def start(self, src_ids: np.ndarray, src_lengths: np.ndarray, group: int = 1) -> None:
        """The encoder on the Bs sources; the decoder then runs Bs x group rows over them."""
        Bs, S = src_ids.shape
        H, D = self.kv_heads, self.head_dim
        self.live = False
        cross_shape, cache_shape = (Bs, H, S, D), (Bs * group, H, self.start_capacity(S, group), D)
        if self.ops is None:  # the last decode's buffers go before the encoder allocates
            self.cache.release()
            self.cross.release()
            self.cross = HostRows(len(self.cross_names), cross_shape, self.kv_dtype)
            self.cache = HostCache(len(self.cache_names), cache_shape, self.kv_dtype)
        else:
            # __init__ made them on the device, as ops
            assert isinstance(self.cross, DeviceRows) and isinstance(self.cache, DeviceCache)
            self.cross.reset(cross_shape, zero=False)
            self.cache.reset(cache_shape)
        self.mask = np.empty((Bs, S), np.float32)  # on the host on every device: a few bytes a row
        self.encode(src_ids, src_lengths, self.cross.addresses(), self.mask)
        self.group = group
        self.buffers(Bs * group, S)
        self.live = True
        self.bind_rows()

    def start_capacity(self, src_len: int, group: int = 1) -> int:
        """The cache's positions at a start over sources of `src_len` tokens, `group` rows a
        source (__init__'s rule)."""
        if self.initial_capacity is not None:
            return self.initial_capacity
        return INITIAL_CAPACITY if self.ops is not None else source_capacity(src_len, self.max_len, group)

    def encode(self, src_ids: np.ndarray, src_lengths: np.ndarray, addresses: list[int], mask: np.ndarray) -> None:
        """The encoder's cross K/V into `addresses`, its source mask into `mask`."""
        enc = self.encoder.io_binding()
        enc.bind_cpu_input("src_ids", np.ascontiguousarray(src_ids))
        enc.bind_cpu_input("src_lengths", np.ascontiguousarray(src_lengths))
        self.bind_tensors(enc, "output", self.cross_names, addresses, (*src_ids.shape[:1], self.kv_heads,
                                                                        src_ids.shape[1], self.head_dim))
        bind_host(enc, "output", "src_mask", mask)
        self.encoder.run_with_iobinding(enc)
        enc.synchronize_outputs()

    def buffers(self, R: int, S: int, positions: np.ndarray | None = None) -> None:
        """The per-row host buffers for R rows over sources of S tokens, every row at position 0
        but the first len(positions) (a join: the running rows keep theirs)."""
        self.ids_buf, self.next_buf = np.empty((R, 1), np.int64), np.empty(R, np.int64)
        self.positions_buf, self.min_new_buf = np.zeros(R, np.int64), np.zeros(R, np.int64)
        if positions is not None:
            self.positions_buf[:len(positions)] = positions
        if self.subset is not None:  # ids outside the subset: -inf, written once a decode
            self.logits_buf = np.full((R, self.vocab), -np.inf, np.float32)
            self.sub_logits_buf = np.empty((R, len(self.subset)), np.float32)
        else:
            self.logits_buf = np.empty((R, self.vocab), np.float32) if self.ops is None else None
        self.attention_buf = np.empty((R, S), np.float32) if self.has_attention else None

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(join=True, candidates=True, attention=self.has_attention,
                            restriction=self.has_restriction)

    def join(self, src_ids: np.ndarray, src_lengths: np.ndarray, group: int = 1) -> slice:
        """Encode new sources and add their Bs x group rows at the end of the running batch, at
        position 0, while the other rows go on at theirs (in-flight batching); a longer source
        widens every source's cross K/V and mask (padding, masked). Returns the new rows."""
        if not self.live or self.rows == 0:
            self.start(src_ids, src_lengths, group)
            return slice(0, self.rows)
        if group != self.group:
            raise InputError(f"a request of {group} rows a source cannot join a batch of {self.group} rows a source")
        Bs, S = src_ids.shape
        H, D = self.kv_heads, self.head_dim
        old_src = self.cross.shape[2]
        new: HostRows | DeviceRows
        if self.ops is None:
            new = HostRows(len(self.cross_names), (Bs, H, S, D), self.kv_dtype)
        else:
            new = DeviceRows(self.ops, len(self.cross_names), self.kv_dtype.itemsize)
            new.reset((Bs, H, S, D), zero=False)
        mask = np.empty((Bs, S), np.float32)
        try:
            self.encode(src_ids, src_lengths, new.addresses(), mask)
        except Exception as e:
            if self.ops is not None:
                new.release()
            # nothing of the running batch was touched: only the joiners fail (Scheduler.admit reads it)
            raise JoinRefused(f"the joining sources failed to encode: {type(e).__name__}: {e}") from e
        sources = self.cross.add(Bs, S)
        width = self.cross.shape[2]
        self.cross.fill(sources, new)  # host rows into host rows, device rows into device rows
        if isinstance(new, DeviceRows):
            new.release()
        grown = np.full((self.mask.shape[0] + Bs, width), MASK_VALUE, np.float32)
        grown[:self.mask.shape[0], :old_src] = self.mask
        grown[self.mask.shape[0]:, :S] = mask
        self.mask = grown
        rows = self.cache.add(Bs * group)
        if len(self.ids_buf) < self.rows or (self.attention_buf is not None and self.attention_buf.shape[1] != width):
            self.buffers(self.rows, width, self.positions)
        self.positions_buf[rows] = 0  # spare rows of the buffers may hold a row that left
        self.bind_rows()
        return rows

    def bind_rows(self) -> None:
        """Follow the rows (after start, a gather, a growth): the per-row views, and every
        decoder-step graph bound anew at its next run (step_binding)."""
        R = self.rows
        self.ids, self.next_ids = self.ids_buf[:R], self.next_buf[:R]
        self.positions, self.min_new = self.positions_buf[:R], self.min_new_buf[:R]
        self.logits = None if self.logits_buf is None else self.logits_buf[:R]
        if self.attention_buf is not None:  # has_attention: (rows, src_len), on the host on every device
            self.attention_rows = self.attention_buf[:R]
        self.bound = {}

    def settle(self, graph: str) -> None:
        """The decoder-step session opened at load is a guess from the bundle's defaults; the first
        decoder step releases it if it runs another graph, with its prepacked weights (docs/design.md,
        "The rest of the memory"). A later decode that asks for it opens it again, once."""
        guess, self.guess = self.guess, None
        if guess is not None and guess != graph:
            self.forget(guess)
            self.graphs.pop(guess, None)
            del self.sessions[guess]

    def forget(self, graph: str) -> None:
        """Drop `graph`'s bindings: it is bound anew at its next run."""
        self.bound = {key: b for key, b in self.bound.items() if key[0] != graph}

    def step_binding(self, graph: str):
        """The IOBinding of the decoder-step graph `graph` (DECODER, RESTRICTED or DECODER_BEAM)
        over the current rows and buffers: made at its first run over them after bind_rows, then
        reused. A device's beam reorder (DeviceRows.gather) moves the cache into the other of its
        two buffer sets with the rows unchanged: the binding of each set is kept (issue 41: the
        binding made anew after every gather was 1.24 ms of a 4 ms beam step at 32 sources)."""
        if self.guess is not None:
            self.settle(graph)
        key = (graph, self.cache.addresses()[0], self.cache.shape, self.cross.addresses()[0], self.cross.shape)
        dec = self.bound.get(key)
        if dec is not None:
            return dec
        dec = (self.restricted_session() if graph == RESTRICTED else self.graph_session(graph)).io_binding()
        if self.capture and graph == DECODER:  # its layout recorded: the graph id it is captured as
            dec = LayoutBinding(dec)
        self.bound[key] = dec
        R, inputs = self.rows, self.inputs  # inputs where the session reads them at each run (step_inputs.py)
        inputs.bind(dec, "input_ids", self.ids, each_step=True)
        inputs.bind(dec, "positions", self.positions, each_step=True)
        inputs.bind(dec, "src_mask", self.mask)  # changes only with the rows: bound anew then
        if graph == RESTRICTED:  # the restricted decoder: the subset's rows of the table in, its logits out
            inputs.bind(dec, "out_weight", self.sub_weight)
            inputs.bind(dec, "out_bias", self.sub_bias)
            self.sub_logits, self.device_logits = self.sub_logits_buf[:R], None
            bind_host(dec, "output", "logits", self.sub_logits)
            self.bind_kv(dec)
            return dec
        inputs.bind(dec, "min_new_tokens", self.min_new, each_step=True)
        if self.attention_buf is not None:
            self.bind_output(dec, "attention", self.attention_rows)
        if graph == DECODER_BEAM:  # only (rows, K) candidates leave it, into host buffers on every device
            assert self.cand_bufs is not None  # beam_step() sized them before binding
            inputs.bind(dec, "num_candidates", self.num_candidates)
            self.bind_output(dec, "cand_logprobs", self.cand_bufs[0][:R])
            self.bind_output(dec, "cand_ids", self.cand_bufs[1][:R])
        else:
            self.bind_output(dec, "next_ids", self.next_ids)
            if self.logits is not None:  # logits in a host buffer; on CUDA they stay on the device unless asked for
                bind_host(dec, "output", "logits", self.logits)
            else:
                # a device buffer of the step inputs': its address, and so a captured layout, recurs
                self.device_logits = inputs.address("logits", R * self.vocab * 4)
                dec.bind_output("logits", self.ort_device, 0, np.float32, [R, self.vocab], self.device_logits)
        self.bind_kv(dec)
        return dec

    def bind_output(self, dec, name: str, array: np.ndarray) -> None:
        """A step output read on the host: bound in place (ONNX Runtime copies it back after each
        run), or, for a captured graph, a device buffer fetched after the run (run_step)."""
        if isinstance(dec, LayoutBinding):
            self.inputs.bind_output(dec, name, array)
        else:
            bind_host(dec, "output", name, array)

    def run_step(self, session, graph: str, dec) -> None:
        """Run a decoder-step graph's binding; captured, as the graph id of its layout."""
        if isinstance(dec, LayoutBinding):
            session.run_with_iobinding(dec, self.captured_options(graph, dec))
            dec.synchronize_outputs()
            self.inputs.fetch(dec)
            return
        session.run_with_iobinding(dec)
        dec.synchronize_outputs()

    def captured_options(self, graph: str, binding: LayoutBinding):
        """The RunOptions of a captured session's binding: its layout's graph id (cuda_graphs.py)."""
        graphs = self.graphs.get(graph)
        if graphs is None:
            graphs = self.graphs[graph] = CapturedGraphs(self.ort)
        return graphs.options(binding)

    def bind_kv(self, dec) -> None:
        """The cross K/V and the cache in, the new position's K/V out."""
        self.bind_tensors(dec, "input", self.cross_names, self.cross.addresses(), self.cross.shape)
        self.bind_tensors(dec, "input", self.cache_names, self.cache.addresses(), self.cache.shape)
        self.bind_tensors(dec, "output", self.new_names, self.cache.new_addresses(), (*self.cache.shape[:2], 1,
                                                                                     self.head_dim))

    def bind_tensors(self, binding, kind: str, tensors: list[str], addresses: list[int], shape) -> None:
        bind = binding.bind_input if kind == "input" else binding.bind_output
        for name, ptr in zip(tensors, addresses):
            bind(name, self.ort_device, 0, self.kv_dtype, list(shape), ptr)

    def step(self, input_ids, min_new_tokens, want_logits=False, beam_idx=None, candidates: int = 0):
        """Each row at its own position (0 after start or join, one more each step). min_new_tokens:
        an int for every row or one per row. With candidates K: the second value is each row's K
        best (log-probs (R, K), ids (R, K)) instead of the logits."""
        if not self.live:
            raise XformError("step(): no decode is running (start() or join() first; or the last start failed)")
        if beam_idx is not None:
            self.gather(np.ascontiguousarray(beam_idx, dtype=np.int64))
        top = int(self.positions.max())
        if top == self.cache.capacity:
            self.cache.grow(grown_capacity(top, self.max_len), top)
            self.bind_rows()
        self.ids[:, 0] = input_ids
        self.min_new[:] = min_new_tokens
        subset = self.subset
        if candidates and subset is None and self.fused_beams:
            return self.beam_step(candidates)
        dec = self.step_binding(DECODER if subset is None else RESTRICTED)
        self.inputs.refresh()
        if self.ops is not None:
            self.ops.sync()  # the cache copies ran on the default stream: done before the graph reads
            dec.synchronize_inputs()
        if subset is not None:
            self.run_step(self.restricted_session(), RESTRICTED, dec)
            self.cache.write(self.positions)
            out = self.restricted_outputs(subset, want_logits, candidates)
            self.positions += 1
            return out
        self.run_step(self.decoder, DECODER, dec)
        self.cache.write(self.positions)
        if candidates:
            out = self.next_ids.copy(), self.run_candidates(candidates)
        elif not want_logits:
            out = self.next_ids.copy(), None
        else:
            out = self.next_ids.copy(), (self.logits.copy() if self.logits is not None else self.fetch_logits())
        self.positions += 1
        return out

    def fetch_logits(self) -> np.ndarray:
        """The step's logits, left on the device (self.device_logits), copied to the host."""
        assert self.ops is not None and self.device_logits is not None
        logits = np.empty((self.rows, self.vocab), np.float32)
        self.ops.download(logits, self.device_logits)
        self.ops.sync()
        return logits

    def attention(self) -> np.ndarray:
        """The last step's attention output (rows, src_len): its decoder layer's cross-attention,
        averaged over heads. Only for a bundle exported --with-attention."""
        if not self.has_attention or not self.live:
            raise XformError("no attention to return: this bundle was exported without the decoder's attention "
                             "(xform export MODEL -o BUNDLE --with-attention), or no decode is running")
        return self.attention_rows.copy()
