"""Triton Python-backend model for an xform bundle (copied as `<model>/1/model.py` by `xform triton`).

The bundle and how to run it come from config.pbtxt's parameters: `bundle` (a path, relative to
this version directory or absolute), `backend` (ort | trt), `device` (cpu | cuda), `threads`,
`vocab_map` and `glossary` (files in this version directory: the glossary is the one text requests
without their own take), and `role`, which of the three models of serving/repository.py this one is:

- `batch` (--scheduling dynamic): Triton's dynamic batcher forms batches of requests and each
  execute call decodes them together (serving/handler.py);
- `engine` (NAME-stream, decoupled): the Scheduler's running batch, which requests join and leave
  step by step, with streaming and cancellation (serving/inflight.py);
- `front` (NAME under --scheduling inflight): plain requests relayed to the engine model through
  BLS from a thread pool and answered through their response sender, so execute never waits.

Loading verifies the bundle (hashes, manifest version); a bundle that fails is refused and the
reason goes to Triton's log. A request parameter the model does not take (Triton 2.51's generate
door passes a key of its JSON body that is no input as one: a misspelt `max_new_token`) is
refused 400 naming it and the input it likely means (parameters.refuse_parameters).
"""
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import triton_python_backend_utils as pb_utils

from xform.runtime.text.translator import Translator
from xform.serving import restart_gauge
from xform.serving.handler import execute
from xform.serving.tensors import inputs as tensor_inputs

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def response(outputs):
    return pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in outputs.items()])


def error(message, kind="request"):
    """An error response: `kind` request (the request's fault: INVALID_ARG, HTTP 400), server
    (INTERNAL, 500) or unavailable (overloaded: UNAVAILABLE, 503). A ServerFault message is the
    server's whatever `kind` says."""
    from xform.serving.handler import ServerFault
    kind = "server" if isinstance(message, ServerFault) else kind
    code = getattr(pb_utils.TritonError, {"request": "INVALID_ARG", "server": "INTERNAL",
                                          "unavailable": "UNAVAILABLE"}[kind], None)
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    return pb_utils.InferenceResponse(error=error)


class Reply:
    """A request's response sender, closed once its final response is on its way; `relayed`: the
    request came from the front model, whose BLS loses error codes (inflight.RELAY)."""

    def __init__(self, sender, relayed: bool = False):
        self.sender, self.closed, self.relayed = sender, False, relayed

    def error(self, message, kind="request"):
        """The final error response of this request (see `error`), its kind in the message when relayed."""
        from xform.serving.handler import ServerFault
        from xform.serving.inflight import tagged
        kind = "server" if isinstance(message, ServerFault) else kind
        return error(tagged(message, kind) if self.relayed else message, kind)


def relayed(request) -> bool:
    """Whether the front model relayed this request (its parameter inflight.RELAY)."""
    from xform.serving.inflight import RELAY
    try:
        return bool(json.loads(request.parameters() or "{}").get(RELAY))
    except (ValueError, AttributeError):
        return False


def declared(config) -> dict[str, str]:
    """A model's inputs as its config declares them: name -> Triton's TYPE_*."""
    return {i["name"]: i["data_type"] for i in config.get("input", [])}


def refused(request, inputs) -> str | None:
    """Why the request is refused for a parameter it carries (parameters.refuse_parameters: a key of a
    generate body that is none of the model's `inputs`, an input sent as a parameter), or None."""
    from xform.errors import InputError
    from xform.serving.inflight import RELAY
    from xform.serving.parameters import parameters_of, refuse_parameters
    try:
        refuse_parameters(parameters_of(request.parameters()), inputs, taken=(RELAY,))
    except InputError as e:
        return str(e)
    return None


def tensors_of(request):
    tensors = {}
    for name in (t.name for t in tensor_inputs()):
        t = pb_utils.get_input_tensor_by_name(request, name)
        tensors[name] = None if t is None else t.as_numpy().copy()
    return tensors


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.role = params.get("role", "batch")
        self.inputs = declared(config)  # what a request may name (refused: parameters.refuse_parameters)
        self.restart_gauge = restart_gauge.publish(pb_utils, args.get("model_instance_name", config["name"]))
        if self.role == "front":
            self.engine = params["engine"]
            self.outputs = [o["name"] for o in config["output"]]
            self.pool = ThreadPoolExecutor(int(params["relays"]), thread_name_prefix="xform-relay")
            pb_utils.Logger.log_info(f"xform: {config['name']} relays requests to {self.engine}")
            return
        from xform.errors import XformError
        from xform.runtime.open import open_session

        bundle = Path(params["bundle"])
        if not bundle.is_absolute():
            bundle = Path(args["model_repository"]) / args["model_version"] / bundle
        threads = int(params["threads"]) if params.get("threads") else None
        self.max_rows = int(params["max_rows"]) if params.get("max_rows") else None  # rows one request may ask
        try:
            self.session = open_session(bundle, params["backend"], params["device"], threads)
        except XformError as e:  # the reason, without a traceback, in Triton's log and load status
            raise pb_utils.TritonModelException(f"xform: cannot load bundle {bundle}: {e}") from None
        glossary = None
        if params.get("glossary"):  # read when the model was written; a failure here is the reason in the log
            from xform.runtime.text.glossary import Glossary
            try:
                glossary = Glossary.load(Path(args["model_repository"]) / args["model_version"] / params["glossary"])
            except XformError as e:
                raise pb_utils.TritonModelException(f"xform: glossary: {e}") from None
        # the model's text door, opened once; text requests without their own glossary take its
        self.translator = Translator(self.session, glossary=glossary)
        self.vocab_map = None
        if params.get("vocab_map"):  # checked when the model was written; a failure here is the reason in the log
            try:
                where = Path(args["model_repository"]) / args["model_version"] / params["vocab_map"]
                self.vocab_map = self.translator.policy.vocab_map(where)
            except XformError as e:
                raise pb_utils.TritonModelException(f"xform: vocabulary map: {e}") from None
        if self.role == "engine":
            self.start_engine(params)
        pb_utils.Logger.log_info(f"xform: serving {bundle} on {params['backend']} ({params['device']}), {self.role}")

    def execute(self, requests):
        if self.role == "front":
            for request in requests:
                why, sender = refused(request, self.inputs), request.get_response_sender()
                if why is not None:  # the engine is asked without the client's parameters: refused here
                    sender.send(error(why), flags=FINAL)
                    continue
                self.pool.submit(self.relay, request.inputs(), sender)
            return None
        if self.role == "engine":
            for request in requests:
                self.start(request)
            return None
        refusals = [refused(request, self.inputs) for request in requests]
        results = iter(execute(self.translator, [tensors_of(r) for r, why in zip(requests, refusals) if why is None],
                               self.vocab_map, self.max_rows))
        responses = []
        for why in refusals:
            result = next(results) if why is None else why
            responses.append(error(result) if isinstance(result, str) else response(result))
        return responses

    # -- front: a plain request through the engine model ----------------------------------------
    def relay(self, inputs, sender):
        from xform.serving.inflight import RELAY, untagged
        final = None
        try:
            call = pb_utils.InferenceRequest(model_name=self.engine, requested_output_names=self.outputs,
                                             inputs=inputs, parameters={RELAY: True})
            for r in call.exec(decoupled=True):
                if r.has_error():  # Triton 2.51's BLS drops the engine's error code: its message tells it
                    kind, message = untagged(r.error().message())
                    final = error(message, kind)
                elif r.output_tensors():
                    final = pb_utils.InferenceResponse(r.output_tensors())
        except Exception as e:  # noqa: BLE001 - the engine model is gone: this request fails, not the relay
            final = error(f"xform: {self.engine}: {e}", "server")
        try:
            sender.send(final if final is not None else error(f"xform: {self.engine} sent no result", "server"),
                        flags=FINAL)
        except Exception as e:  # noqa: BLE001 - the client is gone
            pb_utils.Logger.log_warn(f"xform: a response could not be sent: {e}")

    # -- engine: a request joins the running batch ----------------------------------------------
    def start_engine(self, params):
        import queue
        import threading

        from xform.runtime.scheduling.scheduler import Scheduler
        from xform.serving.inflight import Watcher
        self.scheduler = Scheduler(self.session, max_rows=int(params["max_rows"]),
                                   max_queue=int(params["max_queue"])).start()
        self.watcher = Watcher(self.scheduler)
        from xform.serving.documents import ScheduledSession
        # documents' sentences join the running batch: their translator's session runs through it
        self.scheduled = Translator(ScheduledSession(self.session, self.scheduler))  # type: ignore[arg-type]
        from concurrent.futures import ThreadPoolExecutor
        self.documents = ThreadPoolExecutor(4, thread_name_prefix="xform-document")  # each waits on the batch
        # responses go out from this thread: a send waits on Triton, the engine's steps must not
        # (reply, outputs of a part | the call that sends the final response), or None: stop
        self.outbox: queue.Queue[tuple[Reply, Any] | None] = queue.Queue()
        self.responder = threading.Thread(target=self.respond, name="xform-responder", daemon=True)
        self.responder.start()
        from xform.serving.stall import Stall, abort_server, stall_seconds
        limit = stall_seconds()  # under xform serve: a send Triton never takes aborts it (serving/stall.py)
        self.stall, self.stall_stop = Stall(limit or float("inf"), abort_server(pb_utils.Logger.log_error)), \
            threading.Event()
        if limit is not None:
            self.stall.watch(self.stall_stop)

    def respond(self):
        """Send what the outbox holds, in order: a request's parts, then its final response; never
        anything after the final one (Triton frees the request then)."""
        while True:
            item = self.outbox.get()
            if item is None:
                return
            reply, what = item
            if reply.closed:
                continue
            try:
                with self.stall.sending():
                    if callable(what):
                        reply.closed = True
                        what()
                    else:
                        reply.sender.send(response(what))
            except Exception as e:  # noqa: BLE001 - a client gone mid-stream: its request ends, the others go on
                pb_utils.Logger.log_warn(f"xform: a response could not be sent: {e}")

    def start(self, request):
        from xform.errors import XformError
        from xform.runtime.scheduling.scheduler import OverloadedError
        from xform.serving.documents import DocumentJob
        from xform.serving.handler import one_flag, parse, said
        from xform.serving.inflight import TextStream, submit

        sender = request.get_response_sender()
        reply = Reply(sender, relayed(request))
        why = refused(request, self.inputs)
        if why is not None:
            sender.send(reply.error(why), flags=FINAL)
            return
        try:
            tensors = tensors_of(request)
            streaming = one_flag("stream", tensors.pop("stream"))
            job = parse(self.translator, 0, tensors, self.max_rows)
            if isinstance(job, DocumentJob):
                self.documents.submit(self.document, job, reply)
                return
            stream = TextStream(self.session, job, lambda o: self.outbox.put((reply, o))) if streaming else None
            future = submit(self.scheduler, self.session, job, stream)
        except OverloadedError as e:
            sender.send(reply.error(said(e), "unavailable"), flags=FINAL)
            return
        except XformError as e:
            sender.send(reply.error(said(e)), flags=FINAL)
            return
        except Exception as e:  # noqa: BLE001 - this request fails; the others of the call still start
            sender.send(reply.error(f"xform: {type(e).__name__}: {e}", "server"), flags=FINAL)
            return
        self.watcher.add(future, request.is_cancelled)
        future.add_done_callback(lambda f: self.outbox.put((reply, lambda: self.finish(f, job, reply))))

    def document(self, job, reply):
        """A document request, on a thread of its own: its sentences join the running batch."""
        from xform.serving.handler import document_outcome

        result = document_outcome(self.scheduled, job)
        final = reply.error(result) if isinstance(result, str) else response(result)  # a ServerFault: a 500
        self.outbox.put((reply, lambda: reply.sender.send(final, flags=FINAL)))

    def finish(self, future, job, reply):
        from xform.errors import InputError
        from xform.runtime.scheduling.scheduler import Cancelled
        from xform.serving.handler import job_outputs, said

        self.watcher.forget(future)  # waits for a question under way: none is asked after the answer

        try:
            result = response(job_outputs(self.translator, job, future.result()))
        except Cancelled:
            pb_utils.Logger.log_info("xform: a request was cancelled; its rows left the running batch")
            reply.sender.send(flags=FINAL)  # the client is gone: nothing to say, the request is closed
            return
        except InputError as e:
            result = reply.error(said(e))
        except Exception as e:  # noqa: BLE001 - a backend failure fails this request, not the server
            result = reply.error(f"decoding failed: {type(e).__name__}: {e}", "server")
        reply.sender.send(result, flags=FINAL)

    def finalize(self):
        if self.role == "engine":
            self.watcher.close()
            self.documents.shutdown(wait=False, cancel_futures=True)
            self.scheduler.close()  # what was queued or running is told Cancelled: its FINAL is in the outbox
            self.outbox.put(None)
            self.responder.join(30)
            self.stall_stop.set()
        if self.role == "front":
            self.pool.shutdown(wait=False)
