"""Peak RSS of beam search over a file of many short sentences, and the bytes each beam step
returns to the host, on ONNX Runtime (issue 30 item 3: logits never leave a beam step).

    python scripts/memory_beams.py BUNDLE [--lines 2000] [--beams 4] [--max-new-tokens 32]
                                          [--max-batch-rows 256] [--threads 2] [--unfused]

The file: --lines sentences of 3 to 12 words of the bundle's own target-side tokens (short, as
issue 30's profile had them), translated with `Translator.translate_lines` (what `xform run
--input-file` runs) at --beams beams. `--unfused` runs the beam steps through the decoder and
candidates graphs even when the bundle has the fused one (a bundle without it always does). Run
each setting in a process of its own: the peak is the process's. Not a speed benchmark (one cold
pass); the outputs every decoder-step graph binds are counted at each run: bytes written to host
memory other than the K/V cache's new position (which is the cache itself, written in place).
"""
from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np

from xform.runtime.text.translator import Translator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--lines", type=int, default=2000)
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--max-batch-rows", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--unfused", action="store_true")
    args = ap.parse_args()
    import xform
    import xform.runtime.backends.ort_backend as ob
    from xform.runtime.bench import peak_rss_mib, rss_mib

    outputs: dict[int, dict[str, int]] = {}  # binding -> output name -> bytes bound in host memory
    original = ob.bind_host

    def spy(binding, kind, name, array):
        if kind == "output":
            outputs.setdefault(id(binding), {})[name] = array.nbytes
        return original(binding, kind, name, array)

    ob.bind_host = spy
    s = xform.load(args.bundle, backend="ort", threads=args.threads)
    backend = s.backend
    if args.unfused:
        backend.fused_beams = False
    # an xform from before the fused beam step (no lazily opened sessions): its sessions as attributes
    sessions = getattr(backend, "sessions", None)
    if sessions is None:
        sessions = {g: getattr(backend, g) for g in ("encoder", "decoder", "candidates", "reorder")}
    print(f"loaded                {rss_mib():7.0f} MiB  (sessions: {', '.join(sorted(sessions))})")
    per_step: Counter = Counter()
    runs: Counter = Counter()
    biggest = [0, ""]

    def counted(graph, session):
        run = session.run_with_iobinding

        def wrapped(binding, *a, **k):
            bound = outputs.get(id(binding), {})
            host = sum(n for name, n in bound.items() if not name.startswith("new_"))
            per_step[graph] += host
            runs[graph] += 1
            for name, n in bound.items():
                if not name.startswith("new_") and n > biggest[0]:
                    biggest[:] = [n, f"{graph}.{name}"]
            return run(binding, *a, **k)
        session.run_with_iobinding = wrapped
        return session

    if hasattr(backend, "graph_session"):
        opened = backend.graph_session

        def graph_session(graph):
            fresh = graph not in sessions
            session = opened(graph)
            return counted(graph, session) if fresh else session

        backend.graph_session = graph_session
    for graph in list(sessions):
        counted(graph, sessions[graph])
    rng = np.random.default_rng(0)
    vocab = [t for t, i in s.tokenizer.target_vocabulary().items() if t.isalnum()][:5000]
    lines = [" ".join(rng.choice(vocab, rng.integers(3, 13))) for _ in range(args.lines)]
    gen = s.generation_config(args.max_new_tokens, num_beams=args.beams, length_penalty=1.0, early_stopping=False,
                              num_return_sequences=1)
    t0 = time.perf_counter()
    from xform.runtime.scheduling.batching import Batching
    batching = Batching("tokens", max_batch_tokens=100_000, max_rows=args.max_batch_rows)
    done = sum(1 for line in Translator(s).translate_lines(lines, gen, batching) if line.error is None)
    dt = time.perf_counter() - t0
    steps = runs["decoder_beam"] + runs["decoder"]
    print(f"translated {done}/{len(lines)} lines in {dt:.0f} s (one cold pass on a shared machine: not a timing)")
    print(f"sessions opened       {', '.join(sorted(sessions))}")
    print(f"decoder-step runs     {dict((g, n) for g, n in runs.items() if g.startswith('decoder'))}")
    host = sum(per_step[g] for g in per_step if g != "encoder")
    print(f"bytes to the host per beam step, average over {steps} steps: {host / max(steps, 1) / 1024:.1f} KiB; "
          f"the largest output bound: {biggest[1]} {biggest[0] / 2**20:.2f} MiB")
    print(f"peak                  {peak_rss_mib():7.0f} MiB  now {rss_mib():.0f} MiB")


if __name__ == "__main__":
    main()
