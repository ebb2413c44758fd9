"""Kind `t5`: T5's, mT5's and MADLAD-400's text, as transformers' tokenizers give it, offline.

From `spiece.model`, as the slow T5Tokenizer (legacy mode, transformers' default) tokenizes: the
sentencepiece ids are the model's, end-of-sentence appended, special tokens (pad, eos, unk, the
extra ids) left out of decoded text; or from `tokenizer.json` alone, through the `tokenizers`
library exactly as T5TokenizerFast runs it (its template appends end-of-sentence).

MADLAD-400 chooses the target language in the source: a `<2xx>` piece of its vocabulary written
at the start of the text ("<2pt> I love pizza!"). The pieces are recorded at export as the
tokenizer's `languages`; `encode(text, tgt_lang=...)` writes the code's token first, and an unknown
code is refused with the known ones. There is no forced first target token.
No torch, no transformers.
"""
from __future__ import annotations

from pathlib import Path

from xform.config import TransformerConfig
from xform.errors import BundleError, Message, SettingError
from xform.runtime.text.tokenizer import Tokenizer, clean_up_spaces, join_spm_pieces, load_spm, target_pieces
from xform.tokenizer_spec import T5Spec, language_code


class T5Tokenizer(Tokenizer):
    spm_words = True  # source pieces mark word starts with U+2581
    target_in_source = True  # a target language (MADLAD's <2xx>) is written into the source text
    tgt_lang = None  # no default target language: the text may carry its own <2xx>

    def __init__(self, spec: T5Spec, config: TransformerConfig, root: Path, source: str):
        self.cfg = config
        self.clean = spec.clean_up_tokenization_spaces
        d = root / "tokenizer"
        self.spm = self.fast = None
        if spec.model:
            name = spec.model
            if Path(name).name != name:
                raise BundleError(f"{source}: model must name a file in tokenizer/, found {name!r}")
            self.spm = load_spm(d / name, source)
            self.size = self.spm.GetPieceSize()
        elif spec.fast:
            try:
                from tokenizers import Tokenizer
            except ImportError:
                raise BundleError(f"{source}: this bundle's tokenizer needs tokenizers: "
                                  "pip install tokenizers") from None
            name = spec.fast
            if Path(name).name != name or not (d / name).is_file():
                raise BundleError(f"{source}: fast must name a file in tokenizer/, found {name!r}")
            try:
                self.fast = Tokenizer.from_file(str(d / name))
            except Exception as e:  # tokenizers raises its own exception type for a bad file
                raise BundleError(f"{d / name}: unreadable tokenizer.json ({e})") from None
            self.size = self.fast.get_vocab_size()
        else:
            raise BundleError(f"{source}: a t5 tokenizer names its model (spiece.model) or fast (tokenizer.json)")
        self.extra_ids = spec.extra_ids if self.spm is not None else 0  # the fast vocabulary counts its own
        rows = config.src_vocab_size
        if self.size + self.extra_ids > rows:
            raise BundleError(f"{source}: {self.size + self.extra_ids} token ids, but the model's embedding has "
                              f"{rows} rows")
        self.languages: list[str] = list(spec.languages)
        self.unk_id = self.piece_id(spec.unk_token)
        # decoded text leaves out what T5Tokenizer's skip_special_tokens does: pad, eos, unk, extra ids
        self.skip = {config.pad_id, config.eos_id, config.decoder_start_id, self.unk_id}
        self.skip |= set(range(self.size, self.size + self.extra_ids))

    def piece_id(self, piece: str) -> int | None:
        if self.spm is not None:
            i = self.spm.PieceToId(piece)
            return i if self.spm.IdToPiece(i) == piece else None
        assert self.fast is not None
        return self.fast.token_to_id(piece)

    @property
    def codes(self) -> list[str]:
        """The language codes as users type them: MADLAD's token <2pt> is the code "pt"."""
        return [language_code(t) for t in self.languages]

    def language_token(self, code: str, setting: str = "tgt_lang") -> str:
        token = code if code in self.languages else f"<2{code}>"
        if token not in self.languages:
            known = ", ".join(self.codes)
            raise SettingError(f"{{{setting}}} {code!r}: " + (f"not a language of this model; known: {known}" if known
                                                              else "this model's tokenizer has no languages"), setting)
        return token

    def body(self, text: str) -> list[int]:
        if self.spm is not None:
            return list(self.spm.encode(text, out_type=int))
        assert self.fast is not None
        return self.fast.encode(text, add_special_tokens=False).ids

    def encode(self, text: str, tgt_lang: str | None = None, setting: str = "tgt_lang") -> list[int]:
        """Source ids: (MADLAD) the target language's token and a space first, the text's pieces,
        end-of-sentence."""
        if tgt_lang is not None:
            text = f"{self.language_token(tgt_lang, setting)} {text}"
        if self.fast is not None:
            return self.fast.encode(text).ids
        return self.body(text) + [self.cfg.eos_id]

    def target_ids(self, text: str) -> list[int]:
        """Target ids of a text, as the tokenizer gives text_target, less end-of-sentence."""
        return self.body(text)

    def piece(self, i: int) -> str:
        if self.spm is not None:
            return self.spm.IdToPiece(i) if 0 <= i < self.size else (f"<extra_id_{self.size + self.extra_ids - 1 - i}>"
                                                                       if i < self.size + self.extra_ids else "")
        assert self.fast is not None
        return self.fast.id_to_token(i) or ""

    def decode(self, ids, replacements: dict[int, str] | None = None) -> str:
        pieces = [p for p in target_pieces(ids, self.cfg.eos_id, self.skip, self.piece, replacements) if p]
        if replacements:
            text = join_spm_pieces(pieces)
        elif self.spm is not None:
            text = self.spm.decode_pieces(pieces).strip()
        else:
            assert self.fast is not None
            text = self.fast.decode([int(i) for i in target_pieces(ids, self.cfg.eos_id, self.skip, int)])
        return clean_up_spaces(text) if self.clean else text

    @property
    def target_unk_id(self) -> int | None:
        return self.unk_id

    def target_vocabulary(self) -> dict[str, int]:
        """Piece -> id (one vocabulary for source and target)."""
        if self.spm is not None:
            return {self.piece(i): i for i in range(self.size + self.extra_ids)}
        assert self.fast is not None
        return self.fast.get_vocab()

    def source_pieces(self, text: str, tgt_lang: str | None = None) -> list[str]:
        """The source text's pieces as written, one per id of encode(text, tgt_lang) (the language
        token and end-of-sentence: empty)."""
        if tgt_lang is not None:
            text = f"{self.language_token(tgt_lang)} {text}"
        if self.spm is not None:
            pieces = list(self.spm.encode(text, out_type=str)) + [""]
        else:
            assert self.fast is not None
            encoding = self.fast.encode(text)
            pieces = [t if i not in self.skip else "" for t, i in zip(encoding.tokens, encoding.ids)]
        return ["" if p in self.languages else p for p in pieces]

    def source_piece(self, i: int) -> str:
        return self.piece(i)

    def unknown(self, ids: list[int]) -> tuple[int, int]:
        """(unknown tokens, text tokens) of an encoded source, end-of-sentence not counted."""
        return sum(i == self.unk_id for i in ids[:-1]), len(ids) - 1

    def describe(self) -> list[str]:
        sample = "Hello, world."
        ids = self.encode(sample)
        what = (f"sentencepiece pieces (spiece.model, T5Tokenizer) of {self.size} + {self.extra_ids} extra ids"
                if self.spm is not None else f"tokenizer.json (T5TokenizerFast) of {self.size} tokens")
        langs = (f"; {len(self.languages)} target languages written into the source as <2xx>: {{tgt_lang}}"
                 if self.languages else "")
        return [Message(f"text in: {what}, then end-of-sentence (id {self.cfg.eos_id}){langs}", "tgt_lang"),
                f"sample: {sample!r} -> {' '.join(self.piece(i) for i in ids)} (ids {' '.join(map(str, ids))})"]
