"""Translation quality of reduced precision on a user's file: BLEU and chrF, xform against its peers.

    pip install -e ".[bench,eval]"
    python scripts/train_marian_synthetic.py --out /tmp/xform-files/marian-synthetic   # once, cached
    python scripts/bench_quality.py [--work /tmp/xform-files] [--lines 2000] [--out docs]

The model and the file are scripts/bench_files.py's (a trained Marian-base, 2,000 lines of 3 to 80
words), translated by the same code as there (bench_files.translate, one process per engine):
xform fp32 and int8 (`Translator.translate_lines`, what `xform run --input-file` runs), CTranslate2
fp32 and int8 (converted to decode what transformers decodes), and transformers eager fp32
(`generate`, batches of 16), greedy and beam 4 (the model's default), with transformers'
stopping rule everywhere but CTranslate2 (its patience 1; docs/bench_files.md).

Each system is scored with sacreBLEU (corpus BLEU, chrF) against two references: eager's
translations (how much a system departs from the model as trained, the question of a
reduced-precision export) and the task's correct translations (the synthetic task copies its
source: how well each system translates). The share of lines identical to eager's is given too.
Quality figures do not depend on the machine's load, so this may run beside other work; speed is
bench_files.py's.
"""
from __future__ import annotations

import json
import sys

import harness
from bench_files import prepare, run_engine

SYSTEMS = ("transformers eager", "xform ort fp32", "xform ort int8", "ctranslate2 fp32", "ctranslate2 int8")
REFERENCE = "transformers eager"


def scores(out: list[str], ref: list[str]) -> dict:
    import sacrebleu
    bleu = sacrebleu.metrics.BLEU()
    b = bleu.corpus_score(out, [ref])
    return {"bleu": b.score, "chrf": sacrebleu.metrics.CHRF().corpus_score(out, [ref]).score,
            "signature": str(bleu.get_signature())}


def main() -> None:
    ap = harness.parser(__doc__, work="/tmp/xform-files", out="docs")
    ap.add_argument("--lines", type=int, default=2000)
    ap.add_argument("--beams", default="1,4")
    ap.add_argument("--max-batch-tokens", type=int, default=2048)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    args.subset = args.lines  # bench_files' engines read it: eager translates the whole file here
    paths = prepare(args.work, args.lines, list(SYSTEMS))
    text = paths["file"].read_text().splitlines()
    correct = text  # the synthetic task's translation of a sentence is the sentence (train_marian_synthetic)
    rows = []
    for beams in map(int, args.beams.split(",")):
        outs = {}
        for name in SYSTEMS:
            wall, outs[name], _ = run_engine(name, paths, text, beams, args)
            print(f"  beam {beams}: {name} translated {len(text)} lines in {wall:.0f} s", file=sys.stderr, flush=True)
        eager = outs[REFERENCE]
        for name, out in outs.items():
            vs_eager, vs_task = scores(out, eager), scores(out, correct)
            rows.append({"beams": beams, "system": name, "lines": len(out),
                         "bleu_vs_eager": vs_eager["bleu"], "chrf_vs_eager": vs_eager["chrf"],
                         "identical_to_eager": sum(a == b for a, b in zip(out, eager)) / len(out),
                         "bleu_vs_task": vs_task["bleu"], "chrf_vs_task": vs_task["chrf"],
                         "signature": vs_eager["signature"]})
    summary = {"rows": rows, "command": harness.command(__file__),
               "training": json.loads((paths["hf"] / "training.json").read_text())}
    harness.write_report(args.out, "bench_quality", summary)
    print(markdown(summary))


def markdown(s: dict) -> str:
    lines = [f"Command: `{s['command']}`; model training: {s['training']}; sacreBLEU `{s['rows'][0]['signature']}`.",
             ""]
    lines += harness.table(
        ("beams", "system", "BLEU vs eager", "chrF vs eager", "identical to eager", "BLEU vs task", "chrF vs task"),
        "rlrrrrr", [(r["beams"], r["system"], f"{r['bleu_vs_eager']:.2f}", f"{r['chrf_vs_eager']:.2f}",
                     f"{r['identical_to_eager']:.1%}", f"{r['bleu_vs_task']:.2f}", f"{r['chrf_vs_task']:.2f}")
                    for r in s["rows"]])
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
