"""`xform export`: MODEL -> bundle. Load, validate, export, verify, save; atomic, never overwriting.

The driver chains small steps: resolve the model (models.importers), trace both graphs
(graphs.py), check them with onnx, verify them on ONNX Runtime against eager (verify.py), copy
the reference checkpoint and tokenizer, and write the manifest with every file's hash.
"""
from __future__ import annotations

import json
import logging
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import onnx
import torch

from xform import __version__
from xform.contract import DECODER, ENCODER, signature_for
from xform.errors import ToleranceError, XformError
from xform.exporter.graphs import DEFAULT_OPSET, GRAPHS, MIN_OPSET, export_graph
from xform.exporter.verify import verify_graphs, verify_greedy
from xform.models.checkpoint import save_checkpoint
from xform.models.importers import LoadedModel, resolve_model
from xform.models.transformer import to_fp16
from xform.runtime.bundle import FORMAT, VERSION, Bundle, atomic_directory, refuse_existing, write_manifest
from xform.runtime.compare import tolerance_for

log = logging.getLogger(__name__)
PRECISIONS = ("fp32", "fp16")
KV_DTYPES = {"fp32": "float32", "fp16": "float16"}
PRECISION_PLANS = {
    "fp32": "everything in fp32",
    "fp16": "weights, matmuls, residual stream and KV cache in fp16; LayerNorm, softmax, the output "
            "projection (a tied embedding table with it) and logits in fp32; source mask fp32",
}
REFERENCE_DIR = "reference"


@dataclass
class ExportResult:
    path: Path
    manifest: dict


def check_graph(path: Path) -> None:
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as e:  # onnx raises several types; all mean an invalid graph
        raise XformError(f"{path.name}: the exported graph fails onnx.checker: {e}") from None


def export_bundle(model_ref: str | Path, out: str | Path, precision: str = "fp32", opset: int = DEFAULT_OPSET,
                  force: bool = False, loaded: LoadedModel | None = None, arch: str | None = None,
                  hparams: dict | None = None,
                  progress: Callable[[str], None] = lambda msg: None) -> ExportResult:
    out = Path(out)
    if precision not in PRECISIONS:
        raise XformError(f"--precision {precision!r} is not supported; choose from {PRECISIONS}")
    if opset < MIN_OPSET:
        raise XformError(f"--opset {opset} is too old; xform needs opset {MIN_OPSET} or newer (LayerNormalization)")
    refuse_existing(out, force)
    progress("loading model")
    loaded = loaded or resolve_model(model_ref, arch, hparams)
    model, cfg = loaded.model.eval(), loaded.model.cfg
    graph_model = to_fp16(model) if precision == "fp16" else model
    specs = signature_for(cfg.to_dict(), kv_dtype=KV_DTYPES[precision])
    tol = tolerance_for(precision)
    with atomic_directory(out, force) as tmp:
        for graph in GRAPHS:
            progress(f"exporting {graph} ({precision})")
            export_graph(graph_model, graph, specs[graph], tmp / f"{graph}.onnx", opset)
            check_graph(tmp / f"{graph}.onnx")
        save_checkpoint(model, tmp / REFERENCE_DIR)
        if loaded.tokenizer is not None:
            (tmp / "tokenizer.json").write_text(json.dumps(loaded.tokenizer, indent=1) + "\n")
            if loaded.tokenizer_files:
                (tmp / "tokenizer").mkdir()
                for f in loaded.tokenizer_files:
                    shutil.copyfile(f, tmp / "tokenizer" / f.name)
        manifest = {
            "format": FORMAT, "version": VERSION, "precision": precision, "opset": opset,
            "precision_plan": PRECISION_PLANS[precision],
            "model": {"config": cfg.to_dict(), "source": loaded.source},
            "graphs": {g: {"file": f"{g}.onnx", "signature": specs[g].to_dict()} for g in GRAPHS},
            "reference": {"dir": REFERENCE_DIR},
            "tokenizer": {"file": "tokenizer.json"} if loaded.tokenizer is not None else None,
            "tolerance": {"atol": tol.atol, "rtol": tol.rtol, "min_token_agreement": tol.min_token_agreement,
                          "reason": tol.reason},
            "versions": {"xform": __version__, "torch": torch.__version__, "onnx": onnx.__version__,
                         "python": platform.python_version()},
            "engines": {},
        }
        write_manifest(tmp, manifest)
        progress("verifying against eager PyTorch on onnxruntime")
        manifest["verification"] = verify_bundle(model, Bundle.open(tmp), tol)
        write_manifest(tmp, manifest)
    log.info("exported %s", out)
    return ExportResult(out, manifest)


def verify_bundle(model, bundle: Bundle, tol) -> dict:
    """Graph by graph against eager; greedy tokens against the oracle (fp32: identical); then the
    teacher-forced check of `xform run --check`, which must pass."""
    import onnxruntime

    from xform.api import check
    from xform.runtime.ort_backend import OrtBackend
    from xform.runtime.session import Session

    backend = OrtBackend(bundle, "cpu")
    figures = verify_graphs(model, {ENCODER: backend.encoder, DECODER: backend.decoder},
                            {g: bundle.graph_spec(g) for g in GRAPHS}, tol)
    if tol.min_token_agreement == 1.0:
        figures.update(verify_greedy(model, Session(backend, bundle.config)))
    report = check(bundle.path, session=Session(backend, bundle.config, bundle=bundle), batch=8, src_len=12,
                   max_new_tokens=32)
    figures["check"] = report.to_dict()
    if not report.passed:
        raise ToleranceError(
            f"{bundle.precision} graphs fail the check against eager PyTorch: max abs logit error "
            f"{report.max_abs_err:.3g} (smallest passing atol {report.min_passing_atol:.3g} at rtol {report.rtol:g}, "
            f"allowed atol {report.atol:g}), token agreement {report.token_agreement:.2%} "
            f"(needed {report.min_token_agreement:.0%}), first divergence {report.first_divergence}")
    figures["onnxruntime"] = onnxruntime.__version__
    return figures
