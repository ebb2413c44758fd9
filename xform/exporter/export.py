"""`xform export`: MODEL -> bundle. Load, validate, export, verify, save; atomic, never overwriting.

The driver chains small steps: resolve the model (models.importers), trace the graphs
(graphs.py), check them with onnx, verify them on ONNX Runtime against eager (verify.py), copy
the reference checkpoint and tokenizer, and write the manifest with every file's hash.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import onnx
import torch

from xform import __version__
from xform.contract import CANDIDATES, DECODER, DECODER_BEAM, ENCODER, REORDER, RESTRICTED, WEIGHTLESS, signature_for
from xform.errors import CheckpointError, ToleranceError, XformError
from xform.exporter.beam_graph import share_decoder_data
from xform.exporter.fused import FUSED_GRAPHS, check_fusions
from xform.exporter.graphs import DEFAULT_OPSET, DYNAMO_MIN_OPSET, EXPORTERS, GRAPHS, MIN_OPSET, export_graph
from xform.exporter.verify import verify_graphs, verify_greedy
from xform.exporter.weights import WeightPlan, needs_onnxruntime, quantize_weights, weight_plan
from xform.files import atomic_directory, check_target
from xform.manifest import PRECISIONS, GraphEntry, Manifest, SharedWeight, TokenizerEntry, language_pairs, not_ours
from xform.models.checkpoint import save_checkpoint
from xform.models.importers import LoadedModel, resolve_model
from xform.models.transformer import to_fp16
from xform.models.vocab import VocabFiles, vocab_tokenizer
from xform.runtime.bundle import Bundle
from xform.runtime.compare import GROSS_TOKEN_AGREEMENT, Tolerance, tolerance_for

log = logging.getLogger(__name__)
KV_DTYPES = {"fp32": "float32", "fp16": "float16", "int8": "float32"}
PRECISION_PLANS = {
    "fp32": "everything in fp32",
    "fp16": "weights, matmuls, residual stream and KV cache in fp16; LayerNorm, softmax, the output "
            "projection (a tied embedding table with it) and logits in fp32; source mask fp32",
    "int8": "ONNX Runtime dynamic quantization of the fp32 graphs: MatMul and Gemm weights int8 (signed, 7-bit range, "
            "per tensor), their activations quantized on the fly; embedding lookups, LayerNorm, softmax, "
            "K/V and logits fp32. For ONNX Runtime on the CPU; TensorRT engines come from fp32 / fp16 bundles",
}
REFERENCE_DIR = "reference"
OUTPUT_TABLE = "output.safetensors"  # --with-vocab-map: the output projection's weight and bias, fp32


@dataclass
class ExportResult:
    path: Path
    manifest: Manifest


def quantize_graph(fp32: Path, out: Path) -> None:
    """int8 weights for MatMul / Gemm by ONNX Runtime's dynamic quantization; removes the fp32 input."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from xform.exporter.external_data import save_with_external_data

    unshare_quantized_weights(fp32)
    before = logging.root.manager.disable  # the caller's level, restored after
    logging.disable(max(before, logging.WARNING))  # the quantizer logs advice on the root logger
    try:
        # reduce_range: 7-bit weights. Without VNNI, x86 multiplies u8 x s8 pairs into int16 with
        # saturation; full-range weights overflowed on this AMD EPYC (demo encoder: error 0.27 of a
        # 0.6 scale, outside int8's tolerance), 7-bit weights cannot (error 6% of the scale).
        quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8, per_channel=False, reduce_range=True,
                         op_types_to_quantize=["MatMul", "Gemm"], extra_options={"MatMulConstBOnly": True},
                         use_external_data_format=True)
    finally:
        logging.disable(before)
    save_with_external_data(onnx.load(str(out)), out)  # our layout: one <name>.onnx.data beside it
    for p in (fp32, fp32.with_name(f"{fp32.name}.data")):
        p.unlink(missing_ok=True)
    for stray in out.parent.glob(f"{out.name}.data.*"):
        stray.unlink()


def unshare_quantized_weights(path: Path) -> None:
    """Give a MatMul / Gemm weight that other nodes also read (a tied embedding: Gather + the
    output Gemm) a copy of its own: the quantizer rewrites (transposes, int8s) the weights it
    quantizes in place, which would break the Gather."""
    import onnx

    from xform.exporter.external_data import save_with_external_data

    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    readers: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    changed = False
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        for k, name in enumerate(node.input[:2]):
            if name in inits and readers[name] > 1:
                copy = onnx.TensorProto()
                copy.CopyFrom(inits[name])
                copy.name = f"{name}.{node.op_type.lower()}_weight"
                model.graph.initializer.append(copy)
                node.input[k] = copy.name
                changed = True
    if changed:
        save_with_external_data(model, path)


def shared_weights(directory: Path, min_bytes: int = 1 << 20) -> list[SharedWeight]:
    """Initializers the decoder and another graph hold with identical bytes (the encoder: a shared
    embedding table; the restricted decoder and the fused beam step: every decoder layer): where
    the decoder's copy lies, for the runtime to map once and give every session that holds it
    (manifest `shared_weights`; ort_backend.py). Only tensors of at least `min_bytes`."""
    import hashlib

    import numpy as np

    def external(graph: str) -> dict[str, tuple]:
        proto = onnx.load(str(directory / f"{graph}.onnx"), load_external_data=False)
        found = {}
        for t in proto.graph.initializer:
            info = {e.key: e.value for e in t.external_data}
            if t.data_location == onnx.TensorProto.EXTERNAL and int(info.get("length", 0)) >= min_bytes:
                dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).name
                found[t.name] = (info["location"], int(info.get("offset", 0)), int(info["length"]), dtype, list(t.dims))
        return found

    digests: dict[tuple, str] = {}

    def digest(location: str, offset: int, length: int) -> str:
        if (location, offset) not in digests:
            with open(directory / location, "rb") as f:
                f.seek(offset)
                digests[location, offset] = hashlib.sha256(f.read(length)).hexdigest()
        return digests[location, offset]

    others = {g: external(g) for g in (ENCODER, RESTRICTED, DECODER_BEAM) if (directory / f"{g}.onnx").is_file()}
    out: list[SharedWeight] = []
    for name, (location, offset, length, dtype, dims) in external(DECODER).items():
        graphs = {DECODER: name}
        for graph, tensors in others.items():
            for other_name, (o_loc, o_off, o_len, o_dtype, o_dims) in tensors.items():
                if (o_len, o_dtype, o_dims) == (length, dtype, dims) and \
                        digest(o_loc, o_off, o_len) == digest(location, offset, length):
                    graphs[graph] = other_name
                    break
        if len(graphs) > 1:
            out.append(SharedWeight(location, offset, dtype, tuple(dims), graphs))
    return out


def check_graph(path: Path) -> None:
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as e:  # onnx raises several types; all mean an invalid graph
        raise XformError(f"{path.name}: the exported graph fails onnx.checker: {e}") from None


def judged_on(sample_file: Path | None, judge: bool, tol: Tolerance, batch: int) -> str:
    """What the export's check judged it on, for the manifest's tolerance.judged_on."""
    from xform.exporter.check import sample_used
    if sample_file:
        return f"--sample-file {Path(sample_file).name} ({sample_used(Path(sample_file), batch)})"
    if not judge:
        return UNJUDGED
    # a reduced precision (any tolerance short of fp32's identical tokens) is judged for gross breakage only
    return "random sources" + (" (gross breakage only)" if tol.min_token_agreement < 1.0 else "")


def export_bundle(model_ref: str | Path, out: str | Path, precision: str = "fp32", opset: int | None = None,
                  force: bool = False, loaded: LoadedModel | None = None, arch: str | None = None,
                  hparams: dict | None = None, vocab: VocabFiles | None = None,
                  max_new_tokens: int | None = None, attention_layer: int | None = None, vocab_map: bool = False,
                  progress: Callable[[str], None] = lambda msg: None, exporter: str = "torchscript",
                  sample_file: Path | None = None, judge: bool = True,
                  languages: "list[tuple[str, str]] | None" = None, weights: str | None = None,
                  fuse: str | Iterable[str] | None = None) -> ExportResult:
    """Export a model to a bundle at `out`. `attention_layer` (--with-attention): the decoder
    graph also returns that decoder layer's cross-attention (negative counts from the last), for
    alignments and --replace-unknowns. `vocab_map` (--with-vocab-map): also the restricted decoder
    graph and the output table (output.safetensors), for vocabulary restriction. `exporter`:
    torchscript (the default) or dynamo (torch.export + onnxscript; opset 18 or newer, its default).
    `sample_file` (--sample-file): sentences of the user's (or ids, one source a line, for a model
    without a tokenizer) the check judges the export on; without one, random sources, on which a
    reduced precision is judged for gross breakage only. `judge` False (--no-judgement, fp16 / int8 /
    --weights only): the reduced precision's check figures are recorded but refuse nothing, for speed
    benchmarks on random weights; the manifest's `tolerance.judged_on` says so and `run` warns.
    `opset` None: the exporter's default (17 / 18). `languages` (--languages): the (source, target)
    pairs it translates (runtime/text/languages.py). `weights` (--weights int8 / int4): weight-only MatMul
    weights (weights.py); `fuse` (--fuse): decoder graphs with ONNX Runtime's fused operators (fused.py)."""
    out = Path(out)
    pairs = declared_languages(languages)
    opset, versions, variant = export_options(precision, opset, exporter, judge, sample_file, weights, fuse)
    # before any work, and nothing of theirs is touched
    check_target(out, force, "bundle", not_ours, export_inputs(model_ref, vocab, sample_file))
    progress("loading model")
    loaded, notes = with_vocab(loaded or resolve_model(model_ref, arch, hparams), vocab, model_ref)
    model, cfg = loaded.model.eval(), loaded.model.cfg
    refuse_nonfinite(model, model_ref)
    generation = generation_defaults(loaded, max_new_tokens)
    attention_layer = decoder_layer(attention_layer, cfg.n_decoder_layers)
    specs = signature_for(cfg.to_dict(), kv_dtype=KV_DTYPES[precision], attention=attention_layer is not None)
    tol = tolerance_for(precision, weights=variant.weights.name if variant.weights else None)
    # the fused beam step after the decoder: its weights are the decoder's bytes (beam_graph.py)
    graphs = GRAPHS + (DECODER_BEAM,) + ((RESTRICTED,) if vocab_map else ())
    with atomic_directory(out, force, not_ours) as tmp:
        graph_model = to_fp16(model) if precision == "fp16" else model
        for graph in graphs:
            progress(f"exporting {graph} ({precision})")
            write_graph(graph_model, graph, specs[graph], tmp, precision, opset,
                        attention_layer if graph in (DECODER, DECODER_BEAM) else None, exporter, variant)
        write_files(tmp, model, loaded, vocab_map)
        manifest = Manifest(
            precision=precision, opset=opset, config=cfg, **variant.manifest_fields(precision),
            source=loaded.source, graphs={g: GraphEntry(f"{g}.onnx", specs[g]) for g in graphs},
            output_table=OUTPUT_TABLE if vocab_map else None, shared_weights=shared_weights(tmp),
            # the decoder layer whose cross-attention the decoder graph returns (--with-attention)
            attention_layer=attention_layer, reference_dir=REFERENCE_DIR,
            # decoding defaults of run / translate / generate; greedy unless the model ships others
            generation=generation,
            tokenizer=TokenizerEntry("tokenizer.json", tuple(notes)) if loaded.tokenizer is not None else None,
            tolerance=tolerance_record(tol), versions=versions, languages=pairs)
        manifest.write(tmp)
        manifest.verification = verify_bundle(model, Bundle.open(tmp), tol, sample_file, judge, progress)
        manifest.tolerance["judged_on"] = judged_on(sample_file, judge, tol,
                                                    manifest.verification["check"]["batch"])
        manifest.write(tmp)
    log.info("exported %s", out)
    return ExportResult(out, manifest)


def refuse_nonfinite(model: torch.nn.Module, model_ref: str | Path, most: int = 5) -> None:
    """Refuse a model whose weights (parameters or buffers) hold NaN or inf, naming each such
    tensor and its count, before any graph is exported (its graphs' outputs would be NaN, which
    the verification could only blame on ONNX Runtime)."""
    found = []
    for kind, named in (("weight", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, tensor in named:
            if not tensor.is_floating_point():
                continue
            nan = int(torch.isnan(tensor).sum())
            inf = int(torch.isinf(tensor).sum())
            if nan or inf:
                counts = " and ".join(f"{n:,} {what} value{'s' if n > 1 else ''}"
                                      for n, what in ((nan, "NaN"), (inf, "inf")) if n)
                found.append(f"{kind} {name} {tuple(tensor.shape)} holds {counts}")
    if found:
        more = f"; and {len(found) - most} more tensors" if len(found) > most else ""
        raise CheckpointError(f"{model_ref}: non-finite weights: {'; '.join(found[:most])}{more} (as xform names "
                              "the model's tensors). Its translations would be NaN: export a checkpoint whose "
                              "weights are finite (one saved before training diverged)")


def declared_languages(languages: "list[tuple[str, str]] | None") -> tuple[tuple[str, str], ...] | None:
    """--languages as the manifest's pairs (None: none declared), checked before any work."""
    pairs = None if languages is None else language_pairs(languages)
    if languages is not None and pairs is None:
        raise XformError(f"--languages {languages!r}: expected (source, target) pairs of two different language "
                         "codes, such as [('en', 'de')]")
    return pairs


UNJUDGED = "not judged (--no-judgement: figures recorded for a speed benchmark, quality unknown)"


@dataclass(frozen=True)
class GraphVariant:
    """How the graphs differ from their precision's plain ones: --weights and --fuse."""
    weights: WeightPlan | None = None
    fusions: tuple[str, ...] = ()

    def fusions_of(self, graph: str) -> tuple[str, ...]:
        return self.fusions if graph in FUSED_GRAPHS else ()

    def manifest_fields(self, precision: str) -> dict:
        return {"weights": self.weights.to_json() if self.weights else None, "fusions": self.fusions,
                "precision_plan": PRECISION_PLANS[precision] + (self.weights.plan if self.weights else "")}


PLAIN = GraphVariant()


def graph_variant(precision: str, exporter: str, weights: str | None, fuse: str | Iterable[str] | None
                  ) -> GraphVariant:
    """--weights and --fuse checked before any work."""
    fusions = check_fusions(fuse)
    if fusions and exporter != "torchscript":
        raise XformError(f"--fuse goes with --exporter torchscript (the default): its fused operators are traced "
                         f"through TorchScript's custom symbolics; found --exporter {exporter}")
    if fusions and precision == "int8":
        raise XformError("--fuse goes with --precision fp32 or fp16 (graphs for ONNX Runtime on CUDA); --precision "
                         "int8 is the CPU's, whose plain graphs are faster there (docs/benchmarks.md)")
    if fusions:
        needs_onnxruntime("--fuse", (1, 20))  # MultiHeadAttention's attention_bias input
    return GraphVariant(weight_plan(weights, precision), fusions)


def export_options(precision: str, opset: int | None, exporter: str, judge: bool, sample_file: Path | None,
                   weights: str | None = None, fuse: str | Iterable[str] | None = None
                   ) -> tuple[int, dict, GraphVariant]:
    """The flags checked before any work: the opset to write, the versions to record and the
    graphs' variant (--weights, --fuse)."""
    variant = graph_variant(precision, exporter, weights, fuse)
    plan = variant.weights
    if precision not in PRECISIONS:
        raise XformError(f"--precision {precision!r} is not supported; choose from {PRECISIONS}")
    if not judge and ((precision == "fp32" and plan is None) or sample_file is not None):
        raise XformError("--no-judgement goes with --precision fp16 / int8 or --weights, and no --sample-file (fp32 "
                         "graphs are always verified; a sample file is there to judge)")
    if exporter not in EXPORTERS:
        raise XformError(f"--exporter {exporter!r}: choose from {', '.join(EXPORTERS)}")
    least = DYNAMO_MIN_OPSET if exporter == "dynamo" else MIN_OPSET
    opset = opset if opset is not None else max(DEFAULT_OPSET, least)
    if opset < least:
        raise XformError(f"--opset {opset} is too old; xform needs opset {least} or newer "
                         + ("with --exporter dynamo (the oldest it writes)" if exporter == "dynamo"
                            else "(LayerNormalization)"))
    versions = {"xform": __version__, "torch": str(torch.__version__), "onnx": onnx.__version__,
                "python": platform.python_version(), "exporter": exporter}
    if exporter == "dynamo":
        try:
            import onnxscript
        except ImportError:
            raise XformError("--exporter dynamo needs onnxscript: pip install 'xform[dynamo]' "
                             "(or pip install onnxscript)") from None
        versions["onnxscript"] = onnxscript.__version__
    return opset, versions, variant


def export_inputs(model_ref, vocab: VocabFiles | None, sample_file: Path | None) -> list[tuple[str, Path]]:
    """The files the export reads, by flag: the target may not be (or hold) any of them."""
    inputs = [("MODEL", Path(model_ref))] if Path(model_ref).exists() else []
    inputs += [("--src-vocab", vocab.src), ("--tgt-vocab", vocab.tgt)] if vocab is not None else []
    if sample_file is not None:
        if not Path(sample_file).is_file():
            raise XformError(f"--sample-file {sample_file}: no such file")
        inputs.append(("--sample-file", Path(sample_file)))
    return inputs


def with_vocab(loaded: LoadedModel, vocab: VocabFiles | None, model_ref) -> tuple[LoadedModel, list]:
    """The model with the tokenizer of --src-vocab / --tgt-vocab (a model without its own), and
    the notes the manifest keeps about it."""
    if vocab is None:
        return loaded, []
    if loaded.tokenizer is not None:
        raise XformError(f"{model_ref}: has its own tokenizer; --src-vocab / --tgt-vocab are for models "
                         "without one")
    tokenizer, files, notes = vocab_tokenizer(vocab, loaded.model.cfg.to_dict())
    return dataclasses.replace(loaded, tokenizer=tokenizer, tokenizer_files=files), notes


def generation_defaults(loaded: LoadedModel, max_new_tokens: int | None) -> dict:
    """The decoding defaults the bundle records: the model's (greedy when it ships none), with
    --max-new-tokens."""
    generation = dict(loaded.generation or {"num_beams": 1, "source": "xform default (greedy)"})
    if max_new_tokens is not None:
        max_len = loaded.model.cfg.max_len
        if not 1 <= max_new_tokens <= max_len:
            raise XformError(f"--max-new-tokens {max_new_tokens}: expected 1 to the model's max_len {max_len}")
        generation["max_new_tokens"] = max_new_tokens
    return generation


def decoder_layer(attention_layer: int | None, n: int) -> int | None:
    """--attention-layer as a layer index (negative counts from the last)."""
    if attention_layer is None:
        return None
    if not -n <= attention_layer < n:
        raise XformError(f"--attention-layer {attention_layer}: this model has {n} decoder layers "
                         f"(0 to {n - 1}, or -1 for the last)")
    return attention_layer % n


def write_graph(graph_model, graph: str, spec, tmp: Path, precision: str, opset: int, layer: int | None,
                exporter: str, variant: GraphVariant = PLAIN) -> None:
    """One graph into the bundle being written: exported (--fuse: with fused operators; int8,
    --weights: then quantized), checked."""
    weights, fusions = variant.weights, variant.fusions_of(graph)
    if precision == "int8" and graph not in WEIGHTLESS:
        export_graph(graph_model, graph, spec, tmp / f".{graph}.fp32.onnx", opset, layer, exporter, fusions)
        quantize_graph(tmp / f".{graph}.fp32.onnx", tmp / f"{graph}.onnx")
    elif weights is not None and graph not in WEIGHTLESS:
        export_graph(graph_model, graph, spec, tmp / f".{graph}.full.onnx", opset, layer, exporter, fusions)
        quantize_weights(tmp / f".{graph}.full.onnx", tmp / f"{graph}.onnx", weights)
    else:
        export_graph(graph_model, graph, spec, tmp / f"{graph}.onnx", opset, layer, exporter, fusions)
    if graph == DECODER_BEAM:  # stored once: its initializers point into the decoder's data file
        share_decoder_data(tmp / f"{graph}.onnx", tmp / f"{DECODER}.onnx")
    check_graph(tmp / f"{graph}.onnx")


def write_files(tmp: Path, model, loaded: LoadedModel, vocab_map: bool) -> None:
    """The bundle's files beside its graphs: the output table (--with-vocab-map), the reference
    weights, the tokenizer."""
    if vocab_map:  # the rows the restricted decoder's projection takes, gathered per batch
        from safetensors.numpy import save_file
        weight, bias = model.output_table()
        save_file({"weight": weight.numpy(), "bias": bias.numpy()}, str(tmp / OUTPUT_TABLE))
    save_checkpoint(model, tmp / REFERENCE_DIR)
    if loaded.tokenizer is not None:
        (tmp / "tokenizer.json").write_text(json.dumps(loaded.tokenizer.to_json(), indent=1) + "\n")
        if loaded.tokenizer_files:
            (tmp / "tokenizer").mkdir()
            for f, name in loaded.tokenizer_files:
                shutil.copyfile(f, tmp / "tokenizer" / name)


def tolerance_record(tol) -> dict:
    """The manifest's record of the tolerance the export was judged by."""
    return {"atol": tol.atol, "rtol": tol.rtol, "min_token_agreement": tol.min_token_agreement,
            "beam_score_atol": tol.score_atol, "beam_score_rtol": tol.score_rtol,
            "judged_by": "decodes" if tol.by_decodes else "logits",
            **({"min_decode_agreement": tol.min_decode_agreement,
                "max_logprob_drop": tol.max_logprob_drop} if tol.by_decodes else {}),
            "reason": tol.reason}


def verify_bundle(model, bundle: Bundle, tol, sample_file: Path | None = None, judge: bool = True,
                  progress: Callable[[str], None] = lambda msg: None) -> dict:
    """Graph by graph against eager; greedy tokens against the oracle (fp32: identical); then the
    teacher-forced check of `xform run --check`, which must pass: on the sample file's sources when
    given, else on random ones (for a reduced precision: judged for gross breakage only; with
    `judge` False recorded, not judged). `progress` hears each stage as it starts."""
    import onnxruntime

    from xform.exporter.check import check, read_sample, sample_used
    from xform.runtime.backends.ort_backend import OrtBackend
    from xform.runtime.open import session_over
    from xform.runtime.session import Session

    progress("verifying: opening the graphs on onnxruntime")
    backend = OrtBackend(bundle, "cpu")
    sessions = {ENCODER: backend.encoder, DECODER: backend.decoder, REORDER: backend.reorder,
                CANDIDATES: backend.candidates}
    if bundle.has_graph(DECODER_BEAM):
        sessions[DECODER_BEAM] = backend.graph_session(DECODER_BEAM)
    if bundle.has_graph(RESTRICTED):
        sessions[RESTRICTED] = backend.restricted_session()
    progress(f"verifying: {len(sessions)} graphs one by one against eager PyTorch")
    figures = verify_graphs(model, sessions, {g: bundle.graph_spec(g) for g in sessions}, tol,
                            bundle.manifest.attention_layer)
    if tol.min_token_agreement == 1.0:
        progress("verifying: greedy tokens against eager PyTorch's")
        figures.update(verify_greedy(model, Session(backend, bundle.config)))
    session = session_over(bundle, backend)  # with the bundle's tokenizer: a sample file of text reads through it
    src_ids, src_lengths = read_sample(sample_file, session) if sample_file is not None else (None, None)
    progress("verifying: decoding and comparing step by step with eager PyTorch (the check of run --check)"
             + (f" on --sample-file {Path(sample_file).name}" if sample_file is not None else ""))
    report = check(bundle.path, session=session, batch=8, src_len=12, max_new_tokens=32, src_ids=src_ids,
                   src_lengths=src_lengths)
    figures["check"] = report.to_dict()
    on = (f"on {sample_used(Path(sample_file), report.batch)} of --sample-file {sample_file}"
          if sample_file is not None
          else f"on {report.batch} random sources, judged for gross breakage only")
    if not judge:
        log.warning("%s export not judged (--no-judgement): its figures are recorded, its quality is unknown",
                    bundle.precision_label)
        return figures
    refuse_failed(report, bundle.precision_label, on)
    if report.gross_only:
        log.warning("%s export judged on random token ids, which a trained model never sees: only gross breakage "
                    "is judged (NaNs, scale errors). Give --sample-file with sentences of yours to judge its "
                    "translations", bundle.precision_label)
    figures["onnxruntime"] = onnxruntime.__version__
    return figures


def refuse_failed(report, precision: str, on: str) -> None:
    """The verification's check failed: a ToleranceError with its figures (`on`: the sources)."""
    if not report.passed and report.judged_by == "decodes":
        raise ToleranceError(
            f"{precision} graphs translate unlike eager PyTorch ({on}): whole decodes "
            f"{report.decode_agreement:.2%} "
            f"alike over {report.decodes_compared} sources ("
            f"{'not judged' if report.gross_only else f'needed {report.min_decode_agreement:.0%}'}; identical "
            f"{report.decodes_identical:.2%}), eager's tokens lose {report.logprob_drop:.3g} nats each (allowed "
            f"{report.max_logprob_drop:g}), teacher-forced token agreement {report.token_agreement:.2%} (needed "
            f"{GROSS_TOKEN_AGREEMENT if report.gross_only else report.min_token_agreement:.0%}); max abs logit "
            f"error {report.max_abs_err:.3g}")
    if not report.passed:
        raise ToleranceError(
            f"{precision} graphs fail the check against eager PyTorch ({on}): max abs logit error "
            f"{report.max_abs_err:.3g} (smallest passing atol {report.min_passing_atol:.3g} at rtol {report.rtol:g}, "
            f"allowed atol {report.atol:g}), token agreement {report.token_agreement:.2%} "
            f"(needed {GROSS_TOKEN_AGREEMENT if report.gross_only else report.min_token_agreement:.0%}), first "
            f"divergence {report.first_divergence}")
