"""A real Ray cluster of two nodes on this machine, started once for the session (the `ray_cluster`
fixture, tests/conftest.py) and stopped by it.

The cluster: `ray start --head --block` and a second `ray start --address ... --block` with its
own CPUs and a resource of its own, each in its own process group, on loopback, with a token of
their own (Ray 2.60 turns token authentication on where a token file exists: the nodes and every
driver here share RAY_AUTH_TOKEN, so nothing reads or writes ~/.ray). They are stopped by their
processes (SIGTERM, then SIGKILL), never `ray stop`, which would stop other Ray clusters of this
user; whatever is still running in the nodes' sessions afterwards (workers) is killed by pid.
Every wait is bounded.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 20
NODE_CPUS = 2  # logical CPUs each node offers Ray (this machine may have fewer cores)


@dataclass
class RayCluster:
    address: str
    env: dict
    nodes: list[subprocess.Popen]
    logs: list[Path]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, what: str, procs: list[subprocess.Popen], logs: list[Path], timeout: float = START_TIMEOUT_S):
    """Poll `check` until true; a node that exits, or the time running out, fails with its log's tail."""
    deadline = time.monotonic() + timeout
    while not check():
        dead = [i for i, p in enumerate(procs) if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            tails = "\n".join(f"--- {log}:\n" + log.read_text(errors="replace")[-2000:] for log in logs)
            pytest.fail(f"Ray: {what} {'a node exited' if dead else f'not within {timeout} s'}\n{tails}")
        time.sleep(0.2)


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


def started(log: Path) -> bool:
    return log.exists() and "Ray runtime started" in log.read_text(errors="replace")


def start_node(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    ray = Path(sys.executable).with_name("ray")
    with open(log, "w") as f:
        return subprocess.Popen([str(ray), "start", "--block", "--disable-usage-stats",
                                 "--object-store-memory", str(100 * 2**20), *args],
                                stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def stop(cluster: RayCluster) -> None:
    """The nodes stopped by their `ray start` processes, then any process left in their sessions
    (each `ray start` leads a session of its own, which its daemons and workers keep)."""
    for p in reversed(cluster.nodes):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in reversed(cluster.nodes):
        try:
            p.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(STOP_TIMEOUT_S)
    for pid in in_sessions({p.pid for p in cluster.nodes}):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command: state, parent, group, session, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def in_sessions(sessions: set[int]) -> list[int]:
    """The processes in these sessions (a session's id stays taken while any of them runs)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if int(stat(int(entry.name))[3]) in sessions:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


LOCAL_MARK = "xform-ray-"  # the temporary directory `--ray local` gives its Ray (xform/corpus/local.py)


def local_ray_sessions() -> set[int]:
    """The sessions of the Rays `--ray local` runs now: each `ray start` it starts leads a session
    of its own and names the command's temporary directory, as do its daemons (its workers and
    agents retitle themselves `ray::...`, but stay in its session)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if LOCAL_MARK.encode() in (entry / "cmdline").read_bytes():
                found.add(int(stat(int(entry.name))[3]))
        except (OSError, IndexError, ValueError):
            continue
    return found


def run_with_local_ray(args: list[str], log: Path, timeout: float, **kwargs) -> tuple[int, str, set[int]]:
    """Run a command that starts a `--ray local` Ray: its exit code, its output (stdout and stderr),
    and the sessions of the Ray it started, watched while it ran (none that ran before it)."""
    before, seen = local_ray_sessions(), set()
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, **kwargs)
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        seen |= local_ray_sessions() - before
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"{' '.join(args)}: not done within {timeout} s:\n{log.read_text(errors='replace')}")
        time.sleep(0.1)
    return proc.returncode, log.read_text(errors="replace"), seen


def wait_sessions_gone(sessions: set[int], timeout: float = 20) -> None:
    """Fail, naming them, if processes of these sessions outlive `timeout` s."""
    deadline = time.monotonic() + timeout
    while left := in_sessions(sessions):
        if time.monotonic() > deadline:
            named = []
            for pid in left:
                with contextlib.suppress(OSError):
                    named.append(f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(bytes(1), b" ")
                                 .decode(errors="replace")[:160])
            pytest.fail("--ray local left processes running:\n" + "\n".join(named))
        time.sleep(0.2)


def configure_session() -> None:
    """The test session's Ray token, in this process's environment from its start (pytest_configure):
    Ray reads its authentication mode when it is imported, so a test importing Ray before the
    cluster starts would otherwise hold a mode the cluster does not share. The tests' nodes,
    drivers and `--ray local` clusters authenticate with it (but one `--ray local`, run with no
    RAY_AUTH_* at all, as a user runs it: tests/corpus/test_ray.py); nothing reads or writes ~/.ray."""
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16))


def running_cluster(tmp_path_factory):
    """Two Ray nodes on this machine (the second with the resource `second_node`), yielded while
    they run; this process's environment holds the token meanwhile."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip('the Ray tests need Ray: pip install -e ".[ray]"')
    # no usage reports; a node stops at once on SIGTERM (by default it drains for up to 30 s)
    ray_env = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    env = {**os.environ, **ray_env,
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    temp = Path(tmp_path_factory.mktemp("ray"))
    port = free_port()
    logs = [temp / "head.log", temp / "second.log"]
    nodes = [start_node(["--head", "--port", str(port), "--node-ip-address", "127.0.0.1", "--num-cpus",
                         str(NODE_CPUS), "--include-dashboard=false", "--temp-dir", str(temp / "t"),
                         "--ray-client-server-port", str(free_port()), "--dashboard-port", str(free_port()),
                         "--dashboard-agent-listen-port", str(free_port())], env, logs[0])]
    cluster = RayCluster(f"127.0.0.1:{port}", env, nodes, logs)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in ray_env.items():
            mp.setenv(k, v)
        mp.setenv("PYTHONPATH", env["PYTHONPATH"])
        try:
            wait_for(lambda: listening(port), "the head's port", nodes, logs)
            nodes.append(start_node(["--address", cluster.address, "--num-cpus", str(NODE_CPUS), "--resources",
                                     '{"second_node": 1}', "--dashboard-agent-listen-port", str(free_port())],
                                    env, logs[1]))
            wait_for(lambda: started(logs[0]) and started(logs[1]), "the nodes", nodes, logs)
            yield cluster
        finally:
            stop(cluster)

