"""One Triton `execute` call: requests in, one response (outputs or an error) per request out.

Each request holds exactly one of `text` (strings, [b, 1]) or `src_ids` (int64, [b, S]), and may
hold `max_new_tokens` and `num_beams` (int32, [b, 1]; one value per request), and `src_lang` /
`tgt_lang` (strings, one per request: a multilingual model's language codes). A request that
breaks the contract gets an error naming the tensor; the others are decoded together: requests
with the same settings as one padded batch through the Session's one decoding loop, each
response carrying only its own rows. Rows decode independently of their batch, so a response
equals what `Session.generate` / `translate` gives for that request alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from xform.errors import InputError, XformError

INPUTS = ("text", "src_ids", "max_new_tokens", "num_beams", "src_lang", "tgt_lang")


@dataclass
class Job:
    index: int  # the request's position in the call
    rows: list[list[int]]  # source ids, one list per row of the request
    max_new_tokens: int | None
    num_beams: int | None
    forced_bos: int | None = None  # the target language's token (tgt_lang), else the bundle's default


def one_value(name: str, value: np.ndarray | None) -> int | None:
    if value is None:
        return None
    flat = np.asarray(value).reshape(-1)
    if flat.size == 0 or (flat != flat[0]).any():
        raise InputError(f"input '{name}': one value per request, found {flat.tolist()}")
    if int(flat[0]) < 1:
        raise InputError(f"input '{name}': must be at least 1, found {int(flat[0])}")
    return int(flat[0])


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
    try:
        if src_lang is not None:
            session.encode_text("", src_lang)
    except InputError as e:
        raise InputError(f"input 'src_lang': {e}") from None
    try:
        forced = session.target_language(tgt_lang) if session.tokenizer is not None else None
    except InputError as e:
        raise InputError(f"input 'tgt_lang': {e}") from None
    return src_lang, forced


def parse(session, index: int, inputs: dict[str, np.ndarray | None]) -> Job:
    """A request's tensors (None where absent) as a Job; InputError names the tensor at fault."""
    src_lang, forced = languages(session, inputs)
    text, ids = inputs.get("text"), inputs.get("src_ids")
    if (text is None) == (ids is None):
        raise InputError(f"exactly one of the inputs 'text' and 'src_ids' per request; found "
                         f"{'both' if text is not None else 'neither'}")
    if text is not None:
        if session.tokenizer is None:
            raise InputError("input 'text': this bundle has no tokenizer; send token ids as 'src_ids'")
        rows = []
        for item in np.asarray(text, dtype=object).reshape(-1):
            try:
                s = item.decode("utf-8") if isinstance(item, bytes) else str(item)
            except UnicodeDecodeError as e:
                raise InputError(f"input 'text': not UTF-8 ({e})") from None
            try:
                rows.append(session.encode_text(s, src_lang))
            except InputError as e:
                raise InputError(f"input 'text': {e}") from None
        name, src = "text", session.pad(rows)[0]
    else:
        src = np.asarray(ids)
        if src.dtype != np.int64:
            raise InputError(f"input 'src_ids': expected INT64, found {src.dtype}")
        name = "src_ids"
    try:
        src, lengths = session.prepare(np.ascontiguousarray(src), None)
    except InputError as e:
        raise InputError(f"input '{name}': {e}") from None
    rows = [list(map(int, r[:n])) for r, n in zip(src, lengths)]
    return Job(index, rows, one_value("max_new_tokens", inputs.get("max_new_tokens")),
               one_value("num_beams", inputs.get("num_beams")), forced)


def trim(out: np.ndarray, pad: int) -> np.ndarray:
    """Drop trailing columns that are pad in every row (what decoding these rows alone returns)."""
    keep = out.shape[1]
    while keep > 0 and (out[:, keep - 1] == pad).all():
        keep -= 1
    return out[:, :keep]


def execute(session, requests: list[dict[str, np.ndarray | None]]) -> list[dict[str, np.ndarray] | str]:
    """For each request, its outputs (`output_ids` [b, n] int64, `translation` [b, 1] bytes when
    the bundle has a tokenizer), or an error message."""
    results: list[Any] = [None] * len(requests)
    groups: dict[tuple[int | None, int | None, int | None], list[Job]] = {}
    for i, inputs in enumerate(requests):
        try:
            job = parse(session, i, inputs)
        except XformError as e:
            results[i] = str(e)
            continue
        groups.setdefault((job.max_new_tokens, job.num_beams, job.forced_bos), []).append(job)
    for (max_new, beams, forced), jobs in groups.items():
        rows = [r for job in jobs for r in job.rows]
        try:
            out = session.generate(*session.pad(rows), max_new_tokens=max_new, num_beams=beams,
                                   forced_bos_token_id=forced)
        except XformError as e:  # a setting out of range for this bundle: every request that asked
            for job in jobs:
                results[job.index] = f"input '{'num_beams' if beams else 'max_new_tokens'}': {e}"
            continue
        except Exception as e:  # noqa: BLE001 - a backend failure fails these requests, not the server
            for job in jobs:
                results[job.index] = f"decoding failed: {type(e).__name__}: {e}"
            continue
        start = 0
        for job in jobs:
            ids = trim(out[start:start + len(job.rows)], session.pad_id)
            start += len(job.rows)
            outputs = {"output_ids": np.ascontiguousarray(ids, np.int64)}
            if session.tokenizer is not None:
                outputs["translation"] = np.array([[session.tokenizer.decode(r).encode("utf-8")] for r in ids],
                                                  dtype=object)
            results[job.index] = outputs
    return results
