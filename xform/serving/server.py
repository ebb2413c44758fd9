"""Find, start and stop NVIDIA's `tritonserver`.

Where the server comes from:
- `tritonserver` on PATH (NVIDIA's containers): used as it is, with its own backends; its Python
  must have xform installed.
- otherwise the binary shipped in the `nvidia-pytriton` wheel, installed without its dependencies
  (it pins numpy below 2; xform keeps numpy 2). Its Python-backend stub was built for numpy 1:
  under numpy 2 it reads every tensor with the wrong element size. So the stub runs in a small
  environment layered on this one, where numpy 1.26 shadows numpy 2 and everything else (xform,
  onnxruntime, sentencepiece) is this environment's. It is prepared once, with pip, in the cache
  directory (XFORM_CACHE, default ~/.cache/xform).

The server listens on the given host only (127.0.0.1 by default); `start` waits until the server
and its models are ready, or raises with the tail of Triton's log. With `explicit` (many bundles,
one server), Triton's explicit model control: only the given models load at start, the others of
the repository when a model loads them through BLS, and `index()` says which are loaded.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from xform.errors import XformError
from xform.serving.restart_gauge import RESTARTS_ENV
from xform.serving.stall import STALL_ENV

PYTRITON = "nvidia-pytriton==0.7.0"
INSTALL = f'pip install -e ".[serve]" && pip install --no-deps {PYTRITON}'
STUB_NUMPY = "numpy>=1.26,<2"


class ServerError(XformError):
    pass


class StopRequested(Exception):
    """A stop was asked for (a signal) while tritonserver was starting."""


def die_with_parent() -> None:
    """In the child, before exec: SIGKILL it when the process that started it dies, however it
    dies (SIGKILL included, where no handler runs); Linux only, nothing elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (tritonserver's: itself and its backend stubs)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    backend_dir: Path | None  # None: the server's own
    env: dict[str, str]
    source: str  # "PATH" or "nvidia-pytriton"


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n ports nothing listens on now (for tests and benchmarks that start their own servers)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def cache_dir() -> Path:
    return Path(os.environ.get("XFORM_CACHE") or Path.home() / ".cache" / "xform")


def find_triton(prepare=print, wheel_dir: Path | None = None) -> TritonInstall:
    """tritonserver from PATH, else from the nvidia-pytriton wheel (preparing its stub environment,
    numpy<2 from the package index or, offline, from `wheel_dir`)."""
    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonInstall(Path(on_path), None, dict(os.environ), "PATH")
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServerError(f"no Triton Inference Server: `tritonserver` is not on PATH and nvidia-pytriton is not "
                          f"installed. Install it with: {INSTALL}")
    root = Path(list(spec.submodule_search_locations)[0])
    dist = root / "tritonserver"
    binary = dist / "bin" / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not binary.is_file() or not stub.is_file():
        raise ServerError(f"{dist}: nvidia-pytriton has no tritonserver binary or no Python {version} backend stub; "
                          f"reinstall with: {INSTALL}")
    work = stub_environment(dist, stub, prepare, wheel_dir)
    env = dict(os.environ)
    libs = root.parent / "nvidia_pytriton.libs"
    env["LD_LIBRARY_PATH"] = ":".join(p for p in (env.get("LD_LIBRARY_PATH"), str(libs)) if p)
    env["PATH"] = f"{work / 'env' / 'bin'}:{env.get('PATH', '')}"  # the stub's Python is the first on PATH
    return TritonInstall(binary, work / "backends", env, "nvidia-pytriton")


def stub_environment(dist: Path, stub: Path, prepare, wheel_dir: Path | None = None) -> Path:
    """The backend directory (python backend with the stub for this Python) and the layered
    environment the stub runs in; made once per wheel and Python, atomically (`xform serve
    --prepare` makes it ahead, at an image's build time). Its numpy<2 comes from the package index,
    or with `wheel_dir` from that directory only (no network)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    digest = hashlib.sha256(f"{sys.prefix}|{stub}|{stub.stat().st_size}|{STUB_NUMPY}".encode()).hexdigest()[:16]
    work = cache_dir() / f"triton-stub-py{version}-{digest}"
    if (work / "ready").is_file():
        return work
    prepare(f"preparing the Triton Python-backend environment in {work} (numpy<2 for its stub; once)")
    work.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=work.parent, prefix=".prepare-"))
    try:
        py = tmp / "backends" / "python"
        py.mkdir(parents=True)
        for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
            (py / name).symlink_to(dist / "backends" / "python" / name)
        shutil.copyfile(stub, py / "triton_python_backend_stub")
        os.chmod(py / "triton_python_backend_stub", 0o755)
        (tmp / "caches").symlink_to(dist / "caches")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "env")], check=True,
                       capture_output=True)
        site_dir = next((tmp / "env" / "lib").glob("python*/site-packages"))
        offline = ["--no-index", "--find-links", str(wheel_dir)] if wheel_dir is not None else []
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                              "--no-deps", *offline, "--target", str(site_dir), STUB_NUMPY],
                             capture_output=True, text=True)
        if pip.returncode:
            where = f"--wheel-dir {wheel_dir}" if wheel_dir is not None else "the package index"
            raise ServerError(f"could not install {STUB_NUMPY} for Triton's Python-backend stub from {where} into "
                              f"{site_dir}. Without a package index: run `xform serve --prepare` where one is "
                              f"reachable (an image's build step), or give --wheel-dir with a {STUB_NUMPY} wheel "
                              f"(pip download '{STUB_NUMPY}' -d DIR). pip said:\n{pip.stderr.strip()[-2000:]}")
        # after its own site-packages, this environment's (with their .pth files: editable installs)
        hosts = [p for p in site.getsitepackages() if Path(p).is_dir()]
        (site_dir / "zz_xform_host.pth").write_text(
            "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in hosts) + "\n")
        (tmp / "ready").write_text(f"{STUB_NUMPY}\n")
        if work.exists():
            shutil.rmtree(work)
        os.replace(tmp, work)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return work


@dataclass
class TritonServer:
    """A running tritonserver over one model repository; a context manager that stops it."""
    repo: Path
    models: list[str]
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    log_path: Path | None = None
    install: TritonInstall | None = None
    bls_threads: int | None = None  # the Python backend's thread pool (in-flight relays hold one each)
    grace: float = 30.0  # a stop lets requests in flight finish this long (Triton's --exit-timeout-secs)
    # explicit model control: only `models` load at start (the others of the repository when a model
    # asks, through BLS), and readiness is theirs alone (--strict-readiness=false: a model that failed
    # to load later does not fail /v2/health/ready)
    explicit: bool = False
    restarts: int = 0  # how many times serve restarted it after a crash (lifecycle.Restarts): its models' /metrics
    stall: float | None = None  # seconds an engine's response may wait for Triton before it aborts it (stall.py)
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    def command(self) -> list[str]:
        install = self.install
        if install is None:
            raise ServerError("no tritonserver to run: start() finds one, or give `install` (find_triton())")
        cmd = [str(install.binary), f"--model-repository={self.repo}",
               f"--http-address={self.host}", f"--http-port={self.http_port}",
               f"--grpc-address={self.host}", f"--grpc-port={self.grpc_port}",
               f"--metrics-address={self.host}", f"--metrics-port={self.metrics_port}",
               "--exit-on-error=true", "--log-verbose=0", f"--exit-timeout-secs={max(0, round(self.grace))}"]
        if install.backend_dir is not None:
            cmd.append(f"--backend-directory={install.backend_dir}")
        if self.bls_threads is not None:
            cmd.append(f"--backend-config=python,thread-pool-size={self.bls_threads}")
        if self.explicit:
            cmd += ["--model-control-mode=explicit", *(f"--load-model={m}" for m in self.models),
                    "--strict-readiness=false"]
        return cmd

    def start(self, timeout: float = 180.0, prepare=print, should_stop=lambda: False) -> "TritonServer":
        """Launch tritonserver and wait until it and its models are ready. `should_stop()` is asked
        while waiting: True stops the server and raises StopRequested. Busy ports are refused
        before anything starts."""
        self.install = self.install or find_triton(prepare)
        busy = [f"--{name}-port {port}" for name, port in (("http", self.http_port), ("grpc", self.grpc_port),
                                                            ("metrics", self.metrics_port))
                if port_in_use(self.host, port)]
        if busy:
            raise ServerError(f"{', '.join(busy)}: in use on {self.host} (another server, or an xform serve still "
                              "running?): stop it or choose other ports")
        self.log_path = self.log_path or self.repo.parent / f"tritonserver-{self.http_port}.log"
        log = open(self.log_path, "wb")
        env = {**self.install.env, RESTARTS_ENV: str(self.restarts)}
        if self.stall is not None:
            env[STALL_ENV] = str(self.stall)
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True, preexec_fn=die_with_parent)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if should_stop():
                self.stop()
                raise StopRequested()
            if self.process.poll() is not None:
                self.kill_group()  # stubs it started before it died
                raise ServerError(f"tritonserver exited with code {self.process.returncode} before it was ready"
                                  f"{self.cause()}; its log ({self.log_path}) ends:\n{self.log_tail()}")
            if self.ready():
                return self
            time.sleep(0.25)
        self.stop()
        raise ServerError(f"tritonserver was not ready after {timeout:.0f} s; its log ({self.log_path}) ends:\n"
                          f"{self.log_tail()}")

    def ready(self) -> bool:
        paths = ["/v2/health/ready", *(f"/v2/models/{m}/ready" for m in self.models)]
        try:
            for p in paths:
                with urllib.request.urlopen(self.http_url + p, timeout=2) as r:
                    if r.status != 200:
                        return False
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False
        return True

    def index(self, timeout: float = 5.0) -> list[dict]:
        """Triton's repository index (POST /v2/repository/index): each model's `name`, and where it
        was loaded or tried, its `version`, `state` (READY, UNLOADING, UNAVAILABLE, LOADING) and `reason`."""
        request = urllib.request.Request(self.http_url + "/v2/repository/index", data=b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return json.loads(r.read())

    def ready_models(self) -> set[str]:
        """The models the index says are READY."""
        return {m["name"] for m in self.index() if m.get("state") == "READY"}

    def log_tail(self, lines: int = 12) -> str:
        """Triton's error lines (why a model failed to load), then the last lines of its log."""
        if self.log_path is None:  # not started: no log yet
            return "(no log)"
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        errors = [line for line in text if line.startswith("E") and line[1:5].isdigit()][:8]
        tail = [line for line in text[-lines:] if line not in errors]
        return "\n".join(errors + (["..."] if errors and tail else []) + tail)

    def cause(self) -> str:
        """What Triton's log says went wrong at start-up, in a few words, or ''."""
        text = self.log_tail(200) if self.log_path is not None else ""
        if "already in use" in text or "Address in use" in text:
            return " (a port is already in use: stop what holds it or choose other ports)"
        if "failed to load" in text:
            return " (a model failed to load: the reason is in the log)"
        return ""

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGINT (Triton refuses new requests, lets those in flight finish for its exit timeout,
        unloads its models and exits), then after `timeout` (default: the grace) SIGKILL to the
        process group; the group is killed at the end in any case, so that no backend stub of a
        Triton that died outlives it."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(self.grace if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                self.kill_group()
        code = self.process.wait()
        self.kill_group()
        return code

    def kill_group(self) -> None:
        """SIGKILL to tritonserver's process group (itself and its stubs), now."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def stubs(self) -> list[int]:
        """The pids of the backend stubs tritonserver runs (its process group, itself aside)."""
        if self.process is None:
            return []
        return [p for p in group_members(self.process.pid) if p != self.process.pid]

    def __enter__(self) -> "TritonServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
