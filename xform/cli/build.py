"""`xform export` and `xform build-engine`: a model to a verified bundle, a bundle to engines."""
from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from xform.cli import err, handle_errors, main, out, stages
from xform.cli.flags import said
from xform.errors import XformError
from xform.manifest import PRECISIONS, WEIGHT_BITS, Manifest, language_pairs
from xform.models import STATE_DICT_ARCHS as ARCHS
from xform.models.vocab import TOKENIZE, VocabFiles


def language_option(ctx: click.Context, param: click.Parameter, value: str | None) -> list[tuple[str, str]] | None:
    """--languages en:de,en:fr as pairs; a malformed one is refused naming the flag and the pair."""
    if value is None:
        return None
    pairs = []
    for item in value.split(","):
        src, colon, tgt = item.strip().partition(":")
        if not colon or language_pairs([[src, tgt]]) is None:
            raise click.BadParameter(f"{item.strip()!r} is not SRC:TGT (two different language codes, such as "
                                     "en:de; several separated by commas: en:de,en:fr)", ctx, param)
        pairs.append((src, tgt))
    return pairs


@main.command()
@click.argument("model")
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path),
              help="Bundle directory to write.")
@click.option("--precision", type=click.Choice(list(PRECISIONS)), default="fp32", show_default=True,
              help="fp16: fp16 weights, matmuls and K/V; LayerNorm, softmax and logits in fp32 (for GPUs). "
                   "int8: int8 MatMul weights by ONNX Runtime dynamic quantization (for the CPU).")
@click.option("--weights", type=click.Choice(list(WEIGHT_BITS)), default=None,
              help="Weight-only quantization over --precision fp32 / fp16 activations: every MatMul weight (the "
                   "output projection too) blockwise int8 or int4 as ONNX Runtime's MatMulNBits, for the "
                   "memory-bound decoder step on CUDA (and the CPU). Judged by translations: give --sample-file.")
@click.option("--fuse", "fuse", default=None, metavar="FUSION[,FUSION...]",
              help="For ONNX Runtime on CUDA: the decoder graphs' attention as its fused MultiHeadAttention "
                   "(self_attention, cross_attention; attention: both), the self-attention's q/k/v projections "
                   "as one MatMul (qkv), residual Add + LayerNorm as SkipLayerNormalization (skip_layer_norm). "
                   "Verified like every graph; recorded in the manifest (docs/gpu.md).")
@click.option("--opset", type=int, default=None,
              help="ONNX opset (default 17; 18 with --exporter dynamo, the oldest it writes).")
@click.option("--exporter", type=click.Choice(["torchscript", "dynamo"]), default="torchscript", show_default=True,
              help="dynamo: torch.export + onnxscript (pip install 'xform[dynamo]'), the exporter PyTorch develops; "
                   "torchscript: the tracer it has deprecated, still the default (docs/design.md).")
@click.option("--force", is_flag=True,
              help="Replace an existing bundle at -o: only a bundle xform wrote (nothing else in it) or an empty "
                   "directory; never MODEL, a folder of other files or the current directory.")
@click.option("--arch", type=click.Choice(list(ARCHS)), default=None,
              help="MODEL is a state dict file of this layout (default for a file: auto, recognised from its keys).")
@click.option("--n-heads", type=int, help="State dict: attention heads (not recorded in the weights).")
@click.option("--bos-id", type=int, help="State dict: start-of-sentence id, the decoder's first input.")
@click.option("--eos-id", type=int, help="State dict: end-of-sentence id.")
@click.option("--pad-id", type=int, help="State dict: pad id (default: the tutorial's, 0 or 1).")
@click.option("--max-len", type=int,
              help="State dict: positions to keep (default: the saved table, or the tutorial's).")
@click.option("--n-layers", type=int, help="State dict: encoder and decoder layers, checked against the weights.")
@click.option("--n-encoder-layers", type=int, help="State dict: checked against the weights.")
@click.option("--n-decoder-layers", type=int, help="State dict: checked against the weights.")
@click.option("--d-model", type=int, help="State dict: checked against the weights.")
@click.option("--d-ff", type=int, help="State dict: checked against the weights.")
@click.option("--src-vocab-size", type=int, help="State dict: checked against the weights.")
@click.option("--tgt-vocab-size", type=int, help="State dict: checked against the weights.")
@click.option("--norm-first", is_flag=True, default=None,
              help="torch-nn-transformer: built with norm_first=True (pre-LN); default post-LN, nn.Transformer's.")
@click.option("--activation", type=click.Choice(["relu", "gelu"]), default=None,
              help="torch-nn-transformer: the layers' activation (default relu, nn.Transformer's).")
@click.option("--layer-norm-eps", type=float, default=None, help="torch-nn-transformer: default 1e-5.")
@click.option("--scale-embedding/--no-scale-embedding", default=None,
              help="torch-nn-transformer: embeddings multiplied by sqrt(d_model), as the tutorial's TokenEmbedding "
                   "(default: scaled).")
@click.option("--src-embedding", metavar="KEY", help="torch-nn-transformer: the source embedding table's key.")
@click.option("--tgt-embedding", metavar="KEY", help="torch-nn-transformer: the target embedding table's key.")
@click.option("--generator", metavar="KEY", help="torch-nn-transformer: the output Linear's key.")
@click.option("--positions", metavar="KEY|sinusoidal",
              help="torch-nn-transformer: the position table's key, or sinusoidal when your code does not save one.")
@click.option("--src-vocab", type=click.Path(path_type=Path),
              help="Source vocabulary for text: a JSON list (id -> token) or dict (token -> id), or a "
                   "sentencepiece .model.")
@click.option("--tgt-vocab", type=click.Path(path_type=Path), help="Target vocabulary, as --src-vocab.")
@click.option("--tokenize", type=click.Choice(list(TOKENIZE)), default=None,
              help="How text is split with --src-vocab / --tgt-vocab (default: sentencepiece for a .model, "
                   "else whitespace).")
@click.option("--src-bos", is_flag=True, help="With --src-vocab: the source starts with the bos id too (as "
                                              "PyTorch's translation tutorial does); eos always ends it.")
@click.option("--max-new-tokens", "decode_cap", type=click.IntRange(min=1), default=None,
              help="The bundle's default limit on generated tokens (default: the model's max_length, else 256; "
                   "never beyond max_len). run --max-new-tokens overrides it per run.")
@click.option("--with-attention", is_flag=True,
              help="The decoder graph also returns a decoder layer's cross-attention (averaged over heads): "
                   "alignments (return_attention) and run --replace-unknowns. Off by default: the plain decoder "
                   "returns nothing it does not need.")
@click.option("--with-vocab-map", is_flag=True,
              help="Also the restricted decoder graph and the output table, so run --vocab-map can project onto "
                   "a per-batch target vocabulary (CPU speed).")
@click.option("--sample-file", type=click.Path(path_type=Path), default=None,
              help="Sentences of yours, one a line (token ids separated by spaces for a model without a "
                   "tokenizer; at most 256 used): the export is judged on their translations against eager "
                   "PyTorch. Without it, random token ids, on which fp16 / int8 are judged for gross breakage "
                   "only (a warning says so).")
@click.option("--no-judgement", "no_judgement", is_flag=True,
              help="fp16 / int8 / --weights for a speed benchmark on random weights: the check's figures are recorded, "
                   "nothing is refused; the manifest says the export was not judged and `run` warns.")
@click.option("--attention-layer", type=int, default=None,
              help="With --with-attention: which decoder layer (0-based; negative counts from the end; default "
                   "-1, the last).")
@click.option("--languages", callback=language_option, metavar="SRC:TGT[,SRC:TGT...]", default=None,
              help="The language pairs the bundle translates, recorded in its manifest (for routing by language "
                   "over many bundles: xform.Translator(DIR)); default: what its tokenizer says "
                   "(docs/python.md).")
@handle_errors
def export(model: str, output: Path, precision: str, weights: str | None, fuse: str | None, opset: int | None,
           exporter: str, force: bool, arch: str | None,
           n_layers: int | None, src_vocab: Path | None, tgt_vocab: Path | None, tokenize: str | None,
           src_bos: bool, decode_cap: int | None, with_attention: bool, with_vocab_map: bool,
           attention_layer: int | None, sample_file: Path | None, no_judgement: bool,
           languages: list[tuple[str, str]] | None, **hparams) -> None:
    """Export MODEL to a verified bundle.

    MODEL is `demo`, an xform checkpoint directory, a Hugging Face directory (Marian / OPUS-MT,
    M2M100, NLLB, mBART / mBART-50, BART), or a state dict file of a torch.nn.Transformer or seed
    tutorial model (recognised from its keys, or named with --arch) with the hyper-parameters its
    weights do not record.
    """
    from xform.exporter.export import export_bundle
    from xform.models.importers import BUNDLED, KNOWN

    if model not in BUNDLED and not Path(model).exists():  # before any flag is judged against what it is
        raise XformError(f"{model}: no such file or directory; MODEL is {KNOWN}")
    if n_layers is not None:
        hparams["n_encoder_layers"] = hparams["n_encoder_layers"] or n_layers
        hparams["n_decoder_layers"] = hparams["n_decoder_layers"] or n_layers
    hparams = {k: v for k, v in hparams.items() if v is not None}
    if hparams and arch is None and not Path(model).is_file():
        raise click.UsageError(f"{', '.join('--' + k.replace('_', '-') for k in hparams)} only go with a state "
                               "dict file (or --arch)")
    if (src_vocab is None) != (tgt_vocab is None):
        raise click.UsageError("--src-vocab and --tgt-vocab go together")
    if src_vocab is None and (tokenize or src_bos):
        raise click.UsageError("--tokenize and --src-bos go with --src-vocab / --tgt-vocab")
    vocab = None if src_vocab is None or tgt_vocab is None else VocabFiles(src_vocab, tgt_vocab, tokenize, src_bos)
    if attention_layer is not None and not with_attention:
        raise click.UsageError("--attention-layer goes with --with-attention")
    with stages("exporting") as stage:
        result = export_bundle(model, output, precision=precision, opset=opset, exporter=exporter, force=force,
                               arch=arch, hparams=hparams, vocab=vocab, max_new_tokens=decode_cap,
                               attention_layer=(-1 if attention_layer is None else attention_layer)
                               if with_attention else None, vocab_map=with_vocab_map, sample_file=sample_file,
                               judge=not no_judgement, languages=languages, weights=weights, fuse=fuse,
                               progress=stage)
    fused = f", fused: {', '.join(result.manifest.fusions)}" if result.manifest.fusions else ""
    print_export(result, result.manifest.precision_label + fused, exporter)
    print_text_report(result.path, result.manifest)
    cap, why = decode_cap_of(result.manifest)
    out.print(f"decoding stops after {cap} new tokens unless end-of-sentence comes first: {said(why)}. Change it with "
              "xform export --max-new-tokens N, or per run with xform run --max-new-tokens N")


def print_export(result, precision: str, exporter: str) -> None:
    """What was exported, what was assumed, and how it verified."""
    v = result.manifest.verification or {}
    c = v["check"]
    source = result.manifest.source
    recognised = " state dict, recognised from its keys" if source.get("recognised") else ""
    out.print(f"model: {source['kind']}{recognised}")
    if source.get("options"):
        out.print("assumed (not recorded in the weights): "
                  + ", ".join(f"{k}={v}" for k, v in source["options"].items())
                  + f"; found: {', '.join(f'{k} {v}' for k, v in source['roles'].items())}")
    out.print(f"wrote {result.path} ({precision}, opset {result.manifest.opset}"
              + (", dynamo exporter)" if exporter == "dynamo" else ")"))
    out.print("verified on onnxruntime against eager PyTorch: graphs "
              + ", ".join(f"{k.removesuffix('_max_abs_err')} {v[k]:.2e}" for k in v if k.endswith("max_abs_err"))
              + f"; decoding: max abs logit error {c['max_abs_err']:.2e}, token agreement "
              + f"{c['token_agreement']:.2%} of {c['tokens_compared']}"
              + (f"; translations {c['decode_agreement']:.2%} alike ({c['decodes_identical']:.2%} identical) over "
                 f"{c['decodes_compared']} sources, eager's tokens {c['logprob_drop']:+.4f} nats each"
                 if c.get("judged_by") == "decodes" else "")
              + (f"; BLEU {c['bleu_vs_eager']:.1f} / chrF {c['chrf_vs_eager']:.1f} against eager's translations"
                 if c.get("bleu_vs_eager") is not None else "")
              + f"; judged on {result.manifest.tolerance.get('judged_on', 'random sources')}"
              + ("; greedy tokens identical to the uncached reference" if v.get("greedy_tokens_identical") else ""))


@main.command("build-engine")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--flavor", type=click.Choice(["auto", "tensorrt", "tensorrt_rtx"]), default="auto", show_default=True,
              help="auto: tensorrt when installed, else tensorrt_rtx.")
@click.option("--max-batch", type=int, default=16, show_default=True, help="Sources per batch.")
@click.option("--max-beams", type=int, default=1, show_default=True,
              help="Beams (or samples) per source: the profile's batch is --max-batch x --max-beams.")
@click.option("--max-src-len", type=int, default=None, help="Default: the model's max_len.")
@click.option("--max-new-tokens", type=int, default=None, help="Default: the model's max_len.")
@click.option("--opt-batch", type=int, default=None, help="Default: min(8, --max-batch).")
@click.option("--opt-src-len", type=int, default=None, help="Default: min(32, --max-src-len).")
@click.option("--tf32", is_flag=True, help="Allow TF32 in fp32 layers (cleared by default).")
@click.option("--workspace", "workspace_mib", type=int, default=1024, show_default=True, help="Workspace limit, MiB.")
@click.option("--builder-opt-level", type=int, default=3, show_default=True, help="0 (fast build) to 5.")
@click.option("--timing-cache", type=click.Path(path_type=Path), default=None,
              help="Timing cache file to read and update (tensorrt only; TensorRT-RTX has none).")
@click.option("--force", is_flag=True, help="Rebuild existing engines.")
@handle_errors
def build_engine(bundle, flavor, max_batch, max_beams, max_src_len, max_new_tokens, opt_batch, opt_src_len, tf32,
                 workspace_mib, builder_opt_level, timing_cache, force) -> None:
    """Build TensorRT engines for BUNDLE's encoder and decoder and record them in its manifest."""
    from rich.progress import Progress, TaskID

    from xform.exporter.engine import BuildOptions, build_engines

    options = BuildOptions(tf32=tf32, workspace_mib=workspace_mib, builder_optimization_level=builder_opt_level,
                           timing_cache=timing_cache)
    with Progress(console=err, transient=True) as progress:
        tasks: dict[tuple[str, str], TaskID] = {}

        def on_progress(graph, phase, done, total):
            key = (graph, phase)
            if key not in tasks:
                tasks[key] = progress.add_task(f"{graph}: {phase}", total=max(total, 1))
            progress.update(tasks[key], completed=done)

        engines = build_engines(bundle, flavor, options=options, force=force, progress=on_progress,
                                max_batch=max_batch, max_beams=max_beams, max_src_len=max_src_len,
                                max_new_tokens=max_new_tokens, opt_batch=opt_batch, opt_src_len=opt_src_len)
    for key, e in engines.items():
        p = e.profile
        out.print(f"built {bundle / e.file} ({e.flavor} {e.tensorrt_version}, {e.precision}, "
                  f"{e.details['bytes'] / 2**20:.1f} MiB): batch {p['batch']}, src_len {p['src_len']}, "
                  f"cache_len {p['cache_len']} (min/opt/max); tf32 {'on' if e.details['tf32'] else 'off'}")


def print_text_report(bundle: Path, manifest: Manifest) -> None:
    """How the bundle turns text into ids and back, with a sample split, and the tokenizer's notes
    (inferences on stdout, warnings on stderr)."""
    from xform.runtime.text.tokenizers import load_tokenizer

    if manifest.tokenizer is None:
        notes = [n for n in manifest.source.get("notes", []) if "tokenizer" in n]
        out.print("text: none (" + ("; ".join(escape(n) for n in notes) if notes else
                                    "this model came without vocabularies: export again with --src-vocab / "
                                    "--tgt-vocab to translate text") + "): decode token ids with Session.generate")
        return
    tok = load_tokenizer(bundle / manifest.tokenizer.file, manifest.config)
    for line in tok.describe():
        out.print(escape(said(line)))
    for note in manifest.tokenizer.notes:
        if note.startswith("warning: "):
            err.print(f"[bold yellow]warning:[/] {escape(note.removeprefix('warning: '))}")
        else:
            out.print(escape(note))


def decode_cap_of(manifest: Manifest) -> tuple[int, str]:
    from xform.runtime.decoding.generation import decode_cap
    return decode_cap(manifest.generation, manifest.config.max_len)
