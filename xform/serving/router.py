"""Many bundles on one Triton: the router model `translate`, without Triton (tested directly);
xform/serving/triton_router.py is its Triton side (copied as `translate/1/model.py`).

Every bundle of the server is a Triton model of the repository (serving/repository.py), not
loaded at start (explicit model control). A request to `translate` carries texts, `src_lang`
and `tgt_lang` (and optionally `model`); the router plans its route (runtime.fleet.routes.plan:
a pair bundle, a multilingual one, else two hops through the pivot language), leases each hop's
bundle from a runtime.fleet.pool.Pool (loaded at its first lease, the least recently used idle
one unloaded to make room within `max_loaded`), and relays the hop to the bundle's engine model
through BLS (`call`, injected: Triton's in triton_router.py, a fake in the tests). A pivot's
second hop translates the first's translations. The answer: `translation`, and `route`, the
hops taken (`fr>en opus-fr-en; en>de opus-en-de`).

Errors, by kind (triton_model.error: request 400, unavailable 503, server 500): no route, or a
bad input, is the request's and lists what the bundles translate; no room to load a bundle
within the load timeout (every loaded one busy) is unavailable, and so is a bundle a rescan
removed after the request was routed to it (Removed: sent again, the request is routed over what
is served now); a bundle that fails to load is the server's, for the requests routed to it
only; a hop's own error keeps the kind its engine gave (inflight.untagged).
"""
from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from xform.errors import InputError, XformError
from xform.files import atomic_write
from xform.runtime.fleet.catalog import Catalog, Entry
from xform.runtime.fleet.pool import LoadFailed, Pool, Unavailable
from xform.runtime.fleet.routes import Hop, Route, plan
from xform.runtime.text.languages import Ask, Languages
from xform.serving import tensors
from xform.serving.handler import one_string, said, strings
from xform.serving.tensors import Tensor

ROUTER = "translate"  # the router model's name (no bundle may take it)
CATALOG = "catalog.json"  # in the router's version directory: the bundles, their engines and languages
OWN = [
    Tensor("text", "TYPE_STRING", (1,), "A source text, one a row."),
    Tensor("src_lang", "TYPE_STRING", (1,), "The source language (one a request)."),
    Tensor("tgt_lang", "TYPE_STRING", (1,), "The target language (one a request)."),
    Tensor("model", "TYPE_STRING", (1,), "A bundle by name, instead of the route's choice."),
    Tensor("status", "TYPE_BOOL", (1,), "True: no translation; the router's state as JSON (output `status`)."),
    Tensor("rescan", "TYPE_BOOL", (1,), "True: no translation; the bundles read again (serving/rescan.py), what "
           "changed as JSON (output `status`)."),
]
# the bundle models' text-level inputs, passed to each hop as they came
NOT_PASSED = {"text", "src_ids", "src_lang", "tgt_lang", "return_attention", "stream", "status", "rescan"}
# what shapes the answer, not the decoding: a pivot's first hop makes one translation
LAST_HOP_ONLY = {"num_return_sequences", "return_alternatives", "return_scores", "target_prefix", "qe"}
# a glossary's terms are of the pair asked: no hop through a pivot translates that pair
DIRECT_ONLY = ("glossary",)
OUTPUTS = [
    Tensor("translation", "TYPE_STRING", (1,), "Each row's translation."),
    Tensor("route", "TYPE_STRING", (1,), "The hops taken: `src>tgt bundle`, two through a pivot (`; `)."),
    Tensor("scores", "TYPE_FP32", (1,), "With return_scores: the last hop's score."),
    Tensor("hypotheses", "TYPE_STRING", (-1,), "With num_return_sequences k > 1: all k (the last hop's)."),
    Tensor("hypothesis_scores", "TYPE_FP32", (-1,), "With num_return_sequences k > 1 and return_scores."),
    Tensor("confidence", "TYPE_FP32", (1,), "With qe: the last hop's confidence in [0, 1]."),
    Tensor("unmet", "TYPE_STRING", (1,), "With a glossary or keep: the terms the last hop's translation lacks, "
           "joined by tabs."),
    Tensor("status", "TYPE_STRING", (1,), "With status: the bundles, loaded or not, and their counters; with "
           "rescan: what changed (JSON)."),
]

OWN_OUTPUTS = {"route", "status"}  # the router's, not asked of a bundle


def inputs() -> list[Tensor]:
    """The router's inputs: its own, then the bundles' text-level controls."""
    return OWN + [t for t in tensors.inputs() if t.name not in NOT_PASSED]


class Removed(Unavailable):
    """A bundle a request was routed to, removed by a rescan before its hop: the client did nothing
    wrong, and the same request sent again is routed over the bundles served now (503, retryable)."""


class HopFailed(XformError):
    """A hop's bundle answered an error; `kind` as its engine said (request, server, unavailable)."""

    def __init__(self, message: str, kind: str = "server"):
        super().__init__(message)
        self.kind = kind


def failure(e: BaseException) -> tuple[str, str]:
    """(kind, message) of a request's failure: triton_model.error's kinds."""
    if isinstance(e, HopFailed):
        return e.kind, str(e)
    if isinstance(e, Unavailable):
        return "unavailable", said(e, load_timeout="the server's --load-timeout")
    if isinstance(e, InputError):
        return "request", said(e, model="input 'model'", pivot="the server's --pivot")
    if isinstance(e, LoadFailed):
        return "server", said(e, memory_budget="the server's --memory-budget")
    return "server", f"xform: {type(e).__name__}: {e}"


# -- the catalog the router reads (catalog.json) ---------------------------------------------------
def languages_json(lang: Languages) -> dict[str, Any]:
    return {"pairs": [list(p) for p in lang.pairs], "sources": None if lang.sources is None else list(lang.sources),
            "targets": list(lang.targets), "ask": {"kind": lang.ask.kind, "codes": list(lang.ask.codes)},
            "origin": lang.origin}


def languages_from(data: dict[str, Any]) -> Languages:
    return Languages(tuple((str(s), str(t)) for s, t in data["pairs"]),
                     None if data["sources"] is None else tuple(data["sources"]), tuple(data["targets"]),
                     Ask(data["ask"]["kind"], tuple(data["ask"]["codes"])), data["origin"])


@dataclass(frozen=True)
class Settings:
    """The router's: `max_loaded` bundles at once and `memory_budget` bytes of their stubs (None: no
    bound), `preload`: bundles loaded at start and never unloaded, `load_timeout` seconds a request
    waits for room, the `pivot` language (None: none), `threads` answering requests, `idle_unload`
    seconds after which a bundle no request used is unloaded (None: never)."""
    max_loaded: int | None = None
    memory_budget: int | None = None
    preload: tuple[str, ...] = ()
    load_timeout: float = 60.0
    pivot: str | None = "en"
    threads: int = 64
    unload_timeout: float = 60.0  # how long an unload waits for its stubs to exit
    idle_unload: float | None = None


def write_catalog(path: Path, catalog: Catalog, engines: dict[str, str], settings: Settings,
                  origin: dict | None = None) -> None:
    """catalog.json: the settings, and each bundle's name, path, engine model, languages and
    manifest stamp (read by the scan: the router opens no bundle file to route); `origin`, what a
    rescan reads again (fleet_repository.origin). Written atomically: a rescan rewrites it."""
    data = {"settings": settings.__dict__, "origin": origin, "bundles": [
        {"name": e.name, "path": os.path.abspath(e.path), "engine": engines[e.name],
         "languages": languages_json(e.languages), "stamp": e.stamp} for e in catalog]}
    atomic_write(path, json.dumps(data, indent=1) + "\n")


def read_catalog(path: Path) -> tuple[Catalog, dict[str, str], Settings]:
    data = json.loads(Path(path).read_text())
    bundles = data["bundles"]
    catalog = Catalog([Entry(b["name"], Path(b["path"]), languages_from(b["languages"]), b.get("stamp", ""))
                       for b in bundles])
    settings = Settings(**{**data["settings"], "preload": tuple(data["settings"].get("preload", ()))})
    return catalog, {b["name"]: b["engine"] for b in bundles}, settings


# -- loading bundles into Triton -------------------------------------------------------------------
class StubLoader:
    """A Pool's loader on Triton: a bundle loads as its engine model (`load_model(engine)`: BLS
    pb_utils.load_model, synchronous), its cost the memory of the stubs that run it (`stubs(engine)`
    -> pids; residency.memory_bytes: Pss); unloading (`unload_model`: asynchronous in Triton 2.51)
    waits until those stubs have exited, so the memory is free before the next load.

    `check(name)` runs first (the router verifies the bundle's files: a damaged bundle fails here
    with its reason). Triton 2.51's BLS `load_model` was seen not to return when the engine's
    initialize failed (its log says "failed to load"): so it runs in a thread of its own, and a
    load whose engine stub came and went while the model is not ready (`ready(engine)`), or that
    takes more than `load_timeout`, fails without waiting for the call."""

    def __init__(self, engines: dict[str, str], load_model: Callable[[str], None],
                 unload_model: Callable[[str], None], stubs: Callable[[str], list[int]],
                 memory: Callable[[int], int], wait_gone: Callable[[list[int], float], list[int]],
                 unload_timeout: float = 60.0, observe: Callable[[str, str, float, int], None] = lambda *a: None,
                 check: Callable[[str], None] = lambda name: None, ready: Callable[[str], bool] = lambda e: True,
                 load_timeout: float = 600.0):
        self.engines, self.load_model, self.unload_model = engines, load_model, unload_model
        self.stubs, self.memory, self.wait_gone, self.unload_timeout = stubs, memory, wait_gone, unload_timeout
        self.observe = observe  # (event "load" | "unload", bundle, seconds, bytes)
        self.check, self.ready, self.load_timeout = check, ready, load_timeout

    def load(self, name: str) -> tuple[str, int]:
        engine, t0 = self.engines[name], time.monotonic()
        self.check(name)
        self.guarded(engine)
        cost = sum(self.memory(p) for p in self.stubs(engine))
        self.observe("load", name, time.monotonic() - t0, cost)
        return engine, cost

    def guarded(self, engine: str) -> None:
        """`load_model(engine)`, not waiting for a call that will not return (the class's note)."""
        done: list[BaseException | None] = []
        call = threading.Thread(target=lambda: done.append(caught(self.load_model, engine)), daemon=True,
                                name=f"xform-load-{engine}")
        call.start()
        seen, deadline = False, time.monotonic() + self.load_timeout
        while not done:
            call.join(0.1)
            if done:
                break
            running = bool(self.stubs(engine))
            if (seen and not running and not self.ready(engine)) or time.monotonic() > deadline:
                call.join(1.0)  # an error on its way
                if not done:
                    raise XformError(f"failed to load {engine!r}: its stub exited before it was ready "
                                     "(Triton's log says why)" if seen else
                                     f"{engine!r} was not loaded after {self.load_timeout:.0f} s")
            seen = seen or running
        if done[0] is not None:
            raise done[0]

    def unload(self, name: str, engine: Any) -> None:
        pids, t0 = self.stubs(engine), time.monotonic()
        self.unload_model(engine)
        left = self.wait_gone(pids, self.unload_timeout)
        if left:
            raise XformError(f"{engine}: its stubs {left} were still running {self.unload_timeout:.0f} s after "
                             "its unload")
        self.observe("unload", name, time.monotonic() - t0, 0)


def caught(fn: Callable[[str], None], arg: str) -> BaseException | None:
    try:
        fn(arg)
    except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
        return e
    return None


# -- the router ------------------------------------------------------------------------------------
Call = Callable[[str, dict[str, np.ndarray]], dict[str, np.ndarray]]


class Router:
    """Requests over the bundles of `catalog`: routed (routes.plan), each hop's bundle leased from
    `pool` (whose loaded thing is the bundle's engine model) and asked through `call(engine,
    tensors) -> tensors` (raising HopFailed)."""

    def __init__(self, catalog: Catalog, pool: Pool, call: Call, pivot: str | None = "en",
                 status: Callable[[], dict[str, Any]] | None = None,
                 rescan: Callable[[], dict[str, Any]] | None = None):
        self.catalog, self.pool, self.call, self.pivot = catalog, pool, call, pivot
        self.status = status or (lambda: {})
        self.rescan = rescan

    def handle(self, given: dict[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        """A request's outputs from its inputs (None where absent); raises what `failure` words.
        With a true `status`, the router's state (`status()`) as JSON instead of a translation;
        with a true `rescan`, what `rescan()` found (serving/rescan.py)."""
        for control, answer in (("status", self.status), ("rescan", self.rescan)):
            if given.get(control) is not None and bool(np.asarray(given[control]).reshape(-1)[0]):
                if answer is None:
                    raise InputError(f"input {control!r}: this router cannot {control}")
                return {"status": np.array([[json.dumps(answer()).encode()]], dtype=object)}
        if given.get("text") is None:
            raise InputError("input 'text': missing; the texts to translate, one a row")
        texts = np.asarray(given["text"], dtype=object).reshape(-1, 1)
        src, tgt, model = (one_string(n, given.get(n)) for n in ("src_lang", "tgt_lang", "model"))
        if given.get("document_format") is not None and src == "auto":
            raise InputError("input 'src_lang': auto identifies each paragraph's language inside one multilingual "
                             "bundle; the router picks a bundle by the source language: give it")
        route = plan(self.catalog, src, tgt, model, self.pivot)
        if given.get("document_format") is not None and any(h.asked.prefix for h in route.hops):
            raise InputError(f"input 'document_format': {route} asks its bundle for the target by a prefix on each "
                             "source (Marian's >>xx<<), which a document's sentences cannot carry: send sentences")
        for name in DIRECT_ONLY:
            if given.get(name) is not None and len(route.hops) > 1:
                raise InputError(f"input {name!r}: the route {route} goes through a pivot, and a glossary's "
                                 "terms are of the pair asked, which no hop translates: send it where a bundle "
                                 "translates the pair (or send `keep`, which holds through both hops)")
        passed = {k: v for k, v in given.items() if v is not None and k not in NOT_PASSED and k != "model"}
        outputs: dict[str, np.ndarray] = {}
        for i, hop in enumerate(route.hops):
            last = i == len(route.hops) - 1
            outputs = self.hop(hop, texts, passed if last else {k: v for k, v in passed.items()
                                                                 if k not in LAST_HOP_ONLY})
            texts = np.asarray(outputs["translation"], dtype=object).reshape(-1, 1)
        return self.answer(route, texts, outputs)

    def hop(self, hop: Hop, texts: np.ndarray, passed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One bundle's outputs for `texts`, asked for the hop's pair as its tokenizer takes it."""
        asked, rows = hop.asked, texts.shape[0]
        sent = dict(passed)
        sent["text"] = np.array([[prefixed(asked.prefix, t)] for t in strings("text", texts)], dtype=object)
        for name, code in (("src_lang", asked.src_lang), ("tgt_lang", asked.tgt_lang)):
            if code is not None:
                sent[name] = np.array([[code.encode()]] * rows, dtype=object)
        with self.leased(hop.model) as engine:
            out = self.call(engine, sent)
        if "translation" not in out:
            raise HopFailed(f"{hop.model} answered no translation (a bundle without a tokenizer takes token ids: "
                            "ask it alone)", "request")
        return out

    @contextmanager
    def leased(self, name: str) -> Iterator[Any]:
        """Bundle `name` leased from the pool (Pool.lease) for a hop routed before now; Removed
        where a rescan took the bundle away since: before the lease, or failing its load on the
        way (a rescan replaces the catalog before anything leaves: rescan.Rescanner)."""
        if name not in self.catalog:
            raise self.removed(name)
        try:
            engine = self.pool.acquire(name)
        except LoadFailed as e:
            if name not in self.catalog:
                raise self.removed(name) from e
            raise
        try:
            yield engine
        finally:
            self.pool.release(name)

    def removed(self, name: str) -> Removed:
        served = ", ".join(e.name for e in self.catalog) or "none"
        return Removed(f"bundle {name!r} was removed by a rescan after this request was routed to it; send the "
                       f"request again: it is routed over the bundles served now ({served})")

    def answer(self, route: Route, texts: np.ndarray, last: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {"translation": texts, "route": np.array([[str(route).encode()]] * texts.shape[0], dtype=object)}
        out.update({k: last[k] for k in ("scores", "hypotheses", "hypothesis_scores", "confidence", "unmet")
                    if k in last})
        return out


class Preloading:
    """The bundles of --preload (the pool's pinned names), loaded in a thread started by the
    router's first request (`start`, at every request: once), when the server is ready. Not in
    the router's `initialize`: Triton 2.51 refuses a BLS load while it starts ("Server not
    ready"), and a thread of the stub calling Triton while `initialize` runs was seen to abort
    tritonserver (boost::interprocess::lock_exception). `xform serve` asks for the status as
    soon as Triton is ready, which starts it, and waits for it. `state`: loading, done or failed
    (`error` says why, in the server's flags' words: preloaded bundles that do not fit
    --memory-budget are refused by name)."""

    def __init__(self, pool: Pool, server_ready: Callable[[], bool], timeout: float = 600.0, poll: float = 0.25):
        self.pool, self.server_ready, self.timeout, self.poll = pool, server_ready, timeout, poll
        self.state = "loading" if pool.pinned else "done"
        self.error: str | None = None
        self.started = threading.Lock()

    def start(self) -> None:
        """Start loading, once (later calls return at once)."""
        if self.state == "loading" and self.started.acquire(blocking=False):
            threading.Thread(target=self.run, daemon=True, name="xform-preload").start()

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout
        while not self.server_ready():
            if time.monotonic() > deadline:
                self.state, self.error = "failed", f"the server was not ready {self.timeout:.0f} s after the start"
                return
            time.sleep(self.poll)
        try:
            self.pool.preload()
        except Exception as e:  # noqa: BLE001 - said in the status; xform serve stops the server
            self.error = said(e, preload="--preload", memory_budget="--memory-budget")
            self.state = "failed"
            return
        self.state = "done"

    def said(self) -> dict[str, Any]:
        return {"state": self.state, "error": self.error}


def prefixed(prefix: str, text: str) -> bytes:
    """A text as a hop sends it: a multi-target Marian's `>>tgt<< ` before it (not before a blank one)."""
    return (prefix + text if prefix and text.strip() else text).encode("utf-8")


def config_pbtxt(max_batch: int, threads: int) -> str:
    """The router model's config.pbtxt: not decoupled (answers through its response senders from
    `threads` threads, so `execute` never waits), no dynamic batching (each request routes alone)."""
    lines = [f'name: "{ROUTER}"', 'backend: "python"', f"max_batch_size: {max_batch}", "input ["]
    lines.append(",\n".join(t.pbtxt(optional=True) for t in inputs()))  # text: not with status
    lines += ["]", "output [", ",\n".join(t.pbtxt(optional=False) for t in OUTPUTS), "]",
              "instance_group [ { count: 1 kind: KIND_CPU } ]",
              'parameters { key: "role" value: { string_value: "router" } }',
              f'parameters {{ key: "threads" value: {{ string_value: "{threads}" }} }}']
    return "\n".join(lines) + "\n"
