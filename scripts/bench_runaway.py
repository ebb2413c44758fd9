"""Runaway cost: a tutorial-style nn.Transformer (PyTorch translation tutorial's shapes: 3+3
layers, d_model 512, 8 heads, FFN 512, vocab 10k, PositionalEncoding 5000) whose end-of-sentence
never wins, on 105 lines of 8-20 tokens; the file decoded with the old default (max_len 5000)
vs the new cap (256). The 104 lines that end are emulated by decoding them for 20 tokens; the
runaway line alone for the cap (rows that end leave the batch, so it runs alone after them).
Usage: python scripts/bench_runaway.py [--work DIR]"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import xform  # noqa: E402
from tests import torch_nn_modules as tn  # noqa: E402  (the tutorial's module, as the tests train it)
from xform.exporter.export import export_bundle  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--work", type=Path, default=Path("/tmp/xform-runaway"))
work = ap.parse_args().work
work.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)
V = 10000
m = tn.Seq2SeqTransformer(3, 3, 512, 8, V, V, dim_feedforward=512, dropout=0.0).eval()
sd = m.state_dict()
sd["generator.bias"][3] = -1e4  # end-of-sentence never wins
torch.save(sd, work / "never.pt")
export_bundle(work / "never.pt", work / "never", hparams=dict(n_heads=8, bos_id=2, eos_id=3), force=True)
s = xform.load(work / "never", threads=2)
assert s.default_max_new_tokens() == 256 and s.config.max_len == 5000
rng = np.random.default_rng(0)
lines = [list(rng.integers(4, V, rng.integers(8, 21))) + [3] for _ in range(105)]


def run(cap, runaway_rows):
    t0 = time.perf_counter()
    for i in range(0, 105, 32):
        s.generate(*s.pad(lines[i:i+32]), max_new_tokens=20)
    for r in range(runaway_rows):
        s.generate(*s.pad([lines[r]]), max_new_tokens=cap)
    return time.perf_counter() - t0


out = {"file_normal_s": run(0, 0), "one_runaway_cap256_s": run(256, 1), "one_runaway_cap5000_s": run(5000, 1)}
print(json.dumps(out, indent=1))
