"""How the translator's CTranslate2-named calls take their arguments: options by CTranslate2's
names or the generation config's (`generation_settings`), errors naming a setting as the caller
wrote it (`reworded`, `in_callers_words`), a list of texts where one text would be read as
characters refused (`refuse_one_text`), prefixes beside a stream of sources (`with_prefixes`,
`prefix_lines`), CTranslate2's `max_input_length` and its batching (`input_limit`,
`ct2_batching`)."""
from __future__ import annotations

import functools
import inspect
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, TypeVar

from xform.errors import InputError, XformError
from xform.runtime.decoding.controls import CT2_NAMES, ct2_settings
from xform.runtime.decoding.generation import GenerationConfig
from xform.runtime.decoding.request import REQUEST_OPTIONS, refuse_unknown
from xform.runtime.scheduling.batching import Batching
from xform.runtime.text.ct2_checks import not_offered


def generation_settings(options: dict[str, Any]) -> dict[str, Any]:
    """A translator method's options as generation settings (controls.ct2_settings): CTranslate2's
    names, the generation config's and the request's; another name is refused with the nearest.
    CTranslate2's max_input_length, which only translate_batch takes, is refused saying so."""
    if "max_input_length" in options:
        raise InputError("max_input_length: CTranslate2's option (cut each source to N tokens) is taken by "
                         "translate_batch only; here truncate=True cuts a source longer than the model's max_len")
    options = not_offered(options)  # CTranslate2's options xform does not build: dropped where off, else refused
    refuse_unknown(options, [*CT2_NAMES, *(f.name for f in fields(GenerationConfig)), *REQUEST_OPTIONS])
    return ct2_settings(options)


@contextmanager
def reworded(options: Mapping[str, Any]) -> Iterator[None]:
    """An error inside about a setting the caller gave by CTranslate2's name (max_decoding_length
    for max_new_tokens, beam_size, ...) names it by that name, as the caller wrote it."""
    given = {CT2_NAMES[k]: k for k in options if k in CT2_NAMES}
    try:
        yield
    except XformError as e:
        if given and set(e.settings) & set(given):
            e.args = (e.render(lambda s: "{" + given.get(s, s) + "}"),
                      *(given.get(a, a) if isinstance(a, str) else a for a in e.args[1:]))
            e.settings = tuple(given.get(s, s) for s in e.settings)
        raise


F = TypeVar("F", bound=Callable[..., Any])


def in_callers_words(method: F) -> F:
    """A CTranslate2-named method whose errors name each setting as its caller did (`reworded`)."""
    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def stream(self, *args, **kwargs):
            with reworded(kwargs):
                yield from method(self, *args, **kwargs)
        return stream  # type: ignore[return-value]

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with reworded(kwargs):
            return method(self, *args, **kwargs)
    return call  # type: ignore[return-value]


def refuse_one_text(items: Any, name: str) -> None:
    """A str or bytes where a list of texts belongs (it would translate each character): refused."""
    if isinstance(items, (str, bytes)):
        raise InputError(f"{name}: expected a list of texts, one a source, got a {type(items).__name__} (it would "
                         "translate each character): wrap one text in a list, [text]")


def prefix_lines(path: Path) -> Iterator[str]:
    """A file's lines as target prefixes (UTF-8, the line end dropped)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield line.rstrip("\r\n")


def with_prefixes(source: Iterable, prefixes: Iterable) -> Iterator[tuple]:
    """(source, prefix) pairs of two streams, one prefix a source: more or fewer is refused."""
    ends = object()
    prefix_iter = iter(prefixes)
    for i, line in enumerate(source):
        p = next(prefix_iter, ends)
        if p is ends:
            raise InputError(f"target_prefix: {i} prefixes for more sources; give one a source (None for none)")
        yield line, p
    if next(prefix_iter, ends) is not ends:
        raise InputError("target_prefix: more prefixes than sources; give one a source")


def input_limit(max_input_length: Any) -> int:
    """CTranslate2's max_input_length checked: an integer >= 0 (0 or None: no limit)."""
    if max_input_length is None:
        return 0
    if isinstance(max_input_length, bool) or not isinstance(max_input_length, int) or max_input_length < 0:
        raise InputError(f"max_input_length must be an integer >= 0 (the source tokens kept; 0: no limit), got "
                         f"{max_input_length!r}")
    return max_input_length


def ct2_batching(max_batch_size: int, batch_type: str, read_ahead: int = 8) -> Batching:
    """CTranslate2's max_batch_size and batch_type as a Batching: examples, or padded source tokens."""
    tokens = batch_type == "tokens"
    return Batching(batch_type, None if tokens else max_batch_size, max_batch_size if tokens else None, read_ahead)


def refuse_token_options(**given: bool) -> None:
    """CTranslate2's options for token lists, given with texts: refused by name."""
    for name, value in given.items():
        if value:
            raise InputError(f"{name}: CTranslate2's option for token lists (pass each source as its list of "
                             "tokens); a text's translation is text, with no end token or <unk> in it")


def one_map(vocab_map: Any, vmap: Any) -> Any:
    """translate_batch's vocabulary map: `vocab_map`, or the bundle's vmap.txt (`use_vmap`); both refused."""
    if vmap is not None and vocab_map is not None:
        raise InputError("use_vmap and vocab_map both name a vocabulary map (the bundle's vmap.txt, and "
                         f"{vocab_map}): give one")
    return vmap if vmap is not None else vocab_map
