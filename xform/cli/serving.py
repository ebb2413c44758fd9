"""`xform triton` and `xform serve`: a bundle as a Triton model, and the server that runs it; many
bundles on one server, routed by language through the model `translate` (serving/router.py,
serving/fleet_repository.py)."""
from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Sequence

import click

from xform.cli import err, handle_errors, main, out
from xform.errors import XformError


def triton_model_options(fn):
    """The flags of a Triton model (xform triton, xform serve), as ModelOptions."""
    options = [
        click.option("--name", default=None, help="Model name (default: the bundle directory's name)."),
        click.option("--backend", type=click.Choice(["ort", "trt"]), default="ort", show_default=True,
                     help="trt needs engines (xform build-engine) and a GPU."),
        click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
                     help="Default: cpu for ort, cuda for trt."),
        click.option("--threads", type=click.IntRange(min=1), default=None,
                     help="Intra-op threads per instance (ort; default: all cores)."),
        click.option("--max-batch", type=click.IntRange(min=1), default=8, show_default=True,
                     help="Triton's max_batch_size: sources decoded together."),
        click.option("--max-queue-delay-us", type=click.IntRange(min=0), default=1000, show_default=True,
                     help="How long Triton's dynamic batcher waits to fill a batch."),
        click.option("--scheduling", type=click.Choice(["inflight", "dynamic"]), default=None,
                     help="inflight (the default on ort): requests join one running batch step by step, leave "
                          "when they end, and may stream (models NAME and NAME-stream); dynamic (the default with "
                          "--backend trt or --vocab-map): Triton's dynamic batcher forms batches decoded to their "
                          "longest request."),
        click.option("--max-rows", type=click.IntRange(min=1), default=64, show_default=True,
                     help="The most decoder rows (sources x beams) one request may ask for; inflight, also the "
                          "most the running batch holds: it bounds the cache and the logits."),
        click.option("--max-queue", type=click.IntRange(min=1), default=256, show_default=True,
                     help="inflight: requests that may wait for rows; more are refused as overloaded."),
        click.option("--dynamic-batching/--no-dynamic-batching", default=True, show_default=True),
        click.option("--instances", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Model instances (processes) decoding in parallel."),
        click.option("--vocab-map", type=click.Path(path_type=Path), default=None,
                     help="CTranslate2's vocabulary map: every text request decodes over the target tokens its "
                          "sources allow (a bundle exported --with-vocab-map; ort)."),
        click.option("--glossary", type=click.Path(path_type=Path), default=None,
                     help="Terms and their required translations (TSV or TBX, as run's --glossary), read once: "
                          "every text request without its own `glossary` input holds them (docs/terminology.md)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def model_options(**kw):
    from xform.serving.repository import ModelOptions
    return ModelOptions(**kw)


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("-o", "--output", "repo", required=True, type=click.Path(path_type=Path),
              help="Triton model repository (created if missing; other models in it are kept).")
@triton_model_options
@click.option("--reference", is_flag=True, help="Name the bundle's absolute path instead of copying it.")
@click.option("--force", is_flag=True,
              help="Replace an existing model of that name (only a Triton model xform wrote, or an empty directory).")
@handle_errors
def triton(bundle: Path, repo: Path, reference: bool, force: bool, **options) -> None:
    """Write BUNDLE as a Triton Inference Server model (Python backend) into a model repository."""
    from xform.serving.repository import model_names, write_model

    opts = model_options(**options)
    path = write_model(bundle, repo, opts, reference=reference, force=force)
    for name in model_names(path.name, opts):
        out.print(f"wrote {path.parent / name} (config.pbtxt, 1/model.py{'' if reference else ', 1/bundle'})")
    out.print(f"serve it here: xform serve {bundle} (with the same model flags; it starts the tritonserver of the "
              "nvidia-pytriton wheel, see docs/serving.md)")
    out.print(f"or in NVIDIA's container, with xform installed in its Python: docker run --gpus all -p 8000:8000 "
              f"-v {repo.resolve()}:/models nvcr.io/nvidia/tritonserver:<yy.mm>-py3 tritonserver "
              "--model-repository /models")


@main.command()
@click.argument("bundles", metavar="BUNDLE...", nargs=-1, type=click.Path(path_type=Path))
@click.option("--models", "models_dir", type=click.Path(path_type=Path), default=None,
              help="Serve every bundle in this directory (its subdirectories), routed by language through the "
                   "model `translate`.")
@click.option("--max-loaded", type=click.IntRange(min=1), default=None,
              help="Many bundles: the most loaded at once; the least recently used idle one is unloaded to make "
                   "room (default: no bound).")
@click.option("--memory-budget", metavar="SIZE", default=None,
              help="Many bundles: the most memory the loaded bundles' processes may hold (500MB, 2GiB), each "
                   "bundle's cost measured at its load (Pss); the least recently used idle ones are unloaded to "
                   "make room. A bundle larger than the budget fails its own requests (500).")
@click.option("--preload", "preload", metavar="NAME", multiple=True,
              help="Many bundles: load this bundle at start and never unload it (repeat it, or NAME,NAME); it "
                   "counts against --max-loaded and --memory-budget: more than fits is refused at start.")
@click.option("--status", "status_url", metavar="URL", default=None,
              help="Print the state of the many-bundle server at URL (http://host:port): each bundle loaded or "
                   "not, its memory, requests, loads and their latency, evictions; then exit.")
@click.option("--rescan", "rescan_url", metavar="URL", default=None,
              help="Ask the many-bundle server at URL to read its bundles again (--models DIR: new ones served, "
                   "removed ones unloaded, re-exported ones reloaded; SIGUSR1 to serve does the same), print "
                   "what changed and exit.")
@click.option("--load-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Many bundles: seconds a request waits for room to load its bundle before it is answered "
                   "unavailable (503). [default: 60]")
@click.option("--idle-unload", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Many bundles: unload a bundle no request has used for this many seconds (not a --preload "
                   "one), giving its memory back before a newcomer needs the room. [default: never]")
@click.option("--pivot", default=None,
              help="Many bundles: the language two hops go through where no bundle translates a pair; 'none': "
                   "no pivot. [default: en]")
@click.option("--prepare", is_flag=True,
              help="Only prepare what serving needs (the nvidia-pytriton stub's numpy<2 environment, once, in "
                   "~/.cache/xform) and exit: run it when building an image, so the first serve needs no network.")
@click.option("--wheel-dir", type=click.Path(path_type=Path), default=None,
              help="Take the stub environment's numpy<2 from this directory of wheels, not the package index.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the endpoints listen on.")
@click.option("--http-port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--grpc-port", type=click.IntRange(1, 65535), default=8001, show_default=True)
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=8002, show_default=True)
@click.option("--grace", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds a stop lets requests in flight finish (new ones are refused) before tritonserver and "
                   "its stubs are killed; set it below your supervisor's own (Kubernetes' "
                   "terminationGracePeriodSeconds, systemd's TimeoutStopSec).")
@click.option("--restarts", type=click.IntRange(min=0), default=3, show_default=True,
              help="Restart tritonserver after a crash (SIGSEGV, SIGABRT...: Triton 2.51 can crash when a gRPC "
                   "client cancels a request) at most this many times in 10 minutes, on the same ports; past "
                   "that, or 0, serve exits 1 for its supervisor. Each restart is said on stderr and counted in "
                   "/metrics (xform_serve_restarts).")
@triton_model_options
@handle_errors
def serve(bundles: tuple[Path, ...], models_dir: Path | None, max_loaded: int | None, memory_budget: str | None,
          preload: tuple[str, ...], status_url: str | None, rescan_url: str | None, load_timeout: float | None,
          idle_unload: float | None,
          pivot: str | None, prepare: bool, wheel_dir: Path | None, host: str, http_port: int, grpc_port: int,
          metrics_port: int, grace: float, restarts: int, **options) -> None:
    """Serve BUNDLE on Triton Inference Server until stopped (with --prepare: prepare, then exit).

    Several bundles, or --models DIR: each a Triton model loaded at its first request, and the model
    `translate` routing requests by src_lang / tgt_lang (docs/serving.md, "Many bundles, one server").
    tritonserver comes from PATH (NVIDIA's containers) or the nvidia-pytriton wheel. Exit codes: 0
    stopped by a signal (SIGINT, SIGTERM, SIGHUP); 1 tritonserver did not start, died, or a model's
    stub died (the message says which and where Triton's log is kept); 2 bad flags.
    With --status URL: print that server's state and exit; with --rescan URL, have it read its
    bundles again (SIGUSR1 to a running serve does too).
    """
    from xform.serving.lifecycle import Restarts, Stopper
    from xform.serving.server import find_triton

    for flag, url in (("--status", status_url), ("--rescan", rescan_url)):
        if url is not None:
            if bundles or models_dir is not None or prepare or (status_url and rescan_url):
                raise click.UsageError(f"{flag} URL asks a running server: give no BUNDLE, --models, --prepare, "
                                       "or the other of --status and --rescan")
            return print_status(url) if flag == "--status" else print_rescan(url)
    if wheel_dir is not None and not wheel_dir.is_dir():
        raise XformError(f"--wheel-dir {wheel_dir}: no such directory")
    fleet = {"max_loaded": max_loaded, "load_timeout": load_timeout, "pivot": pivot, "memory_budget": memory_budget,
             "idle_unload": idle_unload,
             "preload": [n for given in preload for n in given.split(",") if n] or None}
    if prepare:
        if bundles or models_dir is not None:
            raise click.UsageError("--prepare prepares the server, not a bundle: give no BUNDLE")
        install = find_triton(prepare=lambda msg: err.print(msg), wheel_dir=wheel_dir)
        where = f" (stub environment {install.backend_dir.parent})" if install.backend_dir is not None else ""
        out.print(f"ready to serve: {install.source} tritonserver {install.binary}{where}")
        return
    if not bundles and models_dir is None:
        raise click.UsageError("missing BUNDLE (or --models DIR, or --prepare)")
    if bundles and models_dir is not None:
        raise click.UsageError("give bundles or --models DIR, not both")
    ports = (http_port, grpc_port, metrics_port)
    with Stopper() as stopper:  # from the first moment: a stop while starting stops what was started
        stopper.restarts = Restarts(restarts)
        if len(bundles) == 1 and all(v is None for v in fleet.values()):
            serve_bundle(bundles[0], wheel_dir, host, ports, grace, options, stopper)
        else:
            serve_fleet(models_dir if models_dir is not None else list(bundles), fleet, wheel_dir, host, ports,
                        grace, options, stopper)


def serve_bundle(bundle: Path, wheel_dir: Path | None, host: str, ports: tuple[int, int, int], grace: float,
                 options: dict, stopper) -> None:
    """`xform serve`'s run: write the models, start tritonserver, watch it until a stop or a death,
    stop it (always), and say how it ended."""
    import tempfile

    from xform.serving.repository import model_names, write_model
    from xform.serving.server import TritonServer

    with tempfile.TemporaryDirectory(prefix="xform-serve-") as tmp:
        opts = model_options(**options)
        model = write_model(bundle, Path(tmp) / "models", opts, reference=True)
        names = model_names(model.name, opts)
        server = stopper.server = TritonServer(Path(tmp) / "models", names, host, *ports,
                                               log_path=Path(tmp) / "tritonserver.log", bls_threads=opts.bls_threads,
                                               grace=grace)
        what, code = run_server(server, stopper, wheel_dir, model.name,
                                lambda: print_endpoints(server, model.name, names))
    out.print(f"{what or 'stopped before tritonserver was ready on ' + stopper.name}; stopped tritonserver "
              f"(exit code {code})")


def run_server(server, stopper, wheel_dir: Path | None, label: str, printer,
               tick=lambda: None) -> tuple[str, int | None]:
    """Start `server`, `printer()` its endpoints, watch it until a stop or a death, stop it (always);
    a crash that the stopper's `restarts` (lifecycle.Restarts, none by default) allows starts it
    again on the same ports and repository. (what ended it, tritonserver's exit code), or
    XformError when it failed or died."""
    from xform.serving.lifecycle import DIED, STOPPED, STUB_DIED, Restarts, first_error, keep_log
    from xform.serving.stall import STALL_S

    restarts = stopper.restarts or Restarts(0)
    server.stall = STALL_S if restarts.limit else None  # a wedged engine aborts the server it restarts
    while True:
        outcome, what, code = run_once(server, stopper, wheel_dir, label, printer, tick)
        if outcome != DIED or stopper.requested or not restarts.allow(code):
            break
        err.print(restarts.said(what, keep_log(server), first_error(server, last=True)), markup=False)
        server.restarts = restarts.count
    if outcome != STOPPED:
        kept = keep_log(server)
        cause = first_error(server, last=outcome in (DIED, STUB_DIED))
        raise XformError(f"{what}{': ' + cause if cause and cause not in what else ''}"
                         f"{f'; Triton log kept at {kept}' if kept else ''}")
    return what, code


def run_once(server, stopper, wheel_dir: Path | None, label: str, printer, tick) -> tuple[str, str, int | None]:
    """One life of tritonserver: started, watched, stopped (always); (outcome, what, exit code)."""
    from xform.serving.lifecycle import STOPPED, watch
    from xform.serving.server import ServerError, StopRequested, find_triton

    outcome, what = STOPPED, ""
    try:
        with err.status(f"starting tritonserver for {label}"):
            server.install = server.install or find_triton(prepare=lambda msg: err.print(msg), wheel_dir=wheel_dir)
            if not stopper.requested:
                server.start(should_stop=lambda: stopper.requested)
        if not stopper.requested:
            printer()
            outcome, what = watch(server, stopper, tick=tick)
    except StopRequested:
        pass
    except ServerError as e:
        outcome, what = "failed", str(e).split("; its log", 1)[0].split("\n", 1)[0]
    finally:
        code = server.stop()
    return outcome, what, code


def print_endpoints(server, name: str, names: list[str]) -> None:
    process = server.process
    out.print(f"serving model [bold]{name}[/] ({server.install.source} tritonserver, pid {process.pid}); Ctrl-C "
              "stops it")
    out.print(f"  HTTP    {server.http_url}/v2/models/{name}/infer")
    out.print(f"  gRPC    {server.host}:{server.grpc_port}")
    if len(names) > 1:
        out.print(f"  stream  {server.http_url}/v2/models/{names[1]}/generate_stream (and gRPC streaming "
                  f"to {names[1]})")
    out.print(f"  metrics http://{server.host}:{server.metrics_port}/metrics")


# -- many bundles, one server: xform serve BUNDLE... | --models DIR ---------------------------------
def router_settings(fleet: dict, catalog=None):
    """The router's settings from serve's flags; --preload names checked against `catalog`."""
    from xform.runtime.fleet.pool import parse_size
    from xform.serving import residency
    from xform.serving.router import Settings
    pivot, budget, preload = fleet.get("pivot"), parse_size(fleet.get("memory_budget")), fleet.get("preload") or ()
    if budget is not None and (budget < 1 or residency.memory_bytes(os.getpid()) == 0):
        raise XformError(f"--memory-budget {fleet['memory_budget']}: " + (
            "at least 1 byte" if budget < 1 else "this system does not say a process's memory (/proc), so a bundle's "
            "cost cannot be measured; bound them by --max-loaded"))
    unknown = [n for n in preload if catalog is not None and n not in catalog]
    if unknown:
        raise XformError(f"--preload {', '.join(unknown)}: no such bundle; the bundles: "
                         f"{', '.join(e.name for e in catalog)}")
    if fleet.get("max_loaded") is not None and len(set(preload)) > fleet["max_loaded"]:
        raise XformError(f"--preload {', '.join(preload)}: {len(set(preload))} bundles, more than --max-loaded "
                         f"{fleet['max_loaded']} (preloaded bundles are never unloaded)")
    return Settings(max_loaded=fleet.get("max_loaded"), memory_budget=budget, preload=tuple(sorted(set(preload))),
                    load_timeout=60.0 if fleet.get("load_timeout") is None else fleet["load_timeout"],
                    pivot="en" if pivot is None else (None if pivot.lower() == "none" else pivot),
                    idle_unload=fleet.get("idle_unload"))


def await_preload(server, settings, stopper) -> None:
    """Wait until the router has loaded the bundles of --preload (it does once Triton is ready);
    XformError saying why it could not (then run_server stops the server)."""
    import time

    from xform.serving.fleet_status import fetch
    if not settings.preload:
        return
    wait = settings.load_timeout * len(settings.preload) + 60
    deadline = time.monotonic() + wait
    with err.status(f"preloading {', '.join(settings.preload)}"):
        while not stopper.requested:
            said = fetch(server.http_url).get("preload", {})
            if said.get("state") == "done":
                return
            if said.get("state") == "failed":
                raise XformError(f"not serving: {said.get('error')}")
            if time.monotonic() > deadline:
                raise XformError(f"--preload {', '.join(settings.preload)}: not loaded {wait:.0f} s after the start")
            time.sleep(0.25)


def print_status(url: str) -> None:
    """`xform serve --status URL`: the server's state, a line a bundle."""
    from xform.serving.fleet_status import fetch, table
    out.print(f"xform serve at {url}: model translate", markup=False)
    for line in table(fetch(url)):
        out.print(f"  {line}", markup=False)


def print_rescan(url: str) -> None:
    """`xform serve --rescan URL`: what the server found when it read its bundles again."""
    from xform.serving.fleet_status import rescan, rescanned
    out.print(f"xform serve at {url}: {rescanned(rescan(url))}", markup=False)


def rescan_on_signal(server, asked) -> None:
    """A SIGUSR1 since the last look: the server asked to rescan, from a thread (watch goes on)."""
    import threading

    from xform.serving.fleet_status import rescan, rescanned

    def ask() -> None:
        try:
            out.print(f"rescan (SIGUSR1): {rescanned(rescan(server.http_url))}", markup=False)
        except XformError as e:
            err.print(f"rescan (SIGUSR1) failed: {e}", markup=False)
    if asked.take():
        threading.Thread(target=ask, name="xform-rescan", daemon=True).start()


def serve_fleet(where: Path | Sequence[Path], fleet: dict, wheel_dir: Path | None, host: str,
                ports: tuple[int, int, int], grace: float, options: dict, stopper) -> None:
    """Scan the bundles, write them and the router into a temporary repository, run tritonserver
    with explicit model control (only `translate` loaded at start) until a stop or a death."""
    import tempfile

    from xform.runtime.fleet.catalog import Catalog
    from xform.serving.fleet_repository import bls_threads, write_fleet
    from xform.serving.lifecycle import Asked
    from xform.serving.router import ROUTER
    from xform.serving.server import TritonServer

    router_settings(fleet)  # its flags checked before the scan
    catalog = Catalog.scan(where)
    opts, settings = model_options(**options), router_settings(fleet, catalog)
    with tempfile.TemporaryDirectory(prefix="xform-serve-") as tmp, Asked() as asked:
        repo = Path(tmp) / "models"
        write_fleet(catalog, repo, opts, settings, where)
        server = stopper.server = TritonServer(repo, [ROUTER], host, *ports, log_path=Path(tmp) / "tritonserver.log",
                                               bls_threads=bls_threads(opts, settings), grace=grace, explicit=True)
        def ready() -> None:
            await_preload(server, settings, stopper)
            print_fleet(server, catalog, settings)
        what, code = run_server(server, stopper, wheel_dir, f"{len(catalog)} bundles", ready,
                                lambda: rescan_on_signal(server, asked))
    out.print(f"{what or 'stopped before tritonserver was ready on ' + stopper.name}; stopped tritonserver "
              f"(exit code {code})")


def example(catalog) -> dict:
    """A request body for the JSON example: the first pair a bundle declares."""
    for entry in catalog:
        lang = entry.languages
        if lang.pairs:
            return {"text": "Hello", "src_lang": lang.pairs[0][0], "tgt_lang": lang.pairs[0][1]}
        if len(lang.targets) > 1 and lang.sources is not None:
            return {"text": "Hello", "src_lang": lang.sources[0], "tgt_lang": lang.targets[1]}
    return {"text": "Hello", "model": next(iter(catalog)).name}


def print_fleet(server, catalog, settings) -> None:
    from xform.serving.router import ROUTER
    bounds = [f"at most {settings.max_loaded} loaded at once"] if settings.max_loaded else []
    bounds += [f"within {settings.memory_budget >> 20} MiB"] if settings.memory_budget else []
    bounds += [f"{', '.join(settings.preload)} preloaded"] if settings.preload else []
    bound = ", ".join(bounds) or "no bound on those loaded"
    out.print(f"serving {len(catalog)} bundles through model [bold]{ROUTER}[/] ({server.install.source} "
              f"tritonserver, pid {server.process.pid}; each bundle loads at its first request, {bound}); Ctrl-C "
              "stops it")
    for line in catalog.summary():
        out.print(f"  bundle  {line}", markup=False)
    body = json.dumps(example(catalog), ensure_ascii=False)
    out.print(f"  HTTP    {server.http_url}/v2/models/{ROUTER}/infer")
    out.print(f"  JSON    curl -X POST {server.http_url}/v2/models/{ROUTER}/generate -d {shlex.quote(body)}",
              markup=False)
    out.print(f"  index   curl -X POST {server.http_url}/v2/repository/index (which bundles are loaded)")
    out.print(f"  status  xform serve --status {server.http_url}")
    out.print(f"  rescan  xform serve --rescan {server.http_url} (or kill -USR1 {os.getpid()})")
    out.print(f"  ready   {server.http_url}/v2/models/{ROUTER}/ready")
    out.print(f"  gRPC    {server.host}:{server.grpc_port}")
    out.print(f"  metrics http://{server.host}:{server.metrics_port}/metrics")
