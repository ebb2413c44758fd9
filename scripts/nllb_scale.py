"""Export an NLLB-200-distilled-600M-shaped model (random weights) and measure what it costs.

    python scripts/nllb_scale.py [--work /tmp/xform-nllb] [--precisions fp32,int8]

Builds transformers' M2M100ForConditionalGeneration with NLLB-200-distilled-600M's shapes (d_model
1024, 12 + 12 layers, 16 heads, FFN 4096, vocabulary 256,206, 1,024 positions; 615M parameters,
its tied embedding table alone 1 GB in fp32), saves it as transformers does, then runs `xform
export` on it once per precision in a process of its own, timed, with that process's peak
resident memory (VmHWM, through /usr/bin/time's maximum RSS). Writes docs/nllb_scale.json and
prints a Markdown table: wall time, peak RSS, and the bundle's size on disk.
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

NLLB_600M = dict(vocab_size=256206, d_model=1024, encoder_layers=12, decoder_layers=12, encoder_attention_heads=16,
                 decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096, max_position_embeddings=1024,
                 activation_function="relu", scale_embedding=True, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                 decoder_start_token_id=2, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)


def build(work: Path) -> Path:
    hf = work / "nllb-600m-random"
    if (hf / "config.json").exists():
        return hf
    import torch
    from transformers import M2M100Config, M2M100ForConditionalGeneration
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model = M2M100ForConditionalGeneration(M2M100Config(**NLLB_600M)).eval()
    model.save_pretrained(hf)
    print(f"built and saved {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters in "
          f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return hf


def measured_export(hf: Path, out: Path, precision: str) -> dict:
    xform = str(Path(sys.executable).parent / "xform")
    t0 = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v", xform, "export", str(hf), "-o", str(out), "--precision", precision,
                           "--force", *(["--no-judgement"] if precision != "fp32" else [])], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"xform export {precision} failed:\n{proc.stdout}\n{proc.stderr}")
    rss_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"precision": precision, "wall_s": round(wall, 1), "peak_rss_mib": round(rss_kib / 1024),
            "bundle_mib": round(size / 2**20), "report": proc.stdout.strip().splitlines()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/xform-nllb"))
    ap.add_argument("--precisions", default="fp32,int8")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    hf = build(args.work)
    weights = sum(p.stat().st_size for p in hf.glob("*.safetensors"))
    rows = [measured_export(hf, args.work / f"xform-{p}", p) for p in args.precisions.split(",")]
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    result = {"command": "python scripts/nllb_scale.py " + " ".join(sys.argv[1:]), "shape": NLLB_600M,
              "safetensors_mib": round(weights / 2**20), "machine": f"{cpu}, {platform.python_version()}",
              "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nllb_scale.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"| precision | export wall s | peak RSS MiB | bundle MiB |  (weights {result['safetensors_mib']} MiB)")
    print("| --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['precision']} | {r['wall_s']} | {r['peak_rss_mib']:,} | {r['bundle_mib']:,} |")


if __name__ == "__main__":
    main()
