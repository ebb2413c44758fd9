"""The many-bundle server's state: what the router model `translate` answers to a request with
`status` true (`state`, built in the router's process from its pool), and `xform serve --status
URL`'s reading of it (`fetch`, `table`). Sizes are bytes: the Pss of a bundle's engine stubs,
now (`bytes`) and as measured at its last load (`bytes_at_load`, what the budget counts)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Callable

from xform.errors import XformError
from xform.runtime.fleet.catalog import Catalog, Changes
from xform.runtime.fleet.pool import Pool


def state(catalog: Catalog, pool: Pool, settings: Any, resident: Callable[[str], int] | None = None) -> dict:
    """The router's settings and each bundle's: loaded or not, its memory, in-flight requests,
    requests, loads, mean and last load seconds, evictions, failures."""
    s = pool.stats()
    bundles = []
    for entry in catalog:
        name = entry.name
        loads = s.loads.get(name, 0)
        loaded = name in s.costs
        bundles.append({
            "name": name, "languages": entry.describe().split(": ", 1)[1], "loaded": loaded,
            "preloaded": name in settings.preload, "loading": s.loading == name,
            "bytes": (resident(name) if resident else s.costs[name]) if loaded else None,
            "bytes_at_load": s.measured.get(name), "in_flight": s.leases.get(name, 0),
            "requests": s.requests.get(name, 0), "loads": loads, "evictions": s.evictions.get(name, 0),
            "failures": s.failures.get(name, 0), "idle_unloads": s.idle_unloads.get(name, 0),
            "mean_load_seconds": s.load_seconds[name] / loads if loads else None,
            "last_load_seconds": s.last_load_seconds.get(name)})
    return {"settings": {"max_loaded": settings.max_loaded, "memory_budget": settings.memory_budget,
                         "preload": list(settings.preload), "load_timeout": settings.load_timeout,
                         "pivot": settings.pivot, "idle_unload": settings.idle_unload},
            "loaded": s.loaded, "loading": s.loading, "resident_bytes": sum(s.costs.values()), "bundles": bundles}


def fetch(url: str, model: str = "translate", timeout: float = 10.0) -> dict:
    """The state a server at `url` (http://host:port, or host:port) answers to a status request."""
    return ask(url, "status", "--status", model, timeout)


def rescan(url: str, model: str = "translate", timeout: float = 600.0) -> dict:
    """What a server at `url` found when asked to rescan its bundles (serving/rescan.py)."""
    return ask(url, "rescan", "--rescan", model, timeout)


def ask(url: str, control: str, flag: str, model: str = "translate", timeout: float = 10.0) -> dict:
    """The JSON the router answers (in its output `status`) to a request with `control` true."""
    base = (url if "://" in url else "http://" + url).rstrip("/")
    body = {"inputs": [{"name": control, "shape": [1, 1], "datatype": "BOOL", "data": [True]}]}
    request = urllib.request.Request(f"{base}/v2/models/{model}/infer", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            answer = json.loads(r.read())
    except urllib.error.HTTPError as e:
        said = (e.read() or b"").decode(errors="replace")[:300]
        raise XformError(f"{flag} {url}: {base} answered HTTP {e.code} ({said}); expected the model {model!r} "
                         "of `xform serve` over many bundles") from e
    except (urllib.error.URLError, OSError) as e:
        raise XformError(f"{flag} {url}: no server answers at {base} ({getattr(e, 'reason', e)})") from e
    out = {o["name"]: o["data"] for o in answer.get("outputs", [])}
    if "status" not in out:
        raise XformError(f"{flag} {url}: the model {model!r} answered no status (outputs {sorted(out)}): "
                         f"an xform older than {flag}, or another model")
    return json.loads(out["status"][0])


def rescanned(data: dict) -> str:
    """A rescan's answer in a line: what changed, and what the server now holds."""
    said = Changes(data["added"], data["removed"], data["changed"], data["refused"]).said()
    said += "".join(f"; {n} not loaded again ({why})" for n, why in data.get("reload_failed", {}).items())
    return f"{said}; {len(data['bundles'])} bundles: {', '.join(data['bundles'])}"


def size(n: int | None) -> str:
    return "-" if n is None else f"{n / (1 << 20):.1f} MiB"


def seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def table(data: dict) -> list[str]:
    """`xform serve --status`'s lines: a summary, then a row a bundle (loaded ones first, least
    recently used first)."""
    st, bundles = data["settings"], data["bundles"]
    bounds = [f"at most {st['max_loaded']} loaded"] if st["max_loaded"] else []
    bounds += [f"memory budget {size(st['memory_budget'])}"] if st["memory_budget"] else []
    head = [f"{len(data['loaded'])} of {len(bundles)} bundles loaded, {size(data['resident_bytes'])} measured at "
            f"load ({', '.join(bounds) or 'no bound'}; preloaded: {', '.join(st['preload']) or 'none'}; loading: "
            f"{data['loading'] or 'none'})"]
    columns = ["bundle", "state", "memory", "at load", "in flight", "requests", "loads", "mean load", "last load",
               "evictions", "failures"]
    order = {n: i for i, n in enumerate(data["loaded"])}
    rows = []
    for b in sorted(bundles, key=lambda b: (order.get(b["name"], len(order)), b["name"])):
        state_ = "loading" if b["loading"] else ("preloaded" if b["preloaded"] and b["loaded"] else
                                                 "loaded" if b["loaded"] else "unloaded")
        rows.append([b["name"], state_, size(b["bytes"]), size(b["bytes_at_load"]), str(b["in_flight"]),
                     str(b["requests"]), str(b["loads"]), seconds(b["mean_load_seconds"]),
                     seconds(b["last_load_seconds"]), str(b["evictions"]), str(b["failures"])])
    widths = [max(len(r[i]) for r in [columns, *rows]) for i in range(len(columns))]
    return head + ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [columns, *rows]]
