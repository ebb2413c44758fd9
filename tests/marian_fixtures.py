"""Build small Marian models with transformers, briefly trained so outputs depend on the input.

The toy task: reverse the source ids. Tokenizer files are made with sentencepiece from a small
corpus, laid out as OPUS-MT ships them (source.spm, target.spm, vocab.json).
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import torch

CONFIGS = {
    # vocab sizes that are not powers of two; depths that differ; every activation
    "swish-scaled": dict(vocab_size=53, encoder_layers=2, decoder_layers=3, activation_function="swish",
                         scale_embedding=True),
    "gelu-unscaled": dict(vocab_size=61, encoder_layers=3, decoder_layers=1, activation_function="gelu",
                          scale_embedding=False),
    "relu-separate-vocab": dict(vocab_size=47, decoder_vocab_size=43, share_encoder_decoder_embeddings=False,
                                tie_word_embeddings=False,
                                encoder_layers=1, decoder_layers=2, activation_function="relu", scale_embedding=True),
}


def marian_config(**kw):
    from transformers import MarianConfig
    vocab = kw["vocab_size"]
    dec_vocab = kw.get("decoder_vocab_size", vocab)
    pad = dec_vocab - 1  # Marian: pad is the last id and the decoder start
    base = dict(d_model=48, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=80,
                decoder_ffn_dim=80, max_position_embeddings=64, pad_token_id=pad, eos_token_id=0,
                decoder_start_token_id=pad, forced_eos_token_id=None, bad_words_ids=[[pad]], dropout=0.0,
                attention_dropout=0.0, activation_dropout=0.0)
    return MarianConfig(**{**base, **kw})


def reverse_batch(gen, batch, vocab, dec_vocab, pad):
    lengths = torch.randint(3, 9, (batch,), generator=gen)
    S = int(lengths.max()) + 1
    src = torch.full((batch, S), pad % vocab if pad < vocab else vocab - 1, dtype=torch.long)
    tgt = torch.full((batch, S), -100, dtype=torch.long)
    mask = torch.zeros(batch, S, dtype=torch.long)
    low, high = 2, min(vocab, dec_vocab) - 1
    for i, n in enumerate(lengths.tolist()):
        ids = torch.randint(low, high, (n,), generator=gen)
        src[i, :n], src[i, n] = ids, 0
        tgt[i, :n], tgt[i, n] = ids.flip(0), 0
        mask[i, :n + 1] = 1
    return src, mask, tgt


def train_marian(model, steps: int = 150, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    cfg = model.config
    dec_vocab = cfg.decoder_vocab_size or cfg.vocab_size
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        src, mask, labels = reverse_batch(gen, 32, cfg.vocab_size, dec_vocab, cfg.pad_token_id)
        loss = model(input_ids=src, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def build_marian(directory: Path, name: str, safe: bool = True, steps: int = 150):
    from transformers import MarianMTModel
    torch.manual_seed(0)
    model = MarianMTModel(marian_config(**CONFIGS[name]))
    train_marian(model, steps)
    model.save_pretrained(directory, safe_serialization=safe)
    return model


def sources(cfg, lengths, seed=0):
    """Right-padded source ids (ending with eos) and the attention mask, as numpy int64."""
    gen = torch.Generator().manual_seed(seed)
    S = max(lengths)
    pad = cfg.pad_token_id if cfg.pad_token_id < cfg.vocab_size else cfg.vocab_size - 1
    src = torch.full((len(lengths), S), pad, dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, :n - 1] = torch.randint(2, min(cfg.vocab_size, cfg.decoder_vocab_size or cfg.vocab_size) - 1,
                                       (n - 1,), generator=gen)
        src[i, n - 1] = 0
    mask = (torch.arange(S)[None] < torch.tensor(lengths)[:, None]).long()
    return src, mask


CORPUS = [f"{a} {b} {c}" for a in ("the red", "a blue", "one green", "my old") for b in ("cat", "dog", "bird")
          for c in ("sleeps", "runs fast", "is here", "eats bread")]


def write_spm(directory: Path) -> dict[str, list[str]]:
    """source.spm (lower case) and target.spm (upper case) in `directory`: side -> its pieces."""
    import sentencepiece as spm
    pieces = {}
    for side, corpus in (("source", CORPUS), ("target", [s.upper() for s in CORPUS])):
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=buf, vocab_size=28,
                                       model_type="unigram", character_coverage=1.0, minloglevel=2)
        (directory / f"{side}.spm").write_bytes(buf.getvalue())
        proc = spm.SentencePieceProcessor(model_proto=buf.getvalue())
        pieces[side] = [proc.id_to_piece(i) for i in range(proc.get_piece_size())]
    return pieces


def marian_vocab(pieces: list[str]) -> dict[str, int]:
    """Marian's vocabulary of sentencepiece pieces: </s> 0, <unk> 1, the pieces, <pad> last."""
    vocab = {"</s>": 0, "<unk>": 1}
    for p in pieces:
        if p not in vocab and p not in ("<s>", "<unk>", "</s>"):
            vocab[p] = len(vocab)
    vocab["<pad>"] = len(vocab)
    return vocab


def write_vocabs(directory: Path, separate: bool) -> list[dict[str, int]]:
    pieces = write_spm(directory)
    vocabs = [marian_vocab(pieces["source"]), marian_vocab(pieces["target"])] if separate else \
        [marian_vocab(pieces["source"] + pieces["target"])]
    for name, vocab in zip(("vocab.json", "target_vocab.json"), vocabs):
        (directory / name).write_text(json.dumps(vocab))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"source_lang": "en", "target_lang": "EN", "unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>",
         "separate_vocabs": separate, "model_max_length": 64}))
    return vocabs


def write_tokenizer(directory: Path) -> int:
    """source.spm / target.spm / vocab.json in Marian's layout; returns the vocabulary size."""
    return len(write_vocabs(directory, separate=False)[0])


def write_separate_tokenizer(directory: Path) -> tuple[int, int]:
    """As write_tokenizer with separate_vocabs: vocab.json holds the source's pieces and
    target_vocab.json the target's; returns the two sizes."""
    source, target = write_vocabs(directory, separate=True)
    return len(source), len(target)


def text_marian_bundle(tmp_path_factory, name: str, seed: int, steps: int, **config) -> Path:
    """A text Marian (build_text_marian) exported to a bundle of its own: its path."""
    from xform.exporter.export import export_bundle
    d = tmp_path_factory.mktemp(name) / "marian"
    d.mkdir()
    build_text_marian(d, seed, steps, **config)
    return export_bundle(d, tmp_path_factory.mktemp(name) / "bundle").path


def build_text_marian(directory: Path, seed: int, steps: int, **config):
    """A Marian with the sentencepiece tokenizer files of write_tokenizer, trained `steps` steps
    from torch seed `seed` and saved in `directory`: a model text goes through."""
    from transformers import MarianMTModel
    vocab = write_tokenizer(directory)
    torch.manual_seed(seed)
    model = train_marian(MarianMTModel(marian_config(vocab_size=vocab, **config)), steps)
    model.save_pretrained(directory)
    return model


def build_upper_marian(directory: Path, steps: int = 150, seed: int = 0, opus: bool = False):
    """A Marian with write_tokenizer's files trained `steps` full-batch steps to write CORPUS's
    sentences in upper case (the target side's pieces): word for word, so its translations are
    words and its attention follows them; saved in `directory` with its tokenizer. `opus`: as an
    OPUS-MT model is (swish, scaled embeddings, the pad row, its decoder start, zero: Marian
    starts the decoder from a zero vector, which CTranslate2 assumes)."""
    from transformers import MarianMTModel, MarianTokenizer
    vocab = write_tokenizer(directory)
    tok = MarianTokenizer.from_pretrained(directory)
    torch.manual_seed(seed)
    opus_like = dict(activation_function="swish", scale_embedding=True) if opus else {}
    model = MarianMTModel(marian_config(vocab_size=vocab, d_model=32, encoder_layers=1, decoder_layers=1,
                                        encoder_ffn_dim=64, decoder_ffn_dim=64, **opus_like))
    batch = tok(CORPUS, text_target=[s.upper() for s in CORPUS], return_tensors="pt", padding=True)
    labels = batch["labels"].masked_fill(batch["labels"] == tok.pad_token_id, -100)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    if opus:
        with torch.no_grad():
            model.model.shared.weight[model.config.pad_token_id] = 0
    model.eval().save_pretrained(directory)
    tok.save_pretrained(directory)
    return model
