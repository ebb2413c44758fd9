"""Word alignments from a decoder layer's cross-attention (a bundle exported --with-attention):
for each word of a translation, the source words its tokens attend to most. Words are
whitespace-separated; a SentencePiece tokenizer's pieces say where each begins (U+2581), so a
token belongs to a word on both sides. Where the pieces do not spell the words (another kind of
tokenizer, a piece the vocabulary lacks), there is no alignment and the marks go around the whole
sentence (marks.py)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from xform.runtime.text.text_request import TextRequest

WORD_START = "\u2581"

Alignment = list[list[int]]  # per target word, the source words it is aligned to


def word_index(pieces: list[str], keep: list[bool]) -> list[int] | None:
    """Each piece's word (0-based; -1 for a piece outside the text), counting word starts among the
    kept pieces (a bare U+2581 starts one too); None where the first kept piece starts no word."""
    out, word = [], -1
    for piece, k in zip(pieces, keep):
        if k and piece.startswith(WORD_START):
            word += 1
        elif k and word < 0:
            return None
        out.append(word if k else -1)
    return out


def word_alignment(tokenizer, framing: set[int], target_piece, row: np.ndarray, attention: np.ndarray,
                   source: list[int], source_text: str, translation: str) -> Alignment | None:
    """The alignment of one translated row: `row` its generated ids, `attention` (tokens x source
    positions) its cross-attention, `source` its source ids from `source_text`; `target_piece`
    maps a target id to its vocabulary piece. None where the words cannot be matched."""
    if not tokenizer.spm_words:
        return None
    framing = framing | set(tokenizer.skip)
    pieces = tokenizer.source_pieces(source_text)
    if len(pieces) != len(source):
        return None
    body = [i not in framing for i in source]
    source_words = word_index(pieces, body)
    if source_words is None or max(source_words, default=-1) + 1 != len(source_text.split()):
        return None
    tokens = [(t, int(i)) for t, i in enumerate(row) if int(i) not in framing]
    target_words = word_index([target_piece(i) for _, i in tokens], [True] * len(tokens))
    if target_words is None or max(target_words, default=-1) + 1 != len(translation.split()):
        return None
    weights = np.where(np.array(body)[None, :], attention[:, :len(source)], -1.0)
    out: Alignment = [[] for _ in translation.split()]
    for (t, _), w in zip(tokens, target_words):
        j = int(weights[t].argmax())
        if source_words[j] >= 0 and source_words[j] not in out[w]:
            out[w].append(source_words[j])
    return [sorted(a) for a in out]


def can_align(translator, options) -> bool:
    """Whether translations can come with word alignments: a decoder that returns its attention,
    a SentencePiece tokenizer, and no vocabulary map (the restricted decoder returns none)."""
    return bool(translator.session.capabilities.attention and translator.policy.text.spm_words
                and options.vocab_map is None)


def decode_aligned(translator, units: list[str], gen, options,
                   batch: int = 16) -> dict[str, tuple[str, Alignment | None]]:
    """Sentences decoded with their attention (`translator`: a Translator; `options`: TextOptions), a
    batch at a time: each one's translation and word alignment (None where none can be made)."""
    session, policy = translator.session, translator.policy
    tokenizer = policy.text
    vocabulary = tokenizer.target_vocabulary()
    pieces = {i: p for p, i in vocabulary.items()}
    framing = {policy.pad_id, policy.eos_id, policy.config.bos_id}
    out: dict[str, tuple[str, Alignment | None]] = {}
    for at in range(0, len(units), batch):
        chunk = units[at:at + batch]
        request = translator.request(TextRequest(tuple(chunk), options=replace(options, scores=False), generation=gen,
                                            return_attention=True))
        result, ids = session.run(request), request.sources()
        texts = policy.decode_rows(result.ids, 1, ids, chunk, result.attention if options.replace_unknowns else None)
        for k, unit in enumerate(chunk):
            out[unit] = texts[k], word_alignment(tokenizer, framing, lambda i: pieces.get(i, ""), result.ids[k],
                                                 result.attention[k], ids[k], unit, texts[k])
    return out
