"""Which language a paragraph is in: py3langid (langid.py's model, shipped in its package, 97
languages), asked to choose among the languages a bundle's codes name; the answer given as the
bundle's own code (codes.py)."""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from xform.errors import XformError
from xform.runtime.text.codes import base_language, codes_for


@lru_cache(maxsize=1)
def identifier():
    """py3langid's identifier with normalised probabilities (loaded once: about 0.2 s)."""
    try:
        from py3langid import langid
    except ImportError as e:
        raise XformError("languages are identified by py3langid: pip install 'xform[documents]'") from e
    ident = langid.LanguageIdentifier.from_modelpath(langid.MODEL_DIR / langid.MODEL_FILE, norm_probs=True)
    return ident, frozenset(ident.nb_classes)  # all it knows, before any restriction


class Detector:
    """Identifies a text's language among `codes` (a bundle's codes; the identifier's languages
    that none of them names are never answered). `codes` empty: among all the identifier knows."""

    def __init__(self, codes: Sequence[str] = ()):
        self.codes = tuple(codes)
        known = identifier()[1]
        self.languages = sorted({base_language(c) for c in self.codes} & known) if self.codes else sorted(known)
        if self.codes and not self.languages:
            raise XformError(f"none of the codes {', '.join(self.codes[:8])} names a language py3langid identifies")

    def language(self, text: str) -> str:
        """The ISO 639-1 code of the language `text` is most likely in."""
        ident = identifier()[0]
        if set(ident.nb_classes) != set(self.languages):  # restricting copies the model's columns: once a change
            ident.set_languages(self.languages)
        return ident.classify(text)[0]

    def code(self, text: str) -> str | None:
        """The bundle's code for `text`'s language (the first that names it), None without codes."""
        if not self.codes:
            return None
        return codes_for(self.language(text), self.codes)[0]
