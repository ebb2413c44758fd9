"""The README's torch install line takes PyTorch's CPU build, here and on an ordinary machine.

An ordinary machine sees PyPI, whose Linux torch is the CUDA build (about 19 CUDA packages), and
PyTorch's CPU index, whose `2.13.0+cpu` matches the same `==2.13.0` and sorts above it (a local
version label sorts after the bare version). Checked with pip's own resolver, offline: two local
indexes stand in for PyPI and the CPU index, each holding a stand-in wheel; and against this
machine's real CPU wheel, when it lies on disk.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def torch_install_args() -> list[str]:
    """The README's `pip install torch==...` step of its main command, after `pip install`."""
    m = re.search(r"<!-- main-command -->\s*```bash\n(.*?)\n```", README.read_text(), re.S)
    steps = [s.strip() for s in m.group(1).split("&&")]
    torch_steps = [s for s in steps if s.startswith("pip install") and " torch==" in s]
    assert len(torch_steps) == 1, steps
    return shlex.split(torch_steps[0])[2:]


def fake_wheel(index: Path, version: str, requires: list[str]) -> None:
    """A minimal wheel of `torch` at `version` in a PEP 503 simple index under `index`."""
    d = index / "torch"
    d.mkdir(parents=True, exist_ok=True)
    name = f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    with zipfile.ZipFile(d / name, "w") as z:
        z.writestr("torch/__init__.py", "")
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: torch\nVersion: " + version + "\n"
                   + "".join(f"Requires-Dist: {r}\n" for r in requires))
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    (d / "index.html").write_text(f'<html><body><a href="{name.replace("+", "%2B")}">{name}</a></body></html>')
    (index / "index.html").write_text('<html><body><a href="torch/">torch</a></body></html>')


def resolved(args: list[str], tmp_path: Path, isolated: bool = True) -> dict:
    """What `pip install ARGS` would install (name, version, url), resolved without installing."""
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps", "--quiet",
           "--report", str(report), *(["--isolated"] if isolated else []), *args]
    env = {**os.environ, "PIP_RETRIES": "0", "PIP_TIMEOUT": "5"}  # an unreachable index fails at once
    subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=300)
    (item,) = json.loads(report.read_text())["install"]
    return {"name": item["metadata"]["name"], "version": item["metadata"]["version"],
            "url": item["download_info"]["url"]}


def test_the_readme_line_prefers_the_cpu_index(tmp_path):
    args = torch_install_args()
    assert CPU_INDEX in args and args[args.index(CPU_INDEX) - 1] == "--extra-index-url", args
    pypi, cpu = tmp_path / "pypi", tmp_path / "cpu"
    fake_wheel(pypi, "2.13.0", ["nvidia-cublas-cu13", "nvidia-cudnn-cu13"])  # PyPI's Linux build
    fake_wheel(cpu, "2.13.0+cpu", [])
    offline = [a if a != CPU_INDEX else cpu.as_uri() for a in args]
    got = resolved(["--index-url", pypi.as_uri(), *offline], tmp_path)
    assert got["version"] == "2.13.0+cpu" and got["url"].startswith(cpu.as_uri()), got
    # without the CPU index the same pin takes the CUDA build: the line, not luck, picks the CPU one
    plain = [a for a in offline if a not in ("--extra-index-url", cpu.as_uri())]
    assert resolved(["--index-url", pypi.as_uri(), *plain], tmp_path)["version"] == "2.13.0"


def test_the_readme_line_takes_this_machines_cpu_wheel(tmp_path):
    if not list(Path("/opt/wheels").glob("torch-2.13.0+cpu-*.whl")):
        pytest.skip("no local CPU wheel of torch 2.13.0 on this machine")
    got = resolved(torch_install_args(), tmp_path, isolated=False)  # this machine's pip configuration
    assert got["version"] == "2.13.0+cpu", got


def test_the_readme_line_does_not_wait_on_an_unreachable_index():
    """On a network that reaches only the package registries, pip's default five retries with
    back-off cost the main command about 2.5 minutes before it went on (issue 55)."""
    args = torch_install_args()
    assert "--retries" in args and int(args[args.index("--retries") + 1]) <= 1, args
