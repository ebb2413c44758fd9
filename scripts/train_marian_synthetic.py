"""Train a Marian Transformer-base on a synthetic translation task, for the file benchmark.

    python scripts/train_marian_synthetic.py --out /tmp/xform-files/marian-synthetic [--minutes 20]

The model is OPUS-MT's size (d_model 512, 6+6 layers, 8 heads, FFN 2048, swish, scaled and tied
embeddings) with a 32,000-word vocabulary. The "languages" are words w0 .. w31996 and a target
sentence is its source (target_words says why), so outputs end at varied lengths (sources of 3
to 80 words). A sentencepiece word model per side and vocab.json make it
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


def target_words(src: np.ndarray) -> np.ndarray:
    """The synthetic translation of one source (word indices): the source itself. A harder task
    (every word mapped to another, every third dropped) had not learned to end its sentences after
    15 minutes of training here; copying, the attention's easiest alignment, does, and a translation
    whose length follows its source's is what the benchmark needs."""
    return src.copy()


def sample_lengths(rng, n: int, low: int = 3, high: int = 80) -> np.ndarray:
    """Sentence lengths skewed short, as real text is: a log-normal clipped to [low, high]."""
    return np.clip(np.round(rng.lognormal(np.log(18), 0.6, n)), low, high).astype(int)


TYPES = 500  # words in use: the output layer stays 32,000 wide (the benchmark's cost), but a few
# hundred steps cannot teach a copy of 32,000 distinct embeddings, most of them seen once or never
_ZIPF = 1.0 / np.arange(1, TYPES + 1)
_ZIPF /= _ZIPF.sum()


def sample_words(rng, n: int) -> np.ndarray:
    """Zipf word frequencies over the TYPES most frequent words, ranks spread over the vocabulary."""
    return rng.choice(TYPES, n, p=_ZIPF) * (WORDS // TYPES)


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


def batch(rng, n: int, max_len: int):
    import torch
    lengths = rng.integers(3, max_len + 1, n)  # uniform: every length seen, so ending is learned
    srcs = [sample_words(rng, int(k)) for k in lengths]
    tgts = [target_words(s) for s in srcs]
    S, T = max(map(len, srcs)) + 1, max(map(len, tgts)) + 1
    src = np.full((n, S), PAD)
    mask = np.zeros((n, S), np.int64)
    labels = np.full((n, T), -100)
    for i, (s, t) in enumerate(zip(srcs, tgts)):
        src[i, :len(s)], src[i, len(s)] = word_ids(s), EOS
        mask[i, :len(s) + 1] = 1
        labels[i, :len(t)], labels[i, len(t)] = word_ids(t), EOS
    return torch.from_numpy(src), torch.from_numpy(mask), torch.from_numpy(labels)


def save_state(model, work: Path, step: int, longest: int, seconds: float) -> None:
    model.save_pretrained(work)
    (work / "state.json").write_text(json.dumps({"step": step, "longest": longest, "seconds": seconds}))


def train(out: Path, minutes: float, seed: int = 0) -> Path:
    import torch
    from transformers import MarianConfig, MarianMTModel

    if (out / "config.json").exists():
        return out
    work = out.with_name(out.name + ".training")  # the latest checkpoint; `out` appears when done
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    state = json.loads((work / "state.json").read_text()) if (work / "state.json").exists() else None
    if state is not None:  # resume: the run was stopped, or its time budget was too short
        model = MarianMTModel.from_pretrained(work)
        rng = np.random.default_rng(seed + state["step"])
    else:
        cfg = MarianConfig(vocab_size=WORDS + 3, decoder_vocab_size=WORDS + 3, d_model=512, encoder_layers=6,
                           decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
                           encoder_ffn_dim=2048, decoder_ffn_dim=2048, max_position_embeddings=512,
                           activation_function="swish", scale_embedding=True, pad_token_id=PAD, eos_token_id=EOS,
                           decoder_start_token_id=PAD, forced_eos_token_id=EOS, bad_words_ids=[[PAD]], num_beams=4,
                           max_length=160, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
        model = MarianMTModel(cfg)
        state = {"step": 0, "longest": 10, "seconds": 0.0}
    peak = 3e-4  # post-LN, six layers: 1e-3 stalled at a loss of 5 (unigram frequencies)
    opt = torch.optim.AdamW(model.parameters(), lr=peak, weight_decay=0.0)
    warmup, t0, recent, base = 60, time.time(), [], state["seconds"]
    step, longest = state["step"], state["longest"]
    first = step
    learned = lambda: len(recent) == 10 and np.mean(recent) < 0.5  # noqa: E731  (nats a token)
    model.train()
    while time.time() - t0 < minutes * 60 and not (longest == 80 and learned()):
        lr = peak * min(1.0, (step - first + 1) / warmup)  # a resumed run warms its fresh Adam up again
        for g in opt.param_groups:
            g["lr"] = lr
        # an adaptive curriculum: sentences up to `longest` words, which grows once the copy is
        # learned at the current lengths (a fixed ramp outran the learning and stalled at a loss
        # of 5, the unigram entropy); every shorter length stays in the mix
        src, mask, labels = batch(rng, max(12, 600 // longest), longest)
        loss = model(input_ids=src, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        recent = (recent + [loss.item()])[-10:]
        if learned() and longest < 80:
            longest, recent = min(80, longest + 10), []
        if step % 10 == 0:
            print(f"step {step} longest {longest} loss {np.mean(recent) if recent else loss.item():.3f} "
                  f"({time.time() - t0:.0f} s)", flush=True)
        if step % 50 == 0:
            save_state(model, work, step, longest, base + time.time() - t0)
    if not (longest == 80 and learned()):  # not yet: keep the checkpoint, say how to go on
        save_state(model, work, step, longest, base + time.time() - t0)
        raise SystemExit(f"after {step} steps the copy is learned up to {longest - 10} words; run again to "
                         f"continue from {work}")
    minutes = (base + time.time() - t0) / 60
    model.eval()
    src, mask, labels = batch(np.random.default_rng(99), 32, 80)
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
    ap.add_argument("--minutes", type=float, default=40.0, help="this run's budget (a stopped run resumes)")
    args = ap.parse_args()
    train(args.out, args.minutes)


if __name__ == "__main__":
    main()
