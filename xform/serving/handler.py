"""One Triton `execute` call: requests in, one response (outputs or an error) per request out.

Each request holds exactly one of `text` (strings, [b, 1]) or `src_ids` (int64, [b, S]), and may
hold one value per request of: `max_new_tokens`, `num_beams`, `no_repeat_ngram_size` (int32),
`repetition_penalty` (fp32), `return_scores`, `truncate` (bool); `src_lang` / `tgt_lang`
(strings: a multilingual model's language codes); `bad_words` (strings, [b, n]: phrases never
generated) and `suppress_tokens` (int32, [b, n]: ids never generated), the same in every row; and
`target_prefix` (strings, [b, 1]: the start of each row's translation); `replace_unknowns`
(bool: unknown target tokens become the source words of the pieces they attend to, a bundle exported
--with-attention); `return_attention` (bool: the `attention` output, fp32 [b, n, src_len], each
generated token's cross-attention of the bundle's attention layer). A request that breaks
the contract gets an error naming the tensor; the others are decoded together: requests with the
same settings as one padded batch through the Session's one decoding loop, each response
carrying only its own rows. Rows decode independently of their batch, so a response equals what
`Session.generate` / `translate` gives for that request alone. With return_scores, a response
also carries `scores` (fp32 [b, 1]) and `token_scores` (fp32 [b, n], 0 in a prefix and after the end).
With `num_return_sequences` k > 1 (int32: beams' best k, or with `return_alternatives` (bool)
the k best continuations of the prefix), `output_ids` / `translation` / `scores` are each row's
best and `hypothesis_ids` (int64 [b, k, n]), `hypotheses` (strings [b, k]) and, with scores,
`hypothesis_scores` (fp32 [b, k]) carry all k, best first.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xform.errors import InputError, XformError


class ServerFault(str):
    """An error message that is the server's, not the request's (Triton INTERNAL, HTTP 500); a plain
    message is the request's fault (INVALID_ARG, HTTP 400)."""


INPUTS = ("text", "src_ids", "max_new_tokens", "num_beams", "src_lang", "tgt_lang", "target_prefix",
          "repetition_penalty", "no_repeat_ngram_size", "bad_words", "suppress_tokens", "return_scores", "truncate",
          "replace_unknowns", "num_return_sequences", "return_alternatives", "return_attention")

# The runtime's errors name a setting as the door that asked for it does (the CLI: its flag); a
# request names its inputs. A setting that is no input (do_sample) is named as itself.
SETTING_INPUTS = {"bad_words_ids": "bad_words", "forced_bos_token_id": "tgt_lang",
                  **{name: name for name in INPUTS}}
NAMES = {setting: f"input '{name}'" for setting, name in SETTING_INPUTS.items()}


@dataclass
class Job:
    index: int  # the request's position in the call
    rows: list[list[int]]  # source ids, one list per row of the request
    settings: dict[str, Any] = field(default_factory=dict)  # generate()'s keywords this request sets
    prefixes: list[list[int]] | None = None  # target prefix ids, one list per row
    scores: bool = False
    texts: list[str] | None = None  # the source texts (None for src_ids)
    replace: bool = False  # replace_unknowns
    attention: bool = False  # return_attention

    # a greedy decode without prefix or forced end-of-sentence: its tokens are a prefix of a
    # longer decode's, so it may run to its batch's largest max_new_tokens, cut to its own (`cap`)
    greedy: bool = False
    cap: int | None = None

    def key(self) -> tuple:
        """Requests with equal keys decode as one batch (a greedy one's max_new_tokens aside)."""
        def frozen(v):
            if not isinstance(v, list):
                return v
            return tuple(map(tuple, v)) if v and isinstance(v[0], list) else tuple(v)
        settings = tuple(sorted((k, frozen(v)) for k, v in self.settings.items()
                                if not (self.greedy and k == "max_new_tokens")))
        return (self.scores, self.replace, self.attention, self.texts is not None, self.greedy) + settings


def one(name: str, value: np.ndarray | None, dtype=None):
    """A numeric input that holds one value per request (every row the same): that value, or None."""
    if value is None:
        return None
    flat = np.asarray(value, dtype).reshape(-1)
    if flat.size == 0 or (flat != flat[0]).any():
        raise InputError(f"input '{name}': one value per request, found {flat.tolist()}")
    return flat[0]


def one_value(name: str, value: np.ndarray | None) -> int | None:
    v = one(name, value)
    if v is not None and int(v) < 1:
        raise InputError(f"input '{name}': must be at least 1, found {int(v)}")
    return None if v is None else int(v)


def one_float(name: str, value: np.ndarray | None) -> float | None:
    v = one(name, value, np.float64)
    return None if v is None else float(v)


def one_flag(name: str, value: np.ndarray | None) -> bool:
    return bool(one(name, value))


def one_row(name: str, value: np.ndarray | None) -> list | None:
    """A list input ([b, n]) that every row of the request repeats: its first row."""
    if value is None:
        return None
    arr = np.asarray(value, dtype=object if np.asarray(value).dtype == object else None)
    arr = arr.reshape(arr.shape[0], -1) if arr.ndim > 1 else arr.reshape(1, -1)
    if any(list(r) != list(arr[0]) for r in arr):
        raise InputError(f"input '{name}': the same list in every row of a request, found {arr.tolist()}")
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in arr[0]]


def strings(name: str, value: np.ndarray) -> list[str]:
    out = []
    for item in np.asarray(value, dtype=object).reshape(-1):
        try:
            out.append(item.decode("utf-8") if isinstance(item, bytes) else str(item))
        except UnicodeDecodeError as e:
            raise InputError(f"input '{name}': not UTF-8 ({e})") from None
    return out


def one_string(name: str, value: np.ndarray | None) -> str | None:
    if value is None:
        return None
    flat = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
            for v in np.asarray(value, dtype=object).reshape(-1)]
    if not flat or any(v != flat[0] for v in flat):
        raise InputError(f"input '{name}': one value per request, found {flat}")
    return flat[0]


def languages(session, inputs: dict[str, np.ndarray | None]) -> tuple[str | None, int | None]:
    """(the source language, the forced first token) a request asks for; InputError names the input."""
    src_lang, tgt_lang = one_string("src_lang", inputs.get("src_lang")), one_string("tgt_lang", inputs.get("tgt_lang"))
    if src_lang is not None:
        session.check_src_lang(src_lang, NAMES["src_lang"])
    forced = session.target_language(tgt_lang, NAMES["tgt_lang"]) if session.tokenizer is not None else None
    return src_lang, forced


def about(name: str, e: Exception) -> InputError:
    """The runtime's error `e` as one about the input `name`, unless it names its input itself."""
    return InputError(str(e) if str(e).startswith("input '") else f"input '{name}': {e}")


def parse(session, index: int, inputs: dict[str, np.ndarray | None], max_rows: int | None = None) -> Job:
    """A request's tensors (None where absent) as a Job; InputError names the tensor at fault.
    `max_rows`: the decoder rows (sources x beams or sequences) one request may ask for, so that no
    request can make the server allocate beyond it."""
    src_lang, forced = languages(session, inputs)
    text, ids = inputs.get("text"), inputs.get("src_ids")
    if (text is None) == (ids is None):
        raise InputError(f"exactly one of the inputs 'text' and 'src_ids' per request; found "
                         f"{'both' if text is not None else 'neither'}")
    truncate = one_flag("truncate", inputs.get("truncate"))
    replace = one_flag("replace_unknowns", inputs.get("replace_unknowns"))
    if replace:
        if text is None:
            raise InputError("input 'replace_unknowns': goes with 'text' (it copies source text)")
        session.check_replace_unknowns(NAMES["replace_unknowns"])
    attention = one_flag("return_attention", inputs.get("return_attention"))
    if attention and not getattr(session.backend, "has_attention", False):
        raise InputError("input 'return_attention': this bundle's decoder returns no attention; export it with "
                         "--with-attention")
    if text is not None:
        if session.tokenizer is None:
            raise InputError("input 'text': this bundle has no tokenizer; send token ids as 'src_ids'")
        rows = []
        for s in strings("text", text):
            try:
                # tgt_lang goes into the source only where the model writes it there (MADLAD's <2xx>)
                row = session.encode_text(s, src_lang, NAMES["src_lang"],
                                          one_string("tgt_lang", inputs.get("tgt_lang")), NAMES["tgt_lang"])
            except InputError as e:
                raise about("text", e) from None
            rows.append(session.truncated(row) if truncate and len(row) > session.config["max_len"] else row)
        name, src = "text", session.pad(rows)[0]
    else:
        src = np.asarray(ids)
        if src.dtype != np.int64:
            raise InputError(f"input 'src_ids': expected INT64, found {src.dtype}")
        if truncate and src.ndim == 2 and src.shape[1] > session.config["max_len"]:
            src = np.array([session.truncated([int(i) for i in r if i != session.pad_id]) for r in src], dtype=object)
            src = session.pad(list(src))[0]
        name = "src_ids"
    if name == "text" and src.shape[1] > session.config["max_len"]:
        raise InputError(f"input 'text': {src.shape[1]} source tokens, more than the model's max_len "
                         f"{session.config['max_len']} (send truncate=true to cut it)")
    try:
        src, lengths = session.prepare(np.ascontiguousarray(src), None)
    except InputError as e:
        raise InputError(f"input '{name}': {e}") from None
    rows = [list(map(int, r[:n])) for r, n in zip(src, lengths)]
    settings: dict[str, Any] = {"max_new_tokens": one_value("max_new_tokens", inputs.get("max_new_tokens")),
                                "num_beams": one_value("num_beams", inputs.get("num_beams")),
                                "forced_bos_token_id": forced,
                                "repetition_penalty": one_float("repetition_penalty", inputs.get("repetition_penalty")),
                                "num_return_sequences": one_value("num_return_sequences",
                                                                  inputs.get("num_return_sequences"))}
    if one_flag("return_alternatives", inputs.get("return_alternatives")):
        settings["return_alternatives"] = True
    ngram = one("no_repeat_ngram_size", inputs.get("no_repeat_ngram_size"))
    if ngram is not None:
        settings["no_repeat_ngram_size"] = int(ngram)
    words = one_row("bad_words", inputs.get("bad_words"))
    if words:
        settings["bad_words_ids"] = [session.target_ids(w) for w in words]
        if any(not w for w in settings["bad_words_ids"]):
            raise InputError(f"input 'bad_words': a phrase gives no target tokens ({words})")
        if any(len(w) > session.config["max_len"] for w in settings["bad_words_ids"]):
            raise InputError(f"input 'bad_words': a phrase of more tokens than the model's max_len "
                             f"{session.config['max_len']} (it could never be generated)")
    suppress = one_row("suppress_tokens", inputs.get("suppress_tokens"))
    if suppress:
        settings["suppress_tokens"] = [int(i) for i in suppress]
    settings = {k: v for k, v in settings.items() if v is not None}
    try:  # the settings' own checks, named by their input
        checked = {k: v for k, v in settings.items() if k not in ("forced_bos_token_id", "max_new_tokens")}
        gen = session.generation_config(settings.get("max_new_tokens") or session.default_max_new_tokens(), NAMES,
                                        **checked)
    except InputError as e:
        raise about(setting_input(str(e)), e) from None
    prefixes = None
    target_prefix = inputs.get("target_prefix")
    if target_prefix is not None:
        texts = strings("target_prefix", target_prefix)
        if len(texts) != len(rows):
            raise InputError(f"input 'target_prefix': one a row, found {len(texts)} for {len(rows)} rows")
        prefixes = [session.target_ids(t) if t else [] for t in texts]
        if any(len(p) >= session.config["max_len"] for p in prefixes):
            raise InputError(f"input 'target_prefix': more tokens than the model's max_len "
                             f"{session.config['max_len']} leaves room for")
    width = gen.num_beams if gen.strategy == "beam" else gen.num_return_sequences
    if max_rows is not None and len(rows) * width > max_rows:
        raise InputError(f"input '{'num_beams' if gen.strategy == 'beam' else name}': {len(rows)} rows x "
                         f"{width} = {len(rows) * width} decoder rows, more than this model's max_rows {max_rows}")
    return Job(index, rows, settings, prefixes, one_flag("return_scores", inputs.get("return_scores")),
               strings("text", text) if text is not None else None, replace, attention,
               greedy=prefixes is None and gen.strategy == "greedy" and not gen.forced_eos)


def setting_input(message: str) -> str:
    """The input a generation-settings error is about: the first it names (NAMES), else max_new_tokens."""
    found = re.search(r"input '(\w+)'", message)
    return found.group(1) if found else "max_new_tokens"


def trim(out: np.ndarray, pad: int) -> np.ndarray:
    """Drop trailing columns that are pad in every row (what decoding these rows alone returns)."""
    keep = out.shape[1]
    while keep > 0 and (out[:, keep - 1] == pad).all():
        keep -= 1
    return out[:, :keep]


def cut(out, job: Job):
    """A greedy request's part of a longer decode, cut to its own max_new_tokens: the ids, token
    scores and attention to that many steps, the score their sum (what decoding it alone gives)."""
    n = job.cap
    if not isinstance(out, tuple):
        return out[:, :n]
    ids, rest = out[0][:, :n], list(out[1:])
    if job.scores:  # (scores, token_scores) follow the ids
        rest[1] = rest[1][:, :n]
        rest[0] = rest[1].sum(1, dtype=np.float32)
    if job.replace or job.attention:
        rest[-1] = rest[-1][:, :n]
    return (ids, *rest)


def job_outputs(session, job: Job, out) -> dict[str, np.ndarray]:
    """A request's outputs from what Session.generate returned for its rows alone (ids, then
    scores and token scores when job.scores, then attention when job.replace or job.attention)."""
    want_attention = job.replace or job.attention
    attention = out[-1] if want_attention else None
    out = out[:-1] if want_attention else out
    out = out[0] if isinstance(out, tuple) and len(out) == 1 else out
    out, scores, tokens = out if job.scores else (out, None, None)
    n = len(out) // len(job.rows)  # hypotheses a row: num_return_sequences
    ids = trim(out, session.pad_id)
    outputs = {"output_ids": np.ascontiguousarray(ids[::n], np.int64)}  # each row's best
    if session.tokenizer is not None:
        texts = session.decode_rows(ids, n, job.rows, job.texts, attention if job.replace else None)
        outputs["translation"] = np.array([[t.encode("utf-8")] for t in texts[::n]], dtype=object)
        if n > 1:
            outputs["hypotheses"] = np.array([t.encode("utf-8") for t in texts], dtype=object).reshape(-1, n)
    if n > 1:
        outputs["hypothesis_ids"] = np.ascontiguousarray(ids.reshape(len(job.rows), n, -1), np.int64)
    if job.attention:  # each row's best: (rows, its tokens, src_len)
        assert attention is not None  # want_attention: the last of `out`
        outputs["attention"] = np.ascontiguousarray(attention[::n, :ids.shape[1]], np.float32)
    if job.scores:
        assert scores is not None and tokens is not None  # job.scores: they follow the ids in `out`
        outputs["scores"] = scores[::n, None].astype(np.float32)
        outputs["token_scores"] = np.ascontiguousarray(tokens[::n, :ids.shape[1]], np.float32)
        if n > 1:
            outputs["hypothesis_scores"] = scores.reshape(-1, n).astype(np.float32)
    return outputs


def decode_settings(job: Job) -> dict[str, Any]:
    """Session.generate's keywords for a request (its rows padded by the caller)."""
    return dict(target_prefix=job.prefixes, return_token_scores=job.scores,
                return_attention=job.replace or job.attention, **job.settings)


def execute(session, requests: list[dict[str, np.ndarray | None]],
            vocab_map=None, max_rows: int | None = None) -> list[dict[str, np.ndarray] | str]:
    """For each request, its outputs (`output_ids` [b, n] int64, `translation` [b, 1] bytes when
    the bundle has a tokenizer, `scores` and `token_scores` when asked), or an error message (a
    ServerFault when the server is at fault, else the request is). With a `vocab_map` (the model's
    --vocab-map), text requests decode over what their sources allow."""
    results: list[Any] = [None] * len(requests)
    groups: dict[tuple, list[Job]] = {}
    for i, inputs in enumerate(requests):
        try:
            job = parse(session, i, inputs, max_rows)
        except XformError as e:
            results[i] = str(e)
            continue
        groups.setdefault(job.key(), []).append(job)
    for jobs in groups.values():
        longest = {}
        if jobs[0].greedy:  # the batch decodes to its largest max_new_tokens, each request cut to its own
            caps = [job.settings.get("max_new_tokens") or session.default_max_new_tokens() for job in jobs]
            for job, cap in zip(jobs, caps):
                job.cap = cap if cap < max(caps) else None
            longest = {"max_new_tokens": max(caps)}
        rows = [r for job in jobs for r in job.rows]
        prefixes = None
        if any(job.prefixes for job in jobs):
            prefixes = [p for job in jobs for p in (job.prefixes or [[]] * len(job.rows))]
        try:
            vocabulary = None
            if vocab_map is not None and jobs[0].texts is not None:
                # every job has texts: Job.key keeps text requests apart from src_ids ones
                vocabulary = session.allowed_ids(vocab_map, [t for job in jobs if job.texts is not None
                                                             for t in job.texts])
            out = session.generate(*session.pad(rows), vocabulary=vocabulary,
                                   **{**decode_settings(jobs[0]), "target_prefix": prefixes, **longest})
        except InputError as e:  # a setting out of range for this bundle: every request that asked
            for job in jobs:
                results[job.index] = str(about("target_prefix" if "prefix" in str(e) else setting_input(str(e)), e))
            continue
        except Exception as e:  # noqa: BLE001 - a backend failure fails these requests, not the server
            for job in jobs:
                results[job.index] = ServerFault(f"decoding failed: {type(e).__name__}: {e}")
            continue
        n = (len(out[0]) if isinstance(out, tuple) else len(out)) // len(rows)  # hypotheses a row
        start = 0
        for job in jobs:
            span = slice(start * n, (start + len(job.rows)) * n)
            part = tuple(o[span] for o in out) if isinstance(out, tuple) else out[span]
            results[job.index] = job_outputs(session, job, cut(part, job) if job.cap is not None else part)
            start += len(job.rows)
    return results
