"""The Ray cluster a corpus runs on: joined by address, found with `auto`, or started on this
machine (`local`, local.py) and stopped after; and how many CPUs each worker may take there.

Ray is imported here and by the Ray pool (pipeline.py), only when a command asks for it: a
missing Ray is an error naming the extra that installs it. Workers x threads never exceed the
cluster's CPUs, packed node by node, unless the caller oversubscribes on purpose; a worker
reserves its threads as Ray CPUs, so Ray never places more on a node than it has.
"""
from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from typing import Iterator

from xform.errors import XformError

INSTALL = 'pip install -e ".[ray]"'
CONNECT_TIMEOUT_S = 5.0
TOKEN_HINT = ("; a cluster started with a token (RAY_AUTH_MODE=token) refuses a driver without it: set "
              "RAY_AUTH_MODE and RAY_AUTH_TOKEN here as on its nodes")
STALL_TIMEOUT_S = 600.0  # a Ray run in which no shard finishes for this long stops (--stall-timeout)


def check_ray_installed() -> None:
    """Refuse at once where Ray is not installed; Ray itself is not imported here (see `connect`)."""
    import importlib.util

    try:
        found = importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):  # a broken or half-removed install
        found = False
    if not found:
        raise XformError(f"--ray needs Ray (Ray Data 2.60), which is not installed: {INSTALL}")


def import_ray():
    check_ray_installed()
    import ray
    return ray


def refresh_auth() -> None:
    """Make this process's Ray read its authentication mode and token from the environment again.

    Ray 2.60 reads them once, when it is imported, and caches them; `connect` imports it only
    after the environment holds the token (local.py puts `--ray local`'s there), and re-reads
    them where Ray was imported earlier (a caller of this module's), as Ray itself does when it
    turns token authentication on (ray._private.authentication.authentication_token_setup)."""
    import importlib

    raylet = importlib.import_module("ray._raylet")  # Ray's own, untyped
    raylet.Config.initialize("")
    raylet.AuthenticationTokenLoader.instance().reset_cache()


@dataclass(frozen=True)
class Cluster:
    """A connected cluster: its address (as asked), each live node's id and CPUs, and its GPUs."""
    address: str
    nodes: dict[str, int]
    gpus: int = 0

    @property
    def cpus(self) -> int:
        return sum(self.nodes.values())


@contextlib.contextmanager
def connect(address: str) -> Iterator[Cluster]:
    """Join the cluster at ADDRESS (host:port, or ray://...), `auto` (RAY_ADDRESS, else one
    started on this machine with `ray start`), or `local`: one started on this machine for the
    block and stopped after (local.py). The connection is closed either way."""
    check_ray_installed()  # missing: said before anything starts
    with contextlib.ExitStack() as stack:
        target = address
        if address == "local":
            from xform.corpus.local import local_head
            stack.callback(refresh_auth)  # last: after local_head took its token out of the environment
            target = stack.enter_context(local_head())
        ray = import_ray()  # only now: Ray reads the token local_head put in the environment when imported
        refresh_auth()  # where Ray was imported before that
        join(ray, address, target)
        stack.callback(ray.shutdown)
        alive = [n for n in ray.nodes() if n["Alive"]]
        yield Cluster(address, {n["NodeID"]: int(n["Resources"].get("CPU", 0)) for n in alive},
                      sum(int(n["Resources"].get("GPU", 0)) for n in alive))


def join(ray, asked: str, target: str) -> None:
    if target != "auto" and "://" not in target:
        check_reachable(asked, target)
    try:
        ray.init(address=target, log_to_driver=False)
    except ConnectionError as e:
        hint = " (RAY_ADDRESS is unset and no cluster was started on this machine)" if (
            asked == "auto" and not os.environ.get("RAY_ADDRESS")) else ""
        raise XformError(f"--ray {asked}: no Ray cluster to join{hint}: {e}. Start one with `ray start --head`, "
                         f"or give --ray local to start one for this command{TOKEN_HINT if asked != 'local' else ''}"
                         ) from None
    except Exception as e:  # Ray's own (authentication, version mismatch, a bad address): said, not a traceback
        raise XformError(f"--ray {asked}: Ray could not join the cluster at {target} ({type(e).__name__}: "
                         f"{one_line(e)}){TOKEN_HINT if asked != 'local' else ''}") from None


def one_line(e: Exception) -> str:
    """An error's message in one line: its last non-blank one (Ray's come after a traceback)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[-1] if lines else type(e).__name__


def check_reachable(asked: str, address: str) -> None:
    """Refuse at once an address where nothing listens (Ray itself would retry for a minute)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise XformError(f"--ray {asked}: expected host:port (the head's GCS address, as `ray start --head` "
                         "prints it), auto, or local")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise XformError(f"--ray {asked}: nothing answers there ({e.strerror or e}); is the cluster's head "
                         "started (`ray start --head`)?") from None


def worker_threads(cpus: list[int], workers: int, threads: int | None, oversubscribe: bool,
                   where: str = "the cluster") -> int:
    """The threads each of `workers` workers runs with on nodes of `cpus` CPUs: as asked, or by
    default the CPUs shared among the workers (at most one node's). More workers x threads than
    the nodes hold is refused unless `oversubscribe`."""
    biggest = max(cpus, default=0)
    if threads is None:
        threads = max(1, min(biggest, sum(cpus) // workers))
    places = sum(c // threads for c in cpus)
    if workers > places and not oversubscribe:
        nodes = ", ".join(str(c) for c in cpus) or "none"
        raise XformError(f"--workers {workers} x --threads {threads} is more than {where} holds (CPUs per node: "
                         f"{nodes}; room for {places} such workers): lower them, or pass --oversubscribe to run "
                         "them anyway")
    return threads


def worker_gpus(job_on_gpu: bool, workers: int, gpus: int, oversubscribe: bool) -> float:
    """The GPUs each worker reserves: one where it decodes on a GPU (--backend trt, --device cuda),
    so that Ray places it on a node that has one; more workers than the cluster's GPUs is refused
    unless `oversubscribe` (then they share them: a fraction each)."""
    if not job_on_gpu:
        return 0
    if gpus == 0:
        raise XformError("--backend trt / --device cuda: the cluster has no GPU (Ray counts none on its nodes)")
    if workers > gpus and not oversubscribe:
        raise XformError(f"--workers {workers} decoding on GPUs, and the cluster has {gpus}: lower --workers, or pass "
                         "--oversubscribe to share them")
    return min(1.0, gpus / workers)
