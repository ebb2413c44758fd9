"""Many bundles in this process: `FleetTranslator` routes a batch by its languages (routes.py) to
bundles a Pool (pool.py) opens on demand as text Translators, and says the route it took.

A bundle's cost is the growth of this process's resident memory across its load
(/proc/self/smaps_rollup, else /proc/self/statm): what it really took, its graphs and
ONNX Runtime's arenas, not its files' size. Unloading drops the Session; the allocator may keep
some of the memory for the next load, so a later load can measure less than the first.
"""
from __future__ import annotations

import gc
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from xform.errors import InputError
from xform.runtime.decoding.request import GenerationStepResult, ScoringResult, TranslationResult
from xform.runtime.fleet import fleet_text
from xform.runtime.fleet.catalog import Catalog, Changes
from xform.runtime.fleet.pool import Pool, PoolStats, parse_size
from xform.runtime.fleet.routes import Hop, Route, plan
from xform.runtime.text.call_words import refuse_one_text
from xform.runtime.text.ct2_files import ExecutionStats
from xform.runtime.text.translator import Translator

# settings that shape the answer, not the decoding: a pivot's first hop makes one translation
# (a step callback hears the translation the caller gets)
LAST_HOP_ONLY = ("num_hypotheses", "num_return_sequences", "return_alternatives", "return_scores", "callback")


def resident_bytes() -> int | None:
    """This process's resident memory, or None where /proc does not say (not Linux)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Loaded:
    """A bundle opened in this process: its text Translator, and the lock that keeps its Session
    to one batch at a time (calls for different bundles run together)."""
    translator: Translator
    lock: threading.Lock = field(default_factory=threading.Lock)


class SessionLoader:
    """A Pool's loader in this process: a bundle of `catalog` opened by `opener` (a text
    Translator over its Session), its cost the resident growth across the load (the first load
    also pays the backend's one-time import: its cost is overstated until it loads again)."""

    def __init__(self, catalog: Catalog, opener: Callable[[Path], Translator]):
        self.catalog, self.opener = catalog, opener

    def load(self, name: str) -> tuple[Loaded, int]:
        gc.collect()
        before = resident_bytes() or 0
        translator = self.opener(self.catalog[name].path)
        after = resident_bytes() or 0
        return Loaded(translator), max(after - before, 0)

    def unload(self, name: str, thing: Any) -> None:
        del thing
        gc.collect()


@dataclass(frozen=True)
class RoutedResult(TranslationResult):
    """A TranslationResult and the `route` that made it (one hop, or two through a pivot)."""
    route: Route | None = None


class FleetTranslator:
    """`xform.Translator(DIR)`: text in one language, out in another, over a directory of bundles
    (or a list of bundle paths), each opened by `opener` at its first use and kept within
    `max_loaded` bundles and `memory_budget` (bytes, or a size: "2GiB", "500MB"; pool.py's rules);
    `pinned` bundles are opened now and never unloaded (together within the budget, else
    refused); `pivot`: the language two hops go through where no bundle translates a pair (None:
    none); `idle_unload`: seconds after which a bundle nothing has used is closed (None: never)."""

    def __init__(self, bundles: str | Path | Sequence[str | Path], opener: Callable[[Path], Translator],
                 max_loaded: int | None = None, memory_budget: int | str | None = None, pinned: Iterable[str] = (),
                 pivot: str | None = "en", load_timeout: float = 60.0, idle_unload: float | None = None):
        self.bundles, self.catalog = bundles, Catalog.scan(bundles)
        unknown = [n for n in pinned if n not in self.catalog]
        if unknown:
            raise InputError(f"pinned {unknown}: no such bundle; known: {', '.join(e.name for e in self.catalog)}")
        if memory_budget is not None and resident_bytes() is None:
            raise InputError("{memory_budget}: this system does not say a process's resident memory (/proc), so "
                             "a bundle's cost cannot be measured; bound them by {max_loaded}"
                             ).naming("memory_budget", "max_loaded")
        self.pivot, self.loader = pivot, SessionLoader(self.catalog, opener)
        self.pool = Pool(self.loader, max_loaded, parse_size(memory_budget), pinned,
                         load_timeout, idle_unload=idle_unload)
        self.pool.preload()

    def route(self, src_lang: str | None, tgt_lang: str | None, model: str | None = None) -> Route:
        """The route a translation from `src_lang` to `tgt_lang` takes (routes.plan)."""
        return plan(self.catalog, src_lang, tgt_lang, model, self.pivot)

    def translate_batch(self, source: Sequence[str], target_prefix: Sequence[str | None] | None = None, *,
                        src_lang: str | None = None, tgt_lang: str | None = None, model: str | None = None,
                        **options: Any) -> list[RoutedResult]:
        """Translate texts from `src_lang` to `tgt_lang` by the bundle the route picks (`model`: by
        that one); one RoutedResult a text, in order. Through a pivot, the first hop's best
        translation is the second's source; `options` (a Translator's translate_batch options)
        go to both hops, but for those that shape the answer (hypotheses, scores) and
        `target_prefix`, which go to the last."""
        refuse_one_text(source, "source")
        fleet_text.no_async(options)
        if not isinstance(source, Sequence):
            raise InputError(f"source: expected a list of texts, one a source, got {type(source).__name__}")
        texts = list(source)
        if not all(isinstance(t, str) for t in texts):
            raise InputError("source: texts, one a source (token lists are one bundle's; a directory of bundles "
                             "takes text)")
        route = self.route(src_lang, tgt_lang, model)
        results: list[TranslationResult] = []
        for i, hop in enumerate(route.hops):
            last = i == len(route.hops) - 1
            results = self.hop(hop, texts, target_prefix if last else None,
                               options if last else {k: v for k, v in options.items() if k not in LAST_HOP_ONLY})
            texts = [r.hypotheses[0] if r.hypotheses else "" for r in results]
        return [RoutedResult(r.hypotheses, r.scores, r.confidence, r.unmet, r.promoted_beams, route=route)
                for r in results]

    def hop(self, hop: Hop, texts: list[str], target_prefix: Sequence[str | None] | None,
            options: dict[str, Any]) -> list[TranslationResult]:
        """One bundle's translations of `texts`, asked for the hop's pair as its tokenizer takes it."""
        asked = hop.asked
        sources = [asked.prefix + t if t.strip() else t for t in texts]
        with self.pool.lease(hop.model) as loaded, loaded.lock:
            return loaded.translator.translate_batch(sources, target_prefix, src_lang=asked.src_lang,
                                                     tgt_lang=asked.tgt_lang, **options)

    # -- a one-bundle Translator's other text methods, routed the same way (fleet_text.py) ----------
    documents: Callable[..., list[str]] | None = None  # the documents door (xform.api sets it)

    def translate_iterable(self, source: Iterable[Any], target_prefix: Iterable[Any] | None = None,
                           **options: Any) -> Iterator[RoutedResult]:
        """translate_batch over a stream of texts, `max_batch_size` (32) at a time, in order."""
        return fleet_text.translate_iterable(self, source, target_prefix, **options)

    def translate_file(self, input_path: str | Path, output_path: str | Path, target_path: str | Path | None = None,
                       **options: Any) -> ExecutionStats:
        """A file of texts, a line an example, as a one-bundle Translator's translate_file writes it
        (each hypothesis a line; `with_scores`: `score ||| translation`); ExecutionStats."""
        return fleet_text.translate_file(self, input_path, output_path, target_path, **options)

    def score_batch(self, source: Sequence[Any], target: Sequence[Any], **options: Any) -> list[ScoringResult]:
        """Each target's log-likelihood, by the one bundle that translates the pair."""
        return fleet_text.score_batch(self, source, target, **options)

    def score_iterable(self, source: Iterable[Any], target: Iterable[Any], max_batch_size: int = 64,
                       batch_type: str = "examples", **options: Any) -> Iterator[ScoringResult]:
        """score_batch over two streams, `max_batch_size` pairs at a time."""
        return fleet_text.score_iterable(self, source, target, max_batch_size, batch_type, **options)

    def score_file(self, source_path: str | Path, target_path: str | Path, output_path: str | Path,
                   **options: Any) -> ExecutionStats:
        """A parallel file of texts scored: `score ||| target` a line; ExecutionStats."""
        return fleet_text.score_file(self, source_path, target_path, output_path, **options)

    def generate_tokens(self, source: str, target_prefix: str | None = None,
                        **options: Any) -> Iterator[GenerationStepResult]:
        """One text's translation token by token, by the one bundle that translates the pair."""
        return fleet_text.generate_tokens(self, source, target_prefix, **options)

    def translate_document(self, text: str, **options: Any) -> str:
        """A document translated by the one bundle that translates the pair (documents/door.py)."""
        return fleet_text.translate_documents(self, [text], **options)[0]

    def translate_documents(self, texts: Sequence[str], **options: Any) -> list[str]:
        """Documents translated by the one bundle that translates the pair."""
        return fleet_text.translate_documents(self, texts, **options)

    def translate(self, texts: Sequence[str], max_new_tokens: int | None = None, **settings: Any) -> list[str]:
        """The Python door's translate (generate()'s keywords), routed: the hypotheses in order."""
        if max_new_tokens is not None:
            settings["max_new_tokens"] = max_new_tokens
        return [h for r in self.translate_batch(texts, **settings) for h in r.hypotheses]

    def __getattr__(self, name: str) -> Any:
        why = fleet_text.refused(name)
        if why is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        raise fleet_text.NotForFleet(why)

    def rescan(self) -> Changes:
        """Read the bundles again (a directory: bundles added and removed; any: re-exported ones):
        new ones are routed to, removed and changed ones closed (now if unused, else when their
        batch ends; a changed one opens its new files at its next use, a pinned one at once).
        A bundle that cannot be read is refused in the answer, the others go on."""
        new, changes = self.catalog.rescan(self.bundles)
        self.loader.catalog = self.catalog = new
        failed = self.pool.follow(changes.changed, changes.removed)
        if failed:
            raise next(iter(failed.values()))
        return changes

    def stats(self) -> PoolStats:
        """Which bundles are loaded (least recently used first), their costs, loads and evictions."""
        return self.pool.stats()

    def close(self) -> None:
        """Unload every bundle not in use."""
        self.pool.close()

    def __enter__(self) -> "FleetTranslator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
