"""The bundle's tokenizer.json, typed: one definition of each kind's fields, read and written here.

The importers (models/) build a spec and the exporter writes its `to_json()`; the runtime's
tokenizers (runtime/text/tokenizer.py and beside it) take the spec `parse` reads, not a dict whose keys
each spells. One frozen dataclass a kind, one field a JSON key, in the order the file holds them:

    xform-vocab   VocabSpec       a source and a target VocabSideSpec (unit char / word: a token list;
                                  unit spm: a sentencepiece model), source_prefix ids
    marian-spm    MarianSpmSpec   Marian's sentencepiece models and vocab.json
    fairseq-spm   FairseqSpmSpec  NLLB's, mBART-50's and M2M100's (fairseq's offset or vocab.json)
    byte-bpe      ByteBpeSpec     BART's byte-level BPE
    t5            T5Spec          T5's spiece.model or the fast tokenizer's tokenizer.json

`parse(data, source)` finds the kind in a table and checks every field's JSON type, refusing a
wrong one by file and field. A key the file lacks takes the default the runtime always gave it,
so tokenizer.json files written by earlier versions load; keys this xform does not know (an
earlier version's eos_token of t5) are left unread. What needs the tokenizer's files or the
model (a file name inside tokenizer/, ids inside the embedding) is the tokenizer's to check.
Pure Python + json: no numpy, no sentencepiece.
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable, ClassVar

from xform.config import is_int
from xform.errors import BundleError
from xform.files import shown

UNITS = ("char", "word", "spm")


def language_code(token: str) -> str:
    """A language token as users type its code: M2M100's "__fr__" is "fr", MADLAD-400's "<2pt>" is
    "pt"; NLLB's "fra_Latn" and mBART-50's "fr_XX" are their own codes. One rule for the tokenizers
    (runtime/text) and for what a bundle says it translates (runtime/text/languages.py)."""
    if len(token) > 4 and token.startswith("__") and token.endswith("__"):
        return token[2:-2]
    if len(token) > 3 and token.startswith("<2") and token.endswith(">"):
        return token[2:-1]
    return token


def _same(v: Any) -> Any:
    return v


@dataclass(frozen=True)
class JsonType:
    """What a field's JSON value must be: `expected` (for errors), its `test`, and its Python form
    (`load`: a JSON list becomes a tuple) and JSON form (`dump`)."""
    expected: str
    test: Callable[[Any], bool]
    load: Callable[[Any], Any] = _same
    dump: Callable[[Any], Any] = _same


def _list_of(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(test(x) for x in v)


TEXT = JsonType("a string", lambda v: isinstance(v, str))
TEXT_OR_NULL = JsonType("a string or null", lambda v: v is None or isinstance(v, str))
FLAG = JsonType("true or false", lambda v: isinstance(v, bool))
INT = JsonType("an integer", is_int)
COUNT = JsonType("a non-negative integer", lambda v: is_int(v) and v >= 0)
UNIT = JsonType('"char", "word" or "spm"', lambda v: isinstance(v, str) and v in UNITS)
IDS = JsonType("a list of integer ids", _list_of(is_int), tuple, list)
TEXTS = JsonType("a list of strings", _list_of(lambda t: isinstance(t, str)), tuple, list)
TOKENS = JsonType("a list of strings (null: an id without a token)",
                  _list_of(lambda t: t is None or isinstance(t, str)), tuple, list)
ID_MAP = JsonType("an object of token -> integer id",
                  lambda v: isinstance(v, dict) and all(is_int(i) for i in v.values()), dict, dict)
ADDED_TOKEN = JsonType("a string, an object (an added token as transformers saves it) or null",
                       lambda v: v is None or isinstance(v, (str, dict)))


def json_field(kind: JsonType, default: Any = MISSING, key: str | None = None, omit_empty: bool = False) -> Any:
    """A spec field: its JSON type, its default (none: required), its JSON key where that is not the
    field's name, and whether to_json leaves it out when empty (a key the importer writes only then)."""
    meta = {"json": kind, "key": key, "omit_empty": omit_empty}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def malformed(source: str, key: str, expected: str, value: Any, error: type[Exception] = BundleError) -> Exception:
    return error(f"{source}: tokenizer field {key!r} is malformed; expected {expected}, found {shown(value)}")


def missing(source: str, key: str, expected: str, error: type[Exception] = BundleError) -> Exception:
    return error(f"{source}: tokenizer field {key!r} is missing; expected {expected}, found nothing")


def read_fields(cls: type, data: Any, source: str, error: type[Exception], where: str = "") -> dict[str, Any]:
    """The fields of `cls` that `data` (a JSON object) gives, each checked against its JSON type; a
    required one absent is refused. `where`: the object's place in the file ("source.")."""
    values: dict[str, Any] = {}
    for f in fields(cls):
        key = f.metadata.get("key") or f.name
        kind: JsonType = f.metadata["json"]
        if key not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                raise missing(source, where + key, kind.expected, error)
            continue
        if not kind.test(data[key]):
            raise malformed(source, where + key, kind.expected, data[key], error)
        values[f.name] = kind.load(data[key])
    return values


def write_fields(spec: Any) -> dict[str, Any]:
    """A spec's fields as JSON, in their order, under their keys."""
    out = {}
    for f in fields(spec):
        value = getattr(spec, f.name)
        if not (f.metadata["omit_empty"] and not value):
            out[f.metadata.get("key") or f.name] = f.metadata["json"].dump(value)
    return out


class TokenizerSpec:
    """What every kind's spec is: its `KIND` (tokenizer.json's "kind"), its JSON and its reading."""

    KIND: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.KIND, **write_fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str, error: type[Exception] = BundleError) -> "TokenizerSpec":
        return cls(**read_fields(cls, data, source, error))


@dataclass(frozen=True, kw_only=True)
class VocabSideSpec:
    """One side of an xform-vocab tokenizer: `tokens` split into characters or whitespace words
    (`unk`: the token of what the list lacks), or a sentencepiece `model` in tokenizer/."""
    unit: str = json_field(UNIT)
    model: str | None = json_field(TEXT, None)
    tokens: tuple[str | None, ...] = json_field(TOKENS, ())
    unk: str = json_field(TEXT, "<unk>")

    def to_json(self) -> dict[str, Any]:
        if self.unit == "spm":
            return {"unit": self.unit, "model": self.model}
        return {"unit": self.unit, "tokens": list(self.tokens), "unk": self.unk}

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str, error: type[Exception], side: str) -> "VocabSideSpec":
        values = read_fields(cls, data, source, error, f"{side}.")
        key, kind = ("model", TEXT) if values["unit"] == "spm" else ("tokens", TOKENS)
        if key not in values:
            raise missing(source, f"{side}.{key}", kind.expected, error)
        return cls(**values)


SIDE = JsonType(f"an object with a unit ({UNIT.expected})", lambda v: isinstance(v, dict), dump=VocabSideSpec.to_json)


@dataclass(frozen=True, kw_only=True)
class VocabSpec(TokenizerSpec):
    """Kind xform-vocab: the vocabularies given at export (--src-vocab / --tgt-vocab) or an xform
    checkpoint's; `source_prefix`: ids before every source's text (--src-bos)."""
    KIND = "xform-vocab"
    source: VocabSideSpec = json_field(SIDE)
    target: VocabSideSpec = json_field(SIDE)
    source_prefix: tuple[int, ...] = json_field(IDS, (), omit_empty=True)

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str, error: type[Exception] = BundleError) -> "VocabSpec":
        values = read_fields(cls, data, source, error)
        return cls(**{**values, **{side: VocabSideSpec.from_json(data[side], source, error, side)
                                   for side in ("source", "target")}})


@dataclass(frozen=True, kw_only=True)
class MarianSpmSpec(TokenizerSpec):
    """Kind marian-spm: source.spm, target.spm and vocab.json in tokenizer/ (target_vocab.json with
    `separate_vocabs`); `files`, `eos_token`, `pad_token`: the record of what was copied."""
    KIND = "marian-spm"
    files: tuple[str, ...] = json_field(TEXTS, ())
    separate_vocabs: bool = json_field(FLAG, False)
    unk_token: str = json_field(TEXT, "<unk>")
    eos_token: str | dict[str, Any] | None = json_field(ADDED_TOKEN, "</s>")
    pad_token: str | dict[str, Any] | None = json_field(ADDED_TOKEN, "<pad>")


@dataclass(frozen=True, kw_only=True)
class FairseqSpmSpec(TokenizerSpec):
    """Kind fairseq-spm: a sentencepiece `model`, its pieces at fairseq's `offset` or through
    `vocab` (M2M100's vocab.json); `special`: added tokens and language codes -> ids; `source`: the
    order of a source's language code, text and end-of-sentence."""
    KIND = "fairseq-spm"
    tokenizer_class: str | None = json_field(TEXT_OR_NULL, None, key="class")
    model: str = json_field(TEXT)
    vocab: str | None = json_field(TEXT_OR_NULL, None)
    offset: int = json_field(INT, 1)
    unk_token: str = json_field(TEXT, "<unk>")
    special: dict[str, int] = json_field(ID_MAP)
    languages: tuple[str, ...] = json_field(TEXTS)
    source: tuple[str, ...] = json_field(TEXTS, ("lang", "text", "eos"))
    src_lang: str | None = json_field(TEXT_OR_NULL, None)
    tgt_lang: str | None = json_field(TEXT_OR_NULL, None)
    clean_up_tokenization_spaces: bool = json_field(FLAG, False)

    @property
    def codes(self) -> list[str]:
        """The language codes as users type them (`language_code`)."""
        return [language_code(t) for t in self.languages]


@dataclass(frozen=True, kw_only=True)
class ByteBpeSpec(TokenizerSpec):
    """Kind byte-bpe: GPT-2's byte-level BPE from `vocab` and `merges` in tokenizer/."""
    KIND = "byte-bpe"
    vocab: str = json_field(TEXT)
    merges: str = json_field(TEXT)
    add_prefix_space: bool = json_field(FLAG, False)
    clean_up_tokenization_spaces: bool = json_field(FLAG, False)
    special: dict[str, int] = json_field(ID_MAP, {})
    bos_token: str = json_field(TEXT, "<s>")
    eos_token: str = json_field(TEXT, "</s>")
    unk_token: str = json_field(TEXT, "<unk>")


@dataclass(frozen=True, kw_only=True)
class T5Spec(TokenizerSpec):
    """Kind t5: spiece.model (`model`) with `extra_ids` after its pieces, or the fast tokenizer's
    file (`fast`); `languages`: MADLAD-400's <2xx> tokens, written only when there are some."""
    KIND = "t5"
    unk_token: str = json_field(TEXT, "<unk>")
    extra_ids: int = json_field(COUNT, 100)
    clean_up_tokenization_spaces: bool = json_field(FLAG, False)
    model: str | None = json_field(TEXT_OR_NULL, None, omit_empty=True)
    fast: str | None = json_field(TEXT_OR_NULL, None, omit_empty=True)
    languages: tuple[str, ...] = json_field(TEXTS, (), omit_empty=True)

    @property
    def codes(self) -> list[str]:
        """MADLAD-400's target codes as users type them (`language_code`)."""
        return [language_code(t) for t in self.languages]


KINDS: dict[str, type[TokenizerSpec]] = {k.KIND: k for k in (VocabSpec, MarianSpmSpec, FairseqSpmSpec, ByteBpeSpec,
                                                              T5Spec)}


def parse(data: Any, source: str, error: type[Exception] = BundleError) -> TokenizerSpec:
    """The spec of a tokenizer.json's content, by its kind; `error` (BundleError: a bundle's file)
    naming `source` and the field otherwise."""
    if not isinstance(data, dict):
        raise error(f"{source}: a tokenizer must be a JSON object, found {shown(data)}")
    kind = data.get("kind")
    spec = KINDS.get(kind) if isinstance(kind, str) else None
    if spec is None:
        names = list(KINDS)
        raise error(f"{source}: unknown tokenizer kind {kind!r}; expected {', '.join(names[:-1])} or {names[-1]}")
    return spec.from_json(data, source, error)
