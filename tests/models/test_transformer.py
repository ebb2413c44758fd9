"""The model: cached decoding equals uncached exactly; padding and batching change nothing."""
import numpy as np
import pytest
import torch
from torch import Tensor

from tests.conftest import make_model, padded_batch
from tests.variants import VARIANTS
from xform.models.transformer import EncoderOutput, Seq2SeqTransformer, greedy_decode


def cached_greedy_decode(model: Seq2SeqTransformer, src_ids: Tensor, src_lengths: Tensor,
                         max_new_tokens: int, min_new_tokens: int = 0) -> Tensor:
    """Greedy decoding with the KV cache, one token a step, as the exported graphs run it."""
    cfg = model.cfg
    enc = model.encode(src_ids, src_lengths)
    tok = torch.full((src_ids.shape[0], 1), cfg.start_id, dtype=torch.long)
    done = torch.zeros(src_ids.shape[0], dtype=torch.bool)
    past, out = None, []
    for step in range(max_new_tokens):
        logits, past = model.decode(tok, enc, past)
        nxt = model.suppress(logits[:, -1], step, min_new_tokens).argmax(-1)
        nxt = torch.where(done, cfg.pad_id, nxt)
        out.append(nxt)
        done |= nxt == cfg.eos_id
        tok = nxt[:, None]
        if done.all():
            break
    return torch.stack(out, 1) if out else torch.zeros(src_ids.shape[0], 0, dtype=torch.long)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_cached_greedy_equals_uncached_exactly(variant):
    model = make_model(variant)
    src, lengths = padded_batch(model.cfg, [9, 4, 7, 1, 6], seed=3)
    src, lengths = torch.from_numpy(src), torch.from_numpy(lengths)
    for min_new in (0, 5):
        ref = greedy_decode(model, src, lengths, 15, min_new)
        got = cached_greedy_decode(model, src, lengths, 15, min_new)
        assert torch.equal(ref, got)
        assert ref.shape[0] == 5


@pytest.mark.parametrize("variant", ["seed-001", "seed-002"])
def test_cached_step_logits_equal_full_decode(variant):
    model = make_model(variant)
    src, lengths = map(torch.from_numpy, padded_batch(model.cfg, [8, 5, 3]))
    enc = model.encode(src, lengths)
    tgt = torch.randint(4, model.cfg.tgt_vocab_size, (3, 6))
    full = model.decode(tgt, enc)[0]  # (B, T, V), no cache
    past, steps = None, []
    for t in range(6):
        logits, past = model.decode(tgt[:, t:t + 1], enc, past)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    assert past[0][0].shape == (3, model.cfg.n_heads, 6, model.cfg.head_dim)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_decode_step_over_a_noisy_cache_equals_decode(variant):
    """The decoder graph's form: a fixed-capacity cache whose positions past past_len hold noise
    (large values, so an unmasked position would show) gives decode's logits and new K/V."""
    model = make_model(variant)
    cfg = model.cfg
    src, lengths = map(torch.from_numpy, padded_batch(cfg, [8, 5, 3]))
    enc = model.encode(src, lengths)
    g = torch.Generator().manual_seed(1)
    tgt = torch.randint(4, cfg.tgt_vocab_size, (3, 7), generator=g)
    capacity = 9
    cache = [tuple(100 * torch.randn(3, cfg.n_heads, capacity, cfg.head_dim, generator=g) for _ in range(2))
             for _ in range(cfg.n_decoder_layers)]
    past = None
    with torch.no_grad():
        for t in range(7):
            ref, past = model.decode(tgt[:, t:t + 1], enc, past)
            got, new = model.decode_step(tgt[:, t:t + 1], enc, cache, torch.full((3,), t))
            torch.testing.assert_close(got, ref[:, -1], atol=2e-5, rtol=0)
            for (k, v), (pk, pv), layer in zip(new, past, cache):
                torch.testing.assert_close(k, pk[:, :, -1:], atol=1e-5, rtol=0)
                torch.testing.assert_close(v, pv[:, :, -1:], atol=1e-5, rtol=0)
                layer[0][:, :, t] = k[:, :, 0]  # what the runtime does with them
                layer[1][:, :, t] = v[:, :, 0]


@pytest.mark.parametrize("variant", ["seed-001", "marian"])
def test_decode_step_with_rows_sharing_their_source_equals_repeated_encoding(variant):
    """Beams read their source's one encoding as extra queries (g rows a source): the same logits
    and new K/V as decode with the encoding repeated g times; a mis-grouping (rows i*g.. taken for
    another source) would mix sources of different lengths and fail."""
    model = make_model(variant)
    cfg = model.cfg
    src, lengths = map(torch.from_numpy, padded_batch(cfg, [8, 3, 5]))
    g = 3
    enc = model.encode(src, lengths)
    rep = model.encode(src.repeat_interleave(g, 0), lengths.repeat_interleave(g, 0))
    gen = torch.Generator().manual_seed(2)
    tgt = torch.randint(4, cfg.tgt_vocab_size, (3 * g, 4), generator=gen)
    cache = [tuple(torch.zeros(3 * g, cfg.n_heads, 5, cfg.head_dim) for _ in range(2))
             for _ in range(cfg.n_decoder_layers)]
    past = None
    with torch.no_grad():
        for t in range(4):
            ref, past = model.decode(tgt[:, t:t + 1], rep, past)
            got, new = model.decode_step(tgt[:, t:t + 1], enc, cache, torch.full((3 * g,), t))
            torch.testing.assert_close(got, ref[:, -1], atol=2e-5, rtol=0)
            for (k, v), layer in zip(new, cache):
                layer[0][:, :, t] = k[:, :, 0]
                layer[1][:, :, t] = v[:, :, 0]


@pytest.mark.parametrize("variant", ["seed-001", "marian", "learned-pre"])
def test_decode_step_with_rows_at_their_own_positions_equals_each_row_alone(variant):
    """In-flight batching's decoder step: rows at different positions in one call (a request that
    joined at position 0 beside one at position 5) give each row's logits and new K/V of decoding
    that row alone; a position taken from another row (the position table or the cache mask) fails."""
    model = make_model(variant)
    cfg = model.cfg
    src, lengths = map(torch.from_numpy, padded_batch(cfg, [8, 3, 5, 6]))
    enc = model.encode(src, lengths)
    gen = torch.Generator().manual_seed(4)
    steps = [6, 1, 4, 0]  # each row's past length
    tgt = torch.randint(4, cfg.tgt_vocab_size, (4, 7), generator=gen)
    capacity = 8
    cache = [tuple(50 * torch.randn(4, cfg.n_heads, capacity, cfg.head_dim, generator=gen) for _ in range(2))
             for _ in range(cfg.n_decoder_layers)]
    refs = []
    with torch.no_grad():
        for r, p in enumerate(steps):
            one = EncoderOutput([(k[r:r + 1], v[r:r + 1]) for k, v in enc.cross_kv], enc.src_mask[r:r + 1])
            logits, present = model.decode(tgt[r:r + 1, :p + 1], one)
            refs.append((logits[0, -1], [(k[0, :, -1:], v[0, :, -1:]) for k, v in present]))
            for (ck, cv), (k, v) in zip(cache, present):
                ck[r, :, :p], cv[r, :, :p] = k[0, :, :p], v[0, :, :p]
        tokens = torch.stack([tgt[r, p] for r, p in enumerate(steps)]).unsqueeze(1)
        got, new = model.decode_step(tokens, enc, cache, torch.tensor(steps))
    for r, (logits, kv) in enumerate(refs):
        torch.testing.assert_close(got[r], logits, atol=2e-5, rtol=0)
        for (k, v), (rk, rv) in zip(new, kv):
            torch.testing.assert_close(k[r], rk, atol=1e-5, rtol=0)
            torch.testing.assert_close(v[r], rv, atol=1e-5, rtol=0)


def test_padding_does_not_change_a_row():
    model = make_model("seed-000")
    src, lengths = map(torch.from_numpy, padded_batch(model.cfg, [9, 4, 6]))
    batched = greedy_decode(model, src, lengths, 12)
    for r in range(3):
        alone = greedy_decode(model, src[r:r + 1, :lengths[r]], lengths[r:r + 1], 12)
        n = alone.shape[1]
        assert torch.equal(batched[r, :n], alone[0])


def test_min_new_tokens_and_pad_never_generated():
    model = make_model("seed-002", output_bias=True)
    cfg = model.cfg
    with torch.no_grad():  # make pad and eos the favourite tokens
        model.output_bias[cfg.pad_id] = 100.0
        model.output_bias[cfg.eos_id] = 50.0
    src, lengths = map(torch.from_numpy, padded_batch(cfg, [5, 3]))
    out = greedy_decode(model, src, lengths, 10, min_new_tokens=4)
    assert out.shape == (2, 5)
    assert (out[:, :4] != cfg.eos_id).all() and (out[:, :4] != cfg.pad_id).all()
    assert (out[:, 4] == cfg.eos_id).all()


def test_training_forward_matches_decode():
    model = make_model("seed-001")
    src, lengths = map(torch.from_numpy, padded_batch(model.cfg, [6, 2]))
    tgt = torch.randint(4, model.cfg.tgt_vocab_size, (2, 5))
    torch.testing.assert_close(model(src, lengths, tgt), model.decode(tgt, model.encode(src, lengths))[0])


def test_shared_and_tied_embeddings_are_one_tensor():
    model = make_model("marian")
    assert model.src_embed.weight is model.tgt_embed.weight is model.lm_head.weight
    model = make_model("seed-000")
    assert model.src_embed.weight is not model.tgt_embed.weight
    assert model.lm_head.weight is not model.tgt_embed.weight


def test_encoder_cross_kv_shapes():
    model = make_model("seed-002")
    cfg = model.cfg
    src, lengths = map(torch.from_numpy, padded_batch(cfg, [7, 2, 5, 3]))
    enc = model.encode(src, lengths)
    assert len(enc.cross_kv) == cfg.n_decoder_layers
    assert enc.cross_kv[0][0].shape == (4, cfg.n_heads, 7, cfg.head_dim)
    assert np.array_equal((enc.src_mask == 0).sum(1).numpy(), lengths.numpy())


def test_banned_ids_never_generated():
    model = make_model("seed-002", output_bias=True, banned_ids=(7, 9))
    with torch.no_grad():
        model.output_bias[7] = 100.0
        model.output_bias[9] = 90.0
    src, lengths = map(torch.from_numpy, padded_batch(model.cfg, [5, 3, 6]))
    out = greedy_decode(model, src, lengths, 8)
    assert not ((out == 7) | (out == 9)).any()
    assert torch.equal(out, cached_greedy_decode(model, src, lengths, 8))
