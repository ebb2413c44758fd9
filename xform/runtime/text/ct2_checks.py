"""CTranslate2's option values checked at the CTranslate2-named methods, so that a wrong type or
range is an InputError naming the option (CTranslate2's pybind11 layer answers a TypeError
listing its whole signature; xform answered TypeError, AttributeError or a numpy error from
deep inside). Only the options given are checked; None keeps a default."""
from __future__ import annotations

import numbers
import os
from collections.abc import Iterable, Sequence
from typing import Any

from xform.errors import InputError

# name -> (kind, lowest allowed, what it is)
COUNTS = {
    "max_batch_size": (0, "examples (or tokens with batch_type 'tokens') a batch; 0: all at once"),
    "read_batch_size": (0, "examples read before sorting and batching; 0: automatic"),
    "offset": (0, "the target tokens left out of the score"),
}
# (the decoding settings, beam_size and the like, are checked where every door's are: the generation
# config, which names them as the caller did)
NUMBERS = {"patience", "coverage_penalty", "prefix_bias_beta", "min_alternative_expansion_prob"}
BATCH_TYPES = ("examples", "tokens")


def check_call(**values: Any) -> None:
    """Each CTranslate2 option among `values` of the right type and range, else an InputError
    naming it, what it is and what was given."""
    for name, value in values.items():
        if value is None:
            continue
        if name in COUNTS:
            low, what = COUNTS[name]
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
                raise InputError(f"{name} must be an integer >= {low} ({what}), got {value!r}")
        elif name in NUMBERS:
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise InputError(f"{name} must be a number, got {value!r}")
        elif name == "batch_type":
            if not isinstance(value, str) or value not in BATCH_TYPES:
                raise InputError(f"batch_type must be 'examples' or 'tokens' (what max_batch_size counts), got "
                                 f"{value!r}")
        elif name in ("src_lang", "tgt_lang"):
            if not isinstance(value, str):
                raise InputError(f"{name} must be a language code (str), got {value!r}")
        elif name == "suppress_sequences":
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not all(
                    isinstance(w, str) or (isinstance(w, Sequence) and not isinstance(w, bytes)
                                           and all(isinstance(t, str) for t in w)) for w in value):
                raise InputError(f"suppress_sequences must be a list of phrases (texts, or token lists for token "
                                 f"lists), got {value!r}")


def check_iterable(value: Any, name: str) -> None:
    """A stream argument (sources, targets, prefixes): something to iterate, else refused by name."""
    if not isinstance(value, Iterable):
        raise InputError(f"{name}: expected a list or an iterable of examples, got {type(value).__name__}")


def check_path(value: Any, name: str) -> None:
    """A file argument: a path (str or os.PathLike), else refused by name."""
    if not isinstance(value, (str, os.PathLike)):
        raise InputError(f"{name}: expected a file path (str or pathlib.Path), got {type(value).__name__}")


# CTranslate2's translate_batch options xform does not build: (the value that means "off", which
# is accepted and dropped, and why another is refused). docs/python.md lists them.
NOT_OFFERED = {
    "patience": (1, "beam search stops as CTranslate2's does with its default patience 1 (its first finished "
                    "hypotheses); another patience is not implemented"),
    "coverage_penalty": (0, "a coverage penalty is not implemented (beam scores are CTranslate2's length-normalised "
                            "sums)"),
    "end_token": (None, "decoding stops at the model's end token only; other end tokens are not implemented"),
    "return_logits_vocab": (False, "the vocabulary's logits are not returned (generate_tokens' return_log_prob, "
                                   "translate_batch's return_scores and callback give the tokens' log-probs)"),
    "return_attention": (False, "a TranslationResult carries no attention; session.generate(..., "
                                "return_attention=True) returns it (a bundle exported with the decoder's attention)"),
    "min_alternative_expansion_prob": (0, "return_alternatives expands every alternative; a minimum probability is "
                                          "not implemented"),
    "prefix_bias_beta": (0, "a soft prefix is not implemented; a target_prefix is always hard"),
}
# the session's request options, which reach it from generate(), not from CTranslate2's methods
REQUEST_ONLY = {
    "return_token_scores": "translate_batch's scores are return_scores (and the callback's log_prob); each token's "
                           "log-prob comes from score_batch or generate_tokens(return_log_prob=True)",
    "vocabulary": "translate_batch restricts the target vocabulary with vocab_map= or use_vmap=True",
    "constraints": "translate_batch's terms are glossary= and keep=",
    "target_prefix": "target_prefix is the second argument of translate_batch, translate_iterable and "
                     "generate_tokens",
    "return_scores": "taken by translate_batch and translate_iterable (translate_file: with_scores); this call's "
                     "results carry no scores",
}


def not_offered(options: dict[str, Any]) -> dict[str, Any]:
    """`options` without CTranslate2's options xform does not build where they are off (patience 1,
    coverage_penalty 0, ...); one set otherwise, or a request option of the session's, is refused
    by name with the reason."""
    out = dict(options)
    for name, (off, why) in NOT_OFFERED.items():
        if name in out:
            value = out.pop(name)
            if value is not None and value != off:
                raise InputError(f"{name}: {why} (CTranslate2's option; xform takes {name}={off!r} only)")
    for name, why in REQUEST_ONLY.items():
        if name in out:
            raise InputError(f"{name}: {why}")
    return out
