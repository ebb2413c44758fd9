"""The Python API: `xform.load` makes a Session on a backend; `xform.check` compares it with eager;
`xform.Translator` opens a bundle as CTranslate2's constructor opens a model directory.

Backends are imported when asked for: `ort` needs onnxruntime only, `torch` needs torch and the
model (the reference), `trt` needs TensorRT and a GPU.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

from xform.errors import XformError
from xform.runtime.bundle import Bundle
from xform.runtime.documents.door import translate_document, translate_documents
from xform.runtime.fleet.catalog import holds_bundles
from xform.runtime.fleet.local import FleetTranslator
from xform.runtime.open import BACKENDS, DEVICES, default_device, open_session
from xform.runtime.session import Session
from xform.runtime.text.async_results import counts
from xform.runtime.text.translator import Translator as TextTranslator

__all__ = ["BACKENDS", "DEVICES", "default_device", "load", "check", "Translator", "FleetTranslator"]

# CTranslate2's compute types and the bundle precision each asks for ("default" and "auto": the
# bundle's own; int8 with 16-bit activations is the nearest an int8 bundle has, int8 x fp32)
COMPUTE_TYPES = {"float32": "fp32", "float16": "fp16", "int8": "int8", "int8_float32": "int8",
                 "int8_float16": "int8", "int8_bfloat16": "int8"}


def torch_backend(bundle, device: str, threads: int | None):
    from xform.models.backend import TorchBackend
    return TorchBackend.for_bundle(bundle, device, threads)


def load(bundle_dir: str | Path, backend: str = "ort", device: str | None = None,
         threads: int | None = None, cache_capacity: int | None = None, allow_tf32: bool = False,
         cuda_graph: bool | None = None) -> Session:
    """device: cpu or cuda; by default cpu for torch and ort, cuda for trt. `cache_capacity`:
    the positions the graph backends' self-attention cache starts with (doubled when full;
    default: on the CPU 16 for greedy rows and, for beams and samples, each batch's longest
    source + 8 rounded up to 16; on a device backend.INITIAL_CAPACITY). `allow_tf32`: ONNX
    Runtime on CUDA may run fp32 matmuls in TF32 (faster, logits about 1e-3 off; the check then
    judges fp32 by fp16's tolerance).
    `cuda_graph`: ONNX Runtime on CUDA captures the decoder step as a CUDA graph (2.3-3x the
    tokens/s on an H100, docs/gpu.md); False runs it uncaptured."""
    return open_session(bundle_dir, backend, device, threads, torch_factory=torch_backend,
                        cache_capacity=cache_capacity, allow_tf32=allow_tf32, cuda_graph=cuda_graph)


def check(bundle_dir: str | Path, backend: str = "ort", device: str | None = None, **kw):
    """xform.exporter.check.check: the backend against eager PyTorch (a CheckReport)."""
    from xform.exporter.check import check as run_check
    return run_check(bundle_dir, backend, device, **kw)


class Translator(TextTranslator):
    """`xform.Translator(bundle_dir)`: CTranslate2's `ctranslate2.Translator(model_path, device,
    device_index, compute_type, inter_threads, intra_threads)` over a bundle, so a CTranslate2
    user changes the import and the path. The bundle's precision is fixed at export: a
    `compute_type` other than "default" must name it. `backend` picks ONNX Runtime (ort, the
    default) or TensorRT (trt); `allow_tf32` lets fp32 matmuls on CUDA run in TF32 (off: fp32 is
    fp32); `cuda_graph` False runs ONNX Runtime's decoder step on CUDA uncaptured (see `load`).

    A directory of bundles (or a list of bundle paths) makes a FleetTranslator instead
    (runtime/fleet/local.py): `translate_batch(texts, src_lang=, tgt_lang=)` routed by language
    to bundles loaded on demand, at most `max_loaded` of them and `memory_budget` bytes,
    `pinned` ones never unloaded, through `pivot` where no bundle translates a pair; waiting at
    most `load_timeout` seconds for room; a bundle unused for `idle_unload` seconds is closed.
    docs/python.md lists where the arguments differ."""

    def __new__(cls, model_path: Any = None, *args: Any, **kwargs: Any) -> Any:  # None: copy / pickle
        if isinstance(model_path, (list, tuple)) or (isinstance(model_path, (str, Path))
                                                    and holds_bundles(Path(model_path))):
            return fleet(model_path, *args, **kwargs)  # not a Translator: __init__ is not called
        return super().__new__(cls)

    def __init__(self, model_path: str | Path, device: str = "cpu", device_index: int = 0,
                 compute_type: str = "default", inter_threads: int = 1, intra_threads: int = 0,
                 backend: str = "ort", allow_tf32: bool = False, cuda_graph: bool | None = None, *,
                 max_loaded: int | None = None, memory_budget: int | str | None = None, pinned: Iterable[str] = (),
                 pivot: str | None = "en", load_timeout: float = 60.0, idle_unload: float | None = None,
                 max_queued_batches: int = 0, flash_attention: bool = False, tensor_parallel: bool = False,
                 files: Any = None, glossary: Any = None, keep: str | Sequence[str] = ()):
        one_process(device_index, inter_threads)
        ct2_only(max_queued_batches, flash_attention, tensor_parallel, files)
        opening(model_path, intra_threads)
        given = [k for k, v in (("max_loaded", max_loaded), ("memory_budget", memory_budget),
                                ("pinned", tuple(pinned) or None), ("load_timeout", load_timeout != 60.0 or None),
                                ("pivot", pivot != "en" or None), ("idle_unload", idle_unload)) if v is not None]
        if given:
            raise XformError(f"{', '.join(given)}: for a directory of bundles; {model_path} is one bundle")
        bundle = Bundle.open(model_path)  # its precision is refused before any graph loads
        compute_type = device_compute_type(compute_type, device)
        if compute_type not in ("default", "auto", *compute_types_of(bundle)):
            raise XformError(f"compute_type {compute_type}: {model_path} is a {bundle.precision_label} bundle "
                             f"(compute_type default or {_ct2_name(bundle)}); export another "
                             "precision with `xform export --precision fp16 / int8` (or --weights int8 / int4)")
        self.opening = (bundle, backend, device, intra_threads or None, allow_tf32, cuda_graph)
        super().__init__(self.opened(), glossary=glossary, keep=keep)

    def translate_document(self, text: str, **options: Any) -> str:
        """A document translated (documents/door.py: sentences decoded together, layout kept)."""
        return translate_document(self, text, **options)

    def translate_documents(self, texts: Sequence[str], **options: Any) -> list[str]:
        """Documents translated as translate_document does one, their sentences decoded together."""
        return translate_documents(self, texts, **options)

    def opened(self):
        bundle, backend, device, threads, allow_tf32, cuda_graph = self.opening
        return open_session(bundle, backend, device, threads, torch_factory=torch_backend, allow_tf32=allow_tf32,
                            cuda_graph=cuda_graph)

    # -- CTranslate2's properties and model residency --------------------------------------------
    @property
    def device(self) -> str:
        return self.opening[2] or ("cuda" if self.opening[1] == "trt" else "cpu")

    @property
    def device_index(self) -> list[int]:
        return [0]  # one device, the first visible (CUDA_VISIBLE_DEVICES picks it)

    @property
    def compute_type(self) -> str:
        return _ct2_name(self.opening[0])

    @property
    def num_translators(self) -> int:
        return 1  # one batch at a time (inter_threads 1)

    @property
    def num_queued_batches(self) -> int:
        return counts(self)[0]  # asynchronous calls not started

    @property
    def num_active_batches(self) -> int:
        return counts(self)[1]  # asynchronous calls decoding

    @property
    def model_is_loaded(self) -> bool:
        return not isinstance(self.session, Unloaded)

    def unload_model(self, to_cpu: bool = False) -> None:
        """Free the model's memory (its ONNX Runtime or TensorRT sessions); `load_model()` opens it
        again. CTranslate2's `to_cpu` (keep a GPU model's weights in host memory) is accepted and
        frees it all: reopening reads the bundle from disk."""
        if self.model_is_loaded:
            self.session = Unloaded(self.opening[0].path)  # type: ignore[assignment]  # refuses every use

    def load_model(self, keep_cache: bool = False) -> None:
        """Open the model again after unload_model (nothing to do when it is loaded)."""
        if not self.model_is_loaded:
            self.session = self.opened()


class Unloaded:
    """A Translator's session after unload_model: every use is refused, saying how to load it."""

    def __init__(self, path) -> None:
        self.path = path

    def __getattr__(self, name: str):
        raise XformError(f"the model of this translator ({self.path}) was unloaded: call load_model() first")


def device_compute_type(compute_type: Any, device: str) -> str:
    """CTranslate2's compute_type: a name, or a dict of names by device ({"cuda": "float16",
    "cpu": "int8"}); the one for `device` ("default" where it names none)."""
    if isinstance(compute_type, dict):
        return str(compute_type.get(device or "cpu", "default"))
    if not isinstance(compute_type, str):
        raise XformError(f"compute_type: a name (default, float32, float16, int8) or a dict of names by device, got "
                         f"{type(compute_type).__name__}")
    return compute_type


def one_process(device_index: Any, inter_threads: int) -> None:
    """A Translator's device and threads: one GPU, one batch at a time."""
    if device_index not in (0, [0], (0,)):
        raise XformError(f"device_index {device_index}: a Translator uses one GPU, the first visible; choose it "
                         "with CUDA_VISIBLE_DEVICES")
    if inter_threads != 1:
        raise XformError(f"inter_threads {inter_threads}: a Translator decodes one batch at a time; run several "
                         "processes, or `xform corpus` for a file over workers")


def opening(model_path: Any, intra_threads: Any) -> None:
    """A Translator's path (a str or a Path) and thread count (an integer >= 0; 0: the default)."""
    if not isinstance(model_path, (str, Path)):
        raise XformError(f"model_path: a bundle directory (str or pathlib.Path), or a directory or list of bundles, "
                         f"got {type(model_path).__name__}")
    if isinstance(intra_threads, bool) or not isinstance(intra_threads, int) or intra_threads < 0:
        raise XformError(f"intra_threads must be an integer >= 0 (threads a batch; 0: the default), got "
                         f"{intra_threads!r}")


def ct2_only(max_queued_batches: Any, flash_attention: Any, tensor_parallel: Any, files: Any) -> None:
    """CTranslate2's constructor options xform does not build, accepted where off (docs/python.md)."""
    if isinstance(max_queued_batches, bool) or not isinstance(max_queued_batches, int) or max_queued_batches > 0:
        raise XformError(f"max_queued_batches {max_queued_batches!r}: asynchronous calls queue without a bound here "
                         "(0 or -1, CTranslate2's automatic and unlimited, are accepted)")
    if flash_attention:
        raise XformError("flash_attention: the backend (ONNX Runtime, TensorRT) chooses the attention kernels; "
                         "CTranslate2's flash attention is not offered")
    if tensor_parallel:
        raise XformError("tensor_parallel: a Translator runs on one GPU (device_index 0); run a process per GPU")
    if files is not None:
        raise XformError("files: a bundle is read from its directory, where its manifest checks its files; "
                         "in-memory model files are not offered")


def fleet(bundles: str | Path | Sequence[str | Path], device: str = "cpu", device_index: int = 0,
          compute_type: str = "default", inter_threads: int = 1, intra_threads: int = 0, backend: str = "ort",
          allow_tf32: bool = False, cuda_graph: bool | None = None, *, max_loaded: int | None = None,
          memory_budget: int | str | None = None, pinned: Iterable[str] = (), pivot: str | None = "en",
          load_timeout: float = 60.0, idle_unload: float | None = None, max_queued_batches: int = 0,
          flash_attention: bool = False, tensor_parallel: bool = False, files: Any = None, glossary: Any = None,
          keep: Any = ()) -> FleetTranslator:
    """`Translator(DIR)`: a FleetTranslator whose bundles open with the Translator's settings."""
    one_process(device_index, inter_threads)
    if glossary is not None or keep:
        raise XformError("glossary, keep: a translator's own terms are one language pair's, and a directory's "
                         "bundles translate many (some through a pivot); open the pair's bundle with them: "
                         "xform.Translator(PATH, glossary=...)")
    ct2_only(max_queued_batches, flash_attention, tensor_parallel, files)
    for one in [bundles] if isinstance(bundles, (str, Path)) else bundles:
        opening(one, intra_threads)
    if isinstance(pinned, str) or not isinstance(pinned, Iterable) or not all(isinstance(n, str) for n in pinned):
        raise XformError(f"pinned: a list of bundle names (str), got {pinned!r}")
    for name, value, low in (("max_loaded", max_loaded, 1), ("load_timeout", load_timeout, 0),
                             ("idle_unload", idle_unload, 0)):
        if (value is not None or name == "load_timeout") and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or value < low):
            raise XformError(f"{name} must be a number >= {low}, got {value!r}")
    if compute_type not in ("default", "auto"):
        raise XformError(f"compute_type {compute_type}: a directory's bundles each keep the precision they were "
                         "exported with (compute_type default)")

    def opener(path: Path) -> TextTranslator:
        return TextTranslator(open_session(path, backend, device, intra_threads or None, torch_factory=torch_backend,
                                           allow_tf32=allow_tf32, cuda_graph=cuda_graph))
    translator = FleetTranslator(bundles, opener, max_loaded, memory_budget, pinned, pivot, load_timeout,
                                 idle_unload)
    translator.documents = translate_documents  # translate_document(s) by the pair's one bundle
    return translator


def _ct2_name(bundle: Bundle) -> str:
    """The bundle's compute type in CTranslate2's words: fp16 with int8 weights is its int8_float16
    (int4 weights, which CTranslate2 does not have, int4_float16 in the same pattern)."""
    if bundle.weights:
        return f"{bundle.weights}_{'float16' if bundle.precision == 'fp16' else 'float32'}"
    return next(k for k, v in COMPUTE_TYPES.items() if v == bundle.precision)


def compute_types_of(bundle: Bundle) -> tuple[str, ...]:
    """The compute_type names that ask for this bundle (besides default / auto)."""
    if bundle.weights:
        return (_ct2_name(bundle),)
    return tuple(k for k, v in COMPUTE_TYPES.items() if v == bundle.precision)
