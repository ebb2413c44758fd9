"""The pool of loaded bundles (runtime/fleet/pool.py) with a loader made of Events: LRU order,
max_loaded, a memory budget, pinned names, a leased name never evicted, a waiter timing out, one
load for many concurrent first leases, a failed load failing that name's leases only and retried.
No sleeps: threads meet at Events and the pool's own Condition."""
import threading

import pytest

from xform.errors import InputError
from xform.runtime.fleet.pool import LoadFailed, Pool, Unavailable


class Loader:
    """Loads `name` as ("loaded", name) at `costs[name]` bytes; `gates[name]`, when set, is an
    Event a load waits for (and `started[name]` is set when it begins); `fail` names refuse."""

    def __init__(self, costs=None, fail=()):
        self.costs, self.fail = costs or {}, set(fail)
        self.gates, self.started = {}, {}
        self.log = []  # ("load" | "unload", name), in order
        self.lock = threading.Lock()

    def load(self, name):
        with self.lock:
            self.log.append(("load", name))
        if name in self.started:
            self.started[name].set()
        if name in self.gates:
            assert self.gates[name].wait(10)
        if name in self.fail:
            raise OSError(f"{name}: corrupt graph")
        return ("loaded", name), self.costs.get(name, 1)

    def unload(self, name, thing):
        assert thing == ("loaded", name)
        with self.lock:
            self.log.append(("unload", name))

    def gate(self, name):
        self.gates[name], self.started[name] = threading.Event(), threading.Event()
        return self.gates[name], self.started[name]


def use(pool, *names):
    for name in names:
        with pool.lease(name) as thing:
            assert thing == ("loaded", name)


def test_least_recently_used_is_evicted_within_max_loaded():
    loader = Loader()
    pool = Pool(loader, max_loaded=2)
    use(pool, "a", "b", "a", "c")  # a was used after b: b goes
    s = pool.stats()
    assert s.loaded == ["a", "c"] and s.evictions == {"b": 1} and s.loads == {"a": 1, "b": 1, "c": 1}
    use(pool, "b")  # a is now the least recent
    assert pool.stats().loaded == ["c", "b"]
    assert loader.log == [("load", "a"), ("load", "b"), ("unload", "b"), ("load", "c"), ("unload", "a"),
                          ("load", "b")]


def test_unbounded_pool_keeps_everything():
    pool = Pool(Loader())
    use(pool, "a", "b", "c", "a")
    assert pool.stats().loaded == ["b", "c", "a"] and pool.stats().evictions == {}


def test_budget_evicts_by_measured_cost():
    pool = Pool(Loader(costs={"a": 70, "b": 30, "c": 50, "d": 10}), budget_bytes=100)
    use(pool, "a", "b")  # b unknown, estimated at the largest seen (70): a goes before b loads
    assert pool.stats().loaded == ["b"] and pool.stats().evictions == {"a": 1}
    use(pool, "c", "b")  # 30 + 70 fits; c measures 50
    use(pool, "d")  # 80 + 70 does not: c (least recent) goes, not b
    s = pool.stats()
    assert s.loaded == ["b", "d"] and s.costs == {"b": 30, "d": 10} and s.evictions == {"a": 1, "c": 1}
    use(pool, "c")  # its own cost now (50): 40 + 50 fits, nothing goes (70 would have evicted b)
    s = pool.stats()
    assert s.loaded == ["b", "d", "c"] and s.evictions == {"a": 1, "c": 1} and sum(s.costs.values()) <= 100


def test_a_load_larger_than_its_estimate_trims_idle_ones_after_it():
    pool = Pool(Loader(costs={"a": 40, "b": 40, "c": 90}), budget_bytes=100)
    use(pool, "a", "b")  # c is estimated at 40: a goes before; measured 90: b goes after
    use(pool, "c")
    s = pool.stats()
    assert s.loaded == ["c"] and s.evictions == {"a": 1, "b": 1}


def test_the_trim_after_a_load_evicts_what_idle_ones_it_can():
    pool = Pool(Loader(costs={"a": 10, "held": 40, "idle": 5, "new": 95}), budget_bytes=100)
    use(pool, "a")
    pool.acquire("held")
    use(pool, "idle")  # 55, each within its estimate
    use(pool, "new")  # estimated 40 (fits), measured 95: a and idle go, though held keeps it over
    assert pool.stats().loaded == ["held", "new"] and pool.stats().evictions == {"a": 1, "idle": 1}


def test_a_name_over_the_budget_on_its_own_is_refused():
    pool = Pool(Loader(costs={"big": 500, "a": 10}), budget_bytes=100)
    use(pool, "big")  # its cost is unknown before its first load
    use(pool, "a")  # estimated at most the budget: big goes, a loads
    assert pool.stats().loaded == ["a"]
    with pytest.raises(LoadFailed, match="500 bytes at its last load, more than the memory_budget 100"):
        use(pool, "big")


def test_pinned_names_are_never_evicted():
    pool = Pool(Loader(), max_loaded=2, pinned=["p"])
    pool.preload()
    use(pool, "a", "b", "c")
    s = pool.stats()
    assert "p" in s.loaded and s.evictions == {"a": 1, "b": 1} and "p" not in s.evictions


def test_settings_are_checked():
    with pytest.raises(InputError, match="2 pinned bundles but max_loaded 1"):
        Pool(Loader(), max_loaded=1, pinned=["a", "b"])
    with pytest.raises(InputError, match="max_loaded 0"):
        Pool(Loader(), max_loaded=0)
    with pytest.raises(InputError, match="memory_budget 0"):
        Pool(Loader(), budget_bytes=0)
    with pytest.raises(InputError, match="load_timeout 0"):
        Pool(Loader(), load_timeout=0)


def test_a_leased_name_is_never_evicted_and_a_waiter_times_out():
    loader = Loader()
    pool = Pool(loader, max_loaded=1, load_timeout=0.05)
    with pool.lease("a"):
        with pytest.raises(Unavailable, match=r"'b': no room to load it within load_timeout 0.05 s \(a in use"):
            use(pool, "b")
        assert pool.stats().loaded == ["a"]
    use(pool, "b")  # released: now a goes
    assert pool.stats().loaded == ["b"] and loader.log[-2:] == [("unload", "a"), ("load", "b")]


def waits(pool, threads=1):
    """An Event set once `threads` threads' leases of `pool` wait (inside the pool's Condition)."""
    event, real, waiting = threading.Event(), pool.wait, set()

    def wait(*args):
        waiting.add(threading.get_ident())
        if len(waiting) >= threads:
            event.set()
        real(*args)
    pool.wait = wait
    return event


def test_a_waiter_gets_the_room_a_release_makes():
    pool = Pool(Loader(), max_loaded=1)
    waiting, got = waits(pool), []
    pool.acquire("a")

    def lease_b():
        with pool.lease("b") as thing:
            got.append(thing)

    t = threading.Thread(target=lease_b)
    t.start()
    assert waiting.wait(10)
    with pool.cond:  # taken once the waiter let go of it in Condition.wait
        assert pool.stats().loaded == ["a"] and got == []
    pool.release("a")
    t.join(10)
    assert got == [("loaded", "b")] and pool.stats().loaded == ["b"]


def test_one_load_for_many_concurrent_first_leases():
    loader = Loader()
    gate, started = loader.gate("a")
    pool = Pool(loader, max_loaded=1)
    got = []

    def lease():
        with pool.lease("a") as thing:
            got.append(thing)

    waiting = waits(pool, threads=7)
    threads = [threading.Thread(target=lease) for _ in range(8)]
    for t in threads:
        t.start()
    assert started.wait(10) and waiting.wait(10)  # one loads, seven wait for its load
    assert pool.stats().loading == "a"
    gate.set()
    for t in threads:
        t.join(10)
    assert got == [("loaded", "a")] * 8 and loader.log == [("load", "a")] and pool.stats().loads == {"a": 1}
    assert pool.stats().leases == {"a": 0}


def test_loads_are_one_at_a_time():
    """A second name's load waits for the first's: two loads never overshoot the budget together."""
    loader = Loader()
    gate, started = loader.gate("a")
    pool = Pool(loader)
    t = threading.Thread(target=use, args=(pool, "a"))
    t.start()
    assert started.wait(10)
    waiting = waits(pool)
    other = threading.Thread(target=use, args=(pool, "b"))
    other.start()
    assert waiting.wait(10)
    assert loader.log == [("load", "a")]  # b waits for a's load to end
    gate.set()
    t.join(10)
    other.join(10)
    assert loader.log == [("load", "a"), ("load", "b")]


def test_a_failed_load_fails_only_its_leases_and_is_retried():
    loader = Loader(fail={"bad"})
    gate, started = loader.gate("bad")
    pool = Pool(loader, max_loaded=2)
    errors, waiting = [], waits(pool, threads=2)

    def lease_bad():
        try:
            use(pool, "bad")
        except LoadFailed as e:
            errors.append(str(e))

    threads = [threading.Thread(target=lease_bad) for _ in range(3)]
    for t in threads:
        t.start()
    assert started.wait(10) and waiting.wait(10)  # one loads, two wait for its load
    gate.set()
    for t in threads:
        t.join(10)
    assert errors == ["'bad' failed to load: bad: corrupt graph"] * 3
    assert loader.log == [("load", "bad")] and pool.stats().failures == {"bad": 1}
    use(pool, "good")  # the others serve
    assert pool.stats().loaded == ["good"]
    loader.fail.clear()
    use(pool, "bad")  # a later lease tries again
    assert loader.log.count(("load", "bad")) == 2 and pool.stats().loaded == ["good", "bad"]
