"""What a bundle translates, and how a request asks it for a pair: read from the bundle's files
(manifest.json, tokenizer.json, tokenizer/), never by opening a session.

Where the languages come from, first found first:

    1. the manifest's `languages` (export --languages SRC:TGT,...), as declared;
    2. the tokenizer's language codes: NLLB / mBART-50 / M2M100 (fairseq-spm) translate any of
       theirs into any other; MADLAD-400 (t5 with <2xx> tokens) any source into its codes;
    3. a Marian's tokenizer/tokenizer_config.json `source_lang` / `target_lang` (`+` lists
       expanded), the targets widened by the `>>xx<<` tokens of tokenizer/vocab.json (a
       multi-target Marian); a group name (`roa`, `ROMANCE`) names no language: then none here;
    4. the OPUS-MT name of the directory it was exported from (`opus-mt-en-de`,
       `opus-mt-tc-big-en-fr`), the manifest's model.source.path;
    5. nothing: the bundle is reached by its name only.

Codes are compared case-folded and otherwise as written: `fra_Latn` is not `fr` unless a bundle
says so. How a request asks (`Ask`) follows the tokenizer, wherever the languages came from: a
fairseq model takes src_lang and tgt_lang in its own codes, MADLAD tgt_lang only, a multi-target
Marian a `>>tgt<<` prefix on the text, any other bundle nothing (it translates one way).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xform.errors import BundleError
from xform.manifest import MANIFEST, Manifest
from xform.tokenizer_spec import FairseqSpmSpec, MarianSpmSpec, T5Spec, TokenizerSpec, parse

# how a request asks a bundle for its pair
NONE, FAIRSEQ, TARGET, PREFIX = "none", "fairseq", "target", "prefix"
# ISO 639-5 group codes OPUS-MT names models by (and `mul`): a group names no one language
GROUPS = frozenset(
    "aav afa alv art azc bat bnt cau ccs cel cpf cpp crp cus dra euq fiu gem gmq gmw grk hyx iir inc ine iro itc "
    "jpx map mkh mul nic phi poz pqe roa sal sem sit sla tai tbq trk tut urj zle zls zlw".split())
MARIAN_TARGET = re.compile(r">>(.+)<<")
OPUS_NAME = re.compile(r"opus-mt-(?:tc-big-)?([A-Za-z]{2,3})-([A-Za-z]{2,3})")


def same(a: str, b: str) -> bool:
    return a.casefold() == b.casefold()


def spelled(code: str, codes: tuple[str, ...]) -> str | None:
    """`code` as `codes` spell it (case-folded match), or None."""
    return next((c for c in codes if same(c, code)), None)


@dataclass(frozen=True)
class Asked:
    """What one request sends a bundle for a pair: its language settings and a prefix on each text."""
    src_lang: str | None = None
    tgt_lang: str | None = None
    prefix: str = ""


@dataclass(frozen=True)
class Ask:
    """How a bundle is asked for a pair (`kind`: none, fairseq, target or prefix) in the codes its
    tokenizer knows (`codes`: the caller's code is written as the bundle spells it)."""
    kind: str = NONE
    codes: tuple[str, ...] = ()

    def asked(self, src: str, tgt: str) -> Asked:
        def own(code: str) -> str:
            return spelled(code, self.codes) or code
        if self.kind == FAIRSEQ:
            return Asked(src_lang=own(src), tgt_lang=own(tgt))
        if self.kind == TARGET:
            return Asked(tgt_lang=own(tgt))
        if self.kind == PREFIX:
            return Asked(prefix=f">>{own(tgt)}<< ")
        return Asked()


@dataclass(frozen=True)
class Languages:
    """What a bundle translates: `pairs` (source, target), and/or every one of `sources` (None:
    any source) into every other of `targets`; `origin`: where they were read; `ask`: how a
    request asks for a pair."""
    pairs: tuple[tuple[str, str], ...] = ()
    sources: tuple[str, ...] | None = ()
    targets: tuple[str, ...] = ()
    ask: Ask = Ask()
    origin: str = "none"

    @property
    def known(self) -> bool:
        return bool(self.pairs or self.targets)

    @property
    def one_pair(self) -> bool:
        """A pair bundle: one source into one target, nothing else."""
        return len(self.pairs) == 1 and not self.targets

    def covers(self, src: str, tgt: str) -> bool:
        if same(src, tgt):
            return False
        if any(same(s, src) and same(t, tgt) for s, t in self.pairs):
            return True
        return spelled(tgt, self.targets) is not None and (self.sources is None
                                                            or spelled(src, self.sources) is not None)

    def asked(self, src: str, tgt: str) -> Asked:
        return self.ask.asked(src, tgt)

    def summary(self, most: int = 12) -> list[str]:
        """What it translates, a phrase a kind: `en>de`, `any of de, fr to another`, `any to de, pt`."""
        def listed(codes: tuple[str, ...]) -> str:
            return ", ".join(codes[:most]) + (f", ... ({len(codes)} codes)" if len(codes) > most else "")
        out = [f"{s}>{t}" for s, t in self.pairs]
        if self.targets and self.sources is None:
            out.append(f"any source to {listed(self.targets)}")
        elif self.targets and self.sources == self.targets:
            out.append(f"any of {listed(self.targets)} to another")
        elif self.targets:
            out.append(f"{listed(self.sources or ())} to {listed(self.targets)}")
        return out


def bundle_languages(bundle: str | Path) -> Languages:
    """What the bundle at `bundle` translates (the module's order), from its files alone."""
    root = Path(bundle)
    manifest = Manifest.read(root / MANIFEST)
    spec = tokenizer_spec(root, manifest)
    ask = ask_of(spec, root)
    if manifest.languages:
        return Languages(pairs=manifest.languages, ask=ask, origin="manifest")
    if isinstance(spec, FairseqSpmSpec) and spec.codes:
        codes = tuple(spec.codes)
        return Languages(sources=codes, targets=codes, ask=ask, origin="tokenizer")
    if isinstance(spec, T5Spec) and spec.codes:
        return Languages(sources=None, targets=tuple(spec.codes), ask=ask, origin="tokenizer")
    if isinstance(spec, MarianSpmSpec):
        marian = marian_languages(root, ask)
        if marian is not None:
            return marian
    pair = opus_pair(manifest.source.get("path"))
    if pair is not None:
        return Languages(pairs=(pair,), ask=ask, origin="OPUS-MT name")
    return Languages(ask=ask)


def tokenizer_spec(root: Path, manifest: Manifest) -> TokenizerSpec | None:
    if manifest.tokenizer is None:
        return None
    path = root / manifest.tokenizer.file
    return parse(read_json(path), str(path))


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BundleError(f"{path}: missing") from None
    except (OSError, ValueError) as e:
        raise BundleError(f"{path}: unreadable JSON ({e})") from None


def ask_of(spec: TokenizerSpec | None, root: Path) -> Ask:
    """How the bundle's tokenizer takes a pair: fairseq codes, MADLAD's target, Marian's >>xx<<."""
    if isinstance(spec, FairseqSpmSpec) and spec.languages:
        return Ask(FAIRSEQ, tuple(spec.codes))
    if isinstance(spec, T5Spec) and spec.languages:
        return Ask(TARGET, tuple(spec.codes))
    if isinstance(spec, MarianSpmSpec):
        targets = marian_targets(root)
        if targets:
            return Ask(PREFIX, targets)
    return Ask()


def marian_targets(root: Path) -> tuple[str, ...]:
    """The `>>xx<<` codes of a Marian's tokenizer/vocab.json (a multi-target model's), in id order."""
    path = root / "tokenizer" / "vocab.json"
    if not path.is_file():
        return ()
    vocab = read_json(path)
    if not isinstance(vocab, dict):
        raise BundleError(f"{path}: expected an object of token -> id")
    tokens = sorted(vocab, key=lambda t: vocab[t] if isinstance(vocab[t], int) else 0)
    return tuple(m[1] for t in tokens if (m := MARIAN_TARGET.fullmatch(t)))


def codes_of(side: Any) -> tuple[str, ...] | None:
    """A Marian side (`en`, `en+fr`) as its codes; None for a group name, or nothing."""
    if not isinstance(side, str) or not side.strip():
        return None
    codes = tuple(c.strip() for c in side.split("+"))
    if any(not c or c.casefold() in GROUPS or (len(c) > 3 and c.isupper()) for c in codes):
        return None
    return codes


def marian_languages(root: Path, ask: Ask) -> Languages | None:
    """A Marian's languages from its tokenizer_config.json, the targets widened by >>xx<<; None
    where a side is missing or a group."""
    path = root / "tokenizer" / "tokenizer_config.json"
    config = read_json(path) if path.is_file() else {}
    if not isinstance(config, dict):
        raise BundleError(f"{path}: expected a JSON object")
    sources = codes_of(config.get("source_lang"))
    named = codes_of(config.get("target_lang")) or ()
    targets = tuple(dict.fromkeys([*named, *(ask.codes if ask.kind == PREFIX else ())]))
    if sources is None or not targets:
        return None
    origin = "Marian tokenizer_config.json" + (" and >>xx<< tokens" if ask.kind == PREFIX else "")
    if len(sources) == 1 and len(targets) == 1:
        return Languages(pairs=((sources[0], targets[0]),), ask=ask, origin=origin)
    return Languages(sources=sources, targets=targets, ask=ask, origin=origin)


def opus_pair(path: Any) -> tuple[str, str] | None:
    """(src, tgt) of an OPUS-MT directory name (`.../opus-mt-en-de`), neither a group; else None."""
    if not isinstance(path, str):
        return None
    m = OPUS_NAME.fullmatch(Path(path).name)
    if m is None or any(codes_of(c) is None for c in m.groups()) or same(m[1], m[2]):
        return None
    return m[1], m[2]
