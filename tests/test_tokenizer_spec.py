"""The typed tokenizer.json (xform/tokenizer_spec.py): one definition of each kind, read by a table.

Each kind's file as the importers wrote it before the spec (dicts built in models/) parses and
writes back the same JSON, keys in the same order; files of earlier versions, without the newer
keys, take the defaults the tokenizers' `.get` gave them; a field of the wrong type is refused
naming the file and the field, an unknown kind naming the kinds. `assert_round_trip` is the
family tests' check of a real export's tokenizer.json (test_marian, test_multilingual_text,
test_t5_text, test_user_models)."""
import copy
import json
import re
import shutil

import pytest

from xform.errors import BundleError, CheckpointError
from xform.tokenizer_spec import (
    KINDS,
    ByteBpeSpec,
    FairseqSpmSpec,
    MarianSpmSpec,
    T5Spec,
    VocabSideSpec,
    VocabSpec,
    parse,
)

# each kind's keys, in the order the importers wrote them before the spec (optional ones last)
KEYS = {"xform-vocab": ["kind", "source", "target", "source_prefix"],
        "marian-spm": ["kind", "files", "separate_vocabs", "unk_token", "eos_token", "pad_token"],
        "fairseq-spm": ["kind", "class", "model", "vocab", "offset", "unk_token", "special", "languages", "source",
                        "src_lang", "tgt_lang", "clean_up_tokenization_spaces"],
        "byte-bpe": ["kind", "vocab", "merges", "add_prefix_space", "clean_up_tokenization_spaces", "special",
                     "bos_token", "eos_token", "unk_token"],
        "t5": ["kind", "unk_token", "extra_ids", "clean_up_tokenization_spaces", "model", "fast", "languages"]}
# what the importers wrote: vocab.py's vocab_tokenizer, marian.py's, bart_family.py's (two kinds)
# and t5.py's tokenizer_spec, as dicts, before the spec (values of the test models' exports)
WRITTEN = {
    "vocab-words-bos": {"kind": "xform-vocab",
                        "source": {"unit": "word", "tokens": ["<pad>", "<s>", "</s>", "<unk>", "w4", None, "w6"],
                                   "unk": "<unk>"},
                        "target": {"unit": "char", "tokens": ["<pad>", "<s>", "</s>", "<unk>", "a", "b"],
                                   "unk": "<unk>"},
                        "source_prefix": [1]},
    "vocab-spm": {"kind": "xform-vocab", "source": {"unit": "spm", "model": "source.model"},
                  "target": {"unit": "spm", "model": "target.model"}},
    "marian": {"kind": "marian-spm", "files": ["source.spm", "target.spm", "vocab.json", "tokenizer_config.json"],
               "separate_vocabs": False, "unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>"},
    "marian-separate": {"kind": "marian-spm", "files": ["source.spm", "target.spm", "vocab.json", "target_vocab.json"],
                        "separate_vocabs": True, "unk_token": "<unk>",
                        "eos_token": {"content": "</s>", "special": True}, "pad_token": "<pad>"},
    "nllb": {"kind": "fairseq-spm", "class": "NllbTokenizer", "model": "sentencepiece.bpe.model", "vocab": None,
             "offset": 1, "unk_token": "<unk>", "special": {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3,
                                                            "fra_Latn": 111, "eng_Latn": 112},
             "languages": ["fra_Latn", "eng_Latn"], "source": ["text", "eos", "lang"], "src_lang": "fra_Latn",
             "tgt_lang": None, "clean_up_tokenization_spaces": True},
    "m2m100": {"kind": "fairseq-spm", "class": "M2M100Tokenizer", "model": "sentencepiece.bpe.model",
               "vocab": "vocab.json", "offset": 1, "unk_token": "<unk>",
               "special": {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "__fr__": 111, "__en__": 112},
               "languages": ["__fr__", "__en__"], "source": ["lang", "text", "eos"], "src_lang": "fr",
               "tgt_lang": "en", "clean_up_tokenization_spaces": False},
    "bart": {"kind": "byte-bpe", "vocab": "vocab.json", "merges": "merges.txt", "add_prefix_space": False,
             "clean_up_tokenization_spaces": False,
             "special": {"<s>": 0, "</s>": 2, "<pad>": 1, "<unk>": 3, "<mask>": 4}, "bos_token": "<s>",
             "eos_token": "</s>", "unk_token": "<unk>"},
    "t5": {"kind": "t5", "unk_token": "<unk>", "extra_ids": 3, "clean_up_tokenization_spaces": False,
           "model": "spiece.model"},
    "madlad": {"kind": "t5", "unk_token": "<unk>", "extra_ids": 3, "clean_up_tokenization_spaces": False,
               "model": "spiece.model", "languages": ["<2de>", "<2pt>"]},
    "t5-fast": {"kind": "t5", "unk_token": "<unk>", "extra_ids": 100, "clean_up_tokenization_spaces": True,
                "fast": "tokenizer.json"},
}


def assert_round_trip(bundle):
    """A bundle's tokenizer.json read as its spec and written back: the same JSON, keys in the same
    order, and those keys the importers wrote before the spec. Returns the spec."""
    text = (bundle / "tokenizer.json").read_text()
    data = json.loads(text)
    spec = parse(copy.deepcopy(data), str(bundle / "tokenizer.json"))
    assert type(spec) is KINDS[data["kind"]]
    assert json.dumps(spec.to_json(), indent=1) + "\n" == text  # as export writes it: the same bytes
    keys = KEYS[data["kind"]]
    assert list(data) == [k for k in keys if k in data] and set(data) >= set(keys) - {"source_prefix", "model", "fast",
                                                                                       "languages"}
    return spec


@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_each_kind_as_the_importers_wrote_it_round_trips(name):
    data = WRITTEN[name]
    spec = parse(copy.deepcopy(data), "tokenizer.json")
    assert spec.to_json() == data and list(spec.to_json()) == list(data)
    assert json.dumps(spec.to_json()) == json.dumps(data)  # nested keys in the same order too
    keys = KEYS[data["kind"]]
    assert list(data) == [k for k in keys if k in data]


def test_the_specs_fields_are_typed_values():
    spec = parse(copy.deepcopy(WRITTEN["vocab-words-bos"]), "t")
    assert isinstance(spec, VocabSpec) and spec.source_prefix == (1,)
    assert spec.source == VocabSideSpec(unit="word", tokens=("<pad>", "<s>", "</s>", "<unk>", "w4", None, "w6"))
    assert spec.target.unit == "char" and spec.target.unk == "<unk>"
    nllb = parse(copy.deepcopy(WRITTEN["nllb"]), "t")
    assert isinstance(nllb, FairseqSpmSpec) and nllb.tokenizer_class == "NllbTokenizer"
    assert nllb.source == ("text", "eos", "lang") and nllb.special["eng_Latn"] == 112 and nllb.vocab is None
    madlad = parse(copy.deepcopy(WRITTEN["madlad"]), "t")
    assert isinstance(madlad, T5Spec) and madlad.languages == ("<2de>", "<2pt>") and madlad.fast is None


def test_a_spec_built_by_an_importer_writes_the_old_dict():
    """What models/ builds (keyword arguments, tuples) is what it wrote as a dict."""
    built = VocabSpec(source=VocabSideSpec(unit="spm", model="source.model"),
                      target=VocabSideSpec(unit="spm", model="target.model"))
    assert built.to_json() == WRITTEN["vocab-spm"]
    assert T5Spec(extra_ids=3, model="spiece.model", languages=("<2de>", "<2pt>")).to_json() == WRITTEN["madlad"]
    assert T5Spec(extra_ids=3, model="spiece.model").to_json() == WRITTEN["t5"]  # no languages: no key
    assert MarianSpmSpec(files=("source.spm", "target.spm", "vocab.json", "tokenizer_config.json")).to_json() \
        == WRITTEN["marian"]
    assert ByteBpeSpec(vocab="vocab.json", merges="merges.txt",
                       special={"<s>": 0, "</s>": 2, "<pad>": 1, "<unk>": 3, "<mask>": 4}).to_json() == WRITTEN["bart"]


# files as earlier versions wrote them, without the keys added since: each reads the defaults the
# tokenizers' data.get(key, default) gave
OLD = [
    ({"kind": "xform-vocab", "source": {"unit": "char", "tokens": ["a"]}, "target": {"unit": "word", "tokens": ["b"]}},
     lambda s: s.source.unk == "<unk>" and s.source_prefix == ()),
    ({"kind": "marian-spm", "files": ["source.spm"], "separate_vocabs": False, "unk_token": "<unk>"},  # hand-made
     lambda s: s.eos_token == "</s>" and s.pad_token == "<pad>"),
    ({"kind": "marian-spm"}, lambda s: s.unk_token == "<unk>" and not s.separate_vocabs and s.files == ()),
    # fairseq-spm of cc047ad (no clean_up_tokenization_spaces; class as tokenizer_config gave it)
    ({"kind": "fairseq-spm", "class": None, "model": "m", "vocab": None, "offset": 1, "unk_token": "<unk>",
      "special": {"<unk>": 3}, "languages": [], "source": ["lang", "text", "eos"], "src_lang": None, "tgt_lang": None},
     lambda s: s.clean_up_tokenization_spaces is False and s.tokenizer_class is None),
    ({"kind": "fairseq-spm", "model": "m", "special": {}, "languages": []},
     lambda s: s.offset == 1 and s.unk_token == "<unk>" and s.source == ("lang", "text", "eos") and s.src_lang is None),
    ({"kind": "byte-bpe", "vocab": "v", "merges": "m"},
     lambda s: s.special == {} and s.bos_token == "<s>" and s.unk_token == "<unk>" and not s.add_prefix_space),
    # t5 of 0e9f08c: eos_token, pad_token and legacy, since dropped, are left unread
    ({"kind": "t5", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>", "legacy": True, "extra_ids": 100,
      "model": "spiece.model"},
     lambda s: s.extra_ids == 100 and s.languages == () and s.clean_up_tokenization_spaces is False),
    ({"kind": "t5"}, lambda s: s.model is None and s.fast is None and s.unk_token == "<unk>" and s.extra_ids == 100),
]


@pytest.mark.parametrize("data, check", OLD, ids=[f"{d['kind']}-{i}" for i, (d, _) in enumerate(OLD)])
def test_files_of_earlier_versions_take_the_old_defaults(data, check):
    assert check(parse(copy.deepcopy(data), "old/tokenizer.json"))


# (kind, field, value, expected): a value of the wrong type, refused naming the field
WRONG = [
    ("nllb", "languages", [["en_XX"]], "a list of strings"),
    ("nllb", "unk_token", ["<unk>"], "a string"),
    ("nllb", "special", {"<s>": "0"}, "an object of token -> integer id"),
    ("nllb", "offset", True, "an integer"),
    ("nllb", "src_lang", 5, "a string or null"),
    ("nllb", "clean_up_tokenization_spaces", "yes", "true or false"),
    ("marian", "separate_vocabs", 1, "true or false"),
    ("marian", "files", "source.spm", "a list of strings"),
    ("bart", "special", [0, 1], "an object of token -> integer id"),
    ("bart", "merges", None, "a string"),
    ("t5", "extra_ids", -1, "a non-negative integer"),
    ("t5", "model", 7, "a string or null"),
    ("madlad", "languages", "<2de>", "a list of strings"),
    ("vocab-words-bos", "source_prefix", ["1"], "a list of integer ids"),
    ("vocab-words-bos", "target", ["a"], 'an object with a unit ("char", "word" or "spm")'),
]


@pytest.mark.parametrize("name, key, value, expected", WRONG, ids=[f"{n}-{k}" for n, k, _, _ in WRONG])
def test_a_field_of_the_wrong_type_is_refused_naming_it(name, key, value, expected):
    data = {**copy.deepcopy(WRITTEN[name]), key: value}
    with pytest.raises(BundleError) as e:
        parse(data, "b/tokenizer.json")
    assert str(e.value) == (f"b/tokenizer.json: tokenizer field {key!r} is malformed; expected {expected}, "
                            f"found {json.dumps(value)}")


@pytest.mark.parametrize("side, key, value, expected", [
    ("source", "unit", "bpe", '"char", "word" or "spm"'),
    ("source", "unit", None, '"char", "word" or "spm"'),
    ("target", "tokens", ["a", 3], "a list of strings (null: an id without a token)"),
    ("target", "unk", ["<unk>"], "a string"),
])
def test_a_vocabulary_side_field_is_refused_by_its_path(side, key, value, expected):
    data = copy.deepcopy(WRITTEN["vocab-words-bos"])
    data[side][key] = value
    with pytest.raises(BundleError, match=re.escape(f"tokenizer field '{side}.{key}' is malformed; expected "
                                                    f"{expected}, found {json.dumps(value)}")):
        parse(data, "b/tokenizer.json")


@pytest.mark.parametrize("name, key, fragment", [
    ("nllb", "model", "tokenizer field 'model' is missing; expected a string, found nothing"),
    ("nllb", "special", "tokenizer field 'special' is missing; expected an object of token -> integer id"),
    ("vocab-words-bos", "target", "tokenizer field 'target' is missing; expected an object with a unit"),
    ("bart", "vocab", "tokenizer field 'vocab' is missing; expected a string"),
])
def test_a_required_field_missing_is_refused_naming_it(name, key, fragment):
    data = copy.deepcopy(WRITTEN[name])
    del data[key]
    with pytest.raises(BundleError, match=re.escape(fragment)):
        parse(data, "b/tokenizer.json")


def test_a_side_without_its_tokens_or_model_is_refused():
    data = copy.deepcopy(WRITTEN["vocab-spm"])
    del data["target"]["model"]
    with pytest.raises(BundleError, match=re.escape("tokenizer field 'target.model' is missing; expected a string")):
        parse(data, "b/tokenizer.json")
    data = {**WRITTEN["vocab-spm"], "source": {"unit": "char", "model": "source.model"}}
    with pytest.raises(BundleError, match=re.escape("tokenizer field 'source.tokens' is missing")):
        parse(data, "b/tokenizer.json")


@pytest.mark.parametrize("kind", ["sentencepiece", None, ["t5"], 3])
def test_an_unknown_kind_is_refused_naming_the_kinds(kind):
    data = {"model": "spiece.model"} if kind is None else {"kind": kind, "model": "spiece.model"}
    with pytest.raises(BundleError) as e:
        parse(data, "b/tokenizer.json")
    assert str(e.value) == (f"b/tokenizer.json: unknown tokenizer kind {kind!r}; expected xform-vocab, marian-spm, "
                            "fairseq-spm, byte-bpe or t5")


def test_not_an_object_is_refused_and_the_error_class_is_the_callers():
    with pytest.raises(BundleError, match="a tokenizer must be a JSON object, found"):
        parse(["xform-vocab"], "b/tokenizer.json")
    with pytest.raises(CheckpointError, match="tokenizer field 'offset' is malformed"):  # an xform checkpoint's file
        parse({**WRITTEN["nllb"], "offset": "1"}, "ckpt/tokenizer.json", CheckpointError)


def test_the_demo_bundles_tokenizer_round_trips(demo_bundle):
    spec = assert_round_trip(demo_bundle)
    assert isinstance(spec, VocabSpec) and spec.source.unit == "char" and spec.target.unit == "word"


def test_load_tokenizer_refuses_through_the_spec(demo_bundle, tmp_path):
    """The runtime's load_tokenizer reads the file through parse: a bad field is the spec's error."""
    import xform
    from xform.runtime.text.tokenizer import VocabTokenizer
    from xform.runtime.text.tokenizers import load_tokenizer
    config = xform.load(demo_bundle).config
    assert isinstance(load_tokenizer(demo_bundle / "tokenizer.json", config), VocabTokenizer)
    b = tmp_path / "b"
    shutil.copytree(demo_bundle, b)
    data = json.loads((b / "tokenizer.json").read_text())
    for bad, fragment in (({**data, "kind": "wordpiece"}, "unknown tokenizer kind 'wordpiece'"),
                          ({**data, "source_prefix": "1"}, "tokenizer field 'source_prefix' is malformed")):
        (b / "tokenizer.json").write_text(json.dumps(bad))
        with pytest.raises(BundleError, match=re.escape(f"{b / 'tokenizer.json'}: {fragment}")):
            load_tokenizer(b / "tokenizer.json", config)
