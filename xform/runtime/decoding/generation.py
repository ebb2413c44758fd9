"""How to decode: the generation config, its checks, and the decode cap.

A frozen dataclass validated at construction (a `SettingError` naming the settings at fault by
their markers, `{num_beams}`, which each front door words its own way: errors.py), as
transformers' GenerationConfig names its fields. Each field a front door takes is a row of the
controls' table (controls.py); the strategies that read it are decoding.py's.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from xform.errors import Message, SettingError

# The longest decode unless the bundle or the caller says otherwise: CTranslate2's
# max_decoding_length. Not the position table's size: a tutorial model's table holds 5,000
# positions, and one source that never yields end-of-sentence would decode all of them. A fixed
# cap rather than fairseq's a * source length + b: it cannot cut a legitimate translation of a
# short source into a wordier language, beams and samples of one source keep one length limit (as
# transformers' max_length), and a runaway row costs only its own steps once the other rows have
# left the batch. docs/design.md "A decode cap that does not come from a table size".
DEFAULT_MAX_NEW_TOKENS = 256


def decode_cap(generation: dict[str, Any], max_len: int) -> tuple[int, Message]:
    """The default max_new_tokens of a bundle and where it comes from (a Message: it may name the
    setting): the bundle's own `max_new_tokens` (set at export), else the model's `max_length`
    less its start token (transformers counts it), else DEFAULT_MAX_NEW_TOKENS; never beyond the
    position table."""
    named: tuple[str, ...] = ()
    if generation.get("max_new_tokens") is not None:
        n, why, named = int(generation["max_new_tokens"]), "set at export with {max_new_tokens}", ("max_new_tokens",)
    elif generation.get("max_length") is not None:
        n = int(generation["max_length"]) - 1
        why = f"the model's max_length {generation['max_length']} less the start token"
    else:
        n, why = DEFAULT_MAX_NEW_TOKENS, f"xform's default {DEFAULT_MAX_NEW_TOKENS}, CTranslate2's max_decoding_length"
    if n > max_len:
        n, why = max_len, f"{why}, cut to the model's max_len {max_len}"
    return max(1, n), Message(why, *named)


def int_id(value) -> int:
    """A token id: an integer >= 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{value!r} is not a token id")
    return int(value)


def whole(v: Any, low: int) -> bool:
    """An integer (not a bool) >= low."""
    return not isinstance(v, bool) and isinstance(v, (int, np.integer)) and bool(v >= low)


def number(v: Any) -> bool:
    """A finite int or float."""
    return isinstance(v, (int, float)) and bool(np.isfinite(v))


@dataclass(frozen=True)
class GenerationConfig:
    """How to decode. Defaults are greedy; a bundle may record others (a Marian import does)."""
    max_new_tokens: int = 64
    min_new_tokens: int = 0
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False  # True, False or "never", as in transformers
    num_return_sequences: int = 1
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    seed: int | None = None
    forced_eos: bool = False  # end-of-sentence forced at the last step (transformers' forced_eos_token_id)
    # the first generated token, whatever the logits say (transformers' forced_bos_token_id: a
    # multilingual model's target language); it scores 0, as transformers' processor gives it
    forced_bos_token_id: int | None = None
    # transformers' repetition controls, with its semantics (processors.Processors)
    repetition_penalty: float = 1.0  # > 0; 1.0: off
    no_repeat_ngram_size: int = 0  # 0: off
    bad_words_ids: tuple[tuple[int, ...], ...] = ()  # id sequences never generated, besides pad and banned ids
    suppress_tokens: tuple[int, ...] = ()  # ids never generated
    # the num_return_sequences best first tokens after the target prefix, each continued greedily
    # (CTranslate2's return_alternatives: what interactive translation shows)
    return_alternatives: bool = False

    def __post_init__(self):
        problems: list[tuple[str, str]] = []  # (the setting at fault, the message naming it by its marker)
        self._id_lists(problems)
        self._ranges(problems)
        if not problems:
            self._combinations(problems)
        if problems:
            message = "invalid generation settings:\n  - " + "\n  - ".join(m for _, m in problems)
            at_fault = list(dict.fromkeys(name for name, _ in problems))
            named = [f.name for f in fields(self) if "{" + f.name + "}" in message and f.name not in at_fault]
            raise SettingError(message, *at_fault, *named)

    def _id_lists(self, problems: list[tuple[str, str]]) -> None:
        """bad_words_ids and suppress_tokens checked, kept as tuples: the config stays hashable."""
        for name in ("bad_words_ids", "suppress_tokens"):
            value = getattr(self, name)
            try:
                if name == "bad_words_ids":
                    value = tuple(tuple(int_id(i) for i in word) for word in value)
                    if any(not word for word in value):
                        raise ValueError("an empty sequence")
                else:
                    value = tuple(int_id(i) for i in value)
            except (TypeError, ValueError) as e:
                shape = "a list of id sequences" if name == "bad_words_ids" else "a list of ids"
                problems.append((name, f"{{{name}}} must be {shape} (integers >= 0), got {value!r} ({e})"))
                value = ()
            object.__setattr__(self, name, value)

    def _ranges(self, problems: list[tuple[str, str]]) -> None:
        """Each setting alone: its type and range."""
        def bad(name: str, message: str) -> None:
            problems.append((name, f"{{{name}}} {message}"))

        # max_new_tokens 0 would decode nothing: refused alike at every door (a decode makes a token)
        for name, low in (("max_new_tokens", 1), ("min_new_tokens", 0), ("num_beams", 1),
                          ("num_return_sequences", 1), ("top_k", 0), ("no_repeat_ngram_size", 0)):
            if not whole(getattr(self, name), low):
                bad(name, f"must be an integer >= {low}, got {getattr(self, name)!r}")
        penalty = self.repetition_penalty
        if isinstance(penalty, bool) or not number(penalty) or not penalty > 0:
            bad("repetition_penalty", f"must be a number > 0 (1.0: off), got {penalty!r}")
        if not problems and self.min_new_tokens > self.max_new_tokens:
            bad("min_new_tokens", f"{self.min_new_tokens} exceeds {{max_new_tokens}} {self.max_new_tokens}")
        if self.early_stopping not in (True, False, "never"):
            bad("early_stopping", f"must be true, false or never, got {self.early_stopping!r}")
        if not number(self.length_penalty):
            bad("length_penalty", f"must be a finite number, got {self.length_penalty!r}")
        if not number(self.temperature) or not self.temperature > 0:
            bad("temperature", f"must be > 0, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            bad("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if self.forced_bos_token_id is not None and not whole(self.forced_bos_token_id, 0):
            bad("forced_bos_token_id", f"must be a token id (an integer >= 0), got {self.forced_bos_token_id!r}")
        if self.seed is not None and not whole(self.seed, 0):
            bad("seed", f"must be a non-negative integer, got {self.seed!r}")

    def _combinations(self, problems: list[tuple[str, str]]) -> None:
        """Settings that exclude each other: the first such pair."""
        beams = f"{{num_beams}} {self.num_beams}"
        sequences = f"{{num_return_sequences}} {self.num_return_sequences}"
        if self.do_sample and self.num_beams > 1:
            problems.append(("do_sample", f"{{do_sample}} with {beams}: beam sampling is not supported; sample "
                                          "with num_beams 1, or search beams without sampling"))
        elif self.num_beams > 1 and self.num_return_sequences > self.num_beams:
            problems.append(("num_return_sequences", f"{sequences} exceeds {beams}: beam search returns at most "
                                                     "its beams"))
        elif self.return_alternatives and (self.num_beams > 1 or self.do_sample):
            problems.append(("return_alternatives", f"{{return_alternatives}} continues each alternative "
                                                    f"greedily: not with {beams} or {{do_sample}}"))
        elif (self.num_beams == 1 and not self.do_sample and not self.return_alternatives
              and self.num_return_sequences > 1):
            problems.append(("num_return_sequences", f"{sequences} needs beams ({{num_beams}} >= it), sampling "
                                                     "({do_sample}) or alternatives ({return_alternatives}); "
                                                     "greedy decoding has one answer"))

    @property
    def strategy(self) -> str:
        if self.return_alternatives:
            return "alternatives"
        return "beam" if self.num_beams > 1 else "sample" if self.do_sample else "greedy"

    def updated(self, **changes: Any) -> "GenerationConfig":
        """A copy with the given fields changed (None means: keep)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
