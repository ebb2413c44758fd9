"""T5 in fp16: which treatment of the feed-forward overflow (docs/design.md, "T5 in fp16").

T5 v1.1 / mT5 / MADLAD activations grow past fp16's 65,504 in the feed-forward output and the
residual stream. This builds a small gated T5 (transformers, random weights) and makes one encoder
feed-forward write values of that size into the residual stream (its output projection x 5e4; RMS
norms make the rest of the model indifferent to the scale in fp32), then compares, against the
fp32 model, three fp16 treatments in eager PyTorch on the CPU:
  plain:  everything fp16 but norms, softmax and the output projection (xform's fp16 plan);
  clamp:  plain, with the residual stream clamped to +-(65504 - 1000) after every sublayer, as
          transformers' T5 does in fp16;
  fp32:   the feed-forward output projection and the residual stream in fp32 (config
          fp32_ffn_output; transformers' _keep_in_fp32_modules = ["wo"]), xform's choice.
and then exports the chosen one through `export_bundle(precision="fp16")`, which verifies it.

    python scripts/t5_fp16.py [--scale 5e4] [--out /tmp/t5-fp16]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import shutil
from pathlib import Path

import numpy as np
import torch


def build(directory: Path, scale: float):
    import transformers
    torch.manual_seed(0)
    cfg = transformers.MT5Config(vocab_size=211, d_model=64, d_kv=16, num_heads=4, d_ff=160, num_layers=3,
                                 num_decoder_layers=2, dropout_rate=0.0, decoder_start_token_id=0)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        model.encoder.block[1].layer[1].DenseReluDense.wo.weight.mul_(scale)
    model.save_pretrained(directory)
    return model


@contextlib.contextmanager
def clamped():
    """xform's Sublayer with transformers' fp16 clamp of the residual stream after each sublayer."""
    from xform.models import layers
    forward = layers.Sublayer.forward

    def clamp(self, x, f):
        y = forward(self, x, f)
        if y.dtype == torch.float16:
            limit = torch.finfo(torch.float16).max - 1000
            y = y.clamp(-limit, limit)
        return y
    layers.Sublayer.forward = clamp
    try:
        yield
    finally:
        layers.Sublayer.forward = forward


def logits(model, src, dec):
    with torch.no_grad():
        s = torch.from_numpy(src)
        return model.decode(torch.from_numpy(dec), model.encode(s, (s != 0).sum(1)))[0].float().numpy()


def greedy(model, src, n=16):
    """(B, n) greedy ids, pad (0) after each row's end."""
    from xform.models.transformer import greedy_decode
    s = torch.from_numpy(src)
    out = greedy_decode(model, s, (s != 0).sum(1), n).numpy()
    return np.pad(out, ((0, 0), (0, n - out.shape[1])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=5e4)
    ap.add_argument("--out", type=Path, default=Path("/tmp/t5-fp16"))
    args = ap.parse_args()
    from xform.exporter.export import export_bundle
    from xform.models.importers import resolve_model
    from xform.models.transformer import Seq2SeqTransformer, to_fp16

    shutil.rmtree(args.out, ignore_errors=True)
    build(args.out / "hf", args.scale)
    fp32 = resolve_model(args.out / "hf").model
    rng = np.random.default_rng(0)
    src = rng.integers(3, 211, (8, 12))
    src[:, -1] = 1
    dec = np.concatenate([np.zeros((8, 1), np.int64), rng.integers(3, 211, (8, 10))], 1)
    ref, ref_tokens = logits(fp32, src, dec), greedy(fp32, src)
    with torch.no_grad():
        s = torch.from_numpy(src)
        enc_x = fp32.src_embed(s)
        peak = 0.0
        for layer in fp32.encoder_layers:  # the residual stream's largest value, fp32
            enc_x = layer(enc_x, torch.zeros(1, 1, 1, s.shape[1]))
            peak = max(peak, float(enc_x.abs().max()))
    rows = {}
    for name in ("plain", "clamp", "fp32"):
        source = fp32
        if name != "fp32":  # the same weights without fp32_ffn_output
            source = Seq2SeqTransformer(fp32.cfg.replace(fp32_ffn_output=False))
            source.load_state_dict(fp32.state_dict())
        model = to_fp16(source.eval())
        with clamped() if name == "clamp" else contextlib.nullcontext():
            got, tokens = logits(model, src, dec), greedy(model, src)
        finite = bool(np.isfinite(got).all())
        rows[name] = {"finite": finite,
                      "max_abs_logit_err": float(np.nanmax(np.abs(got - ref))) if finite else None,
                      "logit_scale": float(np.abs(ref).max()),
                      "greedy_tokens_equal_fp32": float((tokens == ref_tokens).mean())}
    print(json.dumps({"residual_peak_fp32": peak, "treatments": rows}, indent=1))
    bundle = export_bundle(args.out / "hf", args.out / "fp16", precision="fp16")
    verification = {k: v for k, v in bundle.manifest.verification.items() if k.endswith("_err")}
    print(json.dumps({"exported_fp16_verification": verification}, indent=1))


if __name__ == "__main__":
    main()
