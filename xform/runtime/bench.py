"""Benchmark a Session: exactly `new_tokens` greedy tokens per row from random sources.

End-of-sentence is suppressed until `new_tokens` (min_new_tokens), so every backend and peer does
the same work. Reports tokens/s (median over iterations), per-token latency percentiles (one
decoder step is one token per row) and peak RSS of the process. Timing only; no assertions.
"""
from __future__ import annotations

import platform
import resource
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from xform.config import TransformerConfig
from xform.runtime.decoding.generation import GenerationConfig
from xform.runtime.session import Session


@dataclass
class BenchResult:
    backend: str
    precision: str
    strategy: str
    batch: int
    src_len: int
    new_tokens: int
    warmup: int
    iters: int
    tokens_per_s: float
    latency_ms_p50: float
    latency_ms_p90: float
    latency_ms_p99: float
    iteration_s_median: float
    peak_rss_mib: float
    machine: str

    def to_dict(self) -> dict:
        return asdict(self)


def cpu_model() -> str:
    """The CPU's model as the system names it ("AMD EPYC 9454 48-Core Processor", "Intel(R) Xeon(R)
    Platinum 8481C"): /proc/cpuinfo's model name on Linux, else platform.processor(), else the
    architecture."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_name() -> str:
    """The machine a benchmark ran on, as every benchmark table states it: CPU model, the cores this
    process may use, the widest SIMD (Linux), the OS and Python (docs/benchmarks.md: a ratio
    depends on the CPU, so a table says which one)."""
    import os
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    simd = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split() for ln in f if ln.startswith("flags")), [])
        simd = next((f", {s}" for s in ("avx512_vnni", "avx512f", "avx2") if s in flags), "")
    except OSError:
        pass
    return (f"{cpu_model()} ({platform.machine()}{simd}), {cores} cores, {platform.system()}, "
            f"Python {platform.python_version()}")


def proc_status_mib(field: str) -> float | None:
    """A memory field of /proc/self/status (VmRSS, VmHWM) in MiB; None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def rss_mib() -> float:
    """This process's resident set size now, MiB (Linux)."""
    rss = proc_status_mib("VmRSS")
    if rss is None:
        raise RuntimeError("no VmRSS in /proc/self/status")
    return rss


def peak_rss_mib() -> float:
    """This address space's resident high-water mark, MiB: VmHWM (ru_maxrss survives fork + exec
    on Linux, so a worker spawned by a large driver would report the driver's peak); elsewhere
    ru_maxrss."""
    hwm = proc_status_mib("VmHWM")
    if hwm is not None:
        return hwm
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1 << 20) if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB on Linux


def random_sources(config: TransformerConfig, batch: int, src_len: int, seed: int = 0) -> np.ndarray:
    """(batch, src_len) random source ids, none of them pad, start or end-of-sentence."""
    rng = np.random.default_rng(seed)
    special = {config.pad_id, config.bos_id, config.eos_id}
    allowed = np.array([i for i in range(config.src_vocab_size) if i not in special], np.int64)
    return allowed[rng.integers(0, len(allowed), (batch, src_len))]


def padded_sources(config: TransformerConfig, lengths, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random sources of the given lengths, each ending with end-of-sentence, right-padded: what
    --check and export's verification decode."""
    lengths = np.asarray(lengths, np.int64)
    ids = random_sources(config, len(lengths), int(lengths.max()), seed)
    for r, n in enumerate(lengths):
        ids[r, n - 1] = config.eos_id
        ids[r, n:] = config.pad_id
    return ids, lengths


def benchmark(session: Session, batch: int = 1, src_len: int = 32, new_tokens: int = 64, warmup: int = 2,
              iters: int = 10, on_iter: Callable[[int], None] | None = None,
              generation: GenerationConfig | None = None) -> BenchResult:
    """`generation` (greedy by default) is decoded with exactly `new_tokens` tokens per hypothesis;
    tokens/s counts batch x new_tokens (one answer per source, as the peers count)."""
    gen = (generation or GenerationConfig()).updated(max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    src = random_sources(session.config, batch, src_len)
    step_times: list[float] = []
    iter_times: list[float] = []
    for i in range(warmup + iters):
        last = [time.perf_counter()]
        times: list[float] = []

        def on_step(_step, times=times, last=last):
            now = time.perf_counter()
            times.append(now - last[0])
            last[0] = now

        t0 = last[0]
        out = session.run(session.request(src, generation=gen), on_step).ids
        elapsed = time.perf_counter() - t0
        assert out.shape == (batch * gen.num_return_sequences, new_tokens), out.shape  # forced length: an invariant
        if i >= warmup:
            iter_times.append(elapsed)
            step_times.extend(times)
        if on_iter is not None:
            on_iter(i)
    lat = np.array(step_times) * 1e3
    med = float(np.median(iter_times))
    return BenchResult(
        backend=session.backend_name, precision=session.bundle.precision_label if session.bundle else "fp32",
        strategy=f"beam {gen.num_beams}" if gen.strategy == "beam" else gen.strategy, batch=batch, src_len=src_len,
        new_tokens=new_tokens, warmup=warmup, iters=iters,
        tokens_per_s=batch * new_tokens / med, latency_ms_p50=float(np.percentile(lat, 50)),
        latency_ms_p90=float(np.percentile(lat, 90)), latency_ms_p99=float(np.percentile(lat, 99)),
        iteration_s_median=med, peak_rss_mib=peak_rss_mib(),
        machine=machine_name())
