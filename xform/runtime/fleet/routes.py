"""Which bundle translates a pair: `plan(catalog, src, tgt, model=None, pivot="en")` -> a Route.

The order: a pair bundle that does exactly src>tgt first; a multilingual one covering both
next; else a pivot, src>pivot then pivot>tgt, each hop a pair bundle or a multilingual one (by
the same order). Among equals, the first by name. `model` forces that bundle; it is refused when
its languages are known and do not hold the pair. A pair no route reaches is a RouteError (the
request's fault) listing what the catalog can do.
"""
from __future__ import annotations

from dataclasses import dataclass

from xform.errors import InputError
from xform.runtime.fleet.catalog import Catalog, Entry
from xform.runtime.text.languages import Asked, same


class RouteError(InputError):
    """A pair (or a model) no bundle of the catalog translates; the message lists what they do."""


@dataclass(frozen=True)
class Hop:
    """One translation: bundle `model` from `src` to `tgt`, asked as `asked` says."""
    model: str
    src: str
    tgt: str
    asked: Asked

    def __str__(self) -> str:
        return f"{self.src}>{self.tgt} {self.model}" if self.src and self.tgt else self.model


@dataclass(frozen=True)
class Route:
    """One hop, or two through a pivot language (the first's output is the second's input)."""
    hops: tuple[Hop, ...]

    @property
    def pivot(self) -> str | None:
        return self.hops[0].tgt if len(self.hops) > 1 else None

    def __str__(self) -> str:
        return "; ".join(str(h) for h in self.hops)


def hop(entry: Entry, src: str, tgt: str) -> Hop:
    return Hop(entry.name, src, tgt, entry.languages.asked(src, tgt))


def direct(catalog: Catalog, src: str, tgt: str) -> Hop | None:
    """A one-hop route: a pair bundle first, a multilingual one next."""
    covering = [e for e in catalog if e.languages.covers(src, tgt)]
    best = [e for e in covering if e.languages.one_pair] or covering
    return hop(best[0], src, tgt) if best else None


def catalog_entry(catalog: Catalog, model: str) -> Entry:
    if model not in catalog:
        raise RouteError(f"{{model}} {model!r}: no such bundle; known: {', '.join(e.name for e in catalog)}"
                         ).naming("model")
    return catalog[model]


def plan(catalog: Catalog, src: str | None, tgt: str | None, model: str | None = None,
         pivot: str | None = "en") -> Route:
    """The route for `src` > `tgt` (the module's order); `pivot` None: no pivot. Without both
    languages, `model` is asked with what was given, which its tokenizer judges."""
    if src is None or tgt is None:
        if model is None:
            raise RouteError("a directory of bundles picks one by {src_lang} and {tgt_lang} (or by {model}): give "
                             "both").naming("src_lang", "tgt_lang", "model")
        catalog_entry(catalog, model)
        return Route((Hop(model, src or "", tgt or "", Asked(src_lang=src, tgt_lang=tgt)),))
    if model is not None:
        entry = catalog_entry(catalog, model)
        if entry.languages.known and not entry.languages.covers(src, tgt):
            raise RouteError(f"{{model}} {model!r} does not translate {src}>{tgt}; it does: "
                             f"{'; '.join(entry.languages.summary())}").naming("model")
        return Route((hop(entry, src, tgt),))
    one = direct(catalog, src, tgt)
    if one is not None:
        return Route((one,))
    if pivot and not same(pivot, src) and not same(pivot, tgt):
        first, second = direct(catalog, src, pivot), direct(catalog, pivot, tgt)
        if first is not None and second is not None:
            return Route((first, second))
    through = f", nor through {{pivot}} {pivot!r}" if pivot else ""
    raise RouteError(f"no bundle translates {{src_lang}} {src!r} to {{tgt_lang}} {tgt!r}{through}; the pairs these "
                     f"bundles translate: {' | '.join(catalog.summary())}").naming(
        "src_lang", "tgt_lang", *(["pivot"] if pivot else []))


def one_hop(catalog: Catalog, src: str | None, tgt: str | None, pivot: str | None = "en") -> Hop:
    """The one bundle a job that runs a single bundle over its inputs (a corpus) takes for `src` >
    `tgt`: the route `plan` picks, chosen once. A route through the pivot is refused naming its two
    hops (run them one after the other), and so is a bundle asked by a prefix on each text (a
    multi-target Marian's `>>tgt<<`), which such a job does not add."""
    route = plan(catalog, src, tgt, None, pivot)
    if len(route.hops) > 1:
        first, second = route.hops
        raise RouteError(f"no bundle translates {{src_lang}} {src!r} to {{tgt_lang}} {tgt!r} in one hop; the route "
                         f"is {route}, and a corpus runs one bundle: translate to {first.tgt!r} first ({first.model}), "
                         f"then that output to {tgt!r} ({second.model})").naming("src_lang", "tgt_lang")
    one = route.hops[0]
    if one.asked.prefix:
        raise RouteError(f"{{src_lang}} {src!r} to {{tgt_lang}} {tgt!r}: {one.model} is asked by a "
                         f"{one.asked.prefix.strip()!r} prefix on each source, which a corpus does not add: put it "
                         f"at the start of each input line and give the bundle {one.model} itself"
                         ).naming("src_lang", "tgt_lang")
    return one
