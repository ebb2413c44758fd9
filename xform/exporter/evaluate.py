"""`xform eval`: translation quality as MT measures it. A bundle translates a file; sacreBLEU scores
it against reference translations (corpus BLEU with its signature, chrF), and, against a second
system (eager PyTorch from the bundle's own reference weights, or another bundle) decoding the
same file with the same settings, both systems' scores side by side, the share of identical
translations and the sentence-level chrF differences. Without references, the second system's
translations are the reference. In the exporter's layer because eager decoding needs the model.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Callable

from xform.errors import Message, XformError, message
from xform.runtime.decoding.generation import GenerationConfig
from xform.runtime.decoding.request import TextOptions
from xform.runtime.scheduling.batching import Batching
from xform.runtime.text.translator import Translator

WORST = 10  # sentences printed where the bundle loses most against the other system


def sacrebleu_module():
    try:
        import sacrebleu
    except ImportError:
        raise XformError("xform eval scores with sacreBLEU: pip install 'xform[eval]' (or pip install sacrebleu)"
                         ) from None
    return sacrebleu


def read_lines(flag: str, path: Path, per_line: bool = False) -> list:
    """The lines of a text file (UTF-8), refused by name when missing, unreadable, UTF-16 or empty.
    A line that is not UTF-8 is refused naming its number; with `per_line` (the sources, as `run`
    takes them) it is kept as its bytes instead, for the translator to fail alone."""
    from xform.files import not_utf8_text
    if (why := not_utf8_text(Path(path), flag)) is not None:
        raise XformError(why)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise XformError(f"{flag} {path}: no such file") from None
    except IsADirectoryError:
        raise XformError(f"{flag} {path}: is a directory; expected a file of lines") from None
    except OSError as e:
        raise XformError(f"{flag} {path}: unreadable ({e})") from None
    lines: list = []
    for n, raw in enumerate(data.splitlines(), 1):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            if not per_line:
                raise XformError(f"{flag} {path}:{n}: not UTF-8 ({e})") from None
            lines.append(raw)
    if not any(line.strip() for line in lines):
        raise XformError(f"{flag} {path}: empty (no line to translate or compare)")
    return lines


@dataclass
class System:
    """A system's translations, one a source line (a line it could not translate: empty, its error
    in `failed` by line number, 1-based)."""
    name: str
    translations: list[str]
    seconds: float
    bleu: float | None = None
    chrf: float | None = None
    failed: dict[int, Message] = field(default_factory=dict)
    read: int = 0  # the lines it was given (its translations may be fewer: those scored); 0: as many
    confidence: list[float | None] = field(default_factory=list)  # with qe: each translation's (None: blank)

    @property
    def lines_per_s(self) -> float:
        return (self.read or len(self.translations)) / max(self.seconds, 1e-9)


@dataclass
class EvalReport:
    source: str
    reference: str | None  # the references' file; None: the other system's translations are the reference
    systems: list[System]
    bleu_signature: str = ""
    chrf_signature: str = ""
    identical: float | None = None  # share of lines both systems translate alike
    sentence_chrf_delta: list[float] = field(default_factory=list)  # per line: bundle - other (vs reference)
    worst: list[dict] = field(default_factory=list)
    # with qe: the confidence's Spearman rank correlation with each line's chrF against the
    # references, over `qe_lines` lines (blank ones left out)
    qe_spearman: float | None = None
    qe_lines: int = 0

    def to_dict(self) -> dict:
        d = asdict(self)
        main = self.systems[0]
        d.update(bleu=main.bleu, chrf=main.chrf, lines=len(main.translations), lines_per_s=main.lines_per_s,
                 signature={"bleu": self.bleu_signature, "chrf": self.chrf_signature})
        for s in d["systems"]:
            s.pop("translations")
            s["failed"] = {str(n): str(m) for n, m in s["failed"].items()}
        return d


def translate_file(name: str, translator: Translator, lines: list, gen: GenerationConfig, src_lang: str | None,
                   batch_size: int, on_batch: Callable[[int, int], None] | None = None,
                   tgt_lang: str | None = None, vocab_map: Path | None = None, truncate: bool = False,
                   qe: bool = False) -> System:
    """Each line's best translation (a blank line: blank); a line that cannot be translated (not
    UTF-8: its bytes, too long, ...) fails alone, as in `run`: an empty translation, its error in
    `failed`. `tgt_lang` reaches the sources where the model writes it there (MADLAD's <2xx>);
    `vocab_map` restricts each batch's target vocabulary (a bundle exported --with-vocab-map);
    `truncate` cuts a line over max_len instead of failing it; `qe`: each translation's confidence
    (runtime/text/confidence.py)."""
    start = time.perf_counter()
    out, failed, sure = [], {}, []
    text = TextOptions(src_lang=src_lang, tgt_lang=tgt_lang, vocab_map=vocab_map, truncate=truncate, qe=qe)
    for n, line in enumerate(translator.translate_lines(lines, gen, Batching(batch_size=batch_size), text,
                                                        on_batch=on_batch), 1):
        if line.error is not None:  # the settings it names stay named: the CLI words them as flags
            failed[n] = message(line.error)
        out.append(line.hypotheses[0] if line.hypotheses else "")
        sure.append(line.confidence[0] if line.confidence else None)
    return System(name, out, time.perf_counter() - start, failed=failed, confidence=sure if qe else [])


def without_failed(systems: list[System], references: list[str] | None
                   ) -> tuple[list[System], list[str] | None, list[int]]:
    """The systems and references without the lines some system could not translate (scored, an
    empty translation would count against it), and the line numbers (1-based) kept."""
    failed = {n for s in systems for n in s.failed}
    kept = [n for n in range(1, len(systems[0].translations) + 1) if n not in failed]
    if not failed:
        return systems, references, kept
    if not kept:
        raise XformError("no line of --source could be translated: nothing to score")
    pick = [n - 1 for n in kept]
    return ([replace(s, translations=[s.translations[i] for i in pick], read=len(s.translations),
                     confidence=[s.confidence[i] for i in pick] if s.confidence else []) for s in systems],
            None if references is None else [references[i] for i in pick], kept)


def evaluate(systems: list[System], references: list[str] | None, source: str, reference: str | None,
             lines: list[int] | None = None) -> EvalReport:
    """Scores of each system against the references (or, without them, of the first against the
    second); with two systems, their agreement and the sentence chrF differences. `lines`: the
    source line number of each translation (default 1, 2, ...), as the worst lines are named."""
    sacrebleu = sacrebleu_module()
    refs = references if references is not None else systems[1].translations
    scored = systems if references is not None else systems[:1]
    numbers = lines or list(range(1, len(systems[0].translations) + 1))
    report = EvalReport(source, reference, systems)
    for s in scored:
        bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
        s.bleu = float(bleu.corpus_score(s.translations, [refs]).score)
        s.chrf = float(chrf.corpus_score(s.translations, [refs]).score)
        report.bleu_signature, report.chrf_signature = str(bleu.get_signature()), str(chrf.get_signature())
    if systems[0].confidence and references is not None:
        report.qe_spearman, report.qe_lines = qe_correlation(systems[0], refs)
    if len(systems) == 2:
        a, b = (s.translations for s in systems)
        report.identical = sum(x == y for x, y in zip(a, b)) / len(a)
        chrf = sacrebleu.metrics.CHRF()
        if references is not None:
            deltas = [chrf.sentence_score(x, [r]).score - chrf.sentence_score(y, [r]).score
                      for x, y, r in zip(a, b, refs)]
        else:  # how far each line is from the other system's: 0 where identical
            deltas = [chrf.sentence_score(x, [y]).score - 100.0 for x, y in zip(a, b)]
        report.sentence_chrf_delta = [round(float(d), 3) for d in deltas]
        order = sorted(range(len(deltas)), key=lambda i: deltas[i])
        report.worst = [{"line": numbers[i], "chrf_delta": round(float(deltas[i]), 2), systems[0].name: a[i],
                         systems[1].name: b[i], **({"reference": refs[i]} if references is not None else {})}
                        for i in order[:WORST] if deltas[i] < 0]
    return report


def qe_correlation(system: System, references: list[str]) -> tuple[float | None, int]:
    """(the Spearman rank correlation of the system's confidences with its sentences' chrF against
    the references, the lines it is over): lines without a confidence (blank) left out; None
    where fewer than 3 lines remain or either side is constant."""
    import math

    from xform.runtime.text.confidence import sentence_chrf, spearman

    pairs = [(c, sentence_chrf(t, r)) for c, t, r in zip(system.confidence, system.translations, references)
             if c is not None]
    if len(pairs) < 3:
        return None, len(pairs)
    rho = spearman([c for c, _ in pairs], [f for _, f in pairs])
    return (None if math.isnan(rho) else round(float(rho), 4)), len(pairs)


def plot(report: EvalReport, out: Path | IO[bytes]) -> None:
    """A histogram of the sentence chrF differences as a PNG (matplotlib, only for --plot), into a
    path or a binary file."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise XformError("--plot needs matplotlib: pip install -e '.[eval]' (or pip install matplotlib)") from None
    a, b = report.systems[0].name, report.systems[1].name
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(report.sentence_chrf_delta, bins=40)
    ax.set_xlabel(f"sentence chrF, {a} minus {b}" + ("" if report.reference else f" (against {b})"))
    ax.set_ylabel("lines")
    ax.set_title(f"{len(report.sentence_chrf_delta)} lines, {report.identical:.1%} identical")
    fig.tight_layout()
    fig.savefig(out, format="png")
    plt.close(fig)
