"""Is there an NVIDIA GPU, and which? Asked of the CUDA runtime through cuda-bindings when it is
installed, else of nvidia-smi. Which TensorRT flavours import. Never imports torch; never
initialises anything else.
"""
from __future__ import annotations

import importlib
import shutil
import subprocess

from xform.errors import BackendUnavailableError, XformError

TRT_FLAVORS = ("tensorrt", "tensorrt_rtx")
# the README's install lines ("TensorRT"), said the same way wherever TensorRT is missing
TRT_INSTALL_HINT = ("data-centre GPUs: pip install 'tensorrt>=10.12' 'cuda-bindings>=12.6' (CUDA 13), or "
                    "pip install 'tensorrt-cu12>=10.12' 'cuda-bindings>=12.6,<13' (CUDA 12); RTX GPUs: pip install "
                    "'tensorrt-rtx>=1.0' 'cuda-bindings>=12.6' (CUDA 13; tensorrt-rtx-cu12 for CUDA 12), which also "
                    "builds engines without a GPU")


def import_tensorrt(flavor: str = "auto"):
    """(module, flavor name): `tensorrt` when installed, else `tensorrt_rtx`, or as asked."""
    if flavor not in (*TRT_FLAVORS, "auto"):
        raise XformError(f"{{flavor}} {flavor!r}: expected one of auto, {', '.join(TRT_FLAVORS)}").naming("flavor")
    failures = []
    for name in TRT_FLAVORS if flavor == "auto" else (flavor,):
        try:
            return importlib.import_module(name), name
        except ImportError as e:
            failures.append(f"{name}: {e}")
    raise BackendUnavailableError(f"no TensorRT installed ({'; '.join(failures)}); {TRT_INSTALL_HINT}")


def importable_flavors() -> list[str]:
    """The TensorRT flavours this Python can import."""
    found = []
    for name in TRT_FLAVORS:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        found.append(name)
    return found


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
