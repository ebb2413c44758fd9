"""The many-bundle server's bundles read again while it serves: a request to `translate` with
`rescan` true (`xform serve --rescan URL`, or SIGUSR1 to `xform serve`) makes the router read its
bundles' source again (a directory: bundles appear and go; a list of paths: they change), as
catalog.json's `origin` says, and serve what it finds without a restart.

- An added bundle gets its Triton models written into the repository beside the others (as at
  the start: repository.write_model, referenced) and is routed to at once, loaded at its first
  request as any other.
- A removed one is routed to no more; it is unloaded now if no request holds it, else when its
  last one ends (pool.Pool.retire); its models leave the repository then, or at the next rescan
  if a request still held it. A
  --preload bundle removed is no longer preloaded.
- A changed one (its manifest, which holds every file's hash, is not the one read before: a
  re-export) has its models written again and is unloaded the same way, so its next request
  loads the new files; a --preload one is loaded again at once.
- A bundle that cannot be read, or whose name cannot be served beside the others, is refused with
  its reason and the rest goes on: a new one is not added, a known one stays as it was (its own
  requests say what is wrong with it, 500, as before the rescan).

The answer (JSON in the output `status`): added, removed, changed, refused (name -> why),
reload_failed (a changed --preload bundle that could not be loaded again: name -> why), and the
bundles served now. Rescans are one at a time; catalog.json is rewritten so that a router
reloaded by Triton serves what the last rescan found.
"""
from __future__ import annotations

import json
import shutil
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from xform.errors import XformError
from xform.runtime.fleet.catalog import Catalog, Changes
from xform.runtime.fleet.pool import Pool
from xform.serving.fleet_repository import engine_model, name_problems, options_from
from xform.serving.repository import model_names, write_model
from xform.serving.router import Router, read_catalog, write_catalog


class Rescanner:
    """Rescans for `router` (whose pool loads a bundle's engine model by `engines`, the loader's
    map, updated here) from its catalog.json at `catalog_path` (REPO/translate/1/catalog.json)."""

    def __init__(self, catalog_path: Path, router: Router, pool: Pool, engines: dict[str, str]):
        data = json.loads(Path(catalog_path).read_text())
        if not data.get("origin"):
            raise XformError(f"{catalog_path}: no origin (written by an xform older than rescans)")
        self.origin = data["origin"]
        self.source, self.options = self.origin["source"], options_from(self.origin["options"])
        self.catalog_path, self.repo = Path(catalog_path), Path(catalog_path).parents[2]
        self.router, self.pool, self.engines = router, pool, engines
        self.settings = read_catalog(catalog_path)[2]
        self.lock = threading.Lock()
        self.leaving: list[str] = []  # removed bundles whose models stay until they are unloaded

    def __call__(self) -> dict[str, Any]:
        with self.lock:
            old = self.router.catalog
            new, found = old.rescan(self.source)
            new, changes = self.written(old, new, found)
            self.engines.update({n: engine_model(n, self.options) for n in changes.added})
            # routed by the new catalog before anything leaves: a hop planned on the old one that
            # asks a removed bundle now fails its load (the loader checks the catalog), never
            # loads it again behind the rescan's back
            self.router.catalog = new
            self.leaving = [*self.leaving, *changes.removed]
            # a changed --preload bundle that cannot be loaded again is said: the rescan has taken
            # effect either way (a request for it loads it, or says why it cannot)
            failed = {n: str(e) for n, e in self.pool.follow(changes.changed, changes.removed).items()}
            self.settings = replace(self.settings, preload=tuple(n for n in self.settings.preload if n in new))
            write_catalog(self.catalog_path, new, self.engines, self.settings, self.origin)
            self.leaving = self.clear(self.leaving, new)
            return {"added": changes.added, "removed": changes.removed, "changed": changes.changed,
                    "refused": changes.refused, "reload_failed": failed, "bundles": [e.name for e in new]}

    def written(self, old: Catalog, new: Catalog, found: Changes) -> tuple[Catalog, Changes]:
        """`new` with the models of its added and changed bundles written; a bundle refused (its
        name, or its models could not be written) is left out if new, kept as in `old` if known."""
        refused = dict(found.refused)
        refused.update({n: why for n, why in name_problems(new, self.options).items() if n not in old})
        for name in [*found.added, *found.changed]:
            if name in refused:
                continue
            try:
                write_model(new[name].path, self.repo, replace(self.options, name=name), reference=True, force=True)
            except (XformError, OSError) as e:
                refused[name] = str(e)
        kept = [e if e.name not in refused else old[e.name] for e in new if e.name not in refused or e.name in old]
        return Catalog(kept), Changes([n for n in found.added if n not in refused], found.removed,
                                [n for n in found.changed if n not in refused], refused)

    def clear(self, leaving: list[str], served: Catalog) -> list[str]:
        """Remove the models of the bundles in `leaving` that are unloaded and not served again;
        those still loaded (a request holds them)."""
        stats = self.pool.stats()
        loaded = {*stats.loaded, *([stats.loading] if stats.loading else [])}
        still = []
        for name in dict.fromkeys(leaving):
            if name in served:
                continue
            if name in loaded:
                still.append(name)
                continue
            for model in model_names(name, self.options):
                shutil.rmtree(self.repo / model, ignore_errors=True)
            self.engines.pop(name, None)
        return still
