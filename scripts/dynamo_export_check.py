"""Try the dynamo ONNX exporter on every xform graph of a model, and time its decoder against the
TorchScript one (docs/design.md "The exporter's future").

    pip install onnxscript
    python scripts/dynamo_export_check.py MODEL [--out /tmp/dyn] [--bundle BUNDLE]

MODEL is what `xform export` takes (demo, a Marian directory, ...). Each graph is exported by
`export_graph(..., exporter="dynamo")` (xform export --exporter dynamo), run on ONNX Runtime at
shapes other than the trace's and compared with the eager module. With --bundle (an xform bundle of
the same model), its TorchScript decoder and the dynamo one are timed on the same inputs (2
threads, median of 30) and their outputs compared.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from xform.contract import GRAPHS, signature_for
from xform.exporter.graphs import MODULES, example_inputs, export_graph
from xform.models.importers import resolve_model


def export_all(model, out: Path) -> None:
    specs = signature_for(model.cfg.to_dict())
    for graph in GRAPHS:
        spec, module = specs[graph], MODULES[graph](model).eval()
        t = time.time()
        try:
            export_graph(model, graph, spec, out / f"{graph}.onnx", 18, exporter="dynamo")
            session = ort.InferenceSession(str(out / f"{graph}.onnx"), providers=["CPUExecutionProvider"])
            other = example_inputs(model, graph, batch=3, src_len=7, past_len=4, cache_len=9, group=1)
            got = session.run(None, {n: v.numpy() for n, v in zip(spec.input_names, other)})
            with torch.no_grad():
                ref = module(*other)
            ref = ref if isinstance(ref, (tuple, list)) else (ref,)
            err = max((float(np.abs(g.astype(np.float64) - r.numpy().astype(np.float64)).max()) if g.size else 0.0)
                      for g, r in zip(got, ref))
            print(f"{graph}: exported in {time.time() - t:.1f} s; max abs error at other shapes {err:.2e}")
        except Exception as e:  # noqa: BLE001 - report and go on to the next graph
            print(f"{graph}: FAILED ({type(e).__name__}: {str(e)[:400]})")


def time_decoders(bundle: Path, dynamo: Path) -> None:
    sessions = {}
    for name, path in (("torchscript", bundle / "decoder.onnx"), ("dynamo", dynamo / "decoder.onnx")):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = 2, 1
        sessions[name] = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for batch in (1, 16):
        axes = {"batch": batch, "src_batch": batch, "src_len": 24, "cache_len": 32}
        feeds = {}
        for i in sessions["torchscript"].get_inputs():
            shape = [axes.get(d, d) if isinstance(d, str) else d for d in i.shape]
            feeds[i.name] = (np.full(shape, 20 if i.name == "past_len" else 5, np.int64) if "int64" in i.type
                             else rng.standard_normal(shape).astype(np.float32))
        feeds["src_mask"] = np.zeros((batch, 24), np.float32)
        outs = {k: s.run(None, feeds) for k, s in sessions.items()}
        times: dict = {k: [] for k in sessions}
        for _ in range(30):
            for k, s in sessions.items():
                t = time.perf_counter()
                s.run(None, feeds)
                times[k].append(time.perf_counter() - t)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        err = max(float(np.abs(a - b).max()) for a, b in zip(outs["torchscript"], outs["dynamo"])
                  if a.dtype == np.float32)
        print(f"batch {batch}: TorchScript {med['torchscript']:.2f} ms, dynamo {med['dynamo']:.2f} ms "
              f"({med['torchscript'] / med['dynamo']:.2f}x); max abs difference {err:.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--out", type=Path, default=Path("/tmp/dyn"))
    ap.add_argument("--bundle", type=Path, default=None)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    warnings.simplefilter("ignore")
    export_all(resolve_model(args.model).model.eval(), args.out)
    if args.bundle is not None:
        time_decoders(args.bundle, args.out)


if __name__ == "__main__":
    main()
