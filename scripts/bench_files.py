"""A user's work: translating a file with a trained Marian Transformer-base, xform against its peers.

    pip install -e ".[bench]"
    python scripts/train_marian_synthetic.py --out /tmp/xform-files/marian-synthetic   # once, cached
    python scripts/bench_files.py [--work /tmp/xform-files] [--lines 2000] [--subset 200] [--out docs]

The model is scripts/train_marian_synthetic.py's (OPUS-MT's size, trained on a synthetic task);
the file has --lines sentences of 3 to 80 words (skewed short, as text is), so outputs end at
varied lengths. Every engine translates the same text file, text in and text out, with its best
settings for files, in a process of its own with 2 threads, one engine at a time:

- xform (ONNX Runtime, fp32 and int8): `Translator.translate_lines`, the code behind
  `xform run --input-file`: windows of 8 batches read ahead, sorted by length, batches of at
  most --max-batch-tokens source tokens;
- CTranslate2 (fp32 and int8): `translate_iterable` with the same token budget
  (`batch_type="tokens"`, its own read-ahead and sorting), sentencepiece in and out; converted
  and run so that it decodes the model transformers decodes (convert_ct2, ct2_settings: the
  decoder starts from the <pad> embedding, not CTranslate2's zero vector for Marian);
- xform "early" (beam rows only): xform with `early_stopping=True`, CTranslate2's stopping rule
  (patience 1: a sentence stops once num_beams hypotheses are done), beside xform with
  transformers' default rule; each row names its rule;
- transformers eager and Optimum `ORTModelForSeq2SeqLM`: `generate` on batches of 16 lines in
  file order, MarianTokenizer in and out, on the first --subset lines only (they are far
  slower; their speed is per sentence all the same).

Greedy and beam 4 (the model's generation_config default); at most --max-new-tokens tokens.
Reports sentences/s, target tokens/s, peak RSS, and the share of lines whose translation equals
transformers' (on the subset), xform fp32's and xform fp32 early's (on the whole file). The
written sections after the table in --out's bench_files.md are kept.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import harness

from xform.runtime.text.translator import Translator

THREADS = 2
ENGINES = ("xform ort fp32", "xform ort int8", "xform ort fp32 early", "xform ort int8 early", "ctranslate2 fp32",
           "ctranslate2 int8", "transformers eager", "optimum ort")
SUBSET_ENGINES = ("transformers eager", "optimum ort")
EARLY_ENGINES = ("xform ort fp32 early", "xform ort int8 early")  # beam rows only: greedy has no stopping rule
EARLY_REF = "xform ort fp32 early"
# with --vmap MAP: each engine decodes with the vocabulary map too (CTranslate2: the map as the converted
# model's vmap.txt and use_vmap=True; xform: bundles exported --with-vocab-map and --vocab-map)
VMAP_ENGINES = ("xform ort fp32 vmap", "xform ort int8 vmap", "ctranslate2 fp32 vmap", "ctranslate2 int8 vmap")
BASELINE = "ctranslate2 fp32"


def prepare(work: Path, lines: int, engines: list[str], vmap: Path | None = None) -> dict[str, Path]:
    from bench_peers import export_optimum
    from train_marian_synthetic import write_corpus

    hf = work / "marian-synthetic"
    if not (hf / "config.json").exists():
        raise SystemExit(f"{hf}: no trained model; run scripts/train_marian_synthetic.py --out {hf} first")
    paths = {"hf": hf, "file": write_corpus(work / f"corpus-{lines}.txt", lines)}

    from xform.errors import BundleError
    from xform.exporter.export import export_bundle
    from xform.runtime.bundle import Bundle
    for q in ("fp32", "int8"):
        out = work / f"xform-{q}"
        try:
            Bundle.open(out)
        except BundleError:  # the restricted decoder too: it costs nothing unless a map is used
            export_bundle(hf, out, precision=q, force=True, vocab_map=True)
        paths[f"xform-{q}"] = out
    if not (work / "ct2-pad-start" / "model.bin").exists():
        convert_ct2(hf, work / "ct2-pad-start")
    paths["ct2"] = work / "ct2-pad-start"
    if vmap is not None:  # CTranslate2 reads a model's map from its directory (vmap.txt)
        import shutil
        with_map = work / "ct2-pad-start-vmap"
        if not with_map.exists():
            shutil.copytree(paths["ct2"], with_map)
        shutil.copyfile(vmap, with_map / "vmap.txt")
        paths["ct2-vmap"], paths["vmap"] = with_map, vmap
    if "optimum ort" in engines:
        paths["optimum"] = export_optimum(hf, work)
    return paths


def convert_ct2(hf: Path, out: Path) -> None:
    """CTranslate2's conversion of the Marian in `hf` with its decoder started from the model's <pad>
    embedding, as transformers starts it. CTranslate2's MarianMTLoader starts every Marian decoder
    from a zero vector and drops <pad> from the vocabulary: right for OPUS-MT models (converted from
    Marian, their <pad> row is zero), not for this one, trained in transformers with tied embeddings
    (the output layer's gradient moves the <pad> row): docs/bench_files.md says what that changed."""
    from ctranslate2.converters import transformers as ct2t

    loaders = getattr(ct2t, "_MODEL_LOADERS", None)
    if not isinstance(loaders, dict) or "MarianConfig" not in loaders:
        raise SystemExit("ctranslate2.converters.transformers has no _MODEL_LOADERS['MarianConfig'] (this "
                         "CTranslate2 changed its converter): scripts/bench_files.py needs ctranslate2 4.5 to 4.8")

    class PadStartMarianLoader(ct2t.MarianMTLoader):
        def get_model_spec(self, model):
            model.config.normalize_before = False
            model.config.normalize_embedding = False
            return ct2t.BartLoader.get_model_spec(self, model)  # the <pad> row kept

        def set_config(self, config, model, tokenizer):
            super().set_config(config, model, tokenizer)
            config.decoder_start_token = tokenizer.pad_token

        def set_decoder(self, spec, decoder):
            ct2t.BartLoader.set_decoder(self, spec, decoder)  # start_from_zero_embedding stays False

        def get_vocabulary(self, model, tokenizer):
            return ct2t.BartLoader.get_vocabulary(self, model, tokenizer)  # <pad> kept: its id is the start

    stock = loaders["MarianConfig"]
    loaders["MarianConfig"] = PadStartMarianLoader()
    try:
        ct2t.TransformersConverter(str(hf)).convert(str(out), force=True)
    finally:
        loaders["MarianConfig"] = stock


def ct2_settings(hf: Path, max_new_tokens: int) -> dict:
    """translate_iterable's settings that decode as transformers' generate does with the model's
    generation_config: <pad> never generated (its bad_words_ids; the converted vocabulary keeps it),
    the end token counted in the length that scores are divided by, and one step less where
    forced_eos_token_id makes transformers' last step an end token (CTranslate2's last step would
    pick a word instead)."""
    gen = json.loads((hf / "generation_config.json").read_text())
    forced = gen.get("forced_eos_token_id") is not None
    return {"suppress_sequences": [["<pad>"]], "return_end_token": True,
            "max_decoding_length": max_new_tokens - 1 if forced else max_new_tokens}


def stopping_rule(name: str, beams: int) -> str:
    if beams == 1:
        return "greedy"
    if name.startswith("ctranslate2"):
        return f"patience 1: stops at {beams} finished"
    return "early_stopping=True" if name in EARLY_ENGINES else "early_stopping=False (default)"


def translate(name: str, paths: dict, lines: list[str], beams: int, args) -> list[str]:
    """The engine's translations of `lines`, in order."""
    if name.startswith("xform"):
        import xform
        session = xform.load(paths["xform-int8" if "int8" in name else "xform-fp32"], threads=THREADS)
        gen = session.generation_config(args.max_new_tokens, num_beams=beams,
                                        early_stopping=True if name in EARLY_ENGINES else None)
        from xform.runtime.decoding.request import TextOptions
        from xform.runtime.scheduling.batching import Batching
        text = TextOptions(vocab_map=paths["vmap"] if name.endswith("vmap") else None)
        batching = Batching("tokens", max_batch_tokens=args.max_batch_tokens)
        out = Translator(session).translate_lines(lines, gen, batching, text)
        return [line.hypotheses[0] if line.hypotheses else "" for line in out]
    if name.startswith("ctranslate2"):
        import ctranslate2
        import sentencepiece as spm
        sp_src = spm.SentencePieceProcessor(model_file=str(paths["hf"] / "source.spm"))
        sp_tgt = spm.SentencePieceProcessor(model_file=str(paths["hf"] / "target.spm"))
        vmap = name.endswith("vmap")
        tr = ctranslate2.Translator(str(paths["ct2-vmap" if vmap else "ct2"]), device="cpu", inter_threads=1,
                                    intra_threads=THREADS, compute_type="int8" if "int8" in name else "float32")
        tokens = (sp_src.encode(line, out_type=str) + ["</s>"] for line in lines)
        results = tr.translate_iterable(tokens, max_batch_size=args.max_batch_tokens, batch_type="tokens",
                                        beam_size=beams, use_vmap=vmap,
                                        **ct2_settings(paths["hf"], args.max_new_tokens))
        return [sp_tgt.decode([t for t in r.hypotheses[0] if t != "</s>"]) for r in results]
    import torch
    from transformers import MarianTokenizer
    torch.set_num_threads(THREADS)
    tok = MarianTokenizer.from_pretrained(paths["hf"])
    if name == "transformers eager":
        from transformers import MarianMTModel
        model = MarianMTModel.from_pretrained(paths["hf"]).eval()
    else:
        import onnxruntime
        from optimum.onnxruntime import ORTModelForSeq2SeqLM
        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = THREADS, 1
        model = ORTModelForSeq2SeqLM.from_pretrained(paths["optimum"], session_options=opts, use_merged=False)
    out = []
    for i in range(0, len(lines), 16):
        enc = tok(lines[i:i + 16], return_tensors="pt", padding=True)
        with torch.inference_mode():
            ids = model.generate(**enc, num_beams=beams, do_sample=False, max_new_tokens=args.max_new_tokens)
        out += tok.batch_decode(ids, skip_special_tokens=True)
    return out


def worker(name, paths, lines, beams, args, conn) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    t0 = time.perf_counter()
    out = translate(name, paths, lines, beams, args)
    wall = time.perf_counter() - t0
    from xform.runtime.bench import peak_rss_mib
    conn.send((wall, out, peak_rss_mib()))


def run_engine(name, paths, lines, beams, args) -> tuple[float, list[str], float]:
    """(wall seconds, translations, peak RSS MiB) of the engine in a process of its own; RuntimeError
    if it crashes (never a hang)."""
    return harness.in_process(worker, (name, paths, lines, beams, args), name)


def main() -> None:
    ap = harness.parser(__doc__, work="/tmp/xform-files", out="docs", rounds=1)
    ap.add_argument("--lines", type=int, default=2000)
    ap.add_argument("--subset", type=int, default=200)
    ap.add_argument("--beams", default="1,4")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--max-batch-tokens", type=int, default=2048)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--vmap", type=Path, default=None,
                    help="a vocabulary map (scripts/build_vocab_map.py): the *vmap engines decode with it")
    args = ap.parse_args()
    if args.vmap is None and any(name.endswith("vmap") for name in args.engines.split(",")):
        raise SystemExit(f"the engines {', '.join(VMAP_ENGINES)} decode with a vocabulary map: give --vmap MAP")
    paths = prepare(args.work, args.lines, args.engines.split(","), args.vmap)
    text = paths["file"].read_text().splitlines()
    rows: list[dict] = []
    failed: list[str] = []
    for beams in map(int, args.beams.split(",")):
        outs, walls, rss = {}, {}, {}
        for r in range(args.rounds):
            for name in args.engines.split(","):
                if beams == 1 and name in EARLY_ENGINES:
                    continue
                lines = text[:args.subset] if name in SUBSET_ENGINES else text
                try:
                    wall, out, peak = run_engine(name, paths, lines, beams, args)
                except RuntimeError as e:  # reported beside the others, never a hang
                    print(f"  beam {beams} round {r + 1}: {e}", file=sys.stderr, flush=True)
                    failed.append(f"beam {beams}: {e}")
                    continue
                walls.setdefault(name, []).append(wall)
                outs[name], rss[name] = out, peak
                print(f"  beam {beams} round {r + 1}: {name} {len(lines) / wall:.1f} sentences/s", file=sys.stderr,
                      flush=True)
        ref_sub = outs.get("transformers eager")
        ref_all = outs.get("xform ort fp32")
        ref_early = outs.get(EARLY_REF)
        for name, out in outs.items():
            wall = statistics.median(walls[name])
            n = len(out)
            rows.append({"beams": beams, "engine": name, "stopping": stopping_rule(name, beams), "lines": n,
                         "sentences_per_s": n / wall,
                         "target_tokens_per_s": sum(len(t.split()) for t in out) / wall,
                         "peak_rss_mib": rss[name],
                         "same_as_transformers": None if ref_sub is None else
                         sum(a == b for a, b in zip(out, ref_sub)) / len(ref_sub),
                         "same_as_xform_fp32": same(out, ref_all),
                         "same_as_xform_fp32_early": same(out, ref_early)})
        for r in rows:  # against CTranslate2 at fp32, and at the engine's own precision (int8: its int8)
            if r["beams"] != beams:
                continue
            for key, peer in (("vs_ct2_fp32", BASELINE),
                              ("vs_ct2_same", ("ctranslate2 int8" if "int8" in r["engine"] else BASELINE)
                               + (" vmap" if r["engine"].endswith("vmap") else ""))):
                base = next((b for b in rows if b["beams"] == beams and b["engine"] == peer), None)
                if base is not None:
                    r[key] = r["sentences_per_s"] / base["sentences_per_s"]
    lengths = [len(t.split()) for t in text]
    ref = outs.get("xform ort fp32") or []
    out_lengths = [len(t.split()) for t in ref]
    summary = {"rows": rows, "failed": failed, "machine": harness.machine(), "threads": THREADS,
               "source_words": {"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths)},
               "xform_fp32_output_words": {"min": min(out_lengths, default=0),
                                           "median": statistics.median(out_lengths) if out_lengths else 0,
                                           "max": max(out_lengths, default=0)},
               "command": harness.command(__file__),
               "ctranslate2": {"conversion": "decoder started from the <pad> embedding (convert_ct2)",
                               **ct2_settings(paths["hf"], args.max_new_tokens)},
               "training": json.loads((paths["hf"] / "training.json").read_text())}
    md = markdown(summary)
    harness.write_report(args.out, "bench_files", summary, md + notes(args.out / "bench_files.md"))
    print(md)


def notes(path: Path) -> str:
    """The written sections after the table (from the first "## " heading on), kept across runs."""
    text = path.read_text() if path.exists() else ""
    at = text.find("\n## ")
    return "" if at < 0 else text[at:]


def same(out: list[str], ref: list[str] | None) -> float | None:
    """The share of lines equal to `ref`'s (None without a reference of the same length)."""
    return None if ref is None or len(out) != len(ref) else sum(a == b for a, b in zip(out, ref)) / len(out)


def markdown(s: dict) -> str:
    lines = harness.preamble(s["command"], f"{s['machine']}, {s['threads']} threads each. Source words "
                             f"{s['source_words']}; xform fp32 output words {s['xform_fp32_output_words']}. Model "
                             f"training: {s['training']}.")
    pct, ratio = "{:.1%}", "{:.2f}x"
    lines += harness.table(
        ("beams", "engine", "stopping rule", "lines", "sentences/s", "target words/s", "vs CTranslate2 fp32",
         "vs CTranslate2 same precision", "= transformers (subset)", "= xform fp32", "= xform fp32 early",
         "peak RSS MiB"), "rllrrrrrrrrr",
        [(r["beams"], r["engine"], r.get("stopping", "-"), r["lines"], f"{r['sentences_per_s']:.1f}",
          f"{r['target_tokens_per_s']:.0f}", harness.fmt(r.get("vs_ct2_fp32"), ratio),
          harness.fmt(r.get("vs_ct2_same"), ratio), harness.fmt(r["same_as_transformers"], pct),
          harness.fmt(r["same_as_xform_fp32"], pct), harness.fmt(r.get("same_as_xform_fp32_early"), pct),
          f"{r['peak_rss_mib']:.0f}") for r in s["rows"]])
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
