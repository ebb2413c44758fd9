"""Ray started on this machine for one command (`--ray local`), owned by it from start to stop.

`ray start --head --block` runs as a child in a session and process group of its own (its
daemons, the dashboard and runtime-env agents included, are in that group; its workers in that
session), on free ports, with a temporary directory of its own, and is stopped when the command
ends, however it ends: SIGTERM (Ray stops its processes), then SIGKILL to the group, then the
directory removed. So the command owns what it starts, as `xform serve` owns its tritonserver,
rather than leaving that to `ray.init()`'s local cluster and `ray.shutdown()`; and nothing is left
in /tmp/ray. If the command itself is killed, the kernel sends `ray start` SIGTERM
(PR_SET_PDEATHSIG, Linux) and Ray stops its processes.

The head and this process's driver authenticate with one token: the environment's where it sets
RAY_AUTH_MODE, else a token of this command's, set in this process's environment while the block
runs, so nothing is written to ~/.ray. Ray reads it when imported: cluster.connect imports Ray
only inside the block (and has it read the environment again where it was imported before).
"""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from xform.errors import XformError

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0
STARTED = "Ray runtime started"  # what `ray start` prints once its node runs (Ray 2.60)


def ray_command() -> str:
    """The `ray` executable beside this Python, else on PATH."""
    beside = Path(sys.executable).with_name("ray")
    found = str(beside) if beside.is_file() else shutil.which("ray")
    if found is None:
        raise XformError('--ray local needs Ray\'s `ray` command, which is not installed: pip install -e ".[ray]"')
    return found


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def die_with_parent() -> None:
    """In the child, before exec: SIGTERM when this process dies, however it dies (Linux only)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def shared_token() -> Iterator[None]:
    """The token the head and this process's driver share (see the module's docstring)."""
    if "RAY_AUTH_MODE" in os.environ:
        yield
        return
    added = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


@contextlib.contextmanager
def local_head() -> Iterator[str]:
    """A Ray head on this machine for the block; yields its address (host:port)."""
    ray = ray_command()
    temp = Path(tempfile.mkdtemp(prefix="xform-ray-", dir="/tmp" if os.path.isdir("/tmp") else None))
    gcs, client, dashboard, agent = free_ports(4)
    log_path = temp / "ray-start.log"
    with shared_token():
        env = {**os.environ, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", "RAY_USAGE_STATS_ENABLED": "0"}
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [ray, "start", "--head", "--block", "--port", str(gcs), "--ray-client-server-port", str(client),
                 "--dashboard-port", str(dashboard), "--dashboard-agent-listen-port", str(agent),
                 "--include-dashboard=false", "--disable-usage-stats", "--temp-dir", str(temp / "t")],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=die_with_parent)
        try:
            wait_started(proc, log_path)
            yield f"127.0.0.1:{gcs}"
        finally:
            stop(proc)
            shutil.rmtree(temp, ignore_errors=True)


def wait_started(proc: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while STARTED not in log_path.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace")[-2000:]
            why = f"exited with {proc.returncode}" if proc.returncode is not None else \
                f"not started within {START_TIMEOUT_S:.0f} s"
            raise XformError(f"--ray local: `ray start --head` {why}:\n{tail}")
        time.sleep(0.1)


def stop(proc: subprocess.Popen) -> None:
    """`ray start` asked to stop its node, then its process group killed (whatever is left of it)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
