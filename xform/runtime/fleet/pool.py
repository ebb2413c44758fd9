"""Which bundles stay loaded: a pool that loads a name at its first lease and evicts the least
recently used within a count and a memory budget. Pure Python and thread-safe; what a name
loads into (a Session in this process, a Triton model) is the loader's.

The rules:

- `with pool.lease(name) as thing:` loads `name` if it is not loaded, and holds it loaded
  until the block ends. Several threads leasing one name at once wait for one load.
- Loads are one at a time (a loader token), so two loads never overshoot the budget together.
- To make room, the least recently leased names with no lease held and not `pinned` are
  evicted (unloaded before the load starts) until `max_loaded` names and `budget_bytes` hold.
  A name's cost is what the loader measured at its load (`load` returns it); before its first
  load, the largest cost seen (at most what the budget leaves beside the pinned names) stands for
  it, and the log says so. A load that comes out larger than the estimate evicts more idle names
  after it (while leases hold the others, the budget can be passed until they end).
- A name whose measured cost is over what the budget leaves beside the pinned names is unloaded
  at once and refused, then and at every later lease (LoadFailed): it can never fit.
- `preload()` loads the pinned names (measured as they come, no estimate); pinned names that
  together do not fit the budget are refused by name (InputError), none of them kept.
- A lease that finds no room (every loaded name leased or pinned) waits for a release; past
  `load_timeout` seconds of waiting it raises Unavailable; so does a lease waiting for its own
  name's load in progress. Room is given in order: while a lease waits for room, the loaded
  names it would evict (least recently used first) take no new lease, so they drain and it
  loads, rather than busy names keeping a cold one out until its timeout.
- A failed load fails the leases waiting for it, with the loader's reason (LoadFailed), and
  nothing else; the next lease of that name tries again.
- With `idle_unload` seconds, a name no lease has held for that long (not pinned) is unloaded by
  a thread of the pool's (`reap`), so an idle pair gives its memory back without a newcomer
  needing the room; the next lease loads it again.
- `retire(names)` (bundles removed or changed on disk): each leaves the pool, unloaded at once if
  no lease holds it, else when its last lease ends; a lease asked meanwhile waits for that
  unload, then loads it anew. Its measured cost is forgotten; removed ones are unpinned.
  Unloads, like evictions, hold the loader token, so a name is never loaded while it unloads.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter, OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Protocol

from xform.errors import InputError, XformError

log = logging.getLogger(__name__)


UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


def parse_size(value: int | str | None) -> int | None:
    """A memory budget in bytes from an int or a size: `500MB` (10**6), `2GiB` (2**30), `1.5GB`,
    `1048576` (bytes); None stays None."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    m = SIZE.fullmatch(str(value))
    if not m or m.group(2).lower() not in UNITS:
        raise InputError(f"{{memory_budget}} {value!r}: a size such as 500MB, 2GiB or a number of bytes (units: B, "
                         "kB, MB, GB, TB; KiB, MiB, GiB, TiB)").naming("memory_budget")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


class Unavailable(XformError):
    """No room to load a name within the load timeout: try again later (a server's 503)."""


class LoadFailed(XformError):
    """A name's load failed, with the loader's reason; only its own leases fail (a server's 500)."""


class Loader(Protocol):
    """What a pool loads with: `load(name)` -> (the loaded thing, its cost in bytes, measured);
    `unload(name, thing)` frees it (the pool holds no reference after)."""

    def load(self, name: str) -> tuple[Any, int]: ...

    def unload(self, name: str, thing: Any) -> None: ...


@dataclass
class Slot:
    thing: Any
    cost: int
    leases: int = 0
    idle_since: float = 0.0  # when its last lease ended (the clock's time)


@dataclass
class Attempt:
    """The load in progress: its name, and its error once it failed."""
    name: str
    error: BaseException | None = None


@dataclass(frozen=True)
class PoolStats:
    """A pool's state: `loaded` least recently used first, with each one's `costs` (bytes) and
    `leases` held; per name, the `loads`, `evictions` and `failures` so far, the `requests`
    (leases) taken, the `load_seconds` in all and the `last_load_seconds`, and `measured`, its
    cost at its last load (loaded or not); `loading`: the name being loaded."""
    loaded: list[str]
    costs: dict[str, int]
    leases: dict[str, int]
    loads: dict[str, int]
    evictions: dict[str, int]
    failures: dict[str, int]
    loading: str | None
    requests: dict[str, int]
    load_seconds: dict[str, float]
    last_load_seconds: dict[str, float]
    measured: dict[str, int]
    idle_unloads: dict[str, int] = field(default_factory=dict)


class Pool:
    """Names loaded on demand within `max_loaded` names and `budget_bytes` (None: no bound);
    `pinned` names are never evicted; `idle_unload` seconds: a name unused that long is unloaded
    (None: kept until its room is needed) (the module's rules)."""

    def __init__(self, loader: Loader, max_loaded: int | None = None, budget_bytes: int | None = None,
                 pinned: Iterable[str] = (), load_timeout: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, idle_unload: float | None = None):
        self.pinned = frozenset(pinned)
        if max_loaded is not None and max_loaded < 1:
            raise InputError(f"{{max_loaded}} {max_loaded}: at least 1 (None: no bound)").naming("max_loaded")
        if budget_bytes is not None and budget_bytes < 1:
            raise InputError(f"{{memory_budget}} {budget_bytes}: at least 1 byte (None: no bound)"
                             ).naming("memory_budget")
        if max_loaded is not None and len(self.pinned) > max_loaded:
            raise InputError(f"{len(self.pinned)} pinned bundles but {{max_loaded}} {max_loaded}: pinned ones are "
                             "never evicted, so they must fit").naming("max_loaded")
        if load_timeout <= 0:
            raise InputError(f"{{load_timeout}} {load_timeout}: seconds, more than 0").naming("load_timeout")
        if idle_unload is not None and idle_unload <= 0:
            raise InputError(f"{{idle_unload}} {idle_unload}: seconds, more than 0 (None: never)").naming("idle_unload")
        self.loader, self.max_loaded, self.budget, self.load_timeout = loader, max_loaded, budget_bytes, load_timeout
        self.clock = clock
        self.cond = threading.Condition()
        self.slots: OrderedDict[str, Slot] = OrderedDict()  # least recently leased first
        self.costs: dict[str, int] = {}  # each name's cost at its last load
        self.loading: Attempt | None = None
        self.loads: Counter[str] = Counter()
        self.evictions: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.requests: Counter[str] = Counter()
        self.load_seconds: dict[str, float] = {}
        self.last_load_seconds: dict[str, float] = {}
        self.preloading = False
        self.idle_unload, self.idle_unloads = idle_unload, Counter[str]()
        self.retiring: set[str] = set()
        self.waiting: list[str] = []  # the leases waiting for room to load their names, first come first
        self.stopped = threading.Event()
        self.reaper: threading.Thread | None = None
        if idle_unload is not None:
            self.reaper = threading.Thread(target=self.reap_every, args=(max(0.05, min(idle_unload / 4, 5.0)),),
                                           name="xform-pool-reaper", daemon=True)
            self.reaper.start()

    @contextmanager
    def lease(self, name: str) -> Iterator[Any]:
        """`name`'s loaded thing, held loaded (never evicted) until the block ends."""
        thing = self.acquire(name)
        try:
            yield thing
        finally:
            self.release(name)

    def acquire(self, name: str) -> Any:
        """`name` leased (loaded first if need be): release it with `release`."""
        deadline = self.clock() + self.load_timeout
        with self.cond:
            queued = False
            try:
                while True:
                    slot = self.slots.get(name)
                    if slot is not None and name in self.retiring:
                        self.wait(deadline, name, f"{name!r} is being unloaded (retired)")
                        continue
                    if slot is not None and name in self.making_room():
                        self.wait(deadline, name, f"{name!r} is making room for {self.waiting[0]!r}")
                        continue
                    if slot is not None:
                        slot.leases += 1
                        self.requests[name] += 1
                        self.slots.move_to_end(name)
                        return slot.thing
                    if self.loading is not None:
                        attempt = self.loading
                        self.wait(deadline, name, f"{attempt.name!r} is loading")
                        if attempt.name == name and attempt.error is not None:
                            raise self.failed(name, attempt.error)
                        continue
                    victims = self.room_for(name)
                    if victims is None:
                        if not queued:
                            self.waiting.append(name)
                            queued = True
                        self.wait(deadline, name, self.why_full())
                        continue
                    attempt = self.loading = Attempt(name)
                    evicted = self.evict(victims)
                    break
            finally:
                if queued:
                    self.waiting.remove(name)
                    self.cond.notify_all()
        return self.load(attempt, evicted)

    def making_room(self) -> set[str]:
        """The loaded names the first lease waiting for room will evict (least recently used
        first, as if no lease held them): no new lease of them is granted until it has its room,
        so a busy bundle cannot keep a cold one out until its load timeout."""
        if not self.waiting or self.waiting[0] in self.slots:
            return set()
        first = self.waiting[0]
        candidates = [n for n in self.slots if n not in self.pinned and n != first]
        victims: list[str] = []
        while not self.fits(victims, 1, self.estimate(first)):
            if not candidates:
                return set()  # the pinned names fill the room: nothing to hold back
            victims.append(candidates.pop(0))
        return set(victims)

    def release(self, name: str) -> None:
        with self.cond:
            slot = self.slots[name]
            slot.leases -= 1
            if slot.leases == 0:
                slot.idle_since = self.clock()
                if name in self.retiring:
                    threading.Thread(target=self.drop, args=(name,), name=f"xform-retire-{name}", daemon=True).start()
            self.cond.notify_all()

    def retire(self, leaving: Iterable[str], unpin: bool = False) -> list[str]:
        """The names `leaving` leave the pool (the module's rules; `unpin`: no longer pinned, else a
        pinned one loads again at its next lease); those unloaded now (the others at their last
        release)."""
        gone = set(leaving)
        with self.cond:
            if unpin:
                self.pinned = self.pinned - gone
            for name in gone:
                self.costs.pop(name, None)
            loading = {self.loading.name} if self.loading is not None else set()
            self.retiring |= {n for n in gone if n in self.slots or n in loading}
            idle = sorted(n for n in self.retiring & gone if n in self.slots and self.slots[n].leases == 0)
        return [name for name in idle if self.drop(name)]

    def follow(self, changed: Iterable[str], removed: Iterable[str]) -> dict[str, XformError]:
        """The names changed and removed on disk (a rescan's) leave the pool (`retire`; removed
        ones unpinned), and the pinned among the changed are loaded again now; name -> the error
        of each that could not be (the others are in place either way)."""
        changed = list(changed)
        self.retire(changed)
        self.retire(removed, unpin=True)
        failed: dict[str, XformError] = {}
        for name in sorted(set(changed) & self.pinned):
            try:
                self.warm(name)
            except XformError as e:
                failed[name] = e
        return failed

    def drop(self, name: str) -> bool:
        """Unload retiring `name` if no lease holds it, holding the loader token; whether it did."""
        with self.cond:
            while self.loading is not None:
                self.cond.wait()
            slot = self.slots.get(name)
            if slot is None:  # evicted or reaped meanwhile
                self.retiring.discard(name)
            if name not in self.retiring or slot is None or slot.leases:
                return False
            del self.slots[name]
            self.loading = Attempt(name)
        try:
            self.unload(name, slot)
        finally:
            with self.cond:
                self.retiring.discard(name)
                self.loading = None
                self.cond.notify_all()
        return True

    def reap(self) -> list[str]:
        """Unload the names idle for `idle_unload` seconds or more (not pinned, no lease held, not
        loading); the names unloaded."""
        if self.idle_unload is None:
            return []
        with self.cond:
            now = self.clock()
            idle = [n for n, s in self.slots.items() if s.leases == 0 and n not in self.pinned
                    and now - s.idle_since >= self.idle_unload]
            gone = [(n, self.slots.pop(n)) for n in idle]
            self.retiring.difference_update(idle)
            self.idle_unloads.update(idle)
        for name, slot in gone:
            self.unload(name, slot)
        if gone:
            log.info("unloaded %s: idle %.0f s or more", ", ".join(idle), self.idle_unload)
        return idle

    def reap_every(self, interval: float) -> None:
        while not self.stopped.wait(interval):
            self.reap()

    def preload(self) -> None:
        """Load the pinned names now (else at their first lease), each measured as it comes; when
        they do not fit the budget together (or one alone), unload them and refuse them by name."""
        self.preloading = True
        try:
            for name in sorted(self.pinned):
                try:
                    self.warm(name)
                except LoadFailed as e:
                    self.close()
                    raise InputError(f"{{preload}} {name!r}: " + e.template).naming("preload", *e.settings) from e
                with self.cond:
                    held = {n: s.cost for n, s in self.slots.items() if n in self.pinned}
                if self.budget is not None and sum(held.values()) > self.budget:
                    self.close()
                    said = ", ".join(f"{n} {c} bytes" for n, c in sorted(held.items()))
                    raise InputError(f"{{preload}} {sorted(held)}: together {sum(held.values())} bytes ({said}), "
                                     f"more than the {{memory_budget}} {self.budget} bytes; preloaded bundles are "
                                     "never unloaded, so they must fit").naming("preload", "memory_budget")
        finally:
            self.preloading = False

    def warm(self, name: str) -> None:
        """Load `name` now if it is not loaded (counted as a load, not a request)."""
        with self.lease(name):
            with self.cond:
                self.requests[name] -= 1

    def stats(self) -> PoolStats:
        with self.cond:
            return PoolStats(list(self.slots), {n: s.cost for n, s in self.slots.items()},
                             {n: s.leases for n, s in self.slots.items()}, dict(self.loads), dict(self.evictions),
                             dict(self.failures), self.loading.name if self.loading else None,
                             dict(self.requests), dict(self.load_seconds), dict(self.last_load_seconds),
                             dict(self.costs), dict(self.idle_unloads))

    def close(self) -> None:
        """Stop the idle reaper; unload every name with no lease held."""
        self.stopped.set()
        if self.reaper is not None and self.reaper is not threading.current_thread():
            self.reaper.join(10)
        with self.cond:
            idle = [(n, self.slots.pop(n)) for n, s in list(self.slots.items()) if s.leases == 0]
        for name, slot in idle:
            self.unload(name, slot)

    # -- inside --------------------------------------------------------------------------------
    def load(self, attempt: Attempt, evicted: list[tuple[str, Slot]]) -> Any:
        """Holding the loader token: unload `evicted`, load the attempt's name, leased once."""
        name = attempt.name
        for victim, slot in evicted:
            self.unload(victim, slot)
        if name not in self.costs and self.budget is not None and not (self.preloading and name in self.pinned):
            log.info("%s: no cost measured yet; estimated at %d bytes (the largest measured) to make room",
                     name, self.estimate(name))
        t0 = self.clock()
        try:
            thing, cost = self.loader.load(name)
            self.refuse_over_budget(name, thing, int(cost))
        except Exception as e:  # the loader's failure, whatever it is, is this name's alone
            with self.cond:
                attempt.error = e
                self.retiring.discard(name)
                self.failures[name] += 1
                self.loading = None
                self.cond.notify_all()
            raise self.failed(name, e) from e
        with self.cond:
            self.slots[name] = Slot(thing, int(cost), leases=1)
            self.requests[name] += 1
            self.loads[name] += 1
            self.last_load_seconds[name] = self.clock() - t0
            self.load_seconds[name] = self.load_seconds.get(name, 0.0) + self.last_load_seconds[name]
            trimmed = self.evict(self.room_for(None, partial=True) or [])  # larger than its estimate
            self.cond.notify_all()
        for victim, slot in trimmed:
            self.unload(victim, slot)
        with self.cond:
            self.loading = None
            self.cond.notify_all()
        return thing

    def refuse_over_budget(self, name: str, thing: Any, cost: int) -> None:
        """Having just loaded `name` at `cost`: record the cost; when it can never fit (over what
        the budget leaves beside the pinned names), unload it and raise LoadFailed."""
        with self.cond:
            self.costs[name] = cost
            refused = self.budget is not None and cost > self.room(name)
        if refused:
            self.unload(name, Slot(thing, cost))
            raise self.over_budget(name)

    def room(self, name: str) -> int:
        """What the budget leaves to `name` beside the pinned names loaded (the whole budget for a
        pinned one: preload checks them together)."""
        assert self.budget is not None
        if name in self.pinned:
            return self.budget
        return self.budget - sum(s.cost for n, s in self.slots.items() if n in self.pinned)

    def over_budget(self, name: str) -> LoadFailed:
        assert self.budget is not None
        beside = self.budget - self.room(name)
        where = f" leaves beside the preloaded bundles ({beside} bytes)" if beside else ""
        return LoadFailed(f"{name!r} took {self.costs[name]} bytes at its load, more than the {{memory_budget}} "
                          f"{self.budget} bytes{where}: it cannot be loaded within it").naming("memory_budget")

    def room_for(self, name: str | None, partial: bool = False) -> list[str] | None:
        """The idle names to evict (least recently used first) so that `name` fits (None: so that
        what is loaded fits); when evicting every idle one would not do, None (`partial`: every
        idle one, the nearest it comes)."""
        if name is not None and self.budget is not None and self.costs.get(name, 0) > self.room(name):
            raise self.over_budget(name)
        coming = 0 if name is None else 1
        expected = 0 if name is None else self.estimate(name)
        idle = [n for n, s in self.slots.items() if s.leases == 0 and n not in self.pinned and n != name]
        victims: list[str] = []
        while not self.fits(victims, coming, expected):
            if not idle:
                return victims if partial else None
            victims.append(idle.pop(0))
        return victims

    def estimate(self, name: str) -> int:
        """`name`'s cost at its last load; before its first, the largest seen (at most what the
        budget leaves beside the pinned names: a guess makes room, it never blocks a load that
        nothing else stands in the way of); a pinned name while preloading, nothing (measured as
        it comes, preload checks them together)."""
        if name in self.costs:
            return self.costs[name]
        if self.preloading and name in self.pinned:
            return 0
        largest = max(self.costs.values(), default=0)
        return largest if self.budget is None else max(min(largest, self.room(name)), 0)

    def fits(self, victims: list[str], coming: int, expected: int) -> bool:
        kept = [s for n, s in self.slots.items() if n not in victims]
        if self.max_loaded is not None and len(kept) + coming > self.max_loaded:
            return False
        return self.budget is None or sum(s.cost for s in kept) + expected <= self.budget

    def evict(self, victims: list[str]) -> list[tuple[str, Slot]]:
        out = [(n, self.slots.pop(n)) for n in victims]
        self.retiring.difference_update(victims)
        self.evictions.update(victims)
        return out

    def unload(self, name: str, slot: Slot) -> None:
        try:
            self.loader.unload(name, slot.thing)
        except Exception:  # it is out of the pool either way; the loader's failure is logged
            log.exception("unloading %s failed", name)

    def wait(self, deadline: float, name: str, why: str) -> None:
        left = deadline - self.clock()
        if left <= 0:
            raise Unavailable(f"{name!r}: no room to load it within {{load_timeout}} {self.load_timeout} s "
                              f"({why}); try again later").naming("load_timeout")
        self.cond.wait(left)

    def why_full(self) -> str:
        held = [n for n, s in self.slots.items() if s.leases or n in self.pinned]
        bounds = [f"max_loaded {self.max_loaded}"] if self.max_loaded is not None else []
        bounds += [f"memory_budget {self.budget} bytes"] if self.budget is not None else []
        return f"{', '.join(held)} in use or pinned, within {' and '.join(bounds)}"

    def failed(self, name: str, error: BaseException) -> LoadFailed:
        if isinstance(error, LoadFailed):
            return error
        return LoadFailed(f"{name!r} failed to load: {error}")
