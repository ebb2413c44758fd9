"""Train a Marian Transformer-base on a synthetic translation task, for the file benchmark.

    python scripts/train_marian_synthetic.py --out /tmp/xform-files/marian-synthetic [--minutes 20]

The model is OPUS-MT's size (d_model 512, 6+6 layers, 8 heads, FFN 2048, swish, scaled and tied
embeddings) with a 32,000-word vocabulary. The "languages" are words w0 .. w31996: a target
sentence is its source with every word w_i replaced by w_f(i) (f a fixed permutation) and
every third word dropped, so outputs are about two thirds of their sources and end at varied
lengths (sources of 3 to 80 words). A sentencepiece word model per side and vocab.json make it
an ordinary OPUS-MT directory that xform, CTranslate2, Optimum and transformers all load. It
trains for a time budget on the CPU (2 cores: a few hundred steps); how well it learned is
reported (teacher-forced token accuracy), and what the benchmark needs from it is outputs that
depend on the source and end at varied lengths, which the benchmark measures and prints.
Cached: a directory with config.json is reused.
"""
from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import numpy as np

WORDS = 31997  # + </s>, <unk>, <pad> = 32000 ids
EOS, UNK = 0, 1
PAD = WORDS + 2


def word_ids(words: np.ndarray) -> np.ndarray:
    return words + 2  # w_i is id i + 2 (after </s> and <unk>)


def target_words(src: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """The synthetic translation of one source (word indices): mapped, every third word dropped."""
    keep = np.arange(len(src)) % 3 != 2
    return perm[src[keep]]


def sample_lengths(rng, n: int, low: int = 3, high: int = 80) -> np.ndarray:
    """Sentence lengths skewed short, as real text is: a log-normal clipped to [low, high]."""
    return np.clip(np.round(rng.lognormal(np.log(18), 0.6, n)), low, high).astype(int)


def sample_words(rng, n: int) -> np.ndarray:
    """Zipf-like word frequencies over the whole vocabulary."""
    return np.minimum(rng.zipf(1.15, n) - 1, WORDS - 1)


def write_tokenizer(out: Path) -> None:
    """A sentencepiece word model per side (each word one piece) and vocab.json, OPUS-MT's layout."""
    import sentencepiece as spm

    words = [f"w{i}" for i in range(WORDS)]
    corpus = [" ".join(words[i:i + 50]) for i in range(0, WORDS, 50)]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=buf, vocab_size=WORDS + 3,
                                   model_type="word", character_coverage=1.0, minloglevel=2,
                                   hard_vocab_limit=False, max_sentence_length=100000)
    for side in ("source", "target"):
        (out / f"{side}.spm").write_bytes(buf.getvalue())
    vocab = {"</s>": EOS, "<unk>": UNK, **{f"\u2581w{i}": int(word_ids(np.array(i))) for i in range(WORDS)},
             "<pad>": PAD}
    (out / "vocab.json").write_text(json.dumps(vocab))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"source_lang": "src", "target_lang": "tgt", "unk_token": "<unk>", "eos_token": "</s>",
         "pad_token": "<pad>", "separate_vocabs": False, "model_max_length": 512}))


def batch(rng, perm, n: int, max_len: int):
    import torch
    lengths = np.minimum(sample_lengths(rng, n), max_len)
    srcs = [sample_words(rng, int(k)) for k in lengths]
    tgts = [target_words(s, perm) for s in srcs]
    S, T = max(map(len, srcs)) + 1, max(map(len, tgts)) + 1
    src = np.full((n, S), PAD)
    mask = np.zeros((n, S), np.int64)
    labels = np.full((n, T), -100)
    for i, (s, t) in enumerate(zip(srcs, tgts)):
        src[i, :len(s)], src[i, len(s)] = word_ids(s), EOS
        mask[i, :len(s) + 1] = 1
        labels[i, :len(t)], labels[i, len(t)] = word_ids(t), EOS
    return torch.from_numpy(src), torch.from_numpy(mask), torch.from_numpy(labels)


def train(out: Path, minutes: float, seed: int = 0) -> Path:
    import torch
    from transformers import MarianConfig, MarianMTModel

    if (out / "config.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    perm = np.random.default_rng(1).permutation(WORDS)
    cfg = MarianConfig(vocab_size=WORDS + 3, decoder_vocab_size=WORDS + 3, d_model=512, encoder_layers=6,
                       decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
                       decoder_ffn_dim=2048, max_position_embeddings=512, activation_function="swish",
                       scale_embedding=True, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD,
                       forced_eos_token_id=EOS, bad_words_ids=[[PAD]], num_beams=4, max_length=160,
                       dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    model = MarianMTModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.0)
    warmup, step, t0 = 30, 0, time.time()
    model.train()
    while time.time() - t0 < minutes * 60:
        lr = 5e-4 * min(1.0, (step + 1) / warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        src, mask, labels = batch(rng, perm, 24, 40 if step < 200 else 80)  # short first: faster steps
        loss = model(input_ids=src, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.3f} ({time.time() - t0:.0f} s)", flush=True)
    model.eval()
    src, mask, labels = batch(np.random.default_rng(99), perm, 32, 80)
    with torch.no_grad():
        logits = model(input_ids=src, attention_mask=mask, labels=labels).logits
    ok = labels != -100
    acc = float((logits.argmax(-1) == labels)[ok].float().mean())
    model.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    write_tokenizer(out)
    (out / "training.json").write_text(json.dumps({"steps": step, "minutes": minutes, "final_loss": loss.item(),
                                                   "teacher_forced_token_accuracy": acc}, indent=1))
    print(f"trained {step} steps, teacher-forced token accuracy {acc:.1%}: {out}")
    return out


def write_corpus(path: Path, n: int, seed: int = 7) -> Path:
    """n source sentences of 3 to 80 words, one per line."""
    rng = np.random.default_rng(seed)
    lines = [" ".join(f"w{w}" for w in sample_words(rng, int(k))) for k in sample_lengths(rng, n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/xform-files/marian-synthetic"))
    ap.add_argument("--minutes", type=float, default=20.0)
    args = ap.parse_args()
    train(args.out, args.minutes)


if __name__ == "__main__":
    main()
