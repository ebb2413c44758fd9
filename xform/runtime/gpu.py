"""Is there an NVIDIA GPU, and which? Asked of the CUDA runtime through cuda-bindings when it is
installed, else of nvidia-smi. Never imports torch; never initialises anything else.
"""
from __future__ import annotations

import shutil
import subprocess


def gpu_info() -> dict | None:
    """{"name", "compute_capability"} of device 0, or None when there is no usable GPU."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return smi_info()
    err, count = cudart.cudaGetDeviceCount()
    if err != cudart.cudaError_t.cudaSuccess or count < 1:
        return None
    err, prop = cudart.cudaGetDeviceProperties(0)
    if err != cudart.cudaError_t.cudaSuccess:
        return None
    name = prop.name.decode(errors="replace").rstrip("\x00") if isinstance(prop.name, bytes) else str(prop.name)
    return {"name": name, "compute_capability": f"{prop.major}.{prop.minor}"}


def smi_info() -> dict | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    if out.returncode != 0 or not lines:
        return None
    name, _, cc = lines[0].partition(",")
    return {"name": name.strip(), "compute_capability": cc.strip()}
