"""Many bundles, one Triton model repository: each bundle written as `xform serve` writes one
(repository.write_model, the bundle referenced by its path), and the router model `translate`
(serving/router.py) that routes requests to them by language.

REPO/<bundle>/...                  each bundle's models (NAME and NAME-stream, or NAME), none
                                   loaded at start: the router loads a bundle's engine model
                                   (NAME-stream, or NAME under --scheduling dynamic) at its first
                                   request; NAME, the plain relay, is never loaded
REPO/translate/config.pbtxt        the router: text, src_lang, tgt_lang, model, the controls
REPO/translate/1/model.py          xform/serving/triton_router.py
REPO/translate/1/catalog.json      the bundles, their engine models and languages, the router's settings

Tritonserver runs it with `--model-control-mode=explicit --load-model=translate`
(server.TritonServer(explicit=True)).
"""
from __future__ import annotations

import os
import shutil
from dataclasses import asdict, replace
from importlib import resources
from pathlib import Path
from typing import Sequence

from xform.errors import InputError
from xform.files import atomic_directory
from xform.runtime.fleet.catalog import Catalog
from xform.serving.inflight import stream_model
from xform.serving.repository import ModelOptions, model_names, not_our_model, write_model
from xform.serving.router import CATALOG, ROUTER, Settings, config_pbtxt, write_catalog


def origin(source: str | Path | Sequence[str | Path], options: ModelOptions) -> dict:
    """catalog.json's `origin`: what a rescan reads again and writes its new bundles' models with."""
    # absolute, links kept: a bundle reached through a link keeps the name its link gives it
    where = os.path.abspath(source) if isinstance(source, (str, Path)) else [os.path.abspath(p) for p in source]
    return {"source": where, "options": {k: (str(v) if isinstance(v, Path) else v)
                                         for k, v in asdict(options).items()}}


def options_from(data: dict) -> ModelOptions:
    """ModelOptions as `origin` wrote them."""
    paths = {k: None if data.get(k) is None else Path(data[k]) for k in ("vocab_map", "glossary")}
    return ModelOptions(**{**data, **paths})


def engine_model(name: str, options: ModelOptions) -> str:
    """The model that runs bundle `name`'s engine (what the router loads and asks)."""
    return stream_model(name) if options.mode == "inflight" else name


def bls_threads(options: ModelOptions, settings: Settings) -> int:
    """Triton's Python-backend threads: each request the router has in flight holds one, and so
    does each relay of an engine (ModelOptions.bls_threads)."""
    return (options.bls_threads or 32) + settings.threads


def name_problems(catalog: Catalog, options: ModelOptions) -> dict[str, str]:
    """bundle -> why its name cannot be served beside the others (the router's name, or a model
    name another bundle writes too)."""
    problems = {e.name: f"a bundle named {e.name!r}: {ROUTER!r} is the router's model; rename its directory"
                for e in catalog if ROUTER in model_names(e.name, options)}
    written = [m for e in catalog for m in model_names(e.name, options)]
    for e in catalog:
        clash = sorted(m for m in model_names(e.name, options) if written.count(m) > 1)
        if clash and e.name not in problems:
            problems[e.name] = (f"two bundles write the model {clash[0]!r} (a bundle NAME's engine is NAME-stream): "
                                "rename one directory")
    return problems


def write_fleet(catalog: Catalog, repo: str | Path, options: ModelOptions = ModelOptions(),
                settings: Settings = Settings(), source: str | Path | Sequence[str | Path] | None = None) -> list[str]:
    """Write every bundle of `catalog` and the router into `repo`; returns the models written.
    `source`, where the catalog was read (a directory of bundles, or bundle paths), is what a
    rescan reads again (serving/rescan.py; None: the catalog's own paths)."""
    source = [e.path for e in catalog] if source is None else source
    if options.name is not None:
        raise InputError("--name names one bundle's model; many bundles are named by their directories")
    problems = name_problems(catalog, options)
    if problems:
        raise InputError(next(iter(problems.values())))
    engines = {}
    for entry in catalog:
        write_model(entry.path, repo, replace(options, name=entry.name), reference=True)
        engines[entry.name] = engine_model(entry.name, options)
    with atomic_directory(Path(repo) / ROUTER, False, not_our_model) as tmp:
        version = tmp / "1"
        version.mkdir()
        shutil.copyfile(Path(str(resources.files("xform.serving") / "triton_router.py")), version / "model.py")
        write_catalog(version / CATALOG, catalog, engines, settings, origin(source, options))
        (tmp / "config.pbtxt").write_text(config_pbtxt(options.max_batch, settings.threads))
    return [*(m for e in catalog for m in model_names(e.name, options)), ROUTER]
