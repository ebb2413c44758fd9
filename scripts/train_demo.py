"""Train the bundled demo model: numbers written in digits -> English words.

    python scripts/train_demo.py [--out xform/data/demo]

"40512" -> "forty thousand five hundred twelve", for 0 <= n < 1,000,000. A character-level source
vocabulary and a word-level target vocabulary (separate embeddings, output tied to the target
table), a post-LN Transformer with 3 encoder and 2 decoder layers. Deterministic (fixed seeds, one
thread); trains until greedy decoding is exact on a validation set of 2,000 numbers of 4 to 6 digits never
seen in training, then reports exact match on a separate test set of 2,000 more,
checking every EVAL_EVERY steps, and writes the checkpoint, tokenizer.json and training.json.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from xform.config import TransformerConfig  # noqa: E402
from xform.models.checkpoint import save_checkpoint  # noqa: E402
from xform.models.transformer import Seq2SeqTransformer, greedy_decode  # noqa: E402

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
        "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
SRC_TOKENS = SPECIALS + list("0123456789")
TGT_TOKENS = SPECIALS + ONES + TENS[2:] + ["hundred", "thousand"]
LIMIT = 1_000_000
HELD_OUT = 2000
EVAL_EVERY = 250
MAX_STEPS = 12000
BATCH = 128


def below_thousand(n: int) -> list[str]:
    words = [ONES[n // 100], "hundred"] if n >= 100 else []
    r = n % 100
    if r >= 20:
        words += [TENS[r // 10]] + ([ONES[r % 10]] if r % 10 else [])
    elif r or not words:
        words += [ONES[r]]
    return words


def to_words(n: int) -> str:
    if n < 1000:
        return " ".join(below_thousand(n))
    head = below_thousand(n // 1000) + ["thousand"]
    return " ".join(head + (below_thousand(n % 1000) if n % 1000 else []))


def sample_number(rng: random.Random) -> int:
    digits = rng.randint(1, 6)  # every length equally often, so short numbers are learned too
    return rng.randrange(0 if digits == 1 else 10 ** (digits - 1), 10 ** digits)


def encode_batch(numbers: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    src_index = {t: i for i, t in enumerate(SRC_TOKENS)}
    tgt_index = {t: i for i, t in enumerate(TGT_TOKENS)}
    srcs = [[src_index[c] for c in str(n)] + [2] for n in numbers]
    tgts = [[tgt_index[w] for w in to_words(n).split()] + [2] for n in numbers]
    S, T = max(map(len, srcs)), max(map(len, tgts))
    src = torch.zeros(len(numbers), S, dtype=torch.long)
    tgt = torch.zeros(len(numbers), T, dtype=torch.long)
    for i, (s, t) in enumerate(zip(srcs, tgts)):
        src[i, :len(s)] = torch.tensor(s)
        tgt[i, :len(t)] = torch.tensor(t)
    lengths = torch.tensor([len(s) for s in srcs])
    tgt_in = torch.cat([torch.full((len(numbers), 1), 1), tgt[:, :-1]], 1)
    return src, lengths, tgt_in, tgt


def accuracy(model: Seq2SeqTransformer, numbers: list[int]) -> float:
    src, lengths, _, tgt = encode_batch(numbers)
    out = greedy_decode(model, src, lengths, max_new_tokens=tgt.shape[1] + 2)
    exact = 0
    for row, ref in zip(out.tolist(), tgt.tolist()):
        ref = ref[:ref.index(2) + 1]
        exact += row[:len(ref)] == ref
    return exact / len(numbers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "xform" / "data" / "demo")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    rng = random.Random(0)
    # held out: numbers of 4 to 6 digits (all shorter ones are few and needed in training);
    # the validation half decides when to stop, the test half is only reported
    held = rng.sample(range(1000, LIMIT), 2 * HELD_OUT)
    validation, test = sorted(held[:HELD_OUT]), sorted(held[HELD_OUT:])
    excluded = set(held)
    cfg = TransformerConfig(
        src_vocab_size=len(SRC_TOKENS), tgt_vocab_size=len(TGT_TOKENS), d_model=64, n_heads=4, d_ff=192,
        n_encoder_layers=3, n_decoder_layers=2, activation="relu", norm_position="post",
        scale_embedding=True, tie_output=True, pad_id=0, bos_id=1, eos_id=2, max_len=32, dropout=0.0)
    model = Seq2SeqTransformer(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 300) * max(0.05, 0.5 * (1 + math.cos(math.pi * s / MAX_STEPS))))
    t0 = time.time()
    acc, step = 0.0, 0
    for step in range(1, MAX_STEPS + 1):
        numbers = []
        while len(numbers) < BATCH:
            n = sample_number(rng)
            if n not in excluded:
                numbers.append(n)
        src, lengths, tgt_in, tgt = encode_batch(numbers)
        logits = model(src, lengths, tgt_in)
        loss = F.cross_entropy(logits.reshape(-1, cfg.tgt_vocab_size), tgt.reshape(-1), ignore_index=cfg.pad_id)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % EVAL_EVERY == 0:
            model.eval()
            acc = accuracy(model, validation)
            model.train()
            print(f"step {step}  loss {loss.item():.4f}  validation exact {acc:.2%}  {time.time() - t0:.0f}s", flush=True)
            if acc == 1.0:
                break
    model.eval()
    test_acc = accuracy(model, test)
    save_checkpoint(model, args.out)
    tokenizer = {"kind": "xform-vocab",
                 "source": {"tokens": SRC_TOKENS, "unit": "char", "unk": "<unk>"},
                 "target": {"tokens": TGT_TOKENS, "unit": "word", "unk": "<unk>"}}
    (args.out / "tokenizer.json").write_text(json.dumps(tokenizer, indent=1) + "\n")
    report = {"task": "digits -> English number words, 0 <= n < 1,000,000", "steps": step, "batch": BATCH,
              "seconds": round(time.time() - t0, 1),
              "validation_numbers": len(validation), "validation_greedy_exact_match": acc,
              "test_numbers": len(test), "test_greedy_exact_match": test_acc,
              "test_set": "2,000 numbers of 4 to 6 digits, never trained on, not used to stop",
              "torch": torch.__version__}
    (args.out / "training.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))
    if acc < 1.0:
        sys.exit(f"validation exact match {acc:.2%} < 100% after {step} steps")


if __name__ == "__main__":
    main()
