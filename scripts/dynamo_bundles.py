"""The dynamo exporter through xform's whole export: every precision, variant and family, with
the same verification a bundle gets, beside the TorchScript exporter on the same models
(docs/design.md "The exporter's future").

    pip install onnxscript
    python scripts/dynamo_bundles.py [--out /tmp/dyn-bundles] [--quick]

For each model (the demo; every architecture variant of tests/variants.py; a trained Marian of
tests/marian_fixtures.py; trained M2M100, mBART and BART models of tests/models/test_bart_family.py)
and each configuration (fp32, fp16, int8, --with-attention, --with-vocab-map), `export_bundle` runs
twice at opset 18: `exporter="torchscript"` and `exporter="dynamo"` (`xform export --exporter`). Both
go through the same fp16 conversion, int8 quantization, graph checks and verification against eager
PyTorch (graph by graph at other shapes, rows at mixed positions, greedy tokens, `run --check`),
which raise when a graph disagrees. Then TensorRT-RTX builds engines (builder level 0) from the
dynamo bundles of fp32 and fp16. Prints one line per case and a summary table.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
import warnings
from pathlib import Path

import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xform.exporter.export import export_bundle  # noqa: E402

OPSET = 18


def models(work: Path, quick: bool) -> dict[str, object]:
    """name -> what export_bundle takes."""
    from tests.variants import VARIANTS, variant_config
    from xform.models.checkpoint import save_checkpoint
    from xform.models.transformer import Seq2SeqTransformer

    out: dict[str, object] = {"demo": "demo"}
    for name in VARIANTS if not quick else ("seed-003", "seed-004"):
        torch.manual_seed(0)
        d = work / "variants" / name
        save_checkpoint(Seq2SeqTransformer(variant_config(name)).eval(), d)
        out[f"variant {name}"] = d
    if not quick:
        from tests.marian_fixtures import build_marian
        d = work / "marian"
        build_marian(d, "swish-scaled")
        out["marian (trained)"] = d
        from tests.models.test_bart_family import FAMILIES, make
        for family in FAMILIES:
            d = work / family
            make(family).save_pretrained(d)
            out[f"{family} (trained)"] = d
    return out


CONFIGS = {"fp32": {}, "fp16": {"precision": "fp16"}, "int8": {"precision": "int8"},
           "attention": {"attention_layer": -1}, "vocab-map": {"vocab_map": True}}


def run(source, out: Path, exporter: str, settings: dict) -> tuple[str, float, dict]:
    t = time.time()
    try:
        result = export_bundle(source, out, opset=OPSET, force=True, exporter=exporter, **settings)
    except Exception as e:  # noqa: BLE001 - reported per case
        return f"FAILED {type(e).__name__}: {str(e).splitlines()[0][:160]}", time.time() - t, {}
    v = result.manifest.verification or {}
    errs = {k: x for k, x in v.items() if k.endswith("max_abs_err")}
    return "ok", time.time() - t, {"worst graph err": max(errs.values(), default=0.0),
                                   "check err": v["check"]["max_abs_err"]}


def build(bundle: Path) -> str:
    from xform.exporter.engine import BuildOptions, build_engines
    try:
        engines = build_engines(bundle, "tensorrt_rtx", options=BuildOptions(builder_optimization_level=0),
                                force=True, max_batch=4, max_new_tokens=16)
    except Exception as e:  # noqa: BLE001
        return f"FAILED {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return f"ok ({len(engines)} engines)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/dyn-bundles"))
    ap.add_argument("--quick", action="store_true", help="the demo and two variants only")
    ap.add_argument("--model", default=None, help="only this model (what xform export takes), e.g. the "
                    "NLLB-600M-shaped directory scripts/nllb_scale.py builds")
    ap.add_argument("--configs", default=None, help="with --model: comma-separated, of " + ", ".join(CONFIGS))
    ap.add_argument("--no-engines", action="store_true", help="skip the TensorRT-RTX builds (to measure an "
                    "export's own peak memory)")
    ap.add_argument("--exporters", default="torchscript,dynamo", help="one of them alone, for example to measure "
                    "its peak memory under /usr/bin/time -v")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    import logging
    logging.disable(logging.WARNING)
    print(f"torch {torch.__version__}, onnx {onnx.__version__}, onnxscript "
          f"{__import__('onnxscript').__version__}, opset {OPSET}", flush=True)
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)

    rows = []
    chosen = {Path(args.model).name: args.model} if args.model else models(args.out / "models", args.quick)
    for name, source in chosen.items():
        configs = list(CONFIGS) if name == "demo" else ["fp32", "fp16", "int8"] if "trained" in name else ["fp32"]
        configs = args.configs.split(",") if args.configs else configs
        for config in configs:
            line = [name, config]
            slug = name.replace(" ", "_").replace("(", "").replace(")", "")
            for exporter in args.exporters.split(","):
                out = args.out / "bundles" / f"{slug}-{config}-{exporter}"
                status, seconds, figures = run(source, out, exporter, CONFIGS[config])
                print(f"{name:24} {config:10} {exporter:12} {status} in {seconds:.1f} s "
                      + " ".join(f"{k} {x:.1e}" for k, x in figures.items()), flush=True)
                line += [status, f"{seconds:.1f}", f"{figures.get('worst graph err', float('nan')):.1e}"]
                if (exporter == "dynamo" and status == "ok" and config in ("fp32", "fp16") and "variant" not in name
                        and not args.no_engines):
                    engines = build(out)
                    print(f"{'':24} {config:10} tensorrt_rtx from the dynamo graphs: {engines}", flush=True)
            rows.append(line)
    print("\n| model | config | TorchScript | s | worst graph err | dynamo | s | worst graph err |")
    print("| --- | --- | --- | ---: | ---: | --- | ---: | ---: |")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
