"""Opening a bundle's tokenizer: each kind its spec names (tokenizer_spec.py) -> its class.

The kinds live in tokenizer.py (the contract, xform-vocab and marian-spm), fairseq_tokenizer.py
(fairseq-spm, byte-bpe) and t5_tokenizer.py; this module is the one that knows them all, so none
of them imports another's.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from xform.config import TransformerConfig
from xform.errors import BundleError
from xform.files import read_json_object
from xform.runtime.text.fairseq_tokenizer import ByteBpeTokenizer, FairseqSpmTokenizer
from xform.runtime.text.t5_tokenizer import T5Tokenizer
from xform.runtime.text.tokenizer import SpmTokenizer, Tokenizer, VocabTokenizer
from xform.tokenizer_spec import ByteBpeSpec, FairseqSpmSpec, MarianSpmSpec, T5Spec, TokenizerSpec, VocabSpec, parse

KINDS: dict[type[TokenizerSpec], Callable[..., Tokenizer]] = {
    VocabSpec: VocabTokenizer, MarianSpmSpec: SpmTokenizer, FairseqSpmSpec: FairseqSpmTokenizer,
    ByteBpeSpec: ByteBpeTokenizer, T5Spec: T5Tokenizer}


def load_tokenizer(path: Path, config: TransformerConfig) -> Tokenizer:
    """The bundle's tokenizer, by the kind its tokenizer.json names (tokenizer_spec.parse)."""
    path = Path(path)
    spec = parse(read_json_object(path, BundleError, "a tokenizer"), str(path))
    return KINDS[type(spec)](spec, config, path.parent, str(path))
