"""Crash safety: every write is one rename, so a process killed at any point leaves its target
absent or complete, and the next successful run leaves no temporaries. Two exports racing to one
target end with one bundle and one refusal."""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xform.runtime.bundle import Bundle

XFORM = str(Path(sys.executable).parent / "xform")


def killed_after(args, delay):
    """Run `xform args`, SIGKILL it after `delay` seconds (if still running); its exit code."""
    proc = subprocess.Popen([XFORM, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
    return proc.wait()


def timed(args):
    t0 = time.perf_counter()
    subprocess.run([XFORM, *args], check=True, capture_output=True)
    return time.perf_counter() - t0


def leftovers(directory: Path, name: str):
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(f".{name}."))


def assert_absent_or_complete(path: Path):
    if path.exists():
        Bundle.open(path)  # the manifest reads, every file it lists is there and passes its hash


def test_export_killed_at_random_points(tmp_path):
    target = tmp_path / "b"
    # the quickest of two warm runs: the first run of a process pays for cold caches, and delays
    # drawn against it would outlast most later runs (CI once killed 12 of 24)
    full = min(timed(["export", "demo", "-o", str(tmp_path / "ref"), "--force"]) for _ in range(2))
    rng = random.Random(0)
    killed = 0
    for trial in range(10):
        args = ["export", "demo", "-o", str(target)] + (["--force"] if target.exists() else [])
        if killed_after(args, rng.uniform(0.05, full * 0.9)) == -signal.SIGKILL:
            killed += 1
        assert_absent_or_complete(target)
    assert killed >= 6  # most trials were cut short, at different points
    subprocess.run([XFORM, "export", "demo", "-o", str(target), "--force"], check=True, capture_output=True)
    Bundle.open(target)
    assert leftovers(tmp_path, "b") == []


def test_build_engine_killed_at_random_points(tmp_path, checkpoint_dir):
    pytest.importorskip("tensorrt_rtx", reason="tensorrt-rtx is not installed")
    bundle = tmp_path / "b"
    subprocess.run([XFORM, "export", str(checkpoint_dir), "-o", str(bundle)], check=True, capture_output=True)
    build = ["build-engine", str(bundle), "--flavor", "tensorrt_rtx", "--max-batch", "2", "--max-new-tokens", "8",
             "--builder-opt-level", "0", "--force"]
    full = timed(build)
    rng = random.Random(int(os.environ.get("XFORM_KILL_SEED", "1")))
    for trial in range(5):
        killed_after(build, rng.uniform(0.2, full * 1.1))
        b = Bundle.open(bundle)  # the manifest always names engines that are there and match it
        for e in b.manifest.engines.values():
            assert (bundle / e.file).is_file()
    subprocess.run([XFORM, *build], check=True, capture_output=True)
    b = Bundle.open(bundle)
    named = {Path(e.file).name for e in b.manifest.engines.values()}
    assert sorted(p.name for p in (bundle / "engines").iterdir()) == sorted(named)
    assert [p.name for p in bundle.rglob(".*")] == []


def test_json_report_killed_at_random_points(tmp_path, demo_bundle):
    out = tmp_path / "r.json"
    args = ["run", str(demo_bundle), "--benchmark", "--batch", "2", "--new-tokens", "8", "--iters", "2", "--json", str(out)]
    full = timed(args + ["--force"])
    rng = random.Random(2)
    for trial in range(8):
        killed_after(args + ["--force"], rng.uniform(0.05, full * 1.1))
        if out.exists():
            assert json.loads(out.read_text())["backend"] == "ort"  # it parses: whole, never half
    subprocess.run([XFORM, *args, "--force"], check=True, capture_output=True)
    assert leftovers(tmp_path, "r.json") == []


def test_two_exports_racing_to_one_target(tmp_path):
    for trial in range(2):
        target = tmp_path / f"b{trial}"
        procs = [subprocess.Popen([XFORM, "export", "demo", "-o", str(target)], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for _ in range(2)]
        results = [(p.wait(), p.stdout.read()) for p in procs]
        codes = sorted(code for code, _ in results)
        assert codes == [0, 1], results
        refusal = next(out for code, out in results if code == 1)
        assert "already exists" in refusal and "--force" in refusal and "Traceback" not in refusal
        Bundle.open(target)
        assert leftovers(tmp_path, target.name) == []


def test_temporaries_of_dead_writers_are_removed_and_live_ones_kept(tmp_path):
    from xform.files import atomic_directory, atomic_write
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale_dir = tmp_path / f".b.xform-{dead.pid}-abc.tmp"
    stale_dir.mkdir()
    stale_file = tmp_path / f".r.json.xform-{dead.pid}-abc.tmp"
    stale_file.write_text("{")
    live = tmp_path / f".b.xform-{os.getppid()}-abc.tmp"  # a writer that still runs
    live.mkdir()
    other = tmp_path / f".bb.xform-{dead.pid}-abc.tmp"  # another target's: not ours to remove
    other.mkdir()
    with atomic_directory(tmp_path / "b", force=False) as tmp:
        (tmp / "x").write_text("1")
    atomic_write(tmp_path / "r.json", "{}")
    assert not stale_dir.exists() and not stale_file.exists() and live.exists() and other.exists()
