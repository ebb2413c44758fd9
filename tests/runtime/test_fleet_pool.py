"""The pool of loaded bundles (runtime/fleet/pool.py) with a loader made of Events: LRU order,
max_loaded, a memory budget, pinned names, a leased name never evicted, a waiter timing out, one
load for many concurrent first leases, a failed load failing that name's leases only and retried.
No sleeps: threads meet at Events and the pool's own Condition."""
import threading
import time

import pytest

from xform.errors import InputError
from xform.runtime.fleet.pool import LoadFailed, Pool, Unavailable, parse_size


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


def test_a_name_over_the_budget_on_its_own_is_refused_at_its_first_load():
    loader = Loader(costs={"big": 500, "a": 10})
    pool = Pool(loader, budget_bytes=100)
    use(pool, "a")
    with pytest.raises(LoadFailed, match="'big' took 500 bytes at its load, more than the memory_budget 100 bytes: "
                                         "it cannot be loaded within it"):
        use(pool, "big")  # its cost is unknown before its first load: loaded, measured, unloaded
    assert loader.log == [("load", "a"), ("load", "big"), ("unload", "big")]  # estimated 10: a stayed
    assert pool.stats().loaded == ["a"] and pool.stats().failures == {"big": 1}
    with pytest.raises(LoadFailed, match="'big' took 500 bytes"):
        use(pool, "big")  # known now: refused without a load
    assert loader.log.count(("load", "big")) == 1
    use(pool, "a")  # the others serve


def test_an_unmeasured_name_is_estimated_and_the_log_says_so(caplog):
    pool = Pool(Loader(costs={"a": 60, "b": 30, "c": 30}), budget_bytes=100)
    with caplog.at_level("INFO", logger="xform.runtime.fleet.pool"):
        use(pool, "a", "b")
    assert "b: no cost measured yet; estimated at 60 bytes (the largest measured)" in caplog.text
    assert pool.stats().loaded == ["b"] and pool.stats().evictions == {"a": 1}  # 60 + 60 > 100: a made room
    use(pool, "c")  # estimated 60 beside b's 30: fits
    assert pool.stats().loaded == ["b", "c"]


def test_preloaded_names_count_against_the_budget_and_are_refused_by_name_when_they_do_not_fit():
    loader = Loader(costs={"p": 50, "q": 40, "a": 5, "b": 5, "big": 55})
    pool = Pool(loader, budget_bytes=100, pinned=["p", "q"])
    pool.preload()
    assert pool.stats().loaded == ["p", "q"]
    use(pool, "a", "b")  # 10 bytes left beside p and q: b, estimated at 10, evicts a
    assert pool.stats().loaded == ["p", "q", "b"] and pool.stats().evictions == {"a": 1}
    with pytest.raises(LoadFailed, match=r"'big' took 55 bytes .* leaves beside the preloaded bundles \(90 bytes\)"):
        use(pool, "big")
    assert "p" in pool.stats().loaded and "q" in pool.stats().loaded
    loader = Loader(costs={"p": 70, "q": 40})
    pool = Pool(loader, budget_bytes=100, pinned=["p", "q"])
    with pytest.raises(InputError, match=r"preload \['p', 'q'\]: together 110 bytes \(p 70 bytes, q 40 bytes\), "
                                         "more than the memory_budget 100 bytes"):
        pool.preload()
    assert pool.stats().loaded == [] and loader.log[-2:] == [("unload", "p"), ("unload", "q")]
    with pytest.raises(InputError, match="preload 'p': 'p' took 70 bytes at its load, more than the memory_budget 50"):
        Pool(Loader(costs={"p": 70}), budget_bytes=50, pinned=["p"]).preload()


def test_the_stats_count_requests_and_time_loads():
    ticks = iter(range(100))
    pool = Pool(Loader(), max_loaded=1, clock=lambda: float(next(ticks)))
    use(pool, "a", "a", "b", "a")
    s = pool.stats()
    assert s.requests == {"a": 3, "b": 1} and s.loads == {"a": 2, "b": 1}
    assert s.last_load_seconds == {"a": 1.0, "b": 1.0} and s.load_seconds == {"a": 2.0, "b": 1.0}
    assert s.measured == {"a": 1, "b": 1} and s.costs == {"a": 1}


def test_a_lease_waiting_for_its_names_load_times_out_unavailable():
    loader = Loader()
    gate, started = loader.gate("a")
    pool = Pool(loader, load_timeout=0.05)
    t = threading.Thread(target=use, args=(pool, "a"))
    t.start()
    assert started.wait(10)
    with pytest.raises(Unavailable, match=r"'a': no room to load it within load_timeout 0.05 s \('a' is loading\)"):
        use(pool, "a")
    gate.set()
    t.join(10)
    assert pool.stats().loaded == ["a"] and pool.stats().loads == {"a": 1}


def test_sizes():
    assert [parse_size(v) for v in ("500MB", "2GiB", "1.5 GB", "1048576", "64kib", None, 7)] == [
        500_000_000, 2 << 30, 1_500_000_000, 1 << 20, 64 << 10, None, 7]
    for bad in ("2 parsecs", "GiB", "-1GB", ""):
        with pytest.raises(InputError, match=r"memory_budget .*: a size such as 500MB, 2GiB or a number of bytes"):
            parse_size(bad)


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


def test_while_preloading_only_the_pinned_names_go_unestimated():
    """A preloaded name is measured as it comes (preload checks them together); a lease of another
    name that loads between two preloads is estimated as always."""
    pool = Pool(Loader(costs={"x": 40}), budget_bytes=100, pinned=["p", "q"])
    use(pool, "x")
    pool.preloading = True
    assert pool.estimate("q") == 0 and pool.estimate("a") == 40
    pool.preloading = False
    assert pool.estimate("q") == 40


def test_names_idle_for_idle_unload_seconds_are_unloaded():
    """reap() unloads what no lease has held for idle_unload seconds by the pool's clock: not a
    name still leased, not one released since, not a pinned one; the next lease loads it again."""
    now = [0.0]
    loader = Loader()
    pool = Pool(loader, pinned=["p"], clock=lambda: now[0], idle_unload=10)
    try:
        use(pool, "p", "a", "b")
        now[0] = 5.0
        use(pool, "b")  # b's idle time starts again
        with pool.lease("c"):
            now[0] = 10.0
            assert pool.reap() == ["a"]  # a idle 10 s; b 5 s; c leased; p pinned
            now[0] = 30.0
            assert pool.reap() == ["b"]
        assert pool.stats().loaded == ["p", "c"] and pool.stats().idle_unloads == {"a": 1, "b": 1}
        use(pool, "a")
        assert loader.log[-3:] == [("unload", "a"), ("unload", "b"), ("load", "a")]
        assert pool.stats().evictions == {}  # idle unloads are not evictions
    finally:
        pool.close()


def test_the_pools_thread_unloads_idle_names_and_stops_with_it():
    loader = Loader()
    pool = Pool(loader, idle_unload=0.2)
    use(pool, "a")
    deadline = time.monotonic() + 10
    while pool.stats().loaded and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.stats().loaded == [] and loader.log == [("load", "a"), ("unload", "a")]
    pool.close()
    assert pool.reaper is not None and not pool.reaper.is_alive()
    with pytest.raises(InputError, match="idle_unload 0: seconds, more than 0"):
        Pool(loader, idle_unload=0)


def test_retire_unloads_an_idle_name_at_once_and_a_leased_one_at_its_last_release():
    loader = Loader()
    pool = Pool(loader, max_loaded=3, pinned=["p"])
    pool.preload()
    use(pool, "a", "b")
    pool.acquire("b")
    assert pool.retire(["a", "b", "p", "never"], unpin=True) == ["a", "p"]  # b is leased: later
    s = pool.stats()
    assert s.loaded == ["b"] and "p" not in pool.pinned and "a" not in s.measured
    assert ("unload", "b") not in loader.log
    got = []
    waiter = threading.Thread(target=lambda: got.append(use(pool, "b")))
    waiter.start()  # waits for b's unload, then loads it anew
    time.sleep(0.05)
    assert loader.log.count(("load", "b")) == 1 and not got
    pool.release("b")
    waiter.join(10)
    assert not waiter.is_alive() and got == [None]
    assert loader.log[-2:] == [("unload", "b"), ("load", "b")] and pool.stats().loaded == ["b"]
    assert pool.retiring == set()


def test_a_retired_name_evicted_before_its_unload_loads_fresh_and_is_not_held_back():
    pool = Pool(Loader(), max_loaded=1)
    use(pool, "a")
    held = pool.acquire("a")
    pool.retire(["a"])
    pool.release("a")  # its unload runs in a thread; wait for it
    deadline = time.monotonic() + 10
    while pool.stats().loaded and time.monotonic() < deadline:
        time.sleep(0.01)
    use(pool, "b", "a")  # a evicts b, and a's new load is a plain one
    assert pool.stats().loaded == ["a"] and pool.retiring == set() and held == ("loaded", "a")


def wait_for(predicate, seconds=10):
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert predicate()


def test_a_busy_name_takes_no_new_lease_while_a_cold_one_waits_for_its_room():
    """max_loaded 1, a held: b waits for room; a new lease of a (which b would evict) waits too,
    so a drains and b loads, then a loads again: first come, first served (without the order, a
    steady stream of a's requests kept b out until its load timeout)."""
    loader = Loader()
    pool = Pool(loader, max_loaded=1, load_timeout=10)
    pool.acquire("a")
    got = []
    cold = threading.Thread(target=lambda: (got.append(pool.acquire("b")), pool.release("b")))
    cold.start()
    wait_for(lambda: pool.waiting == ["b"])
    busy = threading.Thread(target=lambda: (got.append(pool.acquire("a")), pool.release("a")))
    busy.start()
    time.sleep(0.1)
    assert got == [] and pool.stats().leases == {"a": 1}  # a's new lease waits
    pool.release("a")
    cold.join(10), busy.join(10)
    assert got == [("loaded", "b"), ("loaded", "a")] and pool.waiting == []
    assert loader.log == [("load", "a"), ("unload", "a"), ("load", "b"), ("unload", "b"), ("load", "a")]


def test_a_waiter_that_times_out_holds_nothing_back():
    ticks = [0.0]
    pool = Pool(Loader(), max_loaded=1, load_timeout=5, clock=lambda: ticks[0])
    pool.acquire("a")
    failed = []

    def cold():
        try:
            pool.acquire("b")
        except Unavailable as e:
            failed.append(str(e))
    waiter = threading.Thread(target=cold)
    waiter.start()
    wait_for(lambda: pool.waiting == ["b"])
    ticks[0] = 6.0  # past b's deadline
    with pool.cond:
        pool.cond.notify_all()
    waiter.join(10)
    assert failed and "no room to load it within load_timeout 5" in failed[0] and pool.waiting == []
    assert pool.acquire("a") == ("loaded", "a")  # granted at once again
