"""Vocabulary restriction for CPU speed: CTranslate2's vocabulary map.

A map is a text file of lines `<source n-gram> TAB <target token> <target token> ...`: a source
token (or n tokens separated by spaces, as the source tokenizer splits text) and the target tokens
it allows. A line whose n-gram is empty lists tokens always allowed. For a batch, the allowed
target ids are the union of the always-allowed ones, those of every n-gram of its sources, the
special ids (end-of-sentence, unknown, the decoder start) and any forced or prefix ids; the
restricted decoder (a bundle exported --with-vocab-map) then projects onto those ids only.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from xform.errors import InputError


class VocabMap:
    def __init__(self, rules: dict[tuple[str, ...], list[int]], always: list[int], source: str):
        self.rules, self.always, self.source = rules, always, source
        self.max_n = max((len(k) for k in rules), default=0)

    @classmethod
    def load(cls, path: str | Path, target_vocabulary: dict[str, int]) -> "VocabMap":
        """Read a map; target tokens are looked up in the model's target vocabulary (piece -> id):
        a token it lacks is refused with its line."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"{{vocab_map}} {path}: unreadable ({e})").naming("vocab_map") from None
        rules: dict[tuple[str, ...], list[int]] = {}
        always: list[int] = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            if "\t" not in line:
                raise InputError(f"{{vocab_map}} {path}:{n}: expected '<source n-gram> TAB <target tokens>', "
                                 "found no tab").naming("vocab_map")
            key, _, targets = line.partition("\t")
            ids = []
            for token in targets.split(" "):
                if not token:
                    continue
                if token not in target_vocabulary:
                    raise InputError(f"{{vocab_map}} {path}:{n}: target token {token!r} is not in the model's "
                                     "target vocabulary").naming("vocab_map")
                ids.append(target_vocabulary[token])
            gram = tuple(t for t in key.split(" ") if t)
            if gram:
                rules.setdefault(gram, []).extend(ids)
            else:
                always.extend(ids)
        if not rules and not always:
            raise InputError(f"{{vocab_map}} {path}: no rules").naming("vocab_map")
        return cls(rules, always, str(path))

    def ids_for(self, sources: list[list[str]], extra=()) -> np.ndarray:
        """The sorted target ids a batch of sources (their pieces, as the tokenizer splits them) may
        produce: the always-allowed ones, each n-gram's, and `extra` (special, forced, prefix ids)."""
        out = set(self.always) | {int(i) for i in extra}
        for pieces in sources:
            for n in range(1, self.max_n + 1):
                for start in range(len(pieces) - n + 1):
                    out.update(self.rules.get(tuple(pieces[start:start + n]), ()))
        return np.array(sorted(out), np.int64)


VMAP = "vmap.txt"  # CTranslate2's name for a model's vocabulary map, in the bundle directory too


def bundle_map(policy) -> "VocabMap | None":
    """The bundle's own vocabulary map (CTranslate2's `use_vmap`): its `vmap.txt` (a CTranslate2
    model's, copied beside the bundle's graphs), loaded once, checked as `vocab_map=` is (the
    restricted decoder: export --with-vocab-map); None where the bundle has none, which
    CTranslate2's use_vmap ignores."""
    bundle = getattr(policy.session, "bundle", None)
    path = None if bundle is None else Path(bundle.path) / VMAP
    if path is None or not path.is_file():
        return None
    cached = getattr(policy, "_bundle_vmap", None)
    if cached is None or cached.source != str(path):
        cached = policy.vocab_map(path)
        policy._bundle_vmap = cached
    return cached
