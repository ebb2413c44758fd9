"""Verify exported graphs against eager PyTorch with ONNX Runtime, at shapes other than the trace's.

Encoder: batch 3, a source length unlike the trace's, padded rows. Decoder: past length 0 (the
first step) and past length > 0, in a cache with spare positions full of noise, one row a source
and two rows a source (beams sharing their source's encoding), and rows at different positions (a
relative position bias's model: sources, and one row's position, past its max distance),
checked output by output against the general `decode` (the past as a list). Then whole greedy decoding
through the runtime against the uncached oracle, tokens exactly. Any excess raises ToleranceError.
"""
from __future__ import annotations

import numpy as np
import torch

from xform.contract import CANDIDATES, DECODER, DECODER_BEAM, ENCODER, REORDER, RESTRICTED, GraphSpec
from xform.errors import ToleranceError
from xform.exporter.graphs import EncoderGraph
from xform.models.transformer import EncoderOutput, Seq2SeqTransformer, greedy_decode, recording
from xform.runtime.bench import padded_sources
from xform.runtime.compare import Tolerance, excess

VERIFY_BATCH = 3
VERIFY_SRC_LEN = 7
VERIFY_STEPS = ((0, 1), (4, 1), (2, 2))  # (past length, decoder rows per source: beams share their source)
VERIFY_SPARE = 3  # cache positions past the valid ones, filled with noise the decoder must mask


def verify_src_len(cfg) -> int:
    """VERIFY_SRC_LEN, or for a relative position bias a length whose distances pass its max distance
    (the last, shared bucket), within max_len."""
    if cfg.positions != "relative":
        return VERIFY_SRC_LEN
    return max(VERIFY_SRC_LEN, min(cfg.relative_attention_max_distance + 3, cfg.max_len))


def sample_sources(cfg, batch: int, src_len: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random sources, right-padded rows of lengths src_len, 1, and in between."""
    return padded_sources(cfg, np.linspace(src_len, 1, batch).round().astype(np.int64), seed)


def compare_outputs(graph: str, names: list[str], got: list[np.ndarray], ref: list[torch.Tensor],
                    tol: Tolerance, where: str, logprobs: dict[str, np.ndarray] | None = None) -> float:
    """Each output against eager's: ids exactly (at full precision), floats within atol + rtol x
    the row's scale. `logprobs` names the outputs that are log-probs, with the largest |logit| of
    each row (rows, 1): a log-prob is a logit less the log-sum-exp, each off by at most the logits'
    error, so it is judged at twice the logits' tolerance at the logits' scale (over 256,000 ids of
    a 2,048-wide model, fp32's kernel order alone moves a log-prob by 2e-4)."""
    worst = 0.0
    for name, g, eager in zip(names, got, ref):
        r = eager.detach().cpu().numpy()
        if g.shape != r.shape:
            raise ToleranceError(f"{graph} output {name} ({where}): shape {g.shape}, eager gives {r.shape}")
        if g.dtype.kind in "iu":
            if tol.min_token_agreement < 1.0:
                continue  # reduced precision may flip near-ties; token agreement is checked on decoding
            if not np.array_equal(g, r):
                raise ToleranceError(f"{graph} output {name} ({where}): ids differ from eager at "
                                     f"{np.argwhere(g != r)[:5].tolist()}")
            continue
        if not np.isfinite(g).all():
            raise ToleranceError(f"{graph} output {name} ({where}): NaN or inf in the ONNX Runtime result")
        factor, scale = (2.0, (logprobs or {})[name]) if name in (logprobs or {}) else (1.0, None)
        diff, _, over = excess(g, r, factor * tol.rtol, scale)
        worst = max(worst, float(diff.max(initial=0.0)))
        if over.max(initial=0.0) > factor * tol.atol and not tol.by_decodes:  # by_decodes: translations judge (check)
            raise ToleranceError(f"{graph} output {name} ({where}): max abs error {diff.max():.3g} exceeds "
                                 f"atol {factor * tol.atol:g} + rtol {factor * tol.rtol:g} x scale; smallest "
                                 f"passing atol {over.max():.3g}")
    return worst


def verify_graphs(model: Seq2SeqTransformer, sessions: dict, specs: dict[str, GraphSpec],
                  tol: Tolerance, attention_layer: int | None = None) -> dict:
    """Run the graphs on ORT against eager (the decoder's `attention` too, when it has one);
    returns the figures for the manifest."""
    cfg = model.cfg
    src_len = verify_src_len(cfg)
    src, lengths = sample_sources(cfg, VERIFY_BATCH, src_len)
    enc_in = (torch.from_numpy(src), torch.from_numpy(lengths))
    with torch.no_grad():
        enc_ref = EncoderGraph(model)(*enc_in)
    enc_out = sessions[ENCODER].run(None, {"src_ids": src, "src_lengths": lengths})
    figures = {"encoder_max_abs_err": compare_outputs(
        ENCODER, specs[ENCODER].output_names, enc_out, list(enc_ref), tol,
        f"batch {VERIFY_BATCH}, src_len {src_len}, padded")}
    cross = list(enc_ref[:-1])
    for past_len, group in VERIFY_STEPS:
        rows = VERIFY_BATCH * group
        with torch.no_grad():  # the reference reads the encoding repeated: the graph, one copy a source
            enc = model.encode(*(t.repeat_interleave(group, 0) for t in enc_in))
            g = torch.Generator().manual_seed(past_len)
            prefix = torch.randint(3, cfg.tgt_vocab_size, (rows, past_len), generator=g)
            past = model.decode(prefix, enc)[1] if past_len else [
                (torch.zeros(rows, cfg.n_heads, 0, cfg.head_dim),) * 2 for _ in range(cfg.n_decoder_layers)]
            ids = torch.randint(3, cfg.tgt_vocab_size, (rows, 1), generator=g)
            min_new = torch.full((rows,), past_len + 1)  # exercises the end-of-sentence suppression
            # the reference is the general decode (past as a list, joined with the new token)
            with recording(model, attention_layer) as attention:
                logits, present = model.decode(ids, enc, past if past_len else None)
            logits = logits[:, -1]
            ref = [logits, model.suppress(logits, past_len, past_len + 1).argmax(-1),
                   *[t[:, :, -1:] for kv in present for t in kv], *[a[:, -1] for a in attention]]
        # the graph's cache: the past, then VERIFY_SPARE positions of noise it must ignore
        cache = [torch.cat([t, 3 * torch.randn(*t.shape[:2], VERIFY_SPARE, t.shape[3], generator=g).to(t.dtype)], 2)
                 for kv in past for t in kv]
        # the eager reference is fp32: cast to the dtypes the contract records (fp16 K/V for fp16)
        feeds = {t.name: v.numpy().astype(t.dtype) for t, v in
                 zip(specs[DECODER].inputs, (ids, min_new, torch.full((rows,), past_len), *cache, *cross, enc_ref[-1]))}
        got = sessions[DECODER].run(None, feeds)
        name = f"past{past_len}{'_group' + str(group) if group > 1 else ''}"
        where = (f"{rows} rows over {VERIFY_BATCH} sources, src_len {src_len}, past_len {past_len}, "
                 f"cache_len {past_len + VERIFY_SPARE}")
        figures[f"decoder_{name}_max_abs_err"] = compare_outputs(DECODER, specs[DECODER].output_names, got, ref, tol,
                                                                 where)
        if RESTRICTED in sessions:  # the full decoder's logits at a subset of ids, in that order
            subset = torch.randperm(cfg.tgt_vocab_size, generator=g)[:max(2, cfg.tgt_vocab_size // 3)]
            weight, bias = model.output_table()
            r_feeds = {k: v for k, v in feeds.items() if k != "min_new_tokens"}
            r_feeds.update(out_weight=weight[subset].numpy(), out_bias=bias[subset].numpy())
            got = sessions[RESTRICTED].run(None, r_feeds)
            figures[f"restricted_{name}_max_abs_err"] = compare_outputs(
                RESTRICTED, specs[RESTRICTED].output_names, got, [logits[:, subset], *ref[2:2 + len(got) - 1]], tol,
                f"{where}, {len(subset)} of {cfg.tgt_vocab_size} ids")
    figures["decoder_mixed_positions_max_abs_err"] = verify_mixed_positions(
        model, sessions[DECODER], specs[DECODER], tol, enc_in, cross, enc_ref[-1], attention_layer)
    figures["reorder_exact"] = verify_reorder(sessions[REORDER], specs[REORDER], cache)  # the last past_len's
    figures["candidates_max_abs_err"] = verify_candidates(model, sessions[CANDIDATES], specs[CANDIDATES], tol)
    if DECODER_BEAM in sessions:
        figures["decoder_beam_max_abs_err"] = verify_beam_step(
            model, sessions[DECODER_BEAM], specs[DECODER_BEAM], tol, enc_in, cross, enc_ref[-1], attention_layer)
    return figures


def verify_reorder(session, spec: GraphSpec, cache: list[torch.Tensor]) -> bool:
    """Beam search's cache reorder: rows permuted, one continued twice, one dropped; exactly."""
    n = cache[0].shape[0]
    beam_idx = np.array([(2 * i + 1) % n for i in range(n - 1)], np.int64)
    beam_idx[-1] = beam_idx[0]
    feeds = {t.name: v for t, v in zip(spec.inputs, (beam_idx, *[x.numpy().astype(spec.inputs[1].dtype)
                                                                  for x in cache]))}
    got = session.run(None, feeds)
    want = [x[beam_idx] for x in list(feeds.values())[1:]]
    if not all(np.array_equal(g, w) for g, w in zip(got, want)):
        raise ToleranceError("the reorder graph does not gather the cache by beam_idx on onnxruntime")
    return True


def verify_mixed_positions(model: Seq2SeqTransformer, session, spec: GraphSpec, tol: Tolerance, enc_in, cross,
                           src_mask, attention_layer: int | None) -> float:
    """Rows at different positions in one step (a request joining a running batch): each row
    against eager decoding of that row alone with its own past; end-of-sentence suppressed in the
    rows still short of their min_new_tokens only."""
    cfg = model.cfg
    B = VERIFY_BATCH
    positions = torch.tensor([(3 * r + 2) % 7 for r in range(B)])  # 2, 5, 1, ... and a 0 from B = 3 on
    if cfg.positions == "relative":  # a row whose distances pass the bias's max distance
        positions[0] = min(cfg.relative_attention_max_distance + 2, cfg.max_len - 1)
    capacity = int(positions.max()) + VERIFY_SPARE
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(3, cfg.tgt_vocab_size, (B, 1), generator=g)
    min_new = positions + torch.arange(B) % 2  # odd rows may not end yet
    refs, cache = [], [3 * torch.randn(B, cfg.n_heads, capacity, cfg.head_dim, generator=g)
                       for _ in range(2 * cfg.n_decoder_layers)]
    with torch.no_grad():
        enc = model.encode(*enc_in)
        for r in range(B):
            p = int(positions[r])
            one = EncoderOutput([(k[r:r + 1], v[r:r + 1]) for k, v in enc.cross_kv], enc.src_mask[r:r + 1])
            prefix = torch.randint(3, cfg.tgt_vocab_size, (1, p), generator=g)
            past = model.decode(prefix, one)[1] if p else None
            with recording(model, attention_layer) as attention:
                logits, present = model.decode(ids[r:r + 1], one, past)
            logits = logits[:, -1]
            refs.append([logits, model.suppress(logits, p, int(min_new[r])).argmax(-1),
                         *[t[:, :, -1:] for kv in present for t in kv], *[a[:, -1] for a in attention]])
            for i, t in enumerate(t for kv in present for t in kv):
                cache[i][r, :, :p] = t[0, :, :p]
    ref = [torch.cat(parts, 0) for parts in zip(*refs)]
    feeds = {t.name: v.numpy().astype(t.dtype) for t, v in
             zip(spec.inputs, (ids, min_new, positions, *cache, *cross, src_mask))}
    got = session.run(None, feeds)
    return compare_outputs(DECODER, spec.output_names, got, ref, tol,
                           f"{B} rows at positions {positions.tolist()}, cache_len {capacity}, "
                           f"min_new_tokens {min_new.tolist()}")


def verify_candidates(model: Seq2SeqTransformer, session, spec: GraphSpec, tol: Tolerance) -> float:
    """The candidates graph against eager log-softmax, suppression and topk: ids exactly (distinct
    random logits have no ties), log-probs within the tolerance; before and after min_new_tokens."""
    cfg = model.cfg
    g = torch.Generator().manual_seed(5)
    logits = 4 * torch.randn(VERIFY_BATCH * 2, cfg.tgt_vocab_size, generator=g)
    worst = 0.0
    for k, past_len, min_new in ((min(4, cfg.tgt_vocab_size), 0, 2), (min(7, cfg.tgt_vocab_size), 3, 2)):
        with torch.no_grad():
            ref = torch.topk(model.suppress(torch.log_softmax(logits, -1), past_len, min_new), k, dim=-1)
        rows = logits.shape[0]
        feeds = {"logits": logits.numpy(), "num_candidates": np.array([k]),
                 "min_new_tokens": np.full(rows, min_new), "positions": np.full(rows, past_len)}
        got = session.run(None, feeds)
        worst = max(worst, compare_outputs(CANDIDATES, spec.output_names, got, [ref.values, ref.indices], tol,
                                           f"{logits.shape[0]} rows, {k} candidates, position {past_len}"))
    # rows at different positions: end-of-sentence suppressed only where a row is short of its limit
    positions, row_min_new = np.arange(logits.shape[0]) % 3, np.full(logits.shape[0], 1)
    k = min(5, cfg.tgt_vocab_size)
    with torch.no_grad():
        lp = torch.log_softmax(logits, -1)
        ref = torch.topk(torch.stack([model.suppress(lp[r], int(positions[r]), 1) for r in range(len(lp))]), k, dim=-1)
    got = session.run(None, {"logits": logits.numpy(), "num_candidates": np.array([k]),
                             "min_new_tokens": row_min_new, "positions": positions})
    return max(worst, compare_outputs(CANDIDATES, spec.output_names, got, [ref.values, ref.indices], tol,
                                      f"{logits.shape[0]} rows at positions {positions.tolist()}, {k} candidates"))


def verify_beam_step(model: Seq2SeqTransformer, session, spec: GraphSpec, tol: Tolerance, enc_in, cross, src_mask,
                     attention_layer: int | None, group: int = 2) -> float:
    """The fused beam step (decoder + candidates in one graph) against eager decoding of each row
    alone: `group` rows a source reading its one encoding, every row at its own position over a
    cache with noise past it, end-of-sentence still suppressed in the odd rows. Asked for a few
    candidates: ids exactly, log-probs, new K/V (and attention) within the tolerance. Asked for the
    whole vocabulary: each row's whole suppressed log-softmax, so a normalization or suppression
    error anywhere fails, not only one that reaches the top few (which ids are -inf is exact at
    every precision)."""
    cfg = model.cfg
    B, V = VERIFY_BATCH, cfg.tgt_vocab_size
    R = B * group
    positions = torch.tensor([(3 * r + 2) % 7 for r in range(R)])  # 2, 5, 1, 4, 0, 3: not the trace's
    capacity = int(positions.max()) + VERIFY_SPARE
    g = torch.Generator().manual_seed(13)
    ids = torch.randint(3, V, (R, 1), generator=g)
    min_new = positions + torch.arange(R) % 2  # odd rows may not end yet
    cache = [3 * torch.randn(R, cfg.n_heads, capacity, cfg.head_dim, generator=g)
             for _ in range(2 * cfg.n_decoder_layers)]
    scores, rest, scale = [], [], []
    with torch.no_grad():
        enc = model.encode(*enc_in)
        for r in range(R):
            p, s = int(positions[r]), r // group
            one = EncoderOutput([(k[s:s + 1], v[s:s + 1]) for k, v in enc.cross_kv], enc.src_mask[s:s + 1])
            prefix = torch.randint(3, V, (1, p), generator=g)
            past = model.decode(prefix, one)[1] if p else None
            with recording(model, attention_layer) as attention:
                logits, present = model.decode(ids[r:r + 1], one, past)
            scores.append(model.suppress(torch.log_softmax(logits[:, -1], -1), p, int(min_new[r])))
            scale.append(float(logits[:, -1].abs().max()))
            rest.append([*[t[:, :, -1:] for kv in present for t in kv], *[a[:, -1] for a in attention]])
            for i, t in enumerate(t for kv in present for t in kv):
                cache[i][r, :, :p] = t[0, :, :p]
    lp = torch.cat(scores, 0)  # (R, V): what the graph ranks
    ref_rest = [torch.cat(parts, 0) for parts in zip(*rest)]
    base = {t.name: v.numpy().astype(t.dtype) for t, v in
            zip(spec.inputs, (ids, min_new, positions, torch.zeros(1), *cache, *cross, src_mask))}
    where = (f"{R} rows over {B} sources at positions {positions.tolist()}, cache_len {capacity}, "
             f"min_new_tokens {min_new.tolist()}")
    k = min(5, V)
    got = session.run(None, {**base, "num_candidates": np.array([k], np.int64)})
    top = torch.topk(lp, k, dim=-1)
    logprobs = {spec.output_names[0]: np.array(scale)[:, None]}  # cand_logprobs, at the logits' scale
    worst = compare_outputs(DECODER_BEAM, spec.output_names, got, [top.values, top.indices, *ref_rest], tol,
                            f"{where}, {k} candidates", logprobs)
    got = session.run(None, {**base, "num_candidates": np.array([V], np.int64)})
    return max(worst, compare_distribution(got[0], got[1], lp.numpy(), tol, f"{where}, all {V} ids", logprobs))


def compare_distribution(values: np.ndarray, ids: np.ndarray, ref: np.ndarray, tol: Tolerance, where: str,
                         logprobs: dict[str, np.ndarray]) -> float:
    """Candidates over the whole vocabulary (`values`, `ids`: (rows, V), best first) against the
    (rows, V) log-probs `ref`: the ids a permutation of the vocabulary in each row, the values
    ranked, the same ids suppressed (-inf) and the rest within the tolerance."""
    rows, V = ref.shape
    full = np.full((rows, V), np.nan, np.float32)
    if ids.shape != (rows, V) or ((ids < 0) | (ids >= V)).any():
        raise ToleranceError(f"{DECODER_BEAM} ({where}): candidate ids of shape {ids.shape} are not the vocabulary")
    np.put_along_axis(full, ids, values, 1)
    if np.isnan(full).any():
        raise ToleranceError(f"{DECODER_BEAM} ({where}): a row's candidates repeat an id")
    if not (values[:, 1:] <= values[:, :-1]).all():
        raise ToleranceError(f"{DECODER_BEAM} ({where}): candidates are not ranked best first")
    blocked, want = np.isneginf(full), np.isneginf(ref)
    if (blocked != want).any():
        r, i = np.argwhere(blocked != want)[0]
        raise ToleranceError(f"{DECODER_BEAM} ({where}): row {r} id {i} is {'' if blocked[r, i] else 'not '}"
                             f"suppressed, eager {'does' if want[r, i] else 'does not'} suppress it "
                             f"({int((blocked != want).sum())} such ids)")
    return compare_outputs(DECODER_BEAM, list(logprobs), [np.where(want, 0, full)],
                           [torch.from_numpy(np.where(want, 0, ref))], tol, where, logprobs)


def verify_greedy(model: Seq2SeqTransformer, session, max_new_tokens: int = 12) -> dict:
    """Whole greedy decoding on the runtime against the uncached oracle: tokens identical."""
    cfg = model.cfg
    src, lengths = sample_sources(cfg, VERIFY_BATCH + 1, VERIFY_SRC_LEN + 2, seed=1)
    n = min(max_new_tokens, cfg.max_len)
    got = session.generate(src, lengths, max_new_tokens=n)
    ref = greedy_decode(model, torch.from_numpy(src), torch.from_numpy(lengths), n).numpy()
    if got.shape != ref.shape or not np.array_equal(got, ref):
        raise ToleranceError(f"greedy tokens on onnxruntime differ from eager PyTorch's uncached decoding:\n"
                             f"  ort:   {got.tolist()}\n  eager: {ref.tolist()}")
    return {"greedy_rows": int(src.shape[0]), "greedy_tokens_identical": True}
