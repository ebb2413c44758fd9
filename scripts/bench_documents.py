"""Documents against lines: a 5,000-sentence document with 30% repeated sentences, translated as
a document with a translation memory (first run, then a second run over the same memory), and
line by line as `xform run --input-file` translates a file.

    python scripts/train_marian_synthetic.py --out /tmp/xform-files/marian-synthetic   # once, cached
    python scripts/bench_documents.py [--work /tmp/xform-files] [--sentences 5000] [--repeated 0.3]

The model is scripts/train_marian_synthetic.py's (OPUS-MT's size), exported fp32 as
scripts/bench_files.py exports it. The document: --sentences sentences of 3 to 80 words (the
corpus of bench_files), of which a --repeated share repeat an earlier one, in paragraphs of 1 to
6 sentences separated by blank lines; the lines: the same sentences, one a line. One session,
2 threads, the same batching (--max-batch-tokens padded source tokens, 8 batches read ahead):

- lines: `Translator.translate_lines` over the sentences (every repeat decoded again);
- document, first run: `Translator.translate_document(memory=<empty>)` (each distinct sentence
  decoded once, then kept in the memory);
- document, second run: the same call over the memory the first run filled (nothing decoded).

Each is run --rounds times (a fresh memory for each first run), interleaved; medians. The
document's output is checked: each sentence's translation equals the line run's for it, and the
layout equals the input's outside them. Writes --out/bench_documents.{md,json}.
"""
from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

import harness
import numpy as np

THREADS = 2


def document_text(work: Path, sentences: int, repeated: float, seed: int = 11) -> tuple[str, list[str]]:
    """The document, and its sentences in order (repeats included)."""
    from train_marian_synthetic import write_corpus

    distinct = round(sentences * (1 - repeated))
    pool = [f"{line}." for line in write_corpus(work / f"corpus-{distinct}.txt", distinct).read_text().splitlines()]
    rng = np.random.default_rng(seed)
    order = list(pool) + [pool[int(i)] for i in rng.integers(0, distinct, sentences - distinct)]
    rng.shuffle(order)
    paragraphs, at = [], 0
    while at < len(order):
        k = int(rng.integers(1, 7))
        paragraphs.append(" ".join(order[at:at + k]))
        at += k
    return "\n\n".join(paragraphs) + "\n", order


def bundle(work: Path) -> Path:
    from xform.errors import BundleError
    from xform.exporter.export import export_bundle
    from xform.runtime.bundle import Bundle

    hf, out = work / "marian-synthetic", work / "xform-fp32"
    if not (hf / "config.json").exists():
        raise SystemExit(f"{hf}: no trained model; run scripts/train_marian_synthetic.py --out {hf} first")
    try:
        Bundle.open(out)
    except BundleError:
        export_bundle(hf, out, precision="fp32", force=True, vocab_map=True)
    return out


def rounds(translator, doc: str, order: list[str], n: int, max_batch_tokens: int, options: dict) -> dict:
    """Seconds of each engine per round (interleaved, a fresh memory for each first run) and the
    outputs of the last round."""
    from xform.runtime.decoding.request import TextOptions
    from xform.runtime.scheduling.batching import Batching

    gen = translator.generation(None, dict(options))
    batching = Batching("tokens", None, max_batch_tokens, 8)
    with tempfile.TemporaryDirectory() as tmp:
        memory: list[Path] = []

        def fresh(name: str) -> None:
            if name == "document, first run":
                memory.append(Path(tmp) / f"tm{len(memory)}.db")

        def document() -> str:
            return translator.translate_document(doc, memory=memory[-1], max_batch_size=max_batch_tokens,
                                                 batch_type="tokens", **options)
        runs = {"lines": lambda: [r.hypotheses[0] for r in translator.translate_lines(order, gen, batching,
                                                                                      TextOptions())],
                "document, first run": document, "document, second run": document}
        times, last = harness.interleave(runs, n, before=fresh)
    return {"times": times, "outputs": {"lines": last["lines"], "first": last["document, first run"],
                                        "second": last["document, second run"]}}


def check(doc: str, order: list[str], outputs: dict) -> str:
    """The document's output against the lines': each sentence's translation and the layout."""
    from xform.runtime.documents.layout import plain

    document = plain(doc, None)
    assert [s.source for s in document.segments] == order, "the segmenter did not find the document's sentences"
    expected = document.render(outputs["lines"])
    same = outputs["first"] == expected and outputs["second"] == expected
    return "identical" if same else "DIFFERENT"


def main() -> None:
    ap = harness.parser(__doc__, work="/tmp/xform-files", out="docs", rounds=1)
    ap.add_argument("--sentences", type=int, default=5000)
    ap.add_argument("--repeated", type=float, default=0.3)
    ap.add_argument("--max-batch-tokens", type=int, default=2048)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--beams", type=int, default=1)
    args = ap.parse_args()

    import xform
    from xform.runtime.text.translator import Translator

    doc, order = document_text(args.work, args.sentences, args.repeated)
    translator = Translator(xform.load(bundle(args.work), threads=THREADS))
    options = {"max_decoding_length": args.max_new_tokens, "beam_size": args.beams}
    translator.translate_batch(order[:8], **options)  # warm up
    done = rounds(translator, doc, order, args.rounds, args.max_batch_tokens, options)
    verdict = check(doc, order, done["outputs"])
    medians = {k: statistics.median(v) for k, v in done["times"].items()}
    distinct = len(set(order))
    decoded = {"lines": len(order), "document, first run": distinct, "document, second run": 0}
    rows = [{"engine": k, "seconds": round(s, 3), "sentences_per_s": round(len(order) / s, 1),
             "decoded": decoded[k], "speedup": round(medians["lines"] / s, 2)} for k, s in medians.items()]
    report = {"rows": rows, "sentences": len(order), "distinct": distinct, "output": verdict,
              "machine": harness.machine(), "threads": THREADS, "beams": args.beams,
              "command": harness.command(__file__)}
    write(args.out, report)
    print(json.dumps(report, indent=1))


def write(out: Path, report: dict) -> None:
    lines = [f"{report['sentences']:,} sentences ({report['distinct']:,} distinct), beams {report['beams']}, "
             f"{report['threads']} threads, {report['machine']}; the document's output: {report['output']} "
             "to the lines' translations in its layout.", ""]
    lines += harness.table(("engine", "seconds", "sentences/s", "decoded", "vs lines"), "lrrrr",
                           [(r["engine"], r["seconds"], f"{r['sentences_per_s']:,}", f"{r['decoded']:,}",
                             f"{r['speedup']}x") for r in report["rows"]])
    lines += ["", f"`{report['command']}`"]
    harness.write_report(out, "bench_documents", report, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
