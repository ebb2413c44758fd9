"""`xform build-engine`: TensorRT engines from a bundle's ONNX graphs (docs/cli.md, build-engine).

Strongly typed networks (precision comes from the graph), one optimization profile over batch,
source length and cache capacity derived from the graph contract and the flags, TF32 cleared unless
asked, a workspace limit, the builder optimization level, a timing cache where the flavour has
one, every status checked. Works with `tensorrt` (10.12+ / 11; needs a GPU to build) and
`tensorrt_rtx` (builds ahead of time without a GPU) through the same calls.
It does not run engines (xform/runtime/backends/trt_backend.py does).
"""
from __future__ import annotations

import hashlib
import logging
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

from xform.contract import CANDIDATES, GRAPHS, REORDER, GraphSpec, TensorSpec
from xform.errors import BackendUnavailableError, BundleError, XformError
from xform.files import atomic_write, remove_stale_temporaries
from xform.manifest import ENGINE_DIR, ENGINE_FILE, EngineEntry, Manifest
from xform.runtime.backends.gpu import gpu_info, import_tensorrt
from xform.runtime.bundle import Bundle

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProfileRanges:
    """min / opt / max of every dynamic axis of the contract."""
    batch: tuple[int, int, int]  # decoded rows: sources x beams
    src_len: tuple[int, int, int]
    cache_len: tuple[int, int, int]
    src_batch: tuple[int, int, int]  # sources

    def shapes(self, spec: TensorSpec) -> tuple[tuple[int, ...], ...]:
        """(min, opt, max) shapes of one input: named axes from the ranges, fixed ones as they are."""
        axes = asdict(self)
        return tuple(tuple(axes[a][k] if isinstance(a, str) else a for a in spec.shape) for k in range(3))

    def for_graph(self, graph: str) -> "ProfileRanges":
        """The reorder graph gathers the cache (cache_len positions) and, when sources leave the
        batch, the cross K/V (src_len positions) through the same axis."""
        if graph != REORDER:
            return self
        lo, opt, hi = self.cache_len
        return replace(self, cache_len=(lo, opt, max(hi, self.src_len[2])))

    def to_dict(self) -> dict[str, list[int]]:
        return {k: list(v) for k, v in asdict(self).items()}


def profile_ranges(max_len: int, max_batch: int = 16, max_src_len: int | None = None,
                   max_new_tokens: int | None = None, opt_batch: int | None = None,
                   opt_src_len: int | None = None, max_beams: int = 1) -> ProfileRanges:
    """Ranges from the flags, defaults from the model's max_len; every inconsistency reported at once.

    The batch axis holds sources x beams: its maximum is max_batch x max_beams (beam search and
    sampling decode that many rows; the encoder runs on the expanded sources once).
    The cache capacity runs from 1 to max_new_tokens (the runtime grows it by doubling, so a short
    decode attends over a short cache).
    """
    max_src_len = max_len if max_src_len is None else max_src_len
    max_new_tokens = max_len if max_new_tokens is None else max_new_tokens
    opt_batch = min(8, max_batch) if opt_batch is None else opt_batch
    opt_src_len = min(32, max_src_len) if opt_src_len is None else opt_src_len
    problems = []
    for flag, v in (("--max-batch", max_batch), ("--max-beams", max_beams), ("--max-src-len", max_src_len),
                    ("--max-new-tokens", max_new_tokens),
                    ("--opt-batch", opt_batch), ("--opt-src-len", opt_src_len)):
        if v < 1:
            problems.append(f"{flag} must be at least 1, got {v}")
    if opt_batch > max_batch:
        problems.append(f"--opt-batch {opt_batch} exceeds --max-batch {max_batch}")
    if opt_src_len > max_src_len:
        problems.append(f"--opt-src-len {opt_src_len} exceeds --max-src-len {max_src_len}")
    if max_src_len > max_len:
        problems.append(f"--max-src-len {max_src_len} exceeds the model's max_len {max_len}")
    if max_new_tokens > max_len:
        problems.append(f"--max-new-tokens {max_new_tokens} exceeds the model's max_len {max_len}")
    if problems:
        raise XformError("inconsistent engine profile:\n  - " + "\n  - ".join(problems))
    return ProfileRanges((1, opt_batch, max_batch * max_beams), (1, opt_src_len, max_src_len),
                         (1, max(1, max_new_tokens // 2), max_new_tokens), (1, opt_batch, max_batch))


@dataclass
class BuildOptions:
    tf32: bool = False
    workspace_mib: int = 1024
    builder_optimization_level: int = 3
    timing_cache: Path | None = None


def make_logger(trt: Any):
    class Logger(trt.ILogger):
        """Keeps errors for the exception message; forwards everything to logging."""

        def __init__(self):
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity, msg):
            if severity in (trt.ILogger.Severity.ERROR, trt.ILogger.Severity.INTERNAL_ERROR):
                self.errors.append(msg)
                log.error("TensorRT: %s", msg)
            elif severity == trt.ILogger.Severity.WARNING and "Int64 binding" not in msg:
                # (the parser's reminder to bind int64 tensors as int64 is what the runtime does)
                log.warning("TensorRT: %s", msg)
            else:
                log.debug("TensorRT: %s", msg)
    return Logger()


def make_progress_monitor(trt, callback: Callable[[str, int, int], None]):
    class Monitor(trt.IProgressMonitor):
        """Reports (phase, steps done, steps in phase) for the top-level phases."""

        def __init__(self):
            trt.IProgressMonitor.__init__(self)
            self.totals: dict[str, int] = {}

        def phase_start(self, phase_name, parent_phase, num_steps):
            self.totals[phase_name] = num_steps
            if parent_phase is None:
                callback(phase_name, 0, num_steps)

        def step_complete(self, phase_name, step):
            if phase_name in self.totals:
                callback(phase_name, step + 1, self.totals[phase_name])
            return True  # keep building

        def phase_finish(self, phase_name):
            total = self.totals.pop(phase_name, 0)
            callback(phase_name, total, total)
    return Monitor()


TRT_DTYPES = {"FLOAT": "float32", "HALF": "float16", "INT64": "int64", "INT32": "int32", "BOOL": "bool",
              "BF16": "bfloat16", "INT8": "int8"}


def dtype_name(trt_dtype) -> str:
    return TRT_DTYPES.get(trt_dtype.name, trt_dtype.name.lower())


def network_io(network) -> dict[str, list[dict[str, Any]]]:
    def tensor(t):
        return {"name": t.name, "dtype": dtype_name(t.dtype), "shape": list(t.shape)}
    return {"inputs": [tensor(network.get_input(i)) for i in range(network.num_inputs)],
            "outputs": [tensor(network.get_output(i)) for i in range(network.num_outputs)]}


def check_network_against_contract(io: dict, spec: GraphSpec, onnx_path: Path) -> None:
    """The parsed network must have exactly the contract's tensors, dtypes and fixed dims."""
    problems = []
    for kind, specs in (("inputs", spec.inputs), ("outputs", spec.outputs)):
        got = {t["name"]: t for t in io[kind]}
        if list(got) != [t.name for t in specs]:
            problems.append(f"{kind}: expected {[t.name for t in specs]}, parsed {list(got)}")
            continue
        for t in specs:
            g = got[t.name]
            if g["dtype"] != t.dtype:
                problems.append(f"{t.name}: dtype {g['dtype']}, contract says {t.dtype}")
            want = [-1 if isinstance(a, str) else a for a in t.shape]
            if g["shape"] != want:
                problems.append(f"{t.name}: shape {g['shape']}, contract says {want}")
    if problems:
        raise BundleError(f"{onnx_path}: the parsed TensorRT network does not match the bundle's contract: "
                          + "; ".join(problems))


def build_engine(trt, onnx_path: Path, spec: GraphSpec, ranges: ProfileRanges, options: BuildOptions,
                 flavor: str, progress: Callable[[str, int, int], None] | None = None) -> tuple[bytes, dict]:
    """Parse, configure, build and serialize one engine; returns (engine bytes, build record)."""
    logger = make_logger(trt)
    builder = trt.Builder(logger)
    if builder is None:
        raise XformError(f"{flavor}: could not create a builder: {' '.join(logger.errors)}")
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise XformError(f"{onnx_path}: {flavor} cannot parse the graph: " + "; ".join(errors or logger.errors))
    io = network_io(network)
    check_network_against_contract(io, spec, onnx_path)

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_mib << 20)
    config.builder_optimization_level = options.builder_optimization_level
    if options.tf32:
        config.set_flag(trt.BuilderFlag.TF32)
    else:
        config.clear_flag(trt.BuilderFlag.TF32)
    profile = builder.create_optimization_profile()
    tensor_profiles = {}
    for t in spec.inputs:
        if not t.dynamic_axes():
            continue
        lo, opt, hi = ranges.shapes(t)
        profile.set_shape(t.name, lo, opt, hi)
        tensor_profiles[t.name] = [list(lo), list(opt), list(hi)]
    if config.add_optimization_profile(profile) < 0:
        raise XformError(f"{onnx_path}: {flavor} rejected the optimization profile {ranges.to_dict()}: "
                         + " ".join(logger.errors))
    timing_cache = options.timing_cache if flavor == "tensorrt" else None
    if timing_cache is not None:
        data = timing_cache.read_bytes() if timing_cache.is_file() else b""
        cache = config.create_timing_cache(data)
        if cache is None or not config.set_timing_cache(cache, False):
            raise XformError(f"--timing-cache {timing_cache}: TensorRT could not use it")
    if progress is not None:
        config.progress_monitor = make_progress_monitor(trt, progress)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise XformError(f"{onnx_path}: {flavor} failed to build an engine: " + " ".join(logger.errors))
    if timing_cache is not None:  # the builder's cache, with what this build timed
        atomic_write(timing_cache, bytes(config.get_timing_cache().serialize()))
    # what the engine was built with, read back from the builder config, not the request
    record = {"io": io, "tensor_profiles": tensor_profiles, "tf32": bool(config.get_flag(trt.BuilderFlag.TF32)),
              "workspace_mib": config.get_memory_pool_limit(trt.MemoryPoolType.WORKSPACE) >> 20,
              "builder_optimization_level": config.builder_optimization_level}
    return bytes(serialized), record


def engine_key(graph: str, flavor: str) -> str:
    return f"{graph}.{flavor}"


def remove_unreferenced_engines(engine_dir: Path, manifest: Manifest) -> None:
    """Engine files the manifest no longer names (replaced by a rebuild, or written by a build
    killed before its manifest), and temporaries of killed builds."""
    remove_stale_temporaries(engine_dir, any_target=True)
    used = {Path(e.file).name for e in manifest.engines.values()}
    for p in engine_dir.glob("*.engine"):  # only names engine builds write: never a file of someone else's
        if p.name not in used and ENGINE_FILE.fullmatch(f"{ENGINE_DIR}/{p.name}"):
            p.unlink(missing_ok=True)


def check_build(options: BuildOptions, flavor: str) -> dict | None:
    """The build options checked against what they may be and this machine; its GPU, if any."""
    if not 0 <= options.builder_optimization_level <= 5:
        raise XformError(f"--builder-opt-level {options.builder_optimization_level}: expected 0 to 5")
    if options.workspace_mib < 1:
        raise XformError(f"--workspace {options.workspace_mib}: expected at least 1 MiB")
    gpu = gpu_info()
    if flavor == "tensorrt" and gpu is None:
        raise BackendUnavailableError(
            "tensorrt builds engines on an NVIDIA GPU and this machine has none; use --flavor tensorrt_rtx "
            "(pip install tensorrt-rtx), which builds ahead of time without a GPU")
    if options.timing_cache is not None and flavor != "tensorrt":
        log.warning("--timing-cache: %s has no timing cache (its timing cache calls are no-ops); ignored", flavor)
    return gpu


def engine_target(gpu: dict | None, flavor: str) -> dict:
    """What the engines run on: TensorRT's the GPU they were built on, TensorRT-RTX's any RTX GPU."""
    if gpu and flavor == "tensorrt":
        return {"gpu": gpu["name"], "compute_capability": gpu["compute_capability"]}
    return {"gpu": gpu["name"] if gpu else None,
            "compute_capability": "portable (TensorRT-RTX ahead-of-time default: every supported "
                                  "RTX GPU of compute capability 8.0 or newer)"}


def refuse_onnxruntime_only(bundle: Bundle) -> None:
    """Refuse a bundle whose graphs hold ONNX Runtime's own quantized operators."""
    if bundle.precision == "int8":
        raise XformError(f"{bundle.path}: an int8 bundle holds ONNX Runtime's dynamic quantization, which TensorRT "
                         "does not build; build engines from an fp32 or fp16 export (xform export --precision fp16)")
    if bundle.weights is not None:
        raise XformError(f"{bundle.path}: its MatMul weights are {bundle.weights} (export --weights: ONNX Runtime's "
                         "MatMulNBits), which TensorRT does not parse; build engines from an export without --weights")
    if bundle.fusions:
        raise XformError(f"{bundle.path}: its decoder graphs hold ONNX Runtime's fused operators (export --fuse "
                         f"{','.join(bundle.fusions)}), which TensorRT does not parse; build engines from an export "
                         "without --fuse")


def build_engines(bundle_dir: str | Path, flavor: str = "auto", ranges: ProfileRanges | None = None,
                  options: BuildOptions | None = None, force: bool = False,
                  progress: Callable[[str, str, int, int], None] | None = None,
                  **range_flags) -> dict[str, EngineEntry]:
    """Build the encoder and decoder engines of a bundle and record them in its manifest."""
    bundle = Bundle.open(bundle_dir)  # refuses files that fail their hashes
    refuse_onnxruntime_only(bundle)
    trt, flavor = import_tensorrt(flavor)
    options = options or BuildOptions()
    gpu = check_build(options, flavor)
    ranges = ranges or profile_ranges(bundle.config.max_len, **range_flags)
    engine_dir = bundle.path / ENGINE_DIR
    # the candidates graph runs on ONNX Runtime only: its TopK width is a runtime input, which
    # TensorRT takes as a shape tensor; the TensorRT backend ranks beam candidates on the host
    graphs = [g for g in GRAPHS if bundle.has_graph(g) and g != CANDIDATES]
    existing = [bundle.path / bundle.manifest.engines[engine_key(g, flavor)].file for g in graphs
                if engine_key(g, flavor) in bundle.manifest.engines]
    if existing and not force:
        raise BundleError(f"{', '.join(map(str, existing))}: already built; pass --force to rebuild")
    built: dict[str, tuple[bytes, dict]] = {}
    for graph in graphs:
        cb = (lambda phase, done, total, g=graph: progress(g, phase, done, total)) if progress else None
        built[graph] = build_engine(trt, bundle.graph_file(graph), bundle.graph_spec(graph),
                                    ranges.for_graph(graph), options, flavor, cb)
    target = engine_target(gpu, flavor)
    engine_dir.mkdir(exist_ok=True)
    manifest = bundle.manifest
    # A new engine gets a new file name (its content hash), so the manifest on disk always names
    # files that match it: a build killed before the manifest is written leaves the old engines
    # in use and only unreferenced files behind, removed by the next build.
    targets = {g: engine_dir / f"{engine_key(g, flavor)}.{hashlib.sha256(data).hexdigest()[:12]}.engine"
               for g, (data, _) in built.items()}
    written = []
    try:
        for graph, (data, record) in built.items():
            atomic_write(targets[graph], data)
            written.append(targets[graph])
            onnx_name = manifest.graphs[graph].file
            manifest.engines[engine_key(graph, flavor)] = EngineEntry(
                file=f"{ENGINE_DIR}/{targets[graph].name}", graph=graph, flavor=flavor,
                tensorrt_version=trt.__version__, target=target, profile=ranges.for_graph(graph).to_dict(),
                onnx=onnx_name, onnx_sha256=manifest.files[onnx_name],
                onnx_data_sha256=manifest.files.get(f"{onnx_name}.data"), precision=bundle.precision,
                # from the ranges built, whether given as ranges= or as flags
                max_sources=ranges.src_batch[2], max_beams=max(1, ranges.batch[2] // ranges.src_batch[2]),
                details={"strongly_typed": True, "bytes": len(data),
                         "timing_cache": str(options.timing_cache) if options.timing_cache and flavor == "tensorrt"
                         else None, **record})
        manifest.write(bundle.path)
    except BaseException:
        for p in written:
            p.unlink(missing_ok=True)
        if engine_dir.exists() and not any(engine_dir.iterdir()):
            shutil.rmtree(engine_dir)
        raise
    remove_unreferenced_engines(engine_dir, manifest)
    return {engine_key(g, flavor): manifest.engines[engine_key(g, flavor)] for g in graphs}
