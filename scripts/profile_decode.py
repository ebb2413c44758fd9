"""Where a decode's time goes, on the ONNX Runtime backend: encoder, decoder graph (the fused beam
graph for beams, when the bundle has it), candidates graph, cache writes, growth and gathers, and
the host's strategy (beam search in numpy), per step. On CUDA (`--device cuda`) also the step
inputs' uploads, the outputs' fetch and the stream synchronisations; the decoder step captured as
a CUDA graph unless `--no-cuda-graph`.

    python scripts/profile_decode.py BUNDLE [--batch 16] [--beams 4] [--src-len 32] [--new-tokens 64]
                                     [--threads 2] [--iters 3] [--expanded] [--device cuda [--no-cuda-graph]]

Every decode runs exactly --new-tokens steps (min_new_tokens = max_new_tokens), as the peer
benchmark does. `--expanded` gives each beam its own copy of its source's encoding (the encoder
runs on the sources repeated num_beams times, the decoder reads num_beams copies), which is what
xform did before beams shared their source: the comparison behind docs/design.md, "Beams share
their source".
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict

import harness
import numpy as np


def timed(table: dict, name: str, fn):
    def wrapper(*args, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            table[name] += time.perf_counter() - t0
    return wrapper


def main() -> None:
    import xform

    ap = harness.parser(__doc__, threads=2, iters=3)
    ap.add_argument("bundle")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--src-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--expanded", action="store_true", help="a copy of the encoding per beam (the old layout)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--no-cuda-graph", action="store_true")
    args = ap.parse_args()

    session = xform.load(args.bundle, backend="ort", threads=args.threads, device=args.device,
                         cuda_graph=False if args.no_cuda_graph else None)
    b = session.backend
    cfg = session.config
    rng = np.random.default_rng(0)
    src = rng.integers(2, cfg.src_vocab_size - 2, (args.batch, args.src_len)).astype(np.int64)
    src[src == session.pad_id] = 2
    src[:, -1] = session.eos_id
    t: dict[str, float] = defaultdict(float)
    if args.expanded:
        def start(src_ids, src_lengths, group=1, _start=b.start):
            return _start(np.repeat(src_ids, group, 0), np.repeat(src_lengths, group, 0), 1)
    else:
        start = b.start
    b.encoder.run_with_iobinding = timed(t, "encoder graph", b.encoder.run_with_iobinding)
    if args.beams > 1 and getattr(b, "fused_beams", False):  # beam steps run the fused graph (decoder_beam)
        fused = b.graph_session("decoder_beam")
        fused.run_with_iobinding = timed(t, "decoder graph", fused.run_with_iobinding)
    else:
        b.decoder.run_with_iobinding = timed(t, "decoder graph", b.decoder.run_with_iobinding)
        b.candidates.run_with_iobinding = timed(t, "candidates graph", b.candidates.run_with_iobinding)
    from xform.runtime.backends import cache
    kind = cache.HostCache if args.device == "cpu" else cache.DeviceCache
    kind.write = timed(t, "cache writes", kind.write)  # type: ignore[method-assign]
    kind.grow = timed(t, "cache growth", kind.grow)  # type: ignore[method-assign]
    if b.ops is not None:  # on the device: the small copies and the synchronisations
        b.inputs.refresh = timed(t, "step inputs' uploads", b.inputs.refresh)
        b.inputs.fetch = timed(t, "outputs' fetch (and sync)", b.inputs.fetch)
        b.ops.sync = timed(t, "stream syncs", b.ops.sync)
    b.gather = timed(t, "row gathers (beams, compaction)", b.gather)
    b.start = timed(t, "start (encoder, buffers)", start)
    b.step = timed(t, "backend step", b.step)
    from xform.runtime.decoding import strategies as decoding
    for cls in (decoding.Greedy, decoding.BeamSearch):
        cls.advance = timed(t, "strategy (host)", cls.advance)
    gen = session.generation_config(args.new_tokens, min_new_tokens=args.new_tokens, num_beams=args.beams)
    lens = np.full(args.batch, args.src_len, np.int64)
    walls = harness.timed(lambda: session.run(session.request(src, lens, generation=gen)).ids, args.iters, warmup=1,
                          before=lambda _: t.clear())  # t: the last decode's parts
    wall = statistics.median(walls)
    rows = args.batch * args.beams
    print(f"{args.bundle}: batch {args.batch} x beams {args.beams} = {rows} rows, src_len {args.src_len}, "
          f"{args.new_tokens} steps, {args.threads} threads{', expanded encodings' if args.expanded else ''}, "
          f"{args.device}{' captured' if getattr(b, 'capture', False) else ''}")
    print(f"wall {wall * 1e3:.0f} ms (median of {args.iters}), {args.batch * args.new_tokens / wall:.1f} tokens/s")
    other = t["backend step"] - sum(t[k] for k in ("decoder graph", "candidates graph", "cache writes", "cache growth",
                                                   "row gathers (beams, compaction)", "step inputs' uploads",
                                                   "outputs' fetch (and sync)"))
    parts = {k: v for k, v in t.items() if k != "backend step"}
    parts["the rest of the step: binding, copies"] = other
    for k, v in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {k:34s} {v * 1e3:9.1f} ms  {v / wall:6.1%}  ({v / args.new_tokens * 1e3:.2f} ms a step)")


if __name__ == "__main__":
    main()
