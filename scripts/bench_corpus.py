"""A corpus on Ray against one process: what `xform corpus --ray` costs and gives on one machine.

    pip install -e ".[ray,dev]"
    python scripts/train_marian_synthetic.py --out /tmp/xform-files/marian-synthetic   # once, cached
    python scripts/bench_corpus.py [--work /tmp/xform-files] [--lines 20000] [--beams 1] [--rounds 1] [--out docs]

The model is the trained Marian-base of scripts/bench_files.py (its fp32 bundle in --work, exported
from --work/marian-synthetic when missing); without it, a Marian-base-shaped model with random
weights and the same word vocabulary (said so in the table: an untrained model's outputs run to
--max-new-tokens). The file is --lines sentences of bench_files.py's kind (3 to 80 words, skewed
short). Each configuration runs as a user runs it, a command in a process of its own, one at a
time, configurations interleaved round by round (the median of --rounds):

- `run --input-file --output` with 2 threads: the single process;
- `corpus` without --ray, 2 threads: the same pipeline in one process (shards, record, assembly);
- `corpus --ray local --workers 1 --threads 2` and `--workers 2 --threads 1`: Ray started for the
  command (its start and stop are in the wall time) and one or two actors.

All with --max-batch-tokens 2048, --max-new-tokens 128 and --shard-lines 2000. Reported: wall
time and sentences/s of the whole command, sentences/s of the translation alone (the corpus's
own figure: from the first shard sent to the last recorded, actor start-up and bundle loading
included), Ray's overhead as the ratio of `run --input-file`'s sentences/s to each one's, peak
RSS per process (the command's process, with Ray the driver, and each Ray worker: Ray's own
daemons are not counted), and the share of output lines equal to `run --input-file`'s. Writes
bench_corpus.json and bench_corpus.md into --out.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import harness

THREADS = 2
CONFIGS = {  # name -> the command's arguments after BUNDLE FILE
    "run --input-file": None,
    "corpus, in-process": ["--threads", "2"],
    "corpus --ray local, 1 worker x 2 threads": ["--ray", "local", "--workers", "1", "--threads", "2"],
    "corpus --ray local, 2 workers x 1 thread": ["--ray", "local", "--workers", "2", "--threads", "1"],
}
BASELINE = "run --input-file"
# the xform command, its peak RSS written at exit: VmHWM of its own address space (a child's
# ru_maxrss would include this benchmark's, which it had before exec)
PEAK_RSS = ("import atexit, sys; from xform.runtime.bench import peak_rss_mib; "
            "atexit.register(lambda path=sys.argv[1]: open(path, 'w').write(str(peak_rss_mib()))); "
            "sys.argv = ['xform', *sys.argv[2:]]; from xform.cli import main; main()")


def bundle_for(work: Path) -> tuple[Path, str]:
    """The benchmark's bundle and what it is: bench_files.py's trained Marian-base, else one of
    random weights of its shape."""
    from xform.errors import BundleError
    from xform.exporter.export import export_bundle
    from xform.runtime.bundle import Bundle

    for name, hf, kind in (("xform-fp32", work / "marian-synthetic", "trained Marian-base (bench_files.py's)"),
                           ("xform-random-fp32", work / "marian-base-random", "Marian-base shape, random weights "
                                                                             "(untrained)")):
        out = work / name
        try:
            Bundle.open(out)
            return out, kind
        except BundleError:
            pass
        if name == "xform-fp32" and not (hf / "config.json").exists():
            continue
        if name == "xform-random-fp32":
            random_marian(hf)
        export_bundle(hf, out, precision="fp32", force=True)
        return out, kind
    raise AssertionError("unreachable")


def random_marian(out: Path) -> None:
    """train_marian_synthetic.py's model and tokenizer, untrained."""
    if (out / "config.json").exists():
        return
    import torch
    from train_marian_synthetic import EOS, PAD, WORDS, write_tokenizer
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(0)
    cfg = MarianConfig(vocab_size=WORDS + 3, decoder_vocab_size=WORDS + 3, d_model=512, encoder_layers=6,
                       decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
                       decoder_ffn_dim=2048, max_position_embeddings=512, activation_function="swish",
                       scale_embedding=True, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD,
                       forced_eos_token_id=EOS, bad_words_ids=[[PAD]], num_beams=4, max_length=160)
    out.mkdir(parents=True, exist_ok=True)
    MarianMTModel(cfg).eval().save_pretrained(out)
    write_tokenizer(out)


def command(name: str, bundle: Path, src: Path, out: Path, beams: int) -> list[str]:
    common = ["--num-beams", str(beams), "--max-batch-tokens", "2048", "--max-new-tokens", "128"]
    if CONFIGS[name] is None:
        return ["run", str(bundle), "--input-file", str(src), "--output", str(out / src.name), "--threads",
                str(THREADS), *common]
    return ["corpus", str(bundle), str(src), "--output-dir", str(out), "--shard-lines", "2000",
            "--json", str(out.with_suffix(".json")), *CONFIGS[name], *common]


def run_one(name: str, bundle: Path, src: Path, out: Path, beams: int) -> dict:
    """One command in a process of its own: its wall time, peak RSS and report."""
    for stale in (out, out.with_suffix(".json"), out.with_suffix(".rss")):
        if stale.is_dir():
            shutil.rmtree(stale)
        elif stale.exists():
            stale.unlink()
    if CONFIGS[name] is None:
        out.mkdir(parents=True)
    # Ray started for the command authenticates with a token of its own (nothing written to ~/.ray)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
           "RAY_USAGE_STATS_ENABLED": "0"}
    rss = out.with_suffix(".rss")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PEAK_RSS, str(rss), *command(name, bundle, src, out, beams)],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    row = {"config": name, "wall_s": wall, "process_peak_rss_mib": float(rss.read_text())}
    if CONFIGS[name] is not None:
        report = json.loads(out.with_suffix(".json").read_text())
        keep = ("worker", "lines", "busy_s", "sentences_per_s", "peak_rss_mib")
        row.update(translation_s=report["translated"]["seconds"],
                   workers=[{k: w[k] for k in keep} for w in report["translated"]["workers"]])
    return row


def summarize(rounds: list[dict[str, dict]], lines: int, outputs: dict[str, list[str]]) -> list[dict]:
    rows = []
    base = outputs[BASELINE]
    for name in CONFIGS:
        runs = [r[name] for r in rounds]
        row = dict(runs[-1])
        row["wall_s"] = statistics.median(r["wall_s"] for r in runs)
        row["sentences_per_s"] = lines / row["wall_s"]
        if "translation_s" in row:
            row["translation_s"] = statistics.median(r["translation_s"] for r in runs)
            row["translation_sentences_per_s"] = lines / row["translation_s"]
        row["same_as_run"] = sum(a == b for a, b in zip(outputs[name], base)) / max(len(base), 1)
        rows.append(row)
    baseline = rows[0]["sentences_per_s"]
    for row in rows:
        row["run_over_this"] = baseline / row["sentences_per_s"]  # Ray's (or the pipeline's) overhead
    return rows


def markdown(s: dict) -> str:
    out = harness.preamble(s["command"], s["machine"], f"versions: {harness.listed(s['versions'])}. "
                           f"Model: {s['model']}. "
                           f"{s['lines']:,} lines, {'greedy' if s['beams'] == 1 else 'beam %d' % s['beams']}, "
                           f"median of {s['rounds']} round(s).")
    rows = []
    for r in s["rows"]:
        rss = f"{r['process_peak_rss_mib']:.0f}"
        if r.get("workers") and "ray" in r["config"]:
            rss += " / " + ", ".join(f"{w['peak_rss_mib']:.0f}" for w in r["workers"])
        rows.append((r["config"], f"{r['wall_s']:.1f}", f"{r['sentences_per_s']:.1f}",
                     harness.fmt(r.get("translation_sentences_per_s"), "{:.1f}"), f"{r['run_over_this']:.2f}x", rss,
                     f"{r['same_as_run']:.1%}"))
    out += harness.table(("configuration", "wall s", "sentences/s", "translation alone, sentences/s",
                          "run's sentences/s over this",
                          "peak RSS MiB: the command's process (Ray: the driver) / each worker", "= run's lines"),
                         "lrrrrlr", rows)
    return "\n".join(out) + "\n"


def main() -> None:
    ap = harness.parser(__doc__, work="/tmp/xform-files", out="docs", rounds=1)
    ap.add_argument("--lines", type=int, default=20000)
    ap.add_argument("--beams", type=int, default=1)
    args = ap.parse_args()
    from train_marian_synthetic import write_corpus

    args.work.mkdir(parents=True, exist_ok=True)
    bundle, model = bundle_for(args.work)
    src = args.work / f"corpus-{args.lines}.txt"
    if not src.exists():
        write_corpus(src, args.lines)
    rounds, outputs = [], {}
    for r in range(args.rounds):
        results = {}
        for i, name in enumerate(CONFIGS):
            out = args.work / "bench-corpus" / f"c{i}"
            results[name] = run_one(name, bundle, src, out, args.beams)
            outputs[name] = (out / src.name).read_text().splitlines()
            print(f"  round {r + 1}: {name}: {args.lines / results[name]['wall_s']:.1f} sentences/s", file=sys.stderr,
                  flush=True)
        rounds.append(results)
    summary = {"rows": summarize(rounds, args.lines, outputs), "lines": args.lines, "beams": args.beams,
               "rounds": args.rounds, "model": model, "machine": harness.machine(),
               "versions": harness.versions(("xform", "onnxruntime", "ray")), "command": harness.command(__file__)}
    md = markdown(summary)
    harness.write_report(args.out, "bench_corpus", summary, md)
    print(md)


if __name__ == "__main__":
    main()
