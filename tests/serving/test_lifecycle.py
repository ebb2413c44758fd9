"""`xform serve` owns what it starts: a stop at any moment of its life (signals at random times,
during a decode, twice), tritonserver or one of its stubs dying, a port in use. After each: no
process of that server left, its ports free, its temporary directory gone, and the exit code the
serving guide states. Every server is started on loopback ports and killed by the test if the
test fails."""
import os
import queue
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import requires_triton
from xform.serving.server import free_ports, group_members, port_in_use

pytestmark = [pytest.mark.serve, requires_triton]
XFORM = str(Path(sys.executable).parent / "xform")


class Served:
    """`xform serve BUNDLE` in a process of its own, its temporary files under `tmp`."""
    ready = "serving model"  # a line of its output once it serves

    def __init__(self, bundle, tmp: Path, *flags: str):
        self.start([XFORM, "serve", str(bundle), *flags], tmp)

    def start(self, command: list[str], tmp: Path, cwd: Path | None = None) -> None:
        """Run `command` on three free ports, its TMPDIR under `tmp`."""
        self.ports = free_ports(3)
        self.tmp = tmp / "tmp"
        self.tmp.mkdir(parents=True)
        self.proc = subprocess.Popen(
            [*command, "--http-port", str(self.ports[0]), "--grpc-port", str(self.ports[1]), "--metrics-port",
             str(self.ports[2])], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "TMPDIR": str(self.tmp)})
        self.t0 = time.monotonic()

    def wait_ready(self, timeout: float = 120) -> list[str]:
        lines = []
        for line in self.proc.stdout:
            lines.append(line)
            if "metrics" in line or time.monotonic() - self.t0 > timeout:
                break
        assert any(self.ready in x for x in lines), lines
        return lines

    def triton_pids(self) -> list[int]:
        out = subprocess.run(["pgrep", "-f", "--", f"--http-port={self.ports[0]}( |$)"], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def finish(self, timeout: float = 90) -> tuple[int, str]:
        try:
            rest = self.proc.communicate(timeout=timeout)[0]
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return self.proc.returncode, rest

    def assert_nothing_left(self) -> None:
        """No tritonserver nor stub of this run, its ports free, its temporary directory removed."""
        deadline = time.monotonic() + 10  # stubs of a killed Triton exit when they notice it gone
        while time.monotonic() < deadline and (self.triton_pids() or self.stubs()):
            time.sleep(0.2)
        left = self.triton_pids() + self.stubs()
        subprocess.run(["pkill", "-KILL", "-f", "--", f"--http-port={self.ports[0]}( |$)"])
        for pid in self.stubs():
            os.kill(pid, signal.SIGKILL)
        assert not left, f"processes left: {left}"
        assert not any(port_in_use("127.0.0.1", p) for p in self.ports)
        assert not [p for p in self.tmp.iterdir() if p.name.startswith("xform-serve-") and p.is_dir()]

    def stubs(self) -> list[int]:
        out = subprocess.run(["pgrep", "-f", f"triton_python_backend_stub {self.tmp}/"], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]


@pytest.mark.parametrize("seed", [0, 1])
def test_a_signal_at_a_random_moment_stops_everything(demo_bundle, tmp_path, seed):
    """SIGTERM, SIGINT or SIGHUP at a random time from launch to well after ready: exit 0 (or, in
    the first moments while Python loads and nothing is started, the signal's own death)."""
    rng = np.random.default_rng(seed)
    for i, at in enumerate(sorted(rng.uniform(0.5, 7.0, 2))):
        sig = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP][int(rng.integers(3))]
        served = Served(demo_bundle, tmp_path / f"{i}")
        time.sleep(at)
        served.proc.send_signal(sig)
        code, output = served.finish()
        assert code == 0 or (code == -sig and output == ""), (at, sig, code, output)
        if code == 0:
            assert f"on {signal.Signals(sig).name}; stopped tritonserver" in output, output
        served.assert_nothing_left()


def test_a_stop_during_decoding_lets_requests_finish_and_a_second_signal_kills(demo_bundle, tmp_path):
    """SIGTERM while a burst of requests decodes: each is answered (its translation, or Triton's
    refusal once the stop began), none hangs, exit 0. Then a second server stopped twice at once
    ends at once, nothing left."""
    import tritonclient.grpc as tg
    served = Served(demo_bundle, tmp_path / "a")
    try:
        served.wait_ready()
        client = tg.InferenceServerClient(f"127.0.0.1:{served.ports[1]}")
        got: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        from tests.serving.test_inflight_server import stream_inputs
        n = 200
        for i in range(n):
            client.async_stream_infer(f"{demo_bundle.name}-stream", stream_inputs(["999999 999999 999999"],
                                                                                   stream=False), request_id=str(i))
        got.get(timeout=60)  # decoding has begun
        served.proc.send_signal(signal.SIGTERM)
        answered, refused = 1, 0
        while answered + refused < n:
            result, error = got.get(timeout=60)  # never a hang
            if error is None:
                answered += 1
            else:
                refused += 1
        client.stop_stream()
        client.close()
        code, output = served.finish()
        assert code == 0 and "stopped on SIGTERM" in output, output
    finally:
        served.finish()
    served.assert_nothing_left()
    twice = Served(demo_bundle, tmp_path / "b")
    twice.wait_ready()
    twice.proc.send_signal(signal.SIGINT)
    twice.proc.send_signal(signal.SIGINT)
    code, output = twice.finish(timeout=30)
    assert code == 0, output
    twice.assert_nothing_left()


@pytest.mark.parametrize("victim", ["tritonserver", "stub"])
def test_tritonserver_or_a_stub_dying_stops_serve_with_exit_1(demo_bundle, tmp_path, victim):
    """Triton does not restart a dead stub (and keeps reporting the model ready): serve stops the
    server and exits 1, naming what died and keeping Triton's log, so a supervisor restarts it."""
    served = Served(demo_bundle, tmp_path)
    try:
        served.wait_ready()
        triton = served.triton_pids()[0]
        pids = [triton] if victim == "tritonserver" else [p for p in group_members(triton) if p != triton][:1]
        assert pids
        os.kill(pids[0], signal.SIGKILL)
        code, output = served.finish(timeout=60)
    finally:
        served.finish()
    assert code == 1, output
    why = "tritonserver exited on its own with code -9" if victim == "tritonserver" else "Python-backend stub"
    assert why in output and "Triton log kept at" in output, output
    kept = Path(output.split("Triton log kept at ")[1].split()[0])
    assert kept.is_file()
    kept.unlink()
    served.assert_nothing_left()


def test_a_port_in_use_is_one_line(demo_bundle, tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        ports = free_ports(2)
        r = subprocess.run([XFORM, "serve", str(demo_bundle), "--http-port", str(port), "--grpc-port", str(ports[0]),
                            "--metrics-port", str(ports[1])], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("xform-serve-")]
    lines = (r.stdout + r.stderr).strip().splitlines()
    assert len(lines) == 1 and f"--http-port {port}: in use on 127.0.0.1" in lines[0], lines


def test_xform_serve_killed_takes_tritonserver_with_it(demo_bundle, tmp_path):
    """SIGKILL leaves xform serve no chance to clean up: Linux kills tritonserver with it (its
    parent-death signal) and its stubs follow (only the temporary repository stays, documented)."""
    served = Served(demo_bundle, tmp_path)
    try:
        served.wait_ready()
        served.proc.kill()
        served.finish()
        deadline = time.monotonic() + 15
        while (served.triton_pids() or served.stubs()) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = served.triton_pids() + served.stubs()
    finally:
        for pid in served.triton_pids() + served.stubs():
            os.kill(pid, signal.SIGKILL)
    assert not left
    assert not any(port_in_use("127.0.0.1", p) for p in served.ports)


def translated(port: int, name: str, text: str) -> str:
    import tritonclient.http as th

    from tests.serving.test_server import infer
    with th.InferenceServerClient(f"127.0.0.1:{port}") as client:
        return infer(client, th, name, texts=[text])[1][0]


def restart_gauge(port: int) -> list[float]:
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("xform_serve_restarts{")]


def test_a_crashed_tritonserver_is_restarted_within_the_bound(demo_bundle, tmp_path):
    """Triton 2.51 can die of SIGSEGV when a gRPC cancellation races a completion (docs/serving.md):
    serve restarts it on the same ports, says so, counts it in /metrics, and answers as before;
    past --restarts, the next crash stops serve with exit 1 as any death does."""
    served = Served(demo_bundle, tmp_path, "--restarts", "1")
    try:
        served.wait_ready()
        before = translated(served.ports[0], demo_bundle.name, "40512")
        assert restart_gauge(served.ports[2]) and set(restart_gauge(served.ports[2])) == {0.0}
        first = served.triton_pids()
        os.kill(first[0], signal.SIGSEGV)
        served.t0 = time.monotonic()
        lines = served.wait_ready()
        said = "".join(lines)
        assert "tritonserver exited on its own with code -11 (SIGSEGV)" in said, said
        assert "restarting it, restart 1 (at most 1 in 600 s)" in said and "log kept at" in said, said
        assert served.triton_pids() and served.triton_pids() != first
        assert translated(served.ports[0], demo_bundle.name, "40512") == before
        assert set(restart_gauge(served.ports[2])) == {1.0}
        os.kill(served.triton_pids()[0], signal.SIGSEGV)  # the bound is spent: a death
        code, output = served.finish(timeout=60)
    finally:
        served.finish()
    assert code == 1 and "code -11 (SIGSEGV)" in output and "Triton log kept at" in output, output
    for kept in {Path(part.split()[0].rstrip(";")) for part in (said + output).split("log kept at ")[1:]}:
        kept.unlink(missing_ok=True)
    served.assert_nothing_left()


def test_a_tritonserver_aborting_with_its_stubs_is_a_crash_not_a_stub_death(demo_bundle, tmp_path):
    """Triton 2.51's gRPC race can abort tritonserver ('ASSERTION FAILED: prior > 0', SIGABRT);
    its stubs go with it a moment before it is reaped. Seen first, the stub's end must not pass for
    a stub death (exit 1): serve waits for tritonserver's own exit and restarts the crash."""
    served = Served(demo_bundle, tmp_path, "--restarts", "1")
    try:
        served.wait_ready()
        triton = served.triton_pids()[0]
        stubs = [p for p in group_members(triton) if p != triton]
        os.kill(stubs[0], signal.SIGKILL)  # the stub first, as an abort's teardown does
        time.sleep(0.3)
        os.kill(triton, signal.SIGABRT)
        served.t0 = time.monotonic()
        said = "".join(served.wait_ready())
        assert "code -6 (SIGABRT)" in said and "restarting it, restart 1" in said, said
        assert translated(served.ports[0], demo_bundle.name, "7")
        served.proc.send_signal(signal.SIGTERM)
        code, output = served.finish(timeout=60)
    finally:
        served.finish()
    assert code == 0, output
    for kept in {Path(part.split()[0].rstrip(";")) for part in said.split("log kept at ")[1:]}:
        kept.unlink(missing_ok=True)
    served.assert_nothing_left()
