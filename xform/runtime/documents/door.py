"""The Python door to documents: a translator given, documents in and out (`xform.Translator`'s
translate_document / translate_documents call these). Documents are text work above the
translator (DocumentTranslator, translate.py): the text layer never imports them."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from xform.runtime.decoding.request import TextOptions
from xform.runtime.documents.memory import TranslationMemory
from xform.runtime.documents.translate import DocumentTranslator
from xform.runtime.text.call_words import ct2_batching, refuse_one_text, reworded
from xform.runtime.text.translator import Translator


def translate_document(translator: Translator, text: str, *, format: str = "text",
                       memory: "str | Path | None" = None, src_lang: str | None = None, tgt_lang: str | None = None,
                       skip_target_language: bool = False, truncate: bool = False, max_batch_size: int = 32,
                       batch_type: str = "examples", glossary: Any = None, keep: str | Sequence[str] = (),
                       **options: Any) -> str:
    """Translate a document: its paragraphs split into sentences (sentencex, by `src_lang`'s
    rules), decoded together, and joined back with the text's whitespace, line and paragraph
    breaks; `format` "markdown" leaves code, URLs, link targets and HTML tags as they are.
    `memory`: an SQLite translation memory (created when missing): sentences it holds for this
    bundle and these settings are not decoded again. `src_lang` "auto" (a multilingual model):
    each paragraph's language identified (py3langid); `skip_target_language`: paragraphs
    already in `tgt_lang` kept as they are. A sentence over max_len is cut at its clauses, else
    truncated with `truncate`, else refused. `glossary` and `keep` (else the translator's): each
    sentence's terms enforced as translate_batch enforces them; a `<dnt>...</dnt>` span (plain
    text, Markdown) and an HTML element with translate="no" are kept as written. `options`:
    translate_batch's."""
    return translate_documents(translator, [text], format=format, memory=memory, src_lang=src_lang,
                               tgt_lang=tgt_lang, skip_target_language=skip_target_language, truncate=truncate,
                               max_batch_size=max_batch_size, batch_type=batch_type, glossary=glossary, keep=keep,
                               **options)[0]


def translate_documents(translator: Translator, texts: Sequence[str], *, format: str = "text",
                        memory: "str | Path | None" = None, src_lang: str | None = None,
                        tgt_lang: str | None = None, skip_target_language: bool = False, truncate: bool = False,
                        max_batch_size: int = 32, batch_type: str = "examples", glossary: Any = None,
                        keep: str | Sequence[str] = (), **options: Any) -> list[str]:
    """Documents translated as translate_document does one, their sentences decoded together; an
    error names each setting as the caller gave it (CTranslate2's names included)."""
    with reworded(options):
        refuse_one_text(texts, "texts")
        gen = translator.generation(tgt_lang, options)
        terms = translator.terminology(glossary, keep, None if src_lang == "auto" else src_lang, tgt_lang)
        text = TextOptions(False, src_lang, tgt_lang, truncate, terminology=terms)
        opened = TranslationMemory(memory) if memory is not None else None
        try:
            documents = DocumentTranslator(translator, gen, ct2_batching(max_batch_size, batch_type), text,
                                           markup=format, memory=opened, skip_target_language=skip_target_language)
            return [r.text for r in documents.translate([(f"texts[{i}]", t) for i, t in enumerate(texts)])]
        finally:
            if opened is not None:
                opened.close()
