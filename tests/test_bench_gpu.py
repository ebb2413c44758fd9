"""scripts/bench_gpu.py's smallest case on the CPU (`--device cpu --shape tiny`): the GPU
benchmark's code runs in CI, every engine in its own process, xform's tokens equal transformers',
figures written as JSON and Markdown. No timing is asserted."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_script(name: str, args: list[str], tmp_path: Path) -> Path:
    """scripts/NAME with `args`, its work and output folders under tmp_path: the output folder,
    once it exited 0."""
    pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e '.[dev]')")
    cmd = [sys.executable, str(ROOT / "scripts" / name), *args, "--work", str(tmp_path / "work"),
           "--out", str(tmp_path / "out")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp_path / "out"


def test_bench_gpu_runs_its_smallest_case_on_the_cpu(tmp_path):
    out = run_script("bench_gpu.py", ["--device", "cpu", "--shape", "tiny", "--batches", "1,3", "--beams", "1,2",
                                      "--new-tokens", "6", "--warmup", "0", "--iters", "1"], tmp_path)
    report = json.loads((out / "bench_gpu_cpu.json").read_text())
    assert report["baseline"] == "transformers fp32" and report["device"] == "cpu"
    rows = {(r["engine"], r["batch"], r["beams"]): r for r in report["rows"]}
    assert set(rows) == {(e, b, k) for e in ("xform fp32", "transformers fp32") for b in (1, 3) for k in (1, 2)}
    for (engine, batch, beams), r in rows.items():
        assert r["tokens_per_s"] > 0 and r["step_ms_p50"] > 0 and r["peak_rss_mib"] > 0
        if engine == "xform fp32":  # the same tokens as eager transformers, greedy and beams
            assert r["tokens_equal_transformers"] == 1.0, r
        else:
            assert r["vs_baseline"] == 1.0 and r["tokens_equal_transformers"] is None
    md = (out / "bench_gpu_cpu.md").read_text()
    assert "python scripts/bench_gpu.py --device cpu" in md and "| xform fp32 | 3 | beam 2 |" in md


def test_bench_cuda_step_runs_on_the_cpu(tmp_path):
    """scripts/bench_cuda_step.py (the decoder step bound once, its variants against the plain
    session) on the tiny shape on the CPU: the plain and the optimizer-fused variants run, the fused
    graph's logits stay within 1e-5 of the plain one's, at two positions and again after the others."""
    out = run_script("bench_cuda_step.py", ["--device", "cpu", "--shape", "tiny", "--precisions", "fp32", "--variants",
                                            "plain", "fused", "--rows", "1", "3", "--steps", "3"], tmp_path)
    report = json.loads((out / "bench_cuda_step.json").read_text())
    rows = {(r["variant"], r["rows"]): r for r in report["rows"]}
    assert set(rows) == {(v, n) for v in ("plain", "fused") for n in (1, 3)} and report["machine"]
    for (variant, _), r in rows.items():
        assert "error" not in r and r["ms"] > 0
        diffs = [v for k, v in r.items() if "max_abs" in k]
        assert (len(diffs) == 4 and max(diffs) < 1e-5) if variant == "fused" else not diffs, r
    assert "| fp32 | fused | 3 |" in (out / "bench_cuda_step.md").read_text()
