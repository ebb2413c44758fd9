"""Triton Python-backend model `translate`: many bundles on one server (copied as
`translate/1/model.py` by serving/fleet_repository.py). The logic is serving/router.py's; this
file is what needs Triton:

- the bundles are read from `catalog.json` beside this file (written at the scan);
- a bundle loads as its engine model through BLS (`pb_utils.load_model`, synchronous) and
  unloads through `pb_utils.unload_model` (asynchronous: the loader waits for its stubs, the
  children of tritonserver that run it, to exit); its cost is their Pss (residency.py);
- each request is answered from a thread of a pool through its response sender, so `execute`
  never waits for a load or a decode; one carrying a parameter the router does not take (a key
  of a generate body that is no input: parameters.refuse_parameters) is refused 400 at once; a hop
  is relayed to the engine model by BLS with the parameter inflight.RELAY, its error's kind read
  back from the message (inflight.untagged: Triton 2.51's BLS drops error codes);
- metrics (Triton's /metrics, beside its own): xform_model_loads_total, xform_model_unloads_total,
  xform_model_resident_bytes and the histogram xform_model_load_seconds, each by bundle;
- a request with `status` true answers the router's state (serving/fleet_status.py: `xform serve
  --status URL`), one with `rescan` true reads the bundles again (serving/rescan.py: `xform serve
  --rescan URL`, or SIGUSR1 to serve);
- the bundles of --preload are loaded from a thread the first request starts (router.Preloading:
  Triton refuses a BLS load while it starts), their state in the status.
"""
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import triton_python_backend_utils as pb_utils

from xform.runtime.fleet.pool import Pool
from xform.serving import fleet_status, residency, restart_gauge
from xform.serving import router as xrouter
from xform.serving.inflight import RELAY, STREAM_SUFFIX, untagged
from xform.serving.rescan import Rescanner
from xform.serving.router import CATALOG, OUTPUTS, ROUTER, Router, StubLoader, failure, inputs, read_catalog
from xform.serving.triton_model import FINAL, declared, error, refused, response


def stubs(engine):
    """The stubs (children of tritonserver, this stub's parent) that run `engine`."""
    return residency.stubs_of(engine, residency.children(os.getppid()))


def ready(model):
    """Whether Triton says `model` is ready (False while it cannot say)."""
    try:
        return bool(pb_utils.is_model_ready(model_name=model))
    except Exception:  # noqa: BLE001 - starting
        return False


def verify(bundle):
    """A bundle's files against its manifest's hashes, before Triton is asked to load it."""
    from xform.runtime.bundle import Bundle
    Bundle.open(bundle)  # verifies


def call(engine, given):
    """One hop: `given` tensors to the engine model by BLS; its outputs, or HopFailed with the
    kind its engine tagged (an untagged error, Triton's own about the model, is the server's)."""
    request = pb_utils.InferenceRequest(model_name=engine, requested_output_names=[t.name for t in OUTPUTS
                                                                                  if t.name not in xrouter.OWN_OUTPUTS],
                                        inputs=[pb_utils.Tensor(k, v) for k, v in given.items()],
                                        parameters={RELAY: True})
    decoupled = engine.endswith(STREAM_SUFFIX)
    out = {}
    for r in (request.exec(decoupled=True) if decoupled else [request.exec()]):
        if r.has_error():
            kind, message = untagged(r.error().message())
            raise xrouter.HopFailed(message, kind)
        out.update({t.name(): t.as_numpy() for t in r.output_tensors()})
    return out


LOAD_BUCKETS = [0.5, 1, 2, 5, 10, 30, 60, 120, 300]  # seconds: a tiny bundle loads in 1-2 s, a large one in tens


class Metrics:
    """The router's metrics in Triton's /metrics; nothing where this Triton has no custom metrics."""

    def __init__(self):
        try:
            family = pb_utils.MetricFamily
            self.loads = family("xform_model_loads_total", "Bundles loaded by the router", family.COUNTER)
            self.unloads = family("xform_model_unloads_total", "Bundles unloaded by the router", family.COUNTER)
            self.resident = family("xform_model_resident_bytes", "A loaded bundle's stubs' memory (Pss)",
                                   family.GAUGE)
            self.seconds = family("xform_model_load_seconds", "Seconds a bundle's load took", family.HISTOGRAM)
        except Exception as e:  # noqa: BLE001 - metrics are a help, not a need
            pb_utils.Logger.log_warn(f"xform: no router metrics: {e}")
            self.loads = None
        self.metrics: dict = {}

    def metric(self, family, model):
        key = (id(family), model)
        if key not in self.metrics:
            buckets = {"buckets": LOAD_BUCKETS} if family is self.seconds else {}
            self.metrics[key] = family.Metric(labels={"model": model}, **buckets)
        return self.metrics[key]

    def observe(self, event, model, seconds, cost):
        pb_utils.Logger.log_info(f"xform: {event}ed {model} in {seconds:.2f} s" + (f", {cost >> 20} MiB"
                                                                                    if event == "load" else ""))
        if self.loads is None:
            return
        try:
            self.metric(self.loads if event == "load" else self.unloads, model).increment(1)
            self.metric(self.resident, model).set(cost)
            if event == "load":
                self.metric(self.seconds, model).observe(seconds)
        except Exception as e:  # noqa: BLE001 - a metric never fails the load it counts
            pb_utils.Logger.log_warn(f"xform: router metrics for {model}: {e}")


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        path = Path(args["model_repository"]) / args["model_version"] / CATALOG
        catalog, engines, settings = read_catalog(path)
        self.metrics = Metrics()
        self.restart_gauge = restart_gauge.publish(pb_utils, args.get("model_instance_name", config["name"]))
        loader = StubLoader(engines, lambda m: pb_utils.load_model(model_name=m),
                            lambda m: pb_utils.unload_model(model_name=m), stubs, residency.memory_bytes,
                            residency.wait_gone, settings.unload_timeout, self.metrics.observe,
                            check=lambda name: verify(self.router.catalog[name].path),
                            ready=lambda m: pb_utils.is_model_ready(model_name=m))
        pool = Pool(loader, settings.max_loaded, settings.memory_budget, settings.preload, settings.load_timeout,
                    idle_unload=settings.idle_unload)

        def resident(name):
            return sum(residency.memory_bytes(p) for p in stubs(engines[name]))
        wait = settings.load_timeout * max(len(settings.preload), 1)
        self.preloading = xrouter.Preloading(pool, lambda: ready(ROUTER), wait)
        self.router = Router(catalog, pool, call, settings.pivot, status=lambda: {
            **fleet_status.state(self.router.catalog, pool, settings, resident), "preload": self.preloading.said()})
        self.router.rescan = Rescanner(path, self.router, pool, engines)
        self.names = [t.name for t in inputs()]
        self.inputs = declared(config)  # what a request may name (refused: parameters.refuse_parameters)
        self.threads = ThreadPoolExecutor(settings.threads, thread_name_prefix="xform-route")
        pb_utils.Logger.log_info(f"xform: {config['name']} routes over {len(catalog)} bundles: "
                                 + " | ".join(catalog.summary()))

    def execute(self, requests):
        self.preloading.start()  # once: not from initialize (router.Preloading)
        for request in requests:
            why = refused(request, self.inputs)
            if why is not None:
                self.send(error(why), request.get_response_sender())
                continue
            given = {}
            for name in self.names:
                t = pb_utils.get_input_tensor_by_name(request, name)
                given[name] = None if t is None else t.as_numpy().copy()  # outlives the request's memory
            self.threads.submit(self.answer, given, request.get_response_sender())
        return None

    def answer(self, given, sender):
        try:
            final = response(self.router.handle(given))
        except Exception as e:  # noqa: BLE001 - this request fails, by its kind; the others go on
            kind, message = failure(e)
            final = error(message, kind)
        self.send(final, sender)

    def send(self, final, sender):
        try:
            sender.send(final, flags=FINAL)
        except Exception as e:  # noqa: BLE001 - the client is gone
            pb_utils.Logger.log_warn(f"xform: a response could not be sent: {e}")

    def finalize(self):
        self.threads.shutdown(wait=False)
