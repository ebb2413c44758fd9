"""Many language pairs, one server (issue 45): `xform serve --models` (one tritonserver, the router
model `translate` loading bundles on demand) at several --max-loaded, against one server per
bundle, under Zipf-distributed traffic over the pairs.

    python scripts/bench_multi.py [--bundles 20] [--max-loaded 2 5 20] [--clients 8] [--warmup 10]
                                  [--seconds 20] [--zipf 1.1] [--no-baseline] [--work DIR] [--out DIR]

The bundles: `--bundles` Marian-shaped models with random weights (the tests' tiny Marian:
1 encoder and 1 decoder layer; tests/fleet_fixtures.random_marian), one a pair (en>xx and xx>en
over ten languages), exported once into --work and reused. The traffic: `--clients` threads,
each sending requests one after another for `--seconds` (one sentence each, max_new_tokens 8),
each request's pair drawn from a Zipf law over the pairs (pair of rank r with probability
proportional to 1 / r^zipf; the same draws for every setting). Every setting runs on its own
server, started cold (no bundle loaded) and stopped for it; `--warmup` seconds of the same
traffic come first, not counted.

Reported per setting: answered requests/s, errors (503: no room within the load timeout),
latency p50 / p99 as the client sees it, loads per minute (the router's count, the measured
seconds only) with their mean duration, and the peak
memory of the server's processes (tritonserver and its stubs, Pss sampled every 0.5 s, summed
over every server of the setting). The baseline, one server per bundle (each `xform serve
BUNDLE`, all started before the traffic, their loads not counted), runs where the machine's
available memory holds it (an estimate of 300 MiB a server). Clients and servers share this
machine's cores.
"""
from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import harness
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.fleet_fixtures: the tests' tiny Marian

LANGS = ["de", "fr", "es", "it", "pt", "nl", "sv", "pl", "ru", "fi", "cs", "da", "ro", "hu", "el"]
TEXT = "the red cat sleeps on a blue chair"
NEW_TOKENS = 8
PER_SERVER_MIB = 300  # what the baseline's check budgets for each server (tritonserver and two stubs)


def pairs(n: int) -> list[tuple[str, str]]:
    """n pairs: en>xx and xx>en, language by language."""
    out = [p for lang in LANGS for p in (("en", lang), (lang, "en"))]
    if n > len(out):
        raise SystemExit(f"--bundles {n}: at most {len(out)}")
    return out[:n]


def build_bundles(work: Path, n: int) -> Path:
    """`work`/bundles/<src>-<tgt>: n random Marians, exported once."""
    from tests.fleet_fixtures import random_marian
    from xform.exporter.export import export_bundle
    out = work / "bundles"
    for i, (src, tgt) in enumerate(pairs(n)):
        name = f"{src}-{tgt}"
        if (out / name / "manifest.json").is_file():
            continue
        source = work / "hf" / name
        if not (source / "config.json").is_file():
            import shutil
            shutil.rmtree(source, ignore_errors=True)
            random_marian(source, 100 + i, src, tgt)
        export_bundle(source, out / name)
        print(f"exported {name}", file=sys.stderr)
    return out


def zipf_draws(n_pairs: int, count: int, s: float, seed: int) -> list[int]:
    weights = 1.0 / np.arange(1, n_pairs + 1) ** s
    return [int(i) for i in np.random.default_rng(seed).choice(n_pairs, size=count, p=weights / weights.sum())]


def post(url: str, inputs: list[dict], timeout: float = 300) -> int:
    request = urllib.request.Request(url, json.dumps({"inputs": inputs}).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code
    except OSError:
        return 0


def tensor(name: str, value, datatype: str = "BYTES") -> dict:
    return {"name": name, "shape": [1, 1], "datatype": datatype, "data": [value]}


def server_memory(servers) -> int:
    """The Pss of every server's tritonserver and its stubs, now."""
    from xform.serving import residency
    total = 0
    for server in servers:
        if server.process is not None and server.process.poll() is None:
            pids = [server.process.pid, *residency.children(server.process.pid)]
            total += sum(residency.memory_bytes(p) for p in pids)
    return total


def drive(send, pair_list, args, servers, seconds: float, seed: int = 0) -> dict:
    """The clients' run for `seconds`: `send(pair index)` -> HTTP status; their latencies, errors
    and the peak memory."""
    draws = [zipf_draws(len(pair_list), 100_000, args.zipf, seed=seed + c) for c in range(args.clients)]
    latencies: list[float] = []
    errors: dict[int, int] = {}
    lock, done, peak = threading.Lock(), threading.Event(), [0]
    end = time.monotonic() + seconds

    def client(c: int) -> None:
        for i in draws[c]:
            if time.monotonic() >= end:
                return
            t0 = time.monotonic()
            status = send(i)
            with lock:
                if status == 200:
                    latencies.append(time.monotonic() - t0)
                else:
                    errors[status] = errors.get(status, 0) + 1

    def sample() -> None:
        while not done.wait(0.5):
            peak[0] = max(peak[0], server_memory(servers))

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 600)
    elapsed = time.monotonic() - t0
    done.set()
    watcher.join(5)
    ms = np.array(latencies) * 1000
    return {"seconds": round(elapsed, 1), "answered": len(latencies), "errors": errors,
            "requests_per_s": round(len(latencies) / elapsed, 2),
            "p50_ms": round(float(np.percentile(ms, 50)), 1) if len(ms) else None,
            "p99_ms": round(float(np.percentile(ms, 99)), 1) if len(ms) else None,
            "peak_mib": round(peak[0] / (1 << 20))}


def run_fleet(bundles: Path, max_loaded: int, pair_list, args, tmp: Path) -> dict:
    from xform.runtime.fleet.catalog import Catalog
    from xform.serving.fleet_repository import bls_threads, write_fleet
    from xform.serving.fleet_status import fetch
    from xform.serving.repository import ModelOptions
    from xform.serving.router import ROUTER, Settings
    from xform.serving.server import TritonServer, free_ports
    repo = tmp / f"fleet-{max_loaded}"
    options, settings = ModelOptions(max_batch=8, threads=1), Settings(max_loaded=max_loaded, load_timeout=60.0)
    write_fleet(Catalog.scan(bundles), repo, options, settings)
    server = TritonServer(repo, [ROUTER], "127.0.0.1", *free_ports(3), bls_threads=bls_threads(options, settings),
                          explicit=True, log_path=tmp / f"fleet-{max_loaded}.log")
    try:
        server.start(prepare=lambda m: print(m, file=sys.stderr))
        url = f"{server.http_url}/v2/models/{ROUTER}/infer"

        def send(i: int) -> int:
            src, tgt = pair_list[i]
            return post(url, [tensor("text", TEXT), tensor("src_lang", src), tensor("tgt_lang", tgt),
                              tensor("max_new_tokens", NEW_TOKENS, "INT32")])
        if args.warmup:
            drive(send, pair_list, args, [server], args.warmup, seed=1000)
        before = {b["name"]: b for b in fetch(server.http_url)["bundles"]}
        row = drive(send, pair_list, args, [server], args.seconds)
        after = fetch(server.http_url)["bundles"]
    finally:
        server.stop()
    loads = sum(b["loads"] - before[b["name"]]["loads"] for b in after)
    mean_load = [b["mean_load_seconds"] for b in after if b["mean_load_seconds"] is not None]
    return {"setting": f"one server, --max-loaded {max_loaded}", "max_loaded": max_loaded, **row, "loads": loads,
            "loads_per_min": round(loads / row["seconds"] * 60, 1),
            "mean_load_s": round(float(np.mean(mean_load)), 2) if mean_load else None}


def run_baseline(bundles: Path, pair_list, args, tmp: Path) -> dict:
    """One `xform serve BUNDLE` a pair, all started first, one after another from this thread (a
    server dies with the thread that started it: PR_SET_PDEATHSIG, server.die_with_parent)."""
    from xform.serving.repository import ModelOptions, model_names, write_model
    from xform.serving.server import TritonServer, free_ports
    servers: list = []
    options = ModelOptions(max_batch=8, threads=1)

    def start(i: int):
        src, tgt = pair_list[i]
        repo = tmp / f"one-{src}-{tgt}"
        model = write_model(bundles / f"{src}-{tgt}", repo, options, reference=True)
        server = TritonServer(repo, model_names(model.name, options), "127.0.0.1", *free_ports(3),
                              bls_threads=options.bls_threads, log_path=tmp / f"one-{src}-{tgt}.log")
        servers.append(server)
        server.start(prepare=lambda m: None)
        return server

    t0 = time.monotonic()
    try:
        started = [start(i) for i in range(len(pair_list))]
        startup = time.monotonic() - t0

        def send(i: int) -> int:
            src, tgt = pair_list[i]
            return post(f"{started[i].http_url}/v2/models/{src}-{tgt}/infer",
                        [tensor("text", TEXT), tensor("max_new_tokens", NEW_TOKENS, "INT32")])
        if args.warmup:
            drive(send, pair_list, args, started, args.warmup, seed=1000)
        row = drive(send, pair_list, args, started, args.seconds)
    finally:
        for server in servers:
            server.stop()
    return {"setting": f"{len(pair_list)} servers, one a bundle", "max_loaded": None, **row, "loads": 0,
            "loads_per_min": 0.0, "mean_load_s": None, "startup_s": round(startup, 1)}


def available_mib() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


def markdown(report: dict) -> str:
    lines = [f"`{report['command']}` on {report['machine']}: {report['bundles']} bundles, {report['clients']} clients, "
             f"{report['seconds']} s a setting after {report['warmup']} s of warm-up, Zipf {report['zipf']}.", ""]
    lines += harness.table(
        ("setting", "requests/s", "errors", "p50 ms", "p99 ms", "loads/min", "mean load s", "peak memory MiB"),
        "lrrrrrrr",
        [(r["setting"], r["requests_per_s"], sum(r["errors"].values()), r["p50_ms"], r["p99_ms"], r["loads_per_min"],
          harness.fmt(r["mean_load_s"]), r["peak_mib"]) for r in report["rows"]])
    for note in report["notes"]:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = harness.parser(__doc__, work=str(Path(tempfile.gettempdir()) / "xform-bench-multi"), out="optional")
    ap.add_argument("--bundles", type=int, default=20)
    ap.add_argument("--max-loaded", type=int, nargs="+", default=[2, 5, 20])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--no-baseline", action="store_true", help="Skip the one-server-per-bundle baseline.")
    args = ap.parse_args()
    pair_list = pairs(args.bundles)
    bundles = build_bundles(args.work, args.bundles)
    rows, notes = [], []
    with tempfile.TemporaryDirectory(prefix="xform-bench-multi-") as tmp:
        for n in args.max_loaded:
            rows.append(run_fleet(bundles, n, pair_list, args, Path(tmp)))
            print(json.dumps(rows[-1]), file=sys.stderr)
        need = args.bundles * PER_SERVER_MIB
        if args.no_baseline:
            notes.append("The one-server-per-bundle baseline was not run (--no-baseline).")
        elif available_mib() < need:
            notes.append(f"The one-server-per-bundle baseline was not run: {available_mib()} MiB available, "
                         f"{need} MiB estimated for {args.bundles} servers.")
        else:
            rows.append(run_baseline(bundles, pair_list, args, Path(tmp)))
            print(json.dumps(rows[-1]), file=sys.stderr)
            notes.append(f"The {args.bundles} servers of the baseline took {rows[-1]['startup_s']} s to start "
                         "(one after another), not counted in its figures.")
    report = {"command": harness.command(__file__).strip(), "machine": harness.machine(), "bundles": args.bundles,
              "clients": args.clients, "warmup": args.warmup, "seconds": args.seconds, "zipf": args.zipf,
              "rows": rows, "notes": notes}
    text = markdown(report)
    print(text)
    if args.out is not None:
        harness.write_report(args.out, "bench_multi", report, text)


if __name__ == "__main__":
    main()
