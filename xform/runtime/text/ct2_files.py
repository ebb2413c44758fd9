"""CTranslate2's `translate_file` and `score_file`, each returning CTranslate2's `ExecutionStats`.

A file is read as CTranslate2 reads it (python/cpp/translator.cc, include/ctranslate2/translator.h):

- With `source_tokenize_fn` (and `target_detokenize_fn`; `target_tokenize_fn` for a target
  file), each line is the token list the function returns, so CTranslate2's token-list meanings
  apply (token_lists.py); the output is `target_detokenize_fn(tokens)`.
- Without them, a file of tokens (CTranslate2's "tokenized text file") is split on spaces into
  token lists and the output tokens joined by spaces, as CTranslate2 does. A file is read as
  tokens when `tokenized=True`, or, by default, when its first non-blank line holds
  SentencePiece's word mark "▁" or ends with the end token "</s>" (what CTranslate2's documented
  inputs hold); else its lines are texts, translated (scored) with the bundle's tokenizer:
  xform's addition, with the text meanings of translate_batch.

`with_scores` writes `score ||| translation` (each of num_hypotheses hypotheses on its line);
`score_file` writes `score ||| target` (the target's tokens and "</s>" for tokens, the target
line for texts; the score is the mean of the tokens' log-probs) and, `with_tokens_score`, `|||`
and each token's log-prob. Numbers are written as C++ streams write them (6 significant digits,
%g). Files are written atomically: a line that cannot be read or translated raises InputError
and nothing is written."""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from xform.errors import InputError
from xform.files import atomic_file
from xform.runtime.text.ct2_checks import check_call, check_path
from xform.runtime.text.token_lists import END

MARK = "\u2581"  # SentencePiece's word mark


@dataclass(frozen=True)
class ExecutionStats:
    """CTranslate2's ExecutionStats: the target tokens of the best hypotheses (translate_file;
    the scored tokens for score_file), the examples, and the wall time in milliseconds."""

    num_tokens: int = 0
    num_examples: int = 0
    total_time_in_ms: float = 0.0


def number(value: float) -> str:
    """A float as a C++ ostream writes it by default (CTranslate2's files): %g, 6 digits."""
    return f"{value:g}"


def callable_or_none(value: Any, name: str) -> Callable | None:
    if value is not None and not callable(value):
        raise InputError(f"{name}: a function of a line (str) returning its tokens (list of str), got "
                         f"{type(value).__name__}")
    return value


def lines_of(path: str | Path, name: str) -> Iterator[bytes]:
    """A file's lines as bytes, the line end kept (a stream's lines decode themselves)."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise InputError(f"{name} {path}: cannot be read ({e.strerror or e})") from None
    with f:
        yield from f


def text(line: bytes, index: int) -> str:
    try:
        return line.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as e:
        raise InputError(f"line {index}: not UTF-8 ({e})") from None


def split_tokens(line: str) -> list[str]:
    """CTranslate2's split of a tokenized line: on spaces."""
    return [t for t in line.split(" ") if t]


def looks_tokenized(first: bytes | None) -> bool:
    """Whether a file's first non-blank line is CTranslate2's tokens: SentencePiece's word mark,
    or the end token last."""
    if first is None:
        return False
    line = first.decode("utf-8", "replace").strip()
    return MARK in line or line.split(" ")[-1] == END


def peeked(lines: Iterator[bytes]) -> tuple[bytes | None, Iterator[bytes]]:
    """The first non-blank line of a stream, and the stream whole."""
    seen: list[bytes] = []
    for line in lines:
        seen.append(line)
        if line.strip():
            return line, itertools.chain(seen, lines)
    return None, iter(seen)


def tokens_of(fn: Callable | None, line: str, index: int, name: str) -> list[str]:
    """A line's tokens: the user's function's (checked: a list of str), else split on spaces."""
    if fn is None:
        return split_tokens(line)
    tokens = fn(line)
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Iterable):
        raise InputError(f"{name}: returned {type(tokens).__name__} for line {index}; a list of tokens (str) belongs")
    tokens = list(tokens)
    bad = next((t for t in tokens if not isinstance(t, str)), None)
    if bad is not None:
        raise InputError(f"{name}: returned a token {bad!r} for line {index}; tokens are str")
    return tokens


def batched(items: Iterable, size: int) -> Iterator[list]:
    items = iter(items)
    while batch := list(itertools.islice(items, size)):
        yield batch


def paired(sources: Iterator[bytes], prefixes: Iterator[bytes]) -> Iterator[tuple[bytes, bytes]]:
    """(source line, prefix line) of a file and its target file, one prefix a source: a file
    shorter than the other refused (CTranslate2: "One input stream has less examples")."""
    ends = object()
    for i, (s, p) in enumerate(itertools.zip_longest(sources, prefixes, fillvalue=ends)):
        if not isinstance(s, bytes) or not isinstance(p, bytes):  # one file ended first
            raise InputError(f"target_prefix: the target file has {'fewer' if p is ends else 'more'} lines than "
                             f"the source file (line {i}); give one prefix a source line (a blank line for none)")
        yield s, p


def tokenized_mode(source_tokenize_fn: Any, tokenized: Any, first: bytes | None) -> bool:
    if tokenized is not None and not isinstance(tokenized, bool):
        raise InputError(f"tokenized: True (lines of space-separated tokens), False (texts) or None (by the first "
                         f"line), got {tokenized!r}")
    if source_tokenize_fn is not None:
        if tokenized is False:
            raise InputError("tokenized=False with source_tokenize_fn: the function makes each line's tokens")
        return True
    return tokenized if tokenized is not None else looks_tokenized(first)


def read_size(read_batch_size: int, max_batch_size: int) -> int:
    """Examples read before batching (CTranslate2's read_batch_size; 0: automatic)."""
    return read_batch_size or max(max_batch_size or 32, 1) * 16


def not_here(options: dict[str, Any], refused: dict[str, str]) -> None:
    """Options a file method takes another way (`refused`: each one's reason), refused by name."""
    for name, why in refused.items():
        if name in options:
            raise InputError(f"{name}: {why}")


def translate_file(translator, input_path: str | Path, output_path: str | Path, target_path: str | Path | None = None,
                   *, max_batch_size: int = 32, read_batch_size: int = 0, batch_type: str = "examples",
                   with_scores: bool = False, source_tokenize_fn: Any = None, target_tokenize_fn: Any = None,
                   target_detokenize_fn: Any = None, tokenized: bool | None = None, **options: Any) -> ExecutionStats:
    """The module's translate_file over `translator` (translator.py's Translator)."""
    check_call(max_batch_size=max_batch_size, read_batch_size=read_batch_size, batch_type=batch_type)
    source_fn = callable_or_none(source_tokenize_fn, "source_tokenize_fn")
    target_fn = callable_or_none(target_tokenize_fn, "target_tokenize_fn")
    detok = callable_or_none(target_detokenize_fn, "target_detokenize_fn")
    if (source_fn is None) != (detok is None):
        raise InputError("source_tokenize_fn and target_detokenize_fn should both be set or none at all")
    if target_path is not None and source_fn is not None and target_fn is None:
        raise InputError("target_tokenize_fn should be set when passing a target file")
    not_here(options, {"asynchronous": "translate_batch's and score_batch's option; translate_file returns when "
                                        "the file is written",
                       "return_scores": "translate_file writes the scores with with_scores=True",
                       "target_prefix": "translate_file reads the prefixes from target_path, a line a source line"})
    check_path(input_path, "input_path")
    check_path(output_path, "output_path")
    if target_path is not None:
        check_path(target_path, "target_path")
    start = time.perf_counter()
    first, lines = peeked(lines_of(input_path, "input_path"))
    tokens = tokenized_mode(source_fn, tokenized, first)
    if not tokens and target_fn is not None:
        raise InputError("target_tokenize_fn goes with source_tokenize_fn (or tokenized=True)")
    n_tokens = n_examples = 0
    with atomic_file(Path(output_path)) as out:
        if tokens:
            prefixes = None if target_path is None else lines_of(target_path, "target_path")
            results = translated_tokens(translator, lines, prefixes, source_fn, target_fn, max_batch_size,
                                        read_batch_size, batch_type, with_scores, options)
            render = (lambda h: " ".join(h)) if detok is None else detok
        else:
            results = translated_texts(translator, lines, target_path, max_batch_size, read_batch_size, batch_type,
                                       with_scores, options)
            render = str
        for result in results:
            n_examples += 1
            best = result.hypotheses[0] if result.hypotheses else ([] if tokens else "")
            n_tokens += len(best) if tokens else target_tokens(translator, str(best))
            for k, hypothesis in enumerate(result.hypotheses):
                line = render(hypothesis)
                if not isinstance(line, str):
                    raise InputError(f"target_detokenize_fn: returned {type(line).__name__}; a str belongs")
                if with_scores:
                    line = f"{number(result.scores[k] if result.scores else 0.0)} ||| {line}"
                out.write(line + "\n")
    return ExecutionStats(n_tokens, n_examples, (time.perf_counter() - start) * 1000)


def target_tokens(translator, text: str) -> int:
    """A translation's target tokens, as the bundle's tokenizer splits it (a directory of bundles,
    with no one tokenizer: its words)."""
    policy = getattr(translator, "policy", None)
    if not text:
        return 0
    return len(policy.target_ids(text)) if policy is not None else len(text.split())


def translated_tokens(translator, lines: Iterator[bytes], prefixes: Iterator[bytes] | None, source_fn, target_fn,
                      max_batch_size: int, read_batch_size: int, batch_type: str, with_scores: bool,
                      options: dict[str, Any]) -> Iterator[Any]:
    """A tokenized file's TranslationResults (token lists), read_batch_size examples at a time,
    each read batch through translate_batch (CTranslate2's meanings)."""
    pairs: Iterable[tuple] = ((line, None) for line in lines) if prefixes is None else paired(lines, prefixes)
    index = itertools.count()

    def example(pair: tuple) -> tuple[list[str], list[str] | None]:
        i = next(index)
        source = tokens_of(source_fn, text(pair[0], i), i, "source_tokenize_fn")
        if pair[1] is None:
            return source, None
        prefix = tokens_of(target_fn, text(pair[1], i), i, "target_tokenize_fn")
        return source, prefix or None

    for chunk in batched(map(example, pairs), read_size(read_batch_size, max_batch_size)):
        yield from translator.translate_batch([s for s, _ in chunk],
                                              None if prefixes is None else [p for _, p in chunk],
                                              max_batch_size=max_batch_size, batch_type=batch_type,
                                              return_scores=with_scores, **options)


def translated_texts(translator, lines: Iterator[bytes], target_path, max_batch_size: int, read_batch_size: int,
                     batch_type: str, with_scores: bool, options: dict[str, Any]) -> Iterator[Any]:
    """A text file's TranslationResults (texts) through translate_iterable (the line stream)."""
    prefixes = None if target_path is None else (text(line, i) for i, line in
                                                 enumerate(lines_of(target_path, "target_path")))
    read_ahead = max(1, math.ceil(read_batch_size / max_batch_size)) if read_batch_size and max_batch_size else 8
    return translator.translate_iterable(lines, prefixes, max_batch_size=max_batch_size, batch_type=batch_type,
                                         read_ahead=read_ahead, return_scores=with_scores, **options)


def score_file(translator, source_path: str | Path, target_path: str | Path, output_path: str | Path, *,
               max_batch_size: int = 32, read_batch_size: int = 0, batch_type: str = "examples",
               max_input_length: int | None = None, offset: int = 0, with_tokens_score: bool = False,
               source_tokenize_fn: Any = None, target_tokenize_fn: Any = None, target_detokenize_fn: Any = None,
               tokenized: bool | None = None, **options: Any) -> ExecutionStats:
    """The module's score_file over `translator`: `score ||| target [||| token scores]` a line."""
    check_call(max_batch_size=max_batch_size, read_batch_size=read_batch_size, batch_type=batch_type, offset=offset)
    fns = [callable_or_none(f, n) for f, n in ((source_tokenize_fn, "source_tokenize_fn"),
                                               (target_tokenize_fn, "target_tokenize_fn"),
                                               (target_detokenize_fn, "target_detokenize_fn"))]
    if len({f is None for f in fns}) > 1:
        raise InputError("source_tokenize_fn, target_tokenize_fn, and target_detokenize_fn should all be set or none "
                         "at all")
    source_fn, target_fn, detok = fns
    not_here(options, {"asynchronous": "translate_batch's and score_batch's option; score_file returns when the "
                                        "file is written"})
    for path, name in ((source_path, "source_path"), (target_path, "target_path"), (output_path, "output_path")):
        check_path(path, name)
    start = time.perf_counter()
    first, lines = peeked(lines_of(source_path, "source_path"))
    tokens = tokenized_mode(source_fn, tokenized, first)
    ends = object()
    pairs = itertools.zip_longest(lines, lines_of(target_path, "target_path"), fillvalue=ends)
    index = itertools.count()

    def example(pair: tuple) -> tuple[Any, Any]:
        i = next(index)
        if pair[0] is ends or pair[1] is ends:
            raise InputError(f"{source_path} and {target_path}: one input stream has less examples than the other "
                             f"(line {i})")
        source, target = text(pair[0], i), text(pair[1], i)
        if not tokens:
            return source, target
        return (tokens_of(source_fn, source, i, "source_tokenize_fn"),
                tokens_of(target_fn, target, i, "target_tokenize_fn"))

    n_tokens = n_examples = 0
    render = ((lambda t: " ".join(t)) if detok is None else detok) if tokens else None
    with atomic_file(Path(output_path)) as out:
        for chunk in batched(map(example, pairs), read_size(read_batch_size, max_batch_size)):
            results = translator.score_batch([s for s, _ in chunk], [t for _, t in chunk],
                                             max_batch_size=max_batch_size, batch_type=batch_type,
                                             max_input_length=max_input_length, offset=offset, **options)
            for (_, target), result in zip(chunk, results):
                n_examples += 1
                n_tokens += len(result.log_probs)
                scores = result.log_probs
                shown = render(result.tokens) if render is not None else target
                if not isinstance(shown, str):
                    raise InputError(f"target_detokenize_fn: returned {type(shown).__name__}; a str belongs")
                line = f"{number(sum(scores) / len(scores) if scores else 0.0)} ||| {shown}"
                if with_tokens_score:
                    line += " |||" + "".join(f" {number(v)}" for v in scores)
                out.write(line + "\n")
    return ExecutionStats(n_tokens, n_examples, (time.perf_counter() - start) * 1000)
