"""The CLI's words for the runtime's settings: its flags.

The runtime names a setting by its runtime name (a Python keyword, a GenerationConfig field, a
TextOptions or Batching field, an argument of opening a session), written in a message as a
marker (`{src_lang}`, errors.py). The CLI renders each as its flag: `--` and the name with `-`
for `_`, but for EXCEPTIONS, the flags the CLI has always had under another name. The decoding
controls' click options (options.py) take their flags from here too (`option`).
"""
from __future__ import annotations

from typing import Iterable

from xform.errors import render, worded

# a setting whose flag is not `--` and its name with `-` for `_`
EXCEPTIONS = {
    "do_sample": "--sample",
    "forced_bos_token_id": "--forced-bos-id",
    "bad_words_ids": "--bad-words",  # messages name the phrases' flag; the ids' own option is OPTIONS'
    "return_alternatives": "--alternatives",
    "return_attention": "--replace-unknowns",  # what asks a CLI decode for the decoder's attention
    "max_rows": "--max-batch-rows",
}
# a control's click option where it is not the flag its messages name
OPTIONS = {"bad_words_ids": "--bad-word-ids"}


def flag(setting: str) -> str:
    """The flag that sets `setting` (its runtime name), as the CLI's messages name it."""
    return EXCEPTIONS.get(setting) or "--" + setting.replace("_", "-")


def option(setting: str) -> str:
    """The click option of a decoding control."""
    return OPTIONS.get(setting) or flag(setting)


def said(error_or_message: object) -> str:
    """An error or a message in the CLI's words: each setting it names, as its flag."""
    return render(error_or_message, flag)


def help_text(text: str, settings: Iterable[str]) -> str:
    """A control's help (runtime/decoding/controls.py) with the other controls it names as their flags."""
    return worded(text, settings, flag)


def table() -> dict[str, str]:
    """Each setting of a decode's flag (the generation config's, the text options', the
    batching's, the request's), for what words messages away from the CLI (a corpus's workers)."""
    from dataclasses import fields

    from xform.runtime.decoding.generation import GenerationConfig
    from xform.runtime.decoding.request import REQUEST_OPTIONS, TextOptions
    from xform.runtime.scheduling.batching import Batching

    settings = [f.name for kind in (GenerationConfig, TextOptions, Batching) for f in fields(kind)]
    return {s: flag(s) for s in [*settings, *REQUEST_OPTIONS]}
