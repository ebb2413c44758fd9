"""Load benchmark of a bundle served on Triton: N concurrent clients, dynamic batching on and off,
against the same requests through Session.translate in one process (the ceiling).

    python scripts/bench_serve.py [BUNDLE] [--clients 8] [--requests 50] [--protocol http|grpc]
                                  [--max-batch 8] [--delay-us 2000] [--threads N] [--json FILE]

BUNDLE defaults to the demo model exported to a temporary directory. Each client sends its
requests one after another (one text each, greedy); every mode sends the same texts. Reported per
mode: requests/s, generated tokens/s (end-of-sentence included, as Session counts), latency
p50 / p90 / p99 per request as the client sees it. The ceiling runs the same texts in batches of
--max-batch in this process with no server (and at batch 1, one after another). Clients, server
and model share this machine's cores: on a 2-core machine the client threads take CPU from the
model; the fraction of the ceiling includes that.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


def percentiles(xs):
    q = np.percentile(np.array(xs) * 1000, [50, 90, 99])
    return {"p50_ms": float(q[0]), "p90_ms": float(q[1]), "p99_ms": float(q[2])}


def tokens_of(ids, pad):
    return int((ids != pad).sum())


def run_server(bundle, texts_per_client, args, dynamic: bool, pad: int) -> dict:
    from xform.serving.repository import ModelOptions, write_model
    from xform.serving.server import TritonServer, free_ports

    if args.protocol == "http":
        import tritonclient.http as mod
    else:
        import tritonclient.grpc as mod
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        options = ModelOptions(max_batch=args.max_batch, max_queue_delay_us=args.delay_us, dynamic_batching=dynamic,
                               threads=args.threads)
        model = write_model(bundle, Path(tmp) / "repo", options, reference=True)
        with TritonServer(Path(tmp) / "repo", [model.name], "127.0.0.1", *free_ports(3)).start() as server:
            port = server.http_port if args.protocol == "http" else server.grpc_port

            def one(client, text):
                t = mod.InferInput("text", [1, 1], "BYTES")
                t.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
                t0 = time.perf_counter()
                r = client.infer(model.name, [t])
                return time.perf_counter() - t0, tokens_of(r.as_numpy("output_ids"), pad)

            warm = mod.InferenceServerClient(f"127.0.0.1:{port}")
            for text in texts_per_client[0][:5]:
                one(warm, text)
            start = threading.Barrier(len(texts_per_client))

            def client(texts):
                c = mod.InferenceServerClient(f"127.0.0.1:{port}")
                start.wait()
                return [one(c, text) for text in texts]

            t0 = time.perf_counter()
            with ThreadPoolExecutor(len(texts_per_client)) as pool:
                results = [r for rs in pool.map(client, texts_per_client) for r in rs]
            wall = time.perf_counter() - t0
            stats = warm.get_inference_statistics(model.name, **({"as_json": True} if args.protocol == "grpc" else {}))
            s = stats["model_stats"][0] if isinstance(stats, dict) else None
            # over the whole run, warm-up included
            batches = (int(s["inference_count"]) / max(1, int(s["execution_count"]))) if s else None
    n = len(results)
    return {"mode": f"Triton, dynamic batching {'on' if dynamic else 'off'}", "requests": n,
            "requests_per_s": n / wall, "tokens_per_s": sum(t for _, t in results) / wall,
            "mean_batch": batches, **percentiles([lat for lat, _ in results])}


def run_ceiling(bundle, texts, args, batch: int, pad: int) -> dict:
    import xform

    session = xform.load(bundle, threads=args.threads)
    session.translate(texts[:5])
    lat, tokens = [], 0
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch):
        t = time.perf_counter()
        out = session.generate(session.encode_texts(texts[i:i + batch]))
        [session.tokenizer.decode(r) for r in out]  # the same work as translate: encode, generate, decode
        lat += [time.perf_counter() - t] * len(out)
        tokens += tokens_of(out, pad)
    wall = time.perf_counter() - t0
    return {"mode": f"Session.translate in-process, batch {batch}", "requests": len(texts),
            "requests_per_s": len(texts) / wall, "tokens_per_s": tokens / wall, "mean_batch": batch,
            **percentiles(lat)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", nargs="?", type=Path)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=50, help="per client")
    ap.add_argument("--protocol", choices=["http", "grpc"], default="http")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--delay-us", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import xform

    tmp = tempfile.TemporaryDirectory(prefix="bench-serve-bundle-")
    bundle = args.bundle
    if bundle is None:
        bundle = xform.export("demo", Path(tmp.name) / "demo").path
    pad = xform.load(bundle).config["pad_id"]
    rng = np.random.default_rng(0)
    texts = [str(n) for n in rng.integers(0, 1_000_000, args.clients * args.requests)]
    per_client = [texts[c * args.requests:(c + 1) * args.requests] for c in range(args.clients)]
    rows = [run_ceiling(bundle, texts, args, args.max_batch, pad), run_ceiling(bundle, texts, args, 1, pad),
            run_server(bundle, per_client, args, True, pad), run_server(bundle, per_client, args, False, pad)]
    ceiling = rows[0]["tokens_per_s"]
    print(f"{args.clients} clients x {args.requests} requests ({args.protocol}), max batch {args.max_batch}, "
          f"queue delay {args.delay_us} us, python {sys.version.split()[0]}")
    print("| mode | req/s | tokens/s | of ceiling | mean batch | p50 ms | p90 ms | p99 ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        r["fraction_of_ceiling"] = r["tokens_per_s"] / ceiling
        mb = "" if r["mean_batch"] is None else f"{r['mean_batch']:.1f}"
        print(f"| {r['mode']} | {r['requests_per_s']:.0f} | {r['tokens_per_s']:.0f} | {r['fraction_of_ceiling']:.0%} "
              f"| {mb} | {r['p50_ms']:.1f} | {r['p90_ms']:.1f} | {r['p99_ms']:.1f} |")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
