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
  load, the largest cost seen (at most the budget) stands for it. A load that comes out larger than the estimate
  evicts more idle names after it.
- A lease that finds no room (every loaded name leased or pinned) waits for a release; past
  `load_timeout` seconds of waiting it raises Unavailable. A name whose own cost is over the
  budget is refused (LoadFailed).
- A failed load fails the leases waiting for it, with the loader's reason (LoadFailed), and
  nothing else; the next lease of that name tries again.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Protocol

from xform.errors import InputError, XformError

log = logging.getLogger(__name__)


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


@dataclass
class Attempt:
    """The load in progress: its name, and its error once it failed."""
    name: str
    error: BaseException | None = None


@dataclass(frozen=True)
class PoolStats:
    """A pool's state: `loaded` least recently used first, with each one's `costs` (bytes) and
    `leases` held; per name, the `loads`, `evictions` and `failures` so far; `loading`: the name
    being loaded."""
    loaded: list[str]
    costs: dict[str, int]
    leases: dict[str, int]
    loads: dict[str, int]
    evictions: dict[str, int]
    failures: dict[str, int]
    loading: str | None


class Pool:
    """Names loaded on demand within `max_loaded` names and `budget_bytes` (None: no bound);
    `pinned` names are never evicted (the module's rules)."""

    def __init__(self, loader: Loader, max_loaded: int | None = None, budget_bytes: int | None = None,
                 pinned: Iterable[str] = (), load_timeout: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
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
        self.loader, self.max_loaded, self.budget, self.load_timeout = loader, max_loaded, budget_bytes, load_timeout
        self.clock = clock
        self.cond = threading.Condition()
        self.slots: OrderedDict[str, Slot] = OrderedDict()  # least recently leased first
        self.costs: dict[str, int] = {}  # each name's cost at its last load
        self.loading: Attempt | None = None
        self.loads: Counter[str] = Counter()
        self.evictions: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()

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
            while True:
                slot = self.slots.get(name)
                if slot is not None:
                    slot.leases += 1
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
                    self.wait(deadline, name, self.why_full())
                    continue
                attempt = self.loading = Attempt(name)
                evicted = self.evict(victims)
                break
        return self.load(attempt, evicted)

    def release(self, name: str) -> None:
        with self.cond:
            self.slots[name].leases -= 1
            self.cond.notify_all()

    def preload(self) -> None:
        """Load the pinned names now (else at their first lease)."""
        for name in sorted(self.pinned):
            with self.lease(name):
                pass

    def stats(self) -> PoolStats:
        with self.cond:
            return PoolStats(list(self.slots), {n: s.cost for n, s in self.slots.items()},
                             {n: s.leases for n, s in self.slots.items()}, dict(self.loads), dict(self.evictions),
                             dict(self.failures), self.loading.name if self.loading else None)

    def close(self) -> None:
        """Unload every name with no lease held."""
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
        try:
            thing, cost = self.loader.load(name)
        except Exception as e:  # the loader's failure, whatever it is, is this name's alone
            with self.cond:
                attempt.error = e
                self.failures[name] += 1
                self.loading = None
                self.cond.notify_all()
            raise self.failed(name, e) from e
        with self.cond:
            self.slots[name] = Slot(thing, int(cost), leases=1)
            self.costs[name] = int(cost)
            self.loads[name] += 1
            trimmed = self.evict(self.room_for(None, partial=True) or [])  # larger than its estimate
            self.cond.notify_all()
        for victim, slot in trimmed:
            self.unload(victim, slot)
        with self.cond:
            self.loading = None
            self.cond.notify_all()
        return thing

    def room_for(self, name: str | None, partial: bool = False) -> list[str] | None:
        """The idle names to evict (least recently used first) so that `name` fits (None: so that
        what is loaded fits); when evicting every idle one would not do, None (`partial`: every
        idle one, the nearest it comes)."""
        if name is not None and self.budget is not None and self.costs.get(name, 0) > self.budget:
            raise LoadFailed(f"{name!r} took {self.costs[name]} bytes at its last load, more than the "
                             f"{{memory_budget}} {self.budget} bytes").naming("memory_budget")
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
        """`name`'s cost at its last load; before its first, the largest seen (at most the budget:
        a guess makes room, it never blocks a load that nothing else stands in the way of)."""
        if name in self.costs:
            return self.costs[name]
        largest = max(self.costs.values(), default=0)
        return largest if self.budget is None else min(largest, self.budget)

    def fits(self, victims: list[str], coming: int, expected: int) -> bool:
        kept = [s for n, s in self.slots.items() if n not in victims]
        if self.max_loaded is not None and len(kept) + coming > self.max_loaded:
            return False
        return self.budget is None or sum(s.cost for s in kept) + expected <= self.budget

    def evict(self, victims: list[str]) -> list[tuple[str, Slot]]:
        out = [(n, self.slots.pop(n)) for n in victims]
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
