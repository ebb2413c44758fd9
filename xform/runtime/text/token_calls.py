"""CTranslate2's calls over token lists (token_lists.py says their meanings): translate_batch,
score_batch and generate_tokens' request, each through the one conversion of a TextRequest
(text_request.py); the Translator's methods (translator.py) call these when their sources are
token lists."""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from xform.errors import InputError
from xform.runtime.decoding.request import ScoringResult, TextOptions, TranslationResult
from xform.runtime.scheduling.batching import Batching, plan
from xform.runtime.text.text_request import TextRequest, blank, check, prefix_ids
from xform.runtime.text.token_lists import (
    CT2_DEFAULTS,
    REFUSED,
    Vocabularies,
    ct2_score,
    cut,
    decoding_settings,
    hypothesis,
    token_lists,
)


def translate_call(translator, source: Sequence[Sequence[str]], target_prefix: Any, *, return_scores: bool,
                   return_end_token: bool, disable_unk: bool, max_batch_size: int, limit: int,
                   given: dict[str, Any], options: dict[str, Any], stepper: Any = None, vmap: Any = None) -> list:
    """translate_batch's call over token lists as a TextRequest (text_request.py), checked once
    there: the text-only options in `given` refused by name when set, the sources cut to `limit`
    (max_input_length), one prefix (a token list or None) a source. `stepper`: the call's step
    callback (step_callback.StepCallback); `vmap`: the bundle's vocabulary map (use_vmap), each
    batch restricted to the target ids its sources' pieces allow, as CTranslate2 restricts it."""

    for name, why in REFUSED.items():
        if options.get(name):
            raise InputError(f"{name} with token lists: {why}")
    options = dict(options)
    suppressed = options.pop("suppress_sequences", None)
    if target_prefix is not None:
        for i, p in enumerate(target_prefix):
            if p is not None and (isinstance(p, (str, bytes)) or not all(isinstance(t, str) for t in p)):
                raise InputError(f"target_prefix[{i}]: expected a token list (or None) where the sources are token "
                                 f"lists, got {p!r}")
    asked = TextRequest(tuple(tuple(t) for t in source),
                        None if target_prefix is None else tuple(tuple(p or ()) for p in target_prefix),
                        tuple(tuple(seq) for seq in suppressed or ()),
                        TextOptions(return_scores, given.get("src_lang"), given.get("tgt_lang"),
                                    bool(given.get("truncate")), replace_unknowns=bool(given.get("replace_unknowns")),
                                    vocab_map=given.get("vocab_map"), terminology=given.get("terminology"),
                                    qe=bool(given.get("qe"))),
                        translator.ct2_generation_settings(options), max_input_length=limit, disable_unk=disable_unk)
    check(translator.policy, asked)
    if stepper is not None and asked.settings.get("num_beams", CT2_DEFAULTS["num_beams"]) != 1:
        from xform.runtime.text.step_callback import NOT_WITH_BEAMS
        raise InputError(NOT_WITH_BEAMS)
    return translate(translator, asked, return_end_token, max_batch_size, stepper, vmap)


def translate(translator, asked, return_end_token: bool, max_batch_size: int, stepper: Any = None,
              vmap: Any = None) -> list:
    """CTranslate2's translate_batch over token lists (the module's rules): TranslationResults of
    token lists. Sources are decoded in groups of one prefix length (the length caps count the
    prefix), at most `max_batch_size` at a time."""
    pre = prefix_ids(translator.policy, asked) or [[] for _ in asked.sources]
    cap = translator.session.default_max_new_tokens()
    results: dict[int, Any] = {}
    groups: dict[int, list[int]] = {}
    for i in range(len(asked.sources)):
        groups.setdefault(len(pre[i]), []).append(i)
    for n, group in groups.items():
        room = decoding_settings(dict(asked.settings), n, cap)["max_new_tokens"]
        rows = [i for i in group if not blank(asked.sources[i]) and room > 0]
        vocab = translator.policy.vocabularies
        results.update({i: untouched(vocab, pre[i], room + n, asked) for i in group if i not in rows})
        step = max_batch_size or max(len(rows), 1)
        for at in range(0, len(rows), step):
            chunk = rows[at:at + step]
            results.update(zip(chunk, decoded(translator, asked.part(chunk), return_end_token,
                                              None if stepper is None else stepper.watch(chunk), vmap)))
    return [results[i] for i in range(len(asked.sources))]


def untouched(vocab: Vocabularies, prefix: list[int], max_length: int, asked):
    """CTranslate2's answer where the model is not run: an empty source, or a prefix that fills
    max_decoding_length (`max_length`): the prefix (cut to it), score 0."""
    keep = prefix[:max(0, max_length)]
    k = int(asked.settings.get("num_return_sequences") or 1)
    return TranslationResult([vocab.pieces(keep)] * k, [0.0] * k if asked.options.scores else [])


def decoded(translator, asked, return_end_token: bool, watch: Any = None, vmap: Any = None) -> list:
    """One text request over token lists sharing a prefix length: their TranslationResults
    (sampled hypotheses sorted by score, best first, as CTranslate2 sorts them). `watch`: a step
    callback's hook (Session.run); `vmap`: a VocabMap whose rules the sources' pieces select."""
    vocab, cfg = translator.policy.vocabularies, translator.session.config
    request = translator.request(asked)
    if vmap is not None:  # CTranslate2's candidates: the map's for the sources' n-grams (special ids: Session.restrict)
        request = dataclasses.replace(request, vocabulary=vmap.ids_for(
            [cut(list(s), asked.max_input_length) for s in asked.sources]))
    gen = request.generation
    result = translator.session.run(request, watch=watch)
    k = len(result) // request.batch
    out = []
    for b in range(request.batch):
        hyps = []
        for r in range(b * k, (b + 1) * k):
            assert result.token_scores is not None  # a token list's request always asks for them
            score = ct2_score(result.token_scores[r], result.ids[r], cfg.eos_id, cfg.pad_id, gen.length_penalty)
            hyps.append((vocab.pieces(hypothesis(result.ids[r], cfg.eos_id, cfg.pad_id, return_end_token)), score))
        if gen.do_sample:
            hyps.sort(key=lambda h: -h[1])
        out.append(TranslationResult([h for h, _ in hyps], [s for _, s in hyps] if asked.options.scores else []))
    return out


def score(translator, source: Any, target: Any, limit: int = 0, max_batch_size: int = 0,
          batch_type: str = "examples") -> list:
    """CTranslate2's score_batch over token lists: each source's ids as given (cut to `limit`
    tokens as max_input_length cuts them), its target's ids with the end token appended;
    ScoringResults of the target's pieces, "</s>" last, and each one's log-prob, `max_batch_size`
    examples (or padded source tokens) at a time. An empty source scores its tokens 0, as
    CTranslate2 does."""
    if not (token_lists(source) and token_lists(target)):
        raise InputError("score_batch: sources and targets both token lists, or both texts")
    if len(source) != len(target):
        raise InputError(f"{len(source)} sources for {len(target)} targets: one target a source")
    session, vocab, eos = translator.session, translator.policy.vocabularies, translator.session.config.eos_id
    src = [vocab.source_ids(cut(list(t), limit), f"source[{i}]") for i, t in enumerate(source)]
    tgt = [cut_ids(vocab.target_ids(t, f"target[{i}]") + [eos], limit) for i, t in enumerate(target)]
    results = {i: ScoringResult(vocab.pieces(tgt[i]), [0.0] * len(tgt[i])) for i in range(len(src)) if not src[i]}
    todo = [i for i in range(len(src)) if src[i]]
    for part in score_chunks([len(src[i]) for i in todo], max_batch_size, batch_type):
        rows = [todo[j] for j in part]
        ids, lengths = session.pad([src[i] for i in rows])
        targets, n = session.pad([tgt[i] for i in rows])
        scored = session.score(ids, targets, lengths)
        for r, i in enumerate(rows):
            results[i] = ScoringResult(vocab.pieces(tgt[i]), [float(v) for v in scored["tokens"][r, :n[r]]])
    return [results[i] for i in range(len(src))]


def score_chunks(lengths: list[int], max_batch_size: int, batch_type: str) -> list[list[int]]:
    """score_batch's batches of sources of `lengths`: all at once without max_batch_size, else as
    batching.plan groups them (CTranslate2's batch_type: examples, or padded source tokens)."""
    if not lengths:
        return []
    if not max_batch_size:
        return [list(range(len(lengths)))]
    tokens = batch_type == "tokens"
    return plan(lengths, Batching(batch_type, None if tokens else max_batch_size, max_batch_size if tokens else None))


def cut_ids(ids: list[int], limit: int) -> list[int]:
    """A scored target's ids (its end token last) cut to `limit` as CTranslate2's score_batch cuts
    them with max_input_length: the end token kept last."""
    return ids if not limit or len(ids) <= limit else ids[:max(0, limit - 1)] + ids[-1:]


def step_request(translator, source: list[str], prefix: list[str], settings: dict[str, Any],
                 return_log_prob: bool = False):
    """generate_tokens' request for a token list and its prefix (CTranslate2's meanings, greedy or
    sampling), through the one conversion."""
    if not source:
        raise InputError("source: an empty token list; generate_tokens needs a source to decode")
    room = decoding_settings(dict(settings), len(prefix), translator.session.default_max_new_tokens())
    if room["max_new_tokens"] <= 0:
        raise InputError(f"max_decoding_length {room['max_new_tokens'] + len(prefix)}: the target_prefix's "
                         f"{len(prefix)} tokens fill it")
    return translator.request(TextRequest((tuple(source),), (tuple(prefix),) if prefix else None,
                                          options=TextOptions("tokens" if return_log_prob else False),
                                          settings=settings))
