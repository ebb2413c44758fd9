"""Soak a served bundle: clients send scripts/loadmix.py's mix for --minutes to a real tritonserver
(as `xform serve` runs it), every answer checked against the same request decoded alone
in-process; every --every seconds, the window's requests, errors, p50 / p99 latency and the
resident memory of tritonserver and its Python-backend stubs are recorded.

    pip install -e ".[serve]" && pip install --no-deps nvidia-pytriton==0.7.0
    python scripts/soak_serve.py --minutes 30 [--bundle B] [--clients 32] [--think 0.2] [--json F]
    python scripts/soak_serve.py --minutes 10 --cancel 0.05 --serve 3   # through `xform serve --restarts 3`

With --serve N the server is `xform serve --restarts N` in a process of its own, which restarts a
tritonserver that crashes (Triton 2.51's gRPC cancellation race, docs/serving.md): the report
counts the restarts and the requests lost to them; the memory is then xform serve's, tritonserver's
and its stubs'.

Memory is judged after the warm-up (the first sample holds the allocators' high-water marks of
the shapes seen so far): the table prints the growth from the second sample to the last.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadmix import LoadMix, reference_answer, send_grpc, send_http  # noqa: E402


def tree_rss_mib(pid: int) -> float:
    """VmRSS of `pid` and all its descendants (tritonserver and its stubs), MiB."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            continue
    return total


class Soak:
    def __init__(self, session, server, name: str, clients: int, think: float, seed: int, cancel: float):
        self.session, self.server, self.name = session, server, name
        self.mix = LoadMix(session, seed=seed, streaming=True, cancel=cancel)
        self.lock = threading.Lock()
        self.decoding = threading.Lock()  # one Session decodes one batch at a time: not thread-safe
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.requests = 0
        self.clients, self.think, self.stop_at = clients, think, 0.0

    def client(self) -> None:
        import tritonclient.grpc as tg
        import tritonclient.http as th

        http = th.InferenceServerClient(f"127.0.0.1:{self.server.http_port}")
        try:
            while time.monotonic() < self.stop_at:
                with self.lock:
                    req = self.mix.request()
                t0 = time.monotonic()
                try:
                    got = (send_http(http, self.name, req) if req.transport == "http"
                           else send_grpc(tg, f"127.0.0.1:{self.server.grpc_port}", self.name, req))
                    took = time.monotonic() - t0
                    if not got.get("cancelled"):
                        with self.decoding:
                            want = reference_answer(self.session, req)
                        if got["text"] != want["text"] or not np.array_equal(got["ids"], want["ids"]) or \
                                abs(got["score"] - want["score"]) > 1e-4:
                            raise AssertionError(f"{req}: served {got['text']!r}, alone {want['text']!r}")
                    with self.lock:
                        self.requests += 1
                        self.latencies.append(took)
                except Exception as e:  # noqa: BLE001 - counted and reported, the soak goes on
                    with self.lock:
                        self.errors.append(repr(e)[:300])
                time.sleep(self.think)
        finally:
            http.close()

    def window(self) -> tuple[int, list[float], list[str]]:
        with self.lock:
            out = (self.requests, self.latencies, self.errors)
            self.requests, self.latencies, self.errors = 0, [], []
        return out

    def run(self, minutes: float, every: float) -> list[dict]:
        self.stop_at = time.monotonic() + minutes * 60
        threads = [threading.Thread(target=self.client, daemon=True) for _ in range(self.clients)]
        for t in threads:
            t.start()
        samples, t0 = [], time.monotonic()
        while time.monotonic() < self.stop_at:
            time.sleep(min(every, max(0.0, self.stop_at - time.monotonic())))
            n, lat, errors = self.window()
            pid = self.server.process.pid if self.server.process else 0
            samples.append({"t_s": round(time.monotonic() - t0, 1), "requests": n, "errors": len(errors),
                            "error_examples": errors[:3], "p50_ms": 1e3 * float(np.percentile(lat, 50)) if lat else None,
                            "p99_ms": 1e3 * float(np.percentile(lat, 99)) if lat else None,
                            "rss_mib": round(tree_rss_mib(pid), 1)})
            print(json.dumps(samples[-1]), flush=True)
        for t in threads:
            t.join(180)
        return samples


class Served:
    """`xform serve BUNDLE --restarts N` in a process of its own, on three free ports: the ports and
    `process` the soak reads, its output kept for the restarts it said."""

    def __init__(self, bundle: Path, restarts: int, ports: list[int]):
        self.http_port, self.grpc_port, self.metrics_port = ports
        xform = str(Path(sys.executable).parent / "xform")
        self.output: list[str] = []
        self.process = subprocess.Popen(
            [xform, "serve", str(bundle), "--restarts", str(restarts), "--max-rows", "32", "--http-port",
             str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.process.stdout is not None
        for line in self.process.stdout:  # until it serves (its endpoints end with the metrics line)
            self.output.append(line)
            if "metrics" in line:
                break
        else:
            raise SystemExit(f"xform serve did not start:\n{''.join(self.output)}")
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            print(f"xform serve: {line.rstrip()}", flush=True)

    def stop(self) -> int:
        self.process.terminate()
        code = self.process.wait(120)
        self.reader.join(10)
        return code

    @property
    def restarts(self) -> int:
        return sum("restarting it" in line for line in self.output)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--bundle", type=Path, default=None, help="default: the demo model, exported to a temporary dir")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--think", type=float, default=0.2, help="seconds a client waits between its requests")
    ap.add_argument("--every", type=float, default=60.0, help="seconds between samples")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cancel", type=float, default=0.0,
                    help="share of requests cancelled mid-stream over gRPC (Triton 2.51 can crash on them: docs)")
    ap.add_argument("--serve", type=int, default=None, metavar="N",
                    help="serve through `xform serve --restarts N` (restarting a crashed tritonserver)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    import xform
    from xform.exporter.export import export_bundle
    from xform.serving.repository import ModelOptions, model_names, write_model
    from xform.serving.server import TritonServer, free_ports

    with tempfile.TemporaryDirectory() as tmp:
        bundle = args.bundle or export_bundle("demo", Path(tmp) / "demo").path
        options = ModelOptions(max_rows=32)
        if args.serve is not None:
            server, name = Served(bundle, args.serve, free_ports(3)), bundle.name
        else:
            model = write_model(bundle, Path(tmp) / "repo", options, reference=True)
            server, name = TritonServer(Path(tmp) / "repo", model_names(model.name, options), "127.0.0.1",
                                        *free_ports(3), bls_threads=options.bls_threads).start(prepare=lambda m: None), \
                model.name
        try:
            soak = Soak(xform.load(bundle, backend="ort", threads=1), server, name, args.clients, args.think,
                        args.seed, args.cancel)
            samples = soak.run(args.minutes, args.every)
        finally:
            code = server.stop()
    settled = samples[1:] or samples
    report = {"minutes": args.minutes, "clients": args.clients, "think_s": args.think, "cancel": args.cancel,
              "requests": sum(s["requests"] for s in samples), "errors": sum(s["errors"] for s in samples),
              "rss_first_mib": samples[0]["rss_mib"], "rss_settled_mib": settled[0]["rss_mib"],
              "rss_last_mib": samples[-1]["rss_mib"], "rss_max_mib": max(s["rss_mib"] for s in samples),
              "restarts": server.restarts if isinstance(server, Served) else None, "exit_code": code,
              "samples": samples}
    print(f"{report['requests']} requests, {report['errors']} errors; tritonserver + stubs RSS "
          f"{report['rss_settled_mib']:.0f} MiB after the first sample, {report['rss_last_mib']:.0f} MiB at the end "
          f"(max {report['rss_max_mib']:.0f})" + (f"; xform serve restarted tritonserver {report['restarts']} times, "
                                                  f"exit code {code}" if args.serve is not None else ""))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    sys.exit(1 if report["errors"] and not report["restarts"] else 0)


if __name__ == "__main__":
    main()
