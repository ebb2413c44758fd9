"""What a glossary and the confidence are worth, measured on a model trained here (issue 56).

    python scripts/bench_terminology.py [--work /tmp/xform-files/terminology] [--out docs]

The model: a small Marian (d_model 128, 2 + 2 layers) trained here for a few minutes on a
synthetic lexical task: source words s0 .. s299 each have a translation t_f(i), sentences of 3 to
12 words are translated word for word. Fifty words are ambiguous, as real terms are ("Kündigung"
is "notice" in general text and "termination" in this client's contracts): in training they take
their usual translation 70% of the time and another one 30%, so the model writes the usual one.
The client's glossary (30 of those words and 10 two-word terms of the other 20) asks for the
other. The held-out test set: 300 new sentences of 3 to 16 unambiguous words (longer than any
trained) with one or two glossary terms put in; their references are the lexical translation
with the glossary's terms in place.

Measured, each way in one run: the share of glossary terms present in the output with and without
the glossary, BLEU and chrF against the references (sacreBLEU), the speed of constrained beam
search against plain beam search of the same width (and greedy promoted against greedy), and the
Spearman rank correlation of each sentence's confidence with its sentence chrF. Writes
terminology.json and the Markdown table to --out's bench_terminology.md.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import harness
import numpy as np

WORDS, TERMS, PAIRS = 300, 30, 10
EOS, UNK, PAD = 0, 1, 2  # then s0..s299 and t0..t299


def vocabulary() -> dict[str, int]:
    """One vocabulary for both sides: the specials, the source words, the target words."""
    pieces = [f"\u2581s{i}" for i in range(WORDS)] + [f"\u2581t{i}" for i in range(WORDS)]
    return {"</s>": EOS, "<unk>": UNK, "<pad>": PAD, **{p: 3 + i for i, p in enumerate(pieces)}}


def write_tokenizer(out: Path) -> None:
    """A sentencepiece word model (each word one piece) per side and vocab.json: OPUS-MT's layout."""
    import io

    import sentencepiece as spm

    words = [f"s{i}" for i in range(WORDS)] + [f"t{i}" for i in range(WORDS)]
    buf = io.BytesIO()
    lines = [" ".join(words[i:i + 50]) for i in range(0, len(words), 50)]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=len(words) + 3,
                                   model_type="word", character_coverage=1.0, minloglevel=2, hard_vocab_limit=False)
    for side in ("source", "target"):
        (out / f"{side}.spm").write_bytes(buf.getvalue())
    (out / "vocab.json").write_text(json.dumps(vocabulary()))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"source_lang": "src", "target_lang": "tgt", "unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>",
         "separate_vocabs": False, "model_max_length": 64}))


def lexicon(seed: int = 0) -> np.ndarray:
    """f: source word i -> target word f(i) (a permutation)."""
    return np.random.default_rng(seed).permutation(WORDS)


def sentence(rng, low: int, high: int) -> list[int]:
    return [int(w) for w in rng.integers(0, WORDS, int(rng.integers(low, high + 1)))]


def alternatives(seed: int = 1) -> dict[int, int]:
    """The ambiguous words: source word -> its other translation (the client's), never its usual one."""
    f, rng = lexicon(), np.random.default_rng(seed)
    words = rng.choice(WORDS, TERMS + 2 * PAIRS, replace=False)
    return {int(w): int((f[w] + 1 + rng.integers(WORDS - 1)) % WORDS) for w in words}


def translated(words: list[int], rng, f: np.ndarray, other: dict[int, int]) -> list[int]:
    """A training sentence's translation: word for word, an ambiguous word its other sense 30% of the time."""
    return [other[w] if w in other and rng.random() < 0.3 else int(f[w]) for w in words]


def train(out: Path, minutes: float, seed: int = 0) -> Path:
    """The model (cached in `out`): trained on sentences of 3 to 12 words until its loss is low or
    `minutes` pass."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    if (out / "config.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    f, rng, vocab, other = lexicon(), np.random.default_rng(seed), 3 + 2 * WORDS, alternatives()
    cfg = MarianConfig(vocab_size=vocab, decoder_vocab_size=vocab, d_model=128, encoder_layers=2, decoder_layers=2,
                       encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256,
                       max_position_embeddings=64, activation_function="swish", scale_embedding=True,
                       pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD, forced_eos_token_id=EOS,
                       bad_words_ids=[[PAD]], num_beams=1, max_length=40, dropout=0.0, attention_dropout=0.0)
    model = MarianMTModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    t0, step, recent = time.time(), 0, []
    model.train()
    floor = 0.6 * (0.7 * np.log(1 / 0.7) + 0.3 * np.log(1 / 0.3)) * (TERMS + 2 * PAIRS) / WORDS  # the ambiguity
    while time.time() - t0 < minutes * 60 and not (len(recent) == 20 and np.mean(recent) < floor + 0.02):
        srcs = [sentence(rng, 3, 12) for _ in range(64)]
        S = max(map(len, srcs)) + 1
        src = np.full((64, S), PAD)
        mask = np.zeros((64, S), np.int64)
        labels = np.full((64, S), -100)
        for i, s in enumerate(srcs):
            src[i, :len(s)], src[i, len(s)] = [3 + w for w in s], EOS
            mask[i, :len(s) + 1] = 1
            labels[i, :len(s)], labels[i, len(s)] = [3 + WORDS + t for t in translated(s, rng, f, other)], EOS
        loss = model(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy(mask),
                     labels=torch.from_numpy(labels)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        recent = (recent + [loss.item()])[-20:]
        if step % 50 == 0:
            print(f"step {step} loss {np.mean(recent):.4f} ({time.time() - t0:.0f} s)", flush=True)
    model.eval().save_pretrained(out)
    model.generation_config.save_pretrained(out)
    write_tokenizer(out)
    (out / "training.json").write_text(json.dumps({"steps": step, "seconds": round(time.time() - t0, 1),
                                                   "loss": float(np.mean(recent))}))
    return out


def glossary() -> list[tuple[list[int], list[int]]]:
    """The client's terms: (source words, required target words): each ambiguous word's other
    sense, 30 single words and 10 two-word terms."""
    other = alternatives()
    words = list(other)
    out = [([w], [other[w]]) for w in words[:TERMS]]
    out += [([a, b], [other[a], other[b]]) for a, b in zip(words[TERMS::2], words[TERMS + 1::2])]
    return out


def test_set(terms, n: int = 300, seed: int = 2) -> tuple[list[str], list[str], list[list[str]]]:
    """(sources, references, each source's required target terms): held-out sentences of 3 to 16
    words of the unambiguous words, each holding one or two glossary terms (never one inside
    another), translated word for word, the terms as the glossary says."""
    f, rng, other = lexicon(), np.random.default_rng(seed), alternatives()
    plain = np.array([w for w in range(WORDS) if w not in other])
    sources, references, wanted = [], [], []
    for _ in range(n):
        words = [[int(w)] for w in rng.choice(plain, int(rng.integers(3, 17)))]  # a word or a term a slot
        target = [[f"t{f[w[0]]}"] for w in words]
        required = []
        for _ in range(int(rng.integers(1, 3))):
            src, tgt = terms[int(rng.integers(len(terms)))]
            at = int(rng.integers(0, len(words) + 1))
            words.insert(at, src)
            target.insert(at, [f"t{t}" for t in tgt])
            required.append(" ".join(f"t{t}" for t in tgt))
        sources.append(" ".join(f"s{w}" for slot in words for w in slot))
        references.append(" ".join(t for slot in target for t in slot))
        wanted.append(required)
    return sources, references, wanted


def term_rate(outputs: list[str], wanted: list[list[str]]) -> float:
    """The share of required terms present (as whole words) in their sentence's output."""
    hits = sum(f" {w} " in f" {o} " for o, ws in zip(outputs, wanted) for w in ws)
    return hits / sum(len(ws) for ws in wanted)


def main() -> None:
    ap = harness.parser(__doc__, work="/tmp/xform-files/terminology", out="docs", threads=2, rounds=3)
    ap.add_argument("--minutes", type=float, default=6.0, help="the training budget (cached once trained)")
    args = ap.parse_args()
    import sacrebleu

    import xform
    from xform.exporter.export import export_bundle
    from xform.runtime.text.confidence import sentence_chrf, spearman
    from xform.runtime.text.translator import Translator

    model_dir = train(args.work / "model", args.minutes)
    bundle = args.work / "bundle"
    if not (bundle / "manifest.json").exists():
        export_bundle(model_dir, bundle)
    translator = Translator(xform.load(bundle, threads=args.threads))
    terms = glossary()
    table = {" ".join(f"s{w}" for w in s): " ".join(f"t{t}" for t in t_) for s, t_ in terms}
    sources, references, wanted = test_set(terms)
    runs = {"greedy": {"beam_size": 1}, "beam 4": {"beam_size": 4}}
    rows, report = [], {"training": json.loads((model_dir / "training.json").read_text()), "lines": len(sources),
                        "terms": sum(map(len, wanted)), "glossary_entries": len(table), "runs": {}}
    for name, options in runs.items():
        def decode(extra, options=options):
            return translator.translate_batch(sources, max_batch_size=32, qe=True, **options, **extra)
        seconds, last = harness.interleave({"without": lambda: decode({}), "with": lambda: decode({"glossary": table})},
                                           args.rounds, warmup=1, progress=name)
        got = {}
        for label, results in last.items():
            outputs = [r.hypotheses[0] for r in results]
            got[label] = {
                "term_rate": round(term_rate(outputs, wanted), 4),
                "bleu": round(sacrebleu.corpus_bleu(outputs, [references]).score, 2),
                "chrf": round(sacrebleu.corpus_chrf(outputs, [references]).score, 2),
                "sentences_per_s": round(harness.rate(len(sources), seconds[label]), 1),
                "unmet": sum(bool(r.unmet and r.unmet[0]) for r in results),
                "promoted_beams": results[0].promoted_beams,
                "spearman_confidence_chrf": round(spearman([r.confidence[0] for r in results],
                                                           [sentence_chrf(o, ref) for o, ref in
                                                            zip(outputs, references)]), 3)}
        report["runs"][name] = got
        w, o = got["with"], got["without"]
        cost = o["sentences_per_s"] / w["sentences_per_s"]
        rows.append((name, f"{o['term_rate']:.1%}", f"{w['term_rate']:.1%}", f"{o['bleu']:.1f}", f"{w['bleu']:.1f}",
                     f"{o['chrf']:.1f}", f"{w['chrf']:.1f}", harness.fmt(o["sentences_per_s"], "{:.0f}"),
                     harness.fmt(w["sentences_per_s"], "{:.0f}"), harness.fmt(cost, "{:.2f}x"),
                     f"{o['spearman_confidence_chrf']:+.3f}", f"{w['spearman_confidence_chrf']:+.3f}"))
    markdown = "\n".join([
        *harness.preamble(harness.command("bench_terminology.py"), harness.machine(),
                          f"model: {report['training']}; {len(sources)} held-out sentences, {report['terms']} "
                          f"glossary terms in them, {len(table)} glossary entries"),
        *harness.table(["decode", "terms without", "terms with", "BLEU without", "BLEU with", "chrF without",
                        "chrF with", "sent/s without", "sent/s with", "cost", "Spearman (conf, chrF) without",
                        "Spearman with"], "lrrrrrrrrrrr", rows)]) + "\n"
    print(markdown)
    if args.out is not None:
        harness.write_report(args.out, "bench_terminology", report, markdown)


if __name__ == "__main__":
    main()
