"""Serving under load: in-flight batching against Triton's request-level dynamic batching and the
in-process engine with no server, on a mixed-length workload.

    python scripts/bench_serve.py [BUNDLE] [--clients 8 32 64] [--requests 128] [--max-new R]
                                  [--modes engine inflight dynamic stream] [--json FILE]

BUNDLE defaults to the demo model (trained: numbers to words) exported to a temporary directory.
The workload: each request is one source; for the demo, numbers of 1 to 4 groups (outputs of 2 to
32 tokens, ending where the model ends them); with `--max-new LO:HI` each request also draws its
max_new_tokens uniformly from LO..HI (for a model whose outputs do not end by themselves, such as
bench_peers.py's untrained Marian-base: outputs of exactly 1 to 60 tokens with 1:60). Every mode
gets the same requests in the same order, split among the clients; each client sends its
requests one after another over gRPC (a client thread each, started together).

Modes, each its own run (servers are started and stopped per mode):
- engine: xform.runtime.Scheduler in this process, no server: the clients' threads submit to it
  (the ceiling in-flight serving can reach here);
- inflight: `xform serve`'s default, plain gRPC requests to NAME (relayed to NAME-stream);
- dynamic: --scheduling dynamic (Triton's dynamic batcher, max batch --max-batch, delay --delay-us);
- stream: in-flight, gRPC streaming to NAME-stream: time to first token as well;
- direct: in-flight, plain requests sent straight to NAME-stream over a gRPC stream (no relay
  through NAME): what the relay costs.
Reported: requests/s, generated tokens/s (end-of-sentence included), latency p50 / p90 / p99 per
request as the client sees it, time to first token p50 / p90 (stream), and ratios. Clients,
server and model share this machine's cores.
"""
from __future__ import annotations

import json
import queue
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import harness
import numpy as np

from xform.runtime.text.translator import Translator


def pct(xs, qs=(50, 90, 99)):
    return [float(v) for v in np.percentile(np.array(xs) * 1000, qs)] if xs else [float("nan")] * len(qs)


def workload(n: int, max_new: tuple[int, int] | None, seed: int = 0) -> list[tuple[str, int | None]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        groups = int(rng.integers(1, 5))
        text = " ".join(str(int(rng.integers(0, 10 ** int(rng.integers(1, 7))))) for _ in range(groups))
        out.append((text, None if max_new is None else int(rng.integers(max_new[0], max_new[1] + 1))))
    return out


def run_clients(clients: int, requests, one) -> tuple[float, list]:
    per = [requests[c::clients] for c in range(clients)]
    start = threading.Barrier(clients)

    def client(c):
        state = {}
        start.wait()
        return [one(state, *r) for r in per[c]]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = [x for rs in pool.map(client, range(clients)) for x in rs]
    return time.perf_counter() - t0, results


def engine_mode(bundle, requests, clients, args):
    import xform
    from xform.runtime.scheduling.scheduler import Scheduler

    session = xform.load(bundle, threads=args.threads)
    pad = session.pad_id
    with Scheduler(session, max_rows=args.max_rows) as scheduler:
        def one(state, text, n):
            t0 = time.perf_counter()
            ids = scheduler.submit(Translator(session).policy.encode_texts([text]), max_new_tokens=n).result()
            session.tokenizer.decode(ids[0])
            return time.perf_counter() - t0, int((ids != pad).sum()), None
        for r in requests[:4]:
            one({}, *r)
        return run_clients(clients, requests, one)


def server_mode(bundle, requests, clients, args, mode: str):
    import tritonclient.grpc as tg

    from xform.serving.repository import ModelOptions, model_names, write_model
    from xform.serving.server import TritonServer, free_ports

    scheduling = "dynamic" if mode == "dynamic" else "inflight"
    options = ModelOptions(max_batch=args.max_batch, max_queue_delay_us=args.delay_us, threads=args.threads,
                           scheduling=scheduling, max_rows=args.max_rows, max_queue=max(256, 2 * clients))
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        model = write_model(bundle, Path(tmp) / "repo", options, reference=True)
        names = model_names(model.name, options)
        with TritonServer(Path(tmp) / "repo", names, "127.0.0.1", *free_ports(3),
                          bls_threads=options.bls_threads).start() as server:
            url = f"127.0.0.1:{server.grpc_port}"

            def inputs(text, n, stream):
                t = tg.InferInput("text", [1, 1], "BYTES")
                t.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
                out = [t]
                if n is not None:
                    m = tg.InferInput("max_new_tokens", [1, 1], "INT32")
                    m.set_data_from_numpy(np.array([[n]], np.int32))
                    out.append(m)
                if stream:
                    s = tg.InferInput("stream", [1, 1], "BOOL")
                    s.set_data_from_numpy(np.array([[True]]))
                    out.append(s)
                return out

            def plain(state, text, n):
                client = state.setdefault("client", tg.InferenceServerClient(url))
                t0 = time.perf_counter()
                r = client.infer(model.name, inputs(text, n, False))
                ids = r.as_numpy("output_ids")
                return time.perf_counter() - t0, int((ids != pad).sum()), None

            def streamed(state, text, n):
                if "client" not in state:
                    state["client"], state["got"] = tg.InferenceServerClient(url), queue.Queue()
                    state["client"].start_stream(callback=lambda result, error: state["got"].put((result, error)))
                    state["n"] = 0
                state["n"] += 1
                t0 = time.perf_counter()
                state["client"].async_stream_infer(names[-1], inputs(text, n, mode == "stream"),
                                                   request_id=str(state["n"]))
                first, tokens = None, 0
                while True:
                    result, error = state["got"].get(timeout=300)
                    if error is not None:
                        raise RuntimeError(error)
                    if first is None:
                        first = time.perf_counter() - t0
                    if result.get_response().parameters["triton_final_response"].bool_param:
                        tokens = int((result.as_numpy("output_ids") != pad).sum())
                        return time.perf_counter() - t0, tokens, first

            one = streamed if mode in ("stream", "direct") else plain
            for r in requests[:4]:
                one({}, *r)
            try:
                return run_clients(clients, requests, one)
            except Exception:
                print(f"tritonserver's log ({mode}, {clients} clients):\n{server.log_tail(60)}", file=sys.stderr)
                raise


def summarize(mode, clients, wall, results) -> dict:
    lat = [r[0] for r in results]
    ttft = [r[2] for r in results if r[2] is not None]
    p50, p90, p99 = pct(lat)
    row = {"mode": mode, "clients": clients, "requests": len(results), "requests_per_s": len(results) / wall,
           "tokens_per_s": sum(r[1] for r in results) / wall, "p50_ms": p50, "p90_ms": p90, "p99_ms": p99}
    if ttft:
        row["ttft_p50_ms"], row["ttft_p90_ms"] = pct(ttft, (50, 90))
    return row


def main() -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("bundle", nargs="?", type=Path)
    ap.add_argument("--clients", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--requests", type=int, default=128, help="per client count, in all")
    ap.add_argument("--max-new", default=None, help="LO:HI: each request's max_new_tokens drawn from LO..HI")
    ap.add_argument("--modes", nargs="+", default=["engine", "inflight", "dynamic", "stream"])
    ap.add_argument("--max-batch", type=int, default=8, help="dynamic: Triton's max batch")
    ap.add_argument("--delay-us", type=int, default=2000, help="dynamic: queue delay")
    ap.add_argument("--max-rows", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import xform

    global pad
    tmp = tempfile.TemporaryDirectory(prefix="bench-serve-bundle-")
    bundle = args.bundle or xform.export("demo", Path(tmp.name) / "demo").path
    pad = xform.load(bundle).config.pad_id
    max_new = tuple(map(int, args.max_new.split(":"))) if args.max_new else None
    requests = workload(args.requests, max_new)
    rows = []
    for clients in args.clients:
        for mode in args.modes:
            run = engine_mode(bundle, requests, clients, args) if mode == "engine" else \
                server_mode(bundle, requests, clients, args, mode)
            rows.append(summarize(mode, clients, *run))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"{args.requests} requests of {Path(bundle).name}{' max_new ' + args.max_new if args.max_new else ''} "
          f"over gRPC; max rows {args.max_rows}; dynamic: max batch {args.max_batch}, delay {args.delay_us} us; "
          f"python {sys.version.split()[0]}")
    print("\n".join(harness.table(("clients", "mode", "req/s", "tokens/s", "vs dynamic", "vs engine", "p50 ms", "p90 ms",
                                   "p99 ms", "TTFT p50 / p90 ms"), "rlrrrrrrrr")))
    for r in rows:
        same = {x["mode"]: x for x in rows if x["clients"] == r["clients"]}
        vs = lambda m: f"{r['tokens_per_s'] / same[m]['tokens_per_s']:.2f}x" if m in same else ""  # noqa: E731
        ttft = f"{r['ttft_p50_ms']:.0f} / {r['ttft_p90_ms']:.0f}" if "ttft_p50_ms" in r else ""
        print(harness.row(r["clients"], r["mode"], f"{r['requests_per_s']:.1f}", f"{r['tokens_per_s']:.0f}",
                          vs("dynamic"), vs("engine"), f"{r['p50_ms']:.0f}", f"{r['p90_ms']:.0f}", f"{r['p99_ms']:.0f}",
                          ttft))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))


pad = 0

if __name__ == "__main__":
    main()
