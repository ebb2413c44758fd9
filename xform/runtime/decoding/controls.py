"""The decoding controls as data: one row a `GenerationConfig` field, written once for every door.

A row says how each front door takes the control: the Python keyword (the field's own name:
`Session.generate(**settings)` takes any field), the CLI's option and help (cli's
`generation_options` makes the click options from the rows, its flag named by cli/flags.py) and
the Triton input, when served (serving/tensors.py makes config.pbtxt's inputs, the handler's
parsing and the docs' table from the rows). A help names another control by its marker
(`{num_beams}`, errors.py), which each door words its own way. Adding a control is a field of
`GenerationConfig` (generation.py) and a row here; a test adds a fake one and reaches it from all
three doors (tests/test_doors.py).

This module is data only: it imports nothing of xform, so every layer may read it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

# how a control's value is written, and so its click type and its Triton tensor:
#   int     an integer (TYPE_INT32 [1])        float  a number (TYPE_FP32 [1])
#   bool    a flag (TYPE_BOOL [1])             choice one of `choices` (TYPE_STRING [1])
#   ids     comma-separated ids / TYPE_INT32 [-1], the same list in every row of a request
#   id_lists  a repeated flag of comma-separated ids (a list of id sequences)
KINDS = ("int", "float", "bool", "choice", "ids", "id_lists")


@dataclass(frozen=True)
class Control:
    name: str  # the GenerationConfig field, which is also the Python keyword (the CLI's flag: cli/flags.py)
    kind: str  # KINDS
    help: str
    # the Triton input, or None where the server takes the control otherwise (the reason given in
    # `served_as`) or not at all
    tensor: str | None = None
    served_as: str = ""
    least: int | None = None  # the server refuses a value below it at the door, naming the input
    choices: Mapping[str, Any] | None = None  # kind choice: the words a door takes and their values
    option: bool = True  # False: the commands declare the option themselves (their own help and range)
    dest: str | None = None  # the click parameter's name when it differs from `name`

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"control {self.name}: kind {self.kind!r} is not one of {KINDS}")


CONTROLS: list[Control] = [
    Control("max_new_tokens", "int", "The most tokens generated after the target prefix "
            "(default: the bundle's cap).", tensor="max_new_tokens", least=1, option=False),
    Control("min_new_tokens", "int",
            "End-of-sentence is not generated before this many new tokens (transformers' min_new_tokens; default 0)."),
    Control("num_beams", "int",
            "Beam search width (default: the bundle's; a Marian import records its model's).",
            tensor="num_beams", least=1),
    Control("length_penalty", "float",
            "Beam scores are divided by length ** this (transformers' meaning; default 1.0)."),
    Control("early_stopping", "choice",
            "Beam search stop rule, as in transformers (default false).",
            choices={"true": True, "false": False, "never": "never"}),
    Control("num_return_sequences", "int",
            "Hypotheses per source (at most {num_beams}; or samples with {do_sample}).",
            tensor="num_return_sequences", least=1),
    Control("do_sample", "bool", "Sample instead of searching."),
    Control("temperature", "float", "{do_sample}: divide logits by this (> 0)."),
    Control("top_k", "int", "{do_sample}: keep the k most likely tokens (0: all)."),
    Control("top_p", "float", "{do_sample}: keep the smallest set of mass >= p, (0, 1]."),
    Control("seed", "int", "{do_sample}: the same seed gives the same tokens."),
    Control("forced_bos_token_id", "int",
            "The first generated token, whatever the model prefers (transformers' forced_bos_token_id: "
            "a multilingual model's target-language token; default: the bundle's, if it records one).",
            served_as="tgt_lang"),
    Control("repetition_penalty", "float",
            "Scores of tokens already in the output are divided by this (multiplied when negative), "
            "as transformers' repetition_penalty; > 0, 1.0 off.", tensor="repetition_penalty"),
    Control("no_repeat_ngram_size", "int",
            "No n-gram of this size occurs twice in an output (transformers' meaning; 0 off).",
            tensor="no_repeat_ngram_size"),
    Control("bad_words_ids", "id_lists",
            "An id sequence never generated, comma-separated (3,17,5); repeat for more.",
            served_as="bad_words", dest="bad_word_ids"),
    Control("suppress_tokens", "ids",
            "Ids never generated (transformers' suppress_tokens; on the command line comma-separated).",
            tensor="suppress_tokens"),
    Control("return_alternatives", "bool",
            "The {num_return_sequences} best tokens at the first position after the target prefix, "
            "each continued greedily (interactive translation's choices).", tensor="return_alternatives"),
]


def control(name: str) -> Control:
    for c in CONTROLS:
        if c.name == name:
            return c
    raise KeyError(name)


# CTranslate2's names of the decoding options that mean what a generation setting means (the translator's)
CT2_NAMES = {"beam_size": "num_beams", "num_hypotheses": "num_return_sequences",
             "max_decoding_length": "max_new_tokens", "min_decoding_length": "min_new_tokens",
             "sampling_topk": "top_k", "sampling_topp": "top_p", "sampling_temperature": "temperature"}


def ct2_settings(options: dict[str, Any]) -> dict[str, Any]:
    """CTranslate2's option names as generation settings; the generation config's own names pass
    through. sampling_topk > 1 samples (CTranslate2's rule: 1, its default, is greedy)."""
    settings = {CT2_NAMES.get(k, k): v for k, v in options.items() if v is not None}
    if "top_k" in settings and "do_sample" not in settings:
        settings["do_sample"] = settings["top_k"] != 1
        if settings["top_k"] == 1:
            del settings["top_k"]
    return settings
