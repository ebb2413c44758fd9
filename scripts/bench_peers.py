"""xform against its peers on a Marian Transformer-base with random weights, in one run.

    pip install -e ".[bench]"
    python scripts/bench_peers.py [--work /tmp/xform-bench] [--iters 5] [--out docs] [--beams 4]
    python scripts/bench_peers.py --model nllb-600m [--work /tmp/xform-nllb] [--beams 4]
    python scripts/bench_peers.py --model madlad-3b [--layers 4] [--work /tmp/xform-madlad] [--beams 4]

`--model nllb-600m` takes an NLLB-200-distilled-600M-shaped M2M100 instead (d_model 1024, 12+12
layers, 16 heads, FFN 4096, vocabulary 256,206; scripts/nllb_scale.py's), with a synthetic
M2M100Tokenizer vocabulary (t4 .. t256097, 100 language tokens, 8 made-up words: what CTranslate2's
converter reads), at batch 1 and 16 only; files are named bench_peers_nllb*.

`--model madlad-3b` takes a MADLAD-400-3B-shaped T5 (google/madlad400-3b-mt's config: d_model
1024, 16 heads of d_kv 128, gated-gelu FFN 8192, untied output, vocabulary 256,000, 32 relative
buckets up to 128, decoder start 0, pad 1, eos 2) with `--layers` encoder and decoder layers
(default 4 of its 32: the 3B model's 12 GB of fp32 weights do not export within 24 GiB), random
weights and a placeholder sentencepiece model of 12 pieces (CTranslate2's converter names the ids
past them <extra_id_N>); xform, transformers and CTranslate2 only, batch 1 and 16; files are named
bench_peers_madlad*.

Builds the model locally (d_model 512, 6+6 layers, 8 heads, FFN 2048, vocab 32000), gives it a
synthetic vocabulary (t0 .. t31999) so that every engine sees the same ids, and times, interleaved
round by round: xform `ort` fp32 and int8, xform `torch`, transformers eager `generate`, Optimum
`ORTModelForSeq2SeqLM`, CTranslate2 fp32 and int8. All greedy, 2 threads, exactly 64 new tokens
from 32-token sources at batch 1, batch 16, and batch 16 with ragged lengths 8 to 32. With
`--beams N`, every engine runs beam search of width N instead (length penalty 1, early stopping
off, one hypothesis returned), at batch 1 and 16, and the files are named bench_peers_beamN.*.

Each engine lives in a worker process of its own with default threading settings (so no engine's
thread pool or wait policy is imposed on another, and its peak RSS is its own); the driver runs
one engine at a time, round-robin, pausing between runs so that spinning worker threads settle.
Checks that the fp32 engines agree with transformers' tokens; writes a Markdown table, JSON and a
PNG chart with ratios to CTranslate2 fp32.
"""
from __future__ import annotations

import io
import json
import os
import statistics
import sys
import time
from pathlib import Path

import harness
import numpy as np

THREADS = 2
NEW_TOKENS = 64
# the model's ids, set by set_model: (vocabulary, pad, eos, unk, first and end of the content ids)
# (the last PIECES content ids are the placeholder sentencepiece model's pieces, which xform's import
# requires the vocabulary to hold: random sources stop short of them)
PIECES = 9
MODELS = {"marian-base": (32000, 31999, 0, 1, 2, 31999 - PIECES), "nllb-600m": (256206, 1, 2, 3, 4, 256098 - PIECES),
          "madlad-3b": (256000, 1, 2, 0, 3 + PIECES, 256000)}
LAYERS = 4  # madlad-3b's encoder and decoder depth (--layers)
MODEL = "marian-base"
VOCAB, PAD, EOS, UNK, FIRST, END = MODELS[MODEL]
TITLES = {"marian-base": "Marian Transformer-base", "nllb-600m": "NLLB-200-distilled-600M-shaped M2M100",
          "madlad-3b": "MADLAD-400-3B-shaped T5"}
HF_CLASSES = {"marian-base": "MarianMTModel", "nllb-600m": "M2M100ForConditionalGeneration",
              "madlad-3b": "T5ForConditionalGeneration"}
WORKLOADS = {"batch 1": (1, 32, False), "batch 16": (16, 32, False), "batch 16 ragged": (16, 32, True)}
FP32_ENGINES = ("xform ort fp32", "xform torch", "transformers eager", "optimum ort", "ctranslate2 fp32")
ENGINES = ("xform ort fp32", "xform ort int8", "xform torch", "transformers eager", "optimum ort",
           "ctranslate2 fp32", "ctranslate2 int8")
BASELINE = "ctranslate2 fp32"


# -- the model and the files every engine loads ------------------------------------------------------
def set_model(name: str) -> None:
    global MODEL, VOCAB, PAD, EOS, UNK, FIRST, END
    MODEL = name
    VOCAB, PAD, EOS, UNK, FIRST, END = MODELS[name]
    if name != "marian-base":
        WORKLOADS.pop("batch 16 ragged", None)


def build_model(work: Path) -> Path:
    """The model, random weights, saved with a synthetic tokenizer."""
    if MODEL == "nllb-600m":
        return build_nllb(work)
    if MODEL == "madlad-3b":
        return build_madlad(work)
    import torch
    from transformers import MarianConfig, MarianMTModel

    hf = work / "marian-base"
    if (hf / "config.json").exists():
        return hf
    torch.manual_seed(0)
    cfg = MarianConfig(vocab_size=VOCAB, decoder_vocab_size=VOCAB, d_model=512, encoder_layers=6, decoder_layers=6,
                       encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
                       decoder_ffn_dim=2048, max_position_embeddings=512, activation_function="swish",
                       scale_embedding=True, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD,
                       forced_eos_token_id=None, bad_words_ids=[[PAD]])
    MarianMTModel(cfg).eval().save_pretrained(hf)
    write_synthetic_tokenizer(hf)
    return hf


def write_synthetic_tokenizer(hf: Path) -> None:
    """vocab.json t0..t31999 with </s>, <unk>, <pad> at Marian's ids; placeholder sentencepiece models
    (MarianTokenizer, which CTranslate2's converter reads the vocabulary through, needs them to load)."""

    vocab = {f"t{i}": i for i in range(VOCAB)}
    for tok, i in (("</s>", EOS), ("<unk>", UNK), ("<pad>", PAD)):
        del vocab[f"t{i}"]
        vocab[tok] = i
    buf = placeholder_spm()
    vocab = {**{t: i for t, i in vocab.items() if not END <= i < END + PIECES}, **spm_pieces(buf, END)}
    (hf / "vocab.json").write_text(json.dumps(vocab))
    for side in ("source", "target"):
        (hf / f"{side}.spm").write_bytes(buf.getvalue())
    (hf / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 512, "separate_vocabs": False}))


def placeholder_spm() -> io.BytesIO:
    """A tiny sentencepiece model (the tokenizers need one to load; the benchmarks feed ids)."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(["a b c d e f g"] * 10), model_writer=buf, vocab_size=12,
                                   minloglevel=2)
    return buf


def spm_pieces(buf: io.BytesIO, first: int) -> dict[str, int]:
    """The placeholder model's pieces (its control and unknown symbols aside) at ids first, first + 1, ..."""
    import sentencepiece as spm

    proc = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    pieces = [proc.id_to_piece(i) for i in range(proc.get_piece_size())
              if not (proc.is_control(i) or proc.is_unknown(i))]
    assert len(pieces) == PIECES, pieces
    return {p: first + j for j, p in enumerate(pieces)}


def build_nllb(work: Path) -> Path:
    """scripts/nllb_scale.py's model (built there if missing) with an M2M100Tokenizer vocabulary of
    synthetic tokens: vocab.json holds <s> <pad> </s> <unk> and t4 .. t256097; M2M100 adds 100
    language tokens and 8 made-up words after them, 256,206 ids in all."""

    from nllb_scale import build

    hf = build(work)
    if not (hf / "vocab.json").exists():
        buf = placeholder_spm()
        vocab = {"<s>": 0, "<pad>": PAD, "</s>": EOS, "<unk>": UNK, **{f"t{i}": i for i in range(FIRST, END)},
                 **spm_pieces(buf, END)}
        (hf / "vocab.json").write_text(json.dumps(vocab))
        (hf / "sentencepiece.bpe.model").write_bytes(buf.getvalue())
    if not (hf / "tokenizer_config.json").exists():
        from xform.models.bart_family import M2M100_LANGUAGES
        # the language tokens listed, so that CTranslate2's converter appends them to its vocabulary
        (hf / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "M2M100Tokenizer", "language_codes": "m2m100", "num_madeup_words": 8,
             "src_lang": "en", "tgt_lang": "fr", "model_max_length": 1024,
             "additional_special_tokens": [f"__{c}__" for c in M2M100_LANGUAGES["m2m100"]]}))
    return hf


def build_madlad(work: Path) -> Path:
    """MADLAD-400-3B's widths at LAYERS layers a stack, random weights; a placeholder sentencepiece
    model with MADLAD's special ids (<unk> 0, <pad> 1, </s> 2) and no extra ids, read as T5Tokenizer."""
    import sentencepiece as spm
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    hf = work / f"madlad-3b-{LAYERS}-layers"
    if (hf / "config.json").exists():
        return hf
    torch.manual_seed(0)
    cfg = T5Config(vocab_size=VOCAB, d_model=1024, d_kv=128, d_ff=8192, num_heads=16, num_layers=LAYERS,
                   num_decoder_layers=LAYERS, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                   relative_attention_num_buckets=32, relative_attention_max_distance=128, n_positions=512,
                   decoder_start_token_id=0, pad_token_id=PAD, eos_token_id=EOS)
    T5ForConditionalGeneration(cfg).eval().save_pretrained(hf)
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(["a b c d e f g"] * 10), model_writer=buf, vocab_size=12,
                                   unk_id=UNK, pad_id=PAD, eos_id=EOS, bos_id=-1, minloglevel=2)
    (hf / "spiece.model").write_bytes(buf.getvalue())
    # the fast tokenizer's file too, built with `tokenizers` as transformers' converter lays it out
    # (CTranslate2's converter loads the fast tokenizer; converting it needs a protobuf sentencepiece's
    # generated module may refuse)
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    proc = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    tok = Tokenizer(models.Unigram([(proc.id_to_piece(i), proc.get_score(i)) for i in range(proc.get_piece_size())],
                                   unk_id=UNK, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", EOS)])
    tok.add_special_tokens(["<unk>", "<pad>", "</s>"])
    tok.save(str(hf / "tokenizer.json"))
    (hf / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer", "extra_ids": 0,
                                                          "legacy": True, "model_max_length": 512}))
    return hf


def convert_ct2(hf: Path, work: Path) -> Path:
    out = work / "ct2"
    if not (out / "model.bin").exists():
        import ctranslate2
        ctranslate2.converters.TransformersConverter(str(hf)).convert(str(out), force=True)
    return out


# the export variants a precision may name after a dash (bench_gpu.py's "xform fp16-int4-fused")
VARIANTS = {"int8": {"weights": "int8"}, "int4": {"weights": "int4"},
            "fused": {"fuse": "attention,qkv,skip_layer_norm"}, "fusedx": {"fuse": "cross_attention,skip_layer_norm"}}


def export_xform(hf: Path, work: Path, precision: str) -> Path:
    from xform.errors import BundleError
    from xform.exporter.export import export_bundle
    from xform.runtime.bundle import Bundle

    out = work / f"xform-{precision}"
    # "fp16-int4-fused": fp16 with export --weights int4 and --fuse (VARIANTS)
    activations, *variant = precision.split("-")
    options = {k: v for part in variant for k, v in VARIANTS[part].items()}
    try:
        Bundle.open(out)  # reused while this xform reads it; an older bundle format is re-exported
    except BundleError:
        # random weights: a reduced precision's figures are recorded, not judged (--no-judgement)
        judge = activations == "fp32" and "weights" not in options  # fp32 graphs, fused or not, are verified
        export_bundle(hf, out, precision=activations, force=True, judge=judge, **options)
    return out


# -- the engines: each a callable (src ids (B, S) int64, lengths (B,)) -> generated ids (B, 64) --------
def make_engine(name: str, paths: dict[str, Path], beams: int = 1):
    if name.startswith("xform"):
        import xform
        backend = "torch" if name == "xform torch" else "ort"
        bundle = paths["xform-int8" if name.endswith("int8") else "xform-fp32"]
        session = xform.load(bundle, backend=backend, threads=THREADS)
        return lambda src, lens: session.generate(src, lens, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                                  num_beams=beams)
    if name == "transformers eager":
        import torch
        import transformers
        torch.set_num_threads(THREADS)
        model = getattr(transformers, HF_CLASSES[MODEL]).from_pretrained(paths["hf"]).eval()
        return lambda src, lens: hf_generate(model, src, lens, beams)
    if name == "optimum ort":
        import onnxruntime
        from optimum.onnxruntime import ORTModelForSeq2SeqLM
        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = THREADS, 1
        model = ORTModelForSeq2SeqLM.from_pretrained(paths["optimum"], session_options=opts, use_merged=False)
        return lambda src, lens: hf_generate(model, src, lens, beams)
    if name.startswith("ctranslate2"):
        import ctranslate2
        translator = ctranslate2.Translator(str(paths["ct2"]), device="cpu", inter_threads=1, intra_threads=THREADS,
                                            compute_type="int8" if name.endswith("int8") else "float32")
        ids = ct2_vocabulary(paths["ct2"])
        return lambda src, lens: ct2_generate(translator, src, lens, beams, ids)
    raise ValueError(name)


def hf_generate(model, src, lens, beams=1):
    import torch
    mask = (np.arange(src.shape[1])[None] < lens[:, None]).astype(np.int64)
    with torch.inference_mode():
        out = model.generate(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(mask), num_beams=beams,
                             do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    return out[:, 1:].numpy()


def token(i: int, vocabulary: list[str] | None = None) -> str:
    """The token CTranslate2 reads for id i: the converted vocabulary's where it is given (T5: the
    ids past the tokenizer's are its <extra_id_N>), else the synthetic vocabulary's."""
    if vocabulary is not None:
        return vocabulary[i]
    return {EOS: "</s>", UNK: "<unk>", PAD: "<pad>"}.get(i, f"t{i}")


def ct2_vocabulary(model: Path) -> dict[str, int]:
    """token -> id of the converted model's vocabulary (what its generated tokens mean)."""
    if (model / "shared_vocabulary.json").exists():
        tokens = json.loads((model / "shared_vocabulary.json").read_text())
    else:
        tokens = (model / "shared_vocabulary.txt").read_text(encoding="utf-8").split("\n")
    return {t: i for i, t in enumerate(tokens)}


def ct2_generate(translator, src, lens, beams=1, ids=None):
    names = list(ids) if MODEL == "madlad-3b" and ids is not None else None  # ids in vocabulary order
    batch = [[token(int(i), names) for i in row[:n]] for row, n in zip(src, lens)]
    res = translator.translate_batch(batch, beam_size=beams, max_decoding_length=NEW_TOKENS,
                                     min_decoding_length=NEW_TOKENS, max_batch_size=len(batch))
    return np.array([[ids[t] for t in r.hypotheses[0]] for r in res])


def sources(batch: int, src_len: int, ragged: bool, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lens = rng.integers(8, src_len + 1, batch) if ragged else np.full(batch, src_len)
    src = np.full((batch, src_len), PAD, np.int64)
    for r, n in enumerate(lens):
        src[r, :n - 1] = rng.integers(FIRST, END, n - 1)
        src[r, n - 1] = EOS
    return src, lens.astype(np.int64)


# -- measuring ---------------------------------------------------------------------------------------------
def worker(name: str, paths: dict[str, Path], beams: int, model: str, conn) -> None:
    """Loads one engine, then runs (src, lens) requests until told to stop; reports its peak RSS."""
    from xform.runtime.bench import peak_rss_mib
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    set_model(model)
    run = make_engine(name, paths, beams)

    def timed(request):
        t0 = time.perf_counter()
        out = run(*request)
        return time.perf_counter() - t0, out
    harness.serve(conn, "ready", timed, peak_rss_mib)


def time_interleaved(names: list[str], paths: dict[str, Path], warmup: int, iters: int,
                     beams: int = 1) -> tuple[dict, dict, dict]:
    """Each engine in a worker process of its own (harness.Workers), one engine at a time, round by
    round; the seconds each worker measured, its last outputs and its peak RSS."""
    workers = harness.Workers({name: (worker, (name, paths, beams, MODEL)) for name in names})
    times = {w: {e: [] for e in names} for w in WORKLOADS}
    outputs = {w: {} for w in WORKLOADS}
    for w, (batch, src_len, ragged) in WORKLOADS.items():
        src, lens = sources(batch, src_len, ragged)
        for r in range(warmup + iters):
            for name in names:
                dt, out = workers.ask(name, (src, lens))
                if r >= warmup:
                    times[w][name].append(dt)
                outputs[w][name] = out
            print(f"  {w}: round {r + 1}/{warmup + iters}", file=sys.stderr, flush=True)
    return times, outputs, workers.close()


def summarize(times: dict, outputs: dict, rss: dict) -> dict:
    rows = []
    for w, (batch, _, _) in WORKLOADS.items():
        tps = {e: harness.rate(batch * NEW_TOKENS, t) for e, t in times[w].items()}
        ref = outputs[w].get("transformers eager")
        for e in times[w]:
            out = outputs[w][e]
            agree = None if ref is None else float((out == ref).mean()) if out.shape == ref.shape else 0.0
            rows.append({"workload": w, "engine": e, "tokens_per_s": tps[e], "ratio_to_ct2_fp32": tps[e] / tps[BASELINE],
                         "median_s": statistics.median(times[w][e]), "token_agreement_with_transformers": agree,
                         "peak_rss_mib": rss.get(e)})
    return {"rows": rows, "threads": THREADS, "new_tokens": NEW_TOKENS, "machine": harness.machine()}


# each engine's package; a peer that is not installed is named so (the run measured only the engines asked for)
PACKAGES = ("xform", "onnxruntime", "torch", "transformers", "optimum", "optimum-onnx", "ctranslate2")


def markdown(summary: dict, command: str) -> str:
    strategy = "greedy" if summary.get("beams", 1) == 1 else "beam search, width %d" % summary["beams"]
    lines = harness.preamble(command, summary["machine"], f"{summary['threads']} threads each",
                             f"{strategy}, exactly {summary['new_tokens']} new tokens",
                             "versions: " + harness.listed(summary["versions"]))
    lines += harness.table(
        ("workload", "engine", "tokens/s", "vs CTranslate2 fp32", "tokens = transformers", "peak RSS MiB"), "llrrrr",
        [(r["workload"], r["engine"], f"{r['tokens_per_s']:,.1f}", f"{r['ratio_to_ct2_fp32']:.2f}x",
          harness.fmt(r["token_agreement_with_transformers"], "{:.2%}"),
          harness.fmt(r["peak_rss_mib"] or None, "{:,.0f}"))
         for r in summary["rows"]])
    return "\n".join(lines) + "\n"


def chart(summary: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = list(dict.fromkeys(r["engine"] for r in summary["rows"]))
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(engines)
    for i, e in enumerate(engines):
        vals = [next(r["tokens_per_s"] for r in summary["rows"] if r["workload"] == w and r["engine"] == e)
                for w in WORKLOADS]
        ax.bar(np.arange(len(WORKLOADS)) + i * width, vals, width, label=e)
    ax.set_xticks(np.arange(len(WORKLOADS)) + 0.4 - width / 2, list(WORKLOADS))
    ax.set_ylabel("tokens/s (higher is better)")
    strategy = "greedy" if summary.get("beams", 1) == 1 else f"beam {summary['beams']}"
    ax.set_title(f"{TITLES[MODEL]}, {strategy}, {NEW_TOKENS} new tokens, {THREADS} threads")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    global LAYERS
    ap = harness.parser(__doc__, work="/tmp/xform-bench", out="docs", warmup=1, iters=5)
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--beams", type=int, default=1, help="beam search width for every engine (1: greedy)")
    ap.add_argument("--model", choices=list(MODELS), default="marian-base")
    ap.add_argument("--layers", type=int, default=LAYERS, help="madlad-3b: encoder and decoder layers (of 32)")
    args = ap.parse_args()
    set_model(args.model)
    if args.model == "madlad-3b":
        LAYERS = args.layers
        if args.engines == ",".join(ENGINES):
            args.engines = ",".join(e for e in ENGINES if e not in ("xform torch", "optimum ort"))
    if args.beams > 1:  # beam search: batch 1 and 16; eager PyTorch through xform is no peer here
        for w in ("batch 16 ragged",):
            WORKLOADS.pop(w, None)
    args.work.mkdir(parents=True, exist_ok=True)
    print("building the model and converting it for every engine", file=sys.stderr)
    hf = build_model(args.work)
    names = args.engines.split(",")
    paths = {"hf": hf, "ct2": convert_ct2(hf, args.work), "xform-fp32": export_xform(hf, args.work, "fp32")}
    if "optimum ort" in names:
        paths["optimum"] = export_optimum(hf, args.work)
    if "xform ort int8" in names:
        paths["xform-int8"] = export_xform(hf, args.work, "int8")
    times, outputs, rss = time_interleaved(names, paths, args.warmup, args.iters, args.beams)
    summary = summarize(times, outputs, rss)
    summary["beams"] = args.beams
    summary["versions"] = harness.versions(PACKAGES, missing="not installed")
    command = summary["command"] = harness.command(__file__)
    stem = ("bench_peers" + {"nllb-600m": "_nllb", "madlad-3b": "_madlad"}.get(MODEL, "")
            + ("" if args.beams == 1 else f"_beam{args.beams}"))
    harness.write_report(args.out, stem, summary, markdown(summary, command))
    chart(summary, args.out / f"{stem}.png")
    print(markdown(summary, command))


def export_optimum(hf: Path, work: Path) -> Path:
    out = work / "optimum"
    if not (out / "config.json").exists():
        from optimum.onnxruntime import ORTModelForSeq2SeqLM
        ORTModelForSeq2SeqLM.from_pretrained(hf, export=True).save_pretrained(out)
        for f in ("vocab.json", "source.spm", "target.spm", "tokenizer_config.json"):
            (out / f).write_bytes((hf / f).read_bytes())
    return out


if __name__ == "__main__":
    main()
