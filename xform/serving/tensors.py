"""Triton's inputs and outputs as one table of data.

config.pbtxt's `input` / `output` lists (repository.py), the handler's parsing and the names its
errors give (handler.py), and the tensor table of docs/serving.md (a test asserts they are equal)
all come from here. The decoding controls' inputs come from the controls' table
(runtime/decoding/controls.py): a control served there is an input here, with nothing else to write.
"""
from __future__ import annotations

from dataclasses import dataclass

from xform.errors import worded
from xform.runtime.decoding import controls

# where a tensor exists: every model, a bundle with a tokenizer, a bundle exported
# --with-attention, or only the in-flight engine model (NAME-stream)
WHEN = ("always", "tokenizer", "attention", "engine")
KIND_TYPES = {"int": ("TYPE_INT32", (1,)), "float": ("TYPE_FP32", (1,)), "bool": ("TYPE_BOOL", (1,)),
              "choice": ("TYPE_STRING", (1,)), "ids": ("TYPE_INT32", (-1,))}


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # Triton's TYPE_*
    dims: tuple[int, ...]  # per request row
    doc: str
    when: str = "always"
    setting: str | None = None  # the request setting it gives: errors about that setting name this tensor
    ragged: bool = False  # allow_ragged_batch: rows of different lengths across requests

    def pbtxt(self, optional: bool) -> str:
        dims = ", ".join(str(d) for d in self.dims)
        extra = (" optional: true" if optional else "") + (" allow_ragged_batch: true" if self.ragged else "")
        return f'  {{ name: "{self.name}" data_type: {self.dtype} dims: [ {dims} ]{extra} }}'


HEAD = [
    Tensor("text", "TYPE_STRING", (1,), "A source text; exactly one of `text` and `src_ids` per request."),
    Tensor("src_ids", "TYPE_INT64", (-1,), "Source token ids, right-padded with the pad id.", ragged=True),
]
TAIL = [
    Tensor("return_scores", "TYPE_BOOL", (1,), "Also `scores` and `token_scores`.", setting="return_scores"),
    Tensor("truncate", "TYPE_BOOL", (1,), "A source longer than the model's max_len is cut to it."),
    Tensor("src_lang", "TYPE_STRING", (1,), "A multilingual model's source language code.", "tokenizer"),
    Tensor("tgt_lang", "TYPE_STRING", (1,), "A multilingual model's target language code (the forced first "
           "token).", "tokenizer", setting="forced_bos_token_id"),
    Tensor("target_prefix", "TYPE_STRING", (1,), "The start of each row's translation, one a row.", "tokenizer",
           setting="target_prefix"),
    Tensor("bad_words", "TYPE_STRING", (-1,), "Phrases never generated, split by the target tokenizer.",
           "tokenizer", setting="bad_words_ids"),
    Tensor("replace_unknowns", "TYPE_BOOL", (1,), "Unknown target tokens become the source words they attend "
           "to most (a bundle exported --with-attention).", "tokenizer"),
    Tensor("return_attention", "TYPE_BOOL", (1,), "Also `attention`.", "attention", setting="return_attention"),
    Tensor("stream", "TYPE_BOOL", (1,), "A response every step, then the final one.", "engine"),
    Tensor("document_format", "TYPE_STRING", (1,), "Each `text` row is a document, `text`, `markdown` or `html`: its "
           "sentences split, translated and rejoined with its layout (`src_lang` may be `auto`).", "tokenizer",
           setting="format"),
    Tensor("skip_target_language", "TYPE_BOOL", (1,), "With document_format: paragraphs already in tgt_lang are "
           "kept as they are.", "tokenizer", setting="skip_target_language"),
    Tensor("glossary", "TYPE_STRING", (1,), "This request's terms and their required translations: TSV text "
           "(source TAB target [TAB source language TAB target language], a line each) or TBX. A term found in "
           "a `text` row (whole words, any case, longest first) appears in its translation as written, enforced "
           "in the beam search (a greedy request takes the beam the terms need). Without it, the model's "
           "--glossary; an empty one: none. docs/terminology.md.", "tokenizer", setting="glossary"),
    Tensor("keep", "TYPE_STRING", (-1,), "Regular expressions whose matches in a `text` row stay as written in "
           "its translation (`<dnt>...</dnt>` in a row marks a span too, its tags removed).", "tokenizer",
           setting="keep"),
    Tensor("qe", "TYPE_BOOL", (1,), "Also `confidence`.", setting="qe"),
]
OUTPUTS = [
    Tensor("output_ids", "TYPE_INT64", (-1,), "Each row's best hypothesis."),
    Tensor("scores", "TYPE_FP32", (1,), "With return_scores: its score."),
    Tensor("token_scores", "TYPE_FP32", (-1,), "With return_scores: each token's log-prob (0 in a prefix and "
           "after the end)."),
    Tensor("hypothesis_ids", "TYPE_INT64", (-1, -1), "With num_return_sequences k > 1: all k, best first."),
    Tensor("hypothesis_scores", "TYPE_FP32", (-1,), "With num_return_sequences k > 1 and return_scores: their "
           "scores."),
    Tensor("attention", "TYPE_FP32", (-1, -1), "With return_attention: each token's attention over the source.",
           "attention"),
    Tensor("translation", "TYPE_STRING", (1,), "Each row's best hypothesis as text.", "tokenizer"),
    Tensor("hypotheses", "TYPE_STRING", (-1,), "With num_return_sequences k > 1: all k as text.", "tokenizer"),
    Tensor("confidence", "TYPE_FP32", (1,), "With qe: the best hypothesis' confidence in [0, 1] "
           "(docs/terminology.md's formula; a blank row's is 1)."),
    Tensor("unmet", "TYPE_STRING", (1,), "With a glossary (the request's or the model's) or keep: the terms the "
           "best hypothesis lacks (no room within max_new_tokens, or not in the target vocabulary), joined by "
           "tabs; empty when it holds them all.", "tokenizer"),
]


def inputs() -> list[Tensor]:
    """Every input a model may have, the served controls among them (read from the controls'
    table at the call, so a control added there is an input here; a help naming another control
    names it by its own name)."""
    served = []
    named = [c.name for c in controls.CONTROLS]
    for c in controls.CONTROLS:
        if c.tensor is not None:
            dtype, dims = KIND_TYPES[c.kind]
            served.append(Tensor(c.tensor, dtype, dims, worded(c.help, named), setting=c.name))
    return HEAD + served + TAIL


def present(tensors: list[Tensor], has_tokenizer: bool, has_attention: bool, engine: bool) -> list[Tensor]:
    """The tensors a model of this bundle and role has."""
    have = {"always": True, "tokenizer": has_tokenizer, "attention": has_attention, "engine": engine}
    return [t for t in tensors if have[t.when]]


def names() -> dict[str, str]:
    """How a request names a setting in its errors: the input that gives it (`input 'bad_words'`
    for bad_words_ids); an input by its own name."""
    out = {t.name: f"input '{t.name}'" for t in inputs()}
    out.update({t.setting: f"input '{t.name}'" for t in inputs() if t.setting is not None})
    return out


def input_for(settings: tuple[str, ...]) -> str:
    """The input an error about these settings (SettingError.settings, first the first) is
    about: the first that an input gives (or is), else max_new_tokens (the one every decode has)."""
    given = {t.name: t.name for t in inputs()} | {t.setting: t.name for t in inputs() if t.setting is not None}
    return next((given[s] for s in settings if s in given), "max_new_tokens")


def markdown() -> str:
    """The docs' table of the tensors (docs/serving.md holds it; a test asserts they are equal)."""
    where = {"always": "", "tokenizer": "with a tokenizer", "attention": "exported --with-attention",
             "engine": "NAME-stream only"}
    lines = ["| tensor | in / out | type | dims | when | what |", "| --- | --- | --- | --- | --- | --- |"]
    for kind, tensors in (("in", inputs()), ("out", OUTPUTS)):
        for t in tensors:
            dims = "[" + ", ".join(str(d) for d in t.dims) + "]"
            lines.append(f"| `{t.name}` | {kind} | {t.dtype} | {dims} | {where[t.when]} | {t.doc} |")
    return "\n".join(lines) + "\n"
