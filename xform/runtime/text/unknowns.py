"""Unknown replacement: an unknown target token written as the source word it attends to most
(CTranslate2's replace_unknowns), from a decoder layer's cross-attention."""
from __future__ import annotations

import numpy as np

from xform.errors import XformError


def unknown_warning(tokenizer, ids: list[int]) -> str | None:
    """A warning when more than half of an encoded source's text tokens are unknown, else None."""
    unknown, total = tokenizer.unknown(ids)
    if total and unknown * 2 > total:
        return (f"{unknown} of its {total} source tokens are unknown to the vocabulary: is it in the model's "
                "source language, and does export's 'text in' line show the right tokenization?")
    return None


def decode_rows(tokenizer, framing: set[int], rows: np.ndarray, n: int, sources: list[list[int]] | None,
                texts: list[str] | None, attention: np.ndarray | None) -> list[str]:
    """Text of generated rows, n a source; with `attention`, each unknown target token written as
    the source word of the piece it attends to most (of `sources[k // n]`, as written in
    `texts`); `framing`: the model's pad / eos / bos ids, which are never a word."""
    if attention is None:
        return [tokenizer.decode(r) for r in rows]
    if sources is None:
        raise XformError("unknown tokens are replaced by source pieces: the rows' source ids are needed")
    framing = framing | set(tokenizer.skip)
    return [tokenizer.decode(r, unknown_replacements(tokenizer, framing, r, attention[k], sources[k // n],
                                                     texts[k // n] if texts else None))
            for k, r in enumerate(rows)]


def unknown_replacements(tokenizer, framing: set[int], ids: np.ndarray, attention: np.ndarray, source: list[int],
                         text: str | None = None) -> dict[int, str]:
    """For each unknown target token of `ids` (its position), the source word whose token it
    attends to most, among the source's text tokens (not its language code or end-of-sentence):
    all the word's pieces (a sentencepiece word: from the piece that starts it to the next
    word's), as written in the source `text` when given (a word the vocabulary lacks is copied
    whole), else the vocabulary's pieces. Unknowns in a row aligned to one word copy it once."""
    unk = tokenizer.target_unk_id
    where = np.flatnonzero(ids == unk)
    if not len(where):
        return {}
    body = [i not in framing for i in source] + [False] * (attention.shape[1] - len(source))
    if not any(body):
        return {}
    weights = np.where(np.array(body)[None, :], attention[where], -1.0)
    pieces = None
    if text is not None:
        pieces = tokenizer.source_pieces(text)
        pieces = pieces if len(pieces) == len(source) else None  # a truncated source: the vocabulary's
    if pieces is None:
        pieces = [tokenizer.source_piece(i) for i in source]
    marked = tokenizer.spm_words
    out: dict[int, str] = {}
    previous = None
    for t, j in zip(where.tolist(), weights.argmax(1).tolist()):
        span = word_span(pieces, body, j) if marked else (j, j + 1)
        out[t] = "" if previous == (t - 1, span) else "".join(pieces[span[0]:span[1]])
        previous = (t, span)
    return out


def word_span(pieces: list[str], body: list[bool], j: int) -> tuple[int, int]:
    """[start, end) of the sentencepiece word holding piece j: back to the piece that starts it
    (U+2581 first), on to the next such piece, within the text's pieces (`body`)."""
    start, end = j, j + 1
    while start > 0 and body[start - 1] and not pieces[start].startswith("\u2581"):
        start -= 1
    while end < len(pieces) and body[end] and not pieces[end].startswith("\u2581"):
        end += 1
    return start, end
