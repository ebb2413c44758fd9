"""A seeded mix of Triton requests for an xform model, how to send each, and what the same request
gives decoded alone in-process: used by tests/serving/test_load.py (a few hundred requests) and
scripts/soak_serve.py (minutes to hours).

Each request translates one number (the demo bundle's task) with its own decoding: greedy or beams
2 to 5, a target prefix or none, repetition controls or none, max_new_tokens from 1 to the cap,
scores always returned; sent over HTTP or gRPC to the plain model, or over a gRPC stream to the
in-flight engine (NAME-stream), streaming its tokens or not, and some streams cancelled after their
first response.
"""
from __future__ import annotations

import queue
from dataclasses import dataclass

import numpy as np

from xform.runtime.text.translator import Translator

PREFIXES = ("one", "forty", "nine hundred", "seven thousand")


@dataclass(frozen=True)
class Request:
    text: str
    num_beams: int
    max_new_tokens: int
    transport: str  # http | grpc (the plain model) | stream (gRPC stream to NAME-stream)
    prefix: str | None = None
    repetition_penalty: float | None = None
    no_repeat_ngram_size: int | None = None
    stream: bool = False  # with transport stream: a response a token (greedy), else one final
    cancel_after: int | None = None  # with transport stream: cancel after this many responses


class LoadMix:
    """Requests drawn from a seeded generator; `streaming`: whether NAME-stream exists (in-flight)."""

    def __init__(self, session, seed: int = 0, streaming: bool = True, cap: int = 24, cancel: float = 0.05):
        """`cancel`: the share of requests that are long streams cancelled after their first token.
        Cancelling only long decodes keeps the cancellation away from the final response: Triton
        2.51 (nvidia-pytriton 0.7.0's) can crash when a gRPC cancellation races a request's
        completion (triton-inference-server/server#7840, fixed in r24.12; docs/serving.md)."""
        self.rng = np.random.default_rng(seed)
        self.streaming, self.cancel = streaming, cancel
        self.cap = min(cap, session.config.max_len - 4)  # room for a prefix

    def request(self) -> Request:
        rng = self.rng
        if self.streaming and rng.random() < self.cancel:  # eight-word numbers, cut after the first word
            text = " ".join(str(int(rng.integers(10**5, 10**6))) for _ in range(4))
            return Request(text=text, num_beams=1, max_new_tokens=self.cap, transport="stream", stream=True,
                           cancel_after=1)
        text = str(int(rng.integers(0, 10 ** int(rng.integers(1, 9)))))
        beams = int(rng.choice([1, 1, 2, 3, 4, 5]))
        transport = str(rng.choice(["http", "grpc", "stream", "stream"] if self.streaming else ["http", "grpc"]))
        return Request(
            text=text, num_beams=beams, max_new_tokens=int(rng.integers(1, self.cap + 1)), transport=transport,
            prefix=str(rng.choice(PREFIXES)) if rng.random() < 0.25 else None,
            repetition_penalty=1.3 if rng.random() < 0.2 else None,
            no_repeat_ngram_size=2 if rng.random() < 0.2 else None,
            stream=transport == "stream" and beams == 1 and bool(rng.random() < 0.7))


def inputs(mod, req: Request, stream_input: bool = False) -> list:
    """tritonclient inputs of one request (mod: tritonclient.http or tritonclient.grpc)."""
    def tensor(name, value, dtype, np_dtype):
        t = mod.InferInput(name, [1, 1], dtype)
        t.set_data_from_numpy(np.array([[value]], dtype=np_dtype))
        return t
    out = [tensor("text", req.text.encode(), "BYTES", object), tensor("num_beams", req.num_beams, "INT32", np.int32),
           tensor("max_new_tokens", req.max_new_tokens, "INT32", np.int32),
           tensor("return_scores", True, "BOOL", bool)]
    if req.prefix is not None:
        out.append(tensor("target_prefix", req.prefix.encode(), "BYTES", object))
    if req.repetition_penalty is not None:
        out.append(tensor("repetition_penalty", req.repetition_penalty, "FP32", np.float32))
    if req.no_repeat_ngram_size is not None:
        out.append(tensor("no_repeat_ngram_size", req.no_repeat_ngram_size, "INT32", np.int32))
    if stream_input:
        out.append(tensor("stream", req.stream, "BOOL", bool))
    return out


def answer(result) -> dict:
    return {"ids": result.as_numpy("output_ids"), "text": result.as_numpy("translation").reshape(-1)[0].decode(),
            "score": float(result.as_numpy("scores").reshape(-1)[0])}


def send_http(client, name: str, req: Request) -> dict:
    import tritonclient.http as th
    return answer(client.infer(name, inputs(th, req)))


def send_grpc(tg, url: str, name: str, req: Request, timeout: float = 120.0) -> dict:
    """A plain gRPC request to NAME, or a gRPC stream to NAME-stream: its final answer, or
    {"cancelled": True} for a stream cancelled after `cancel_after` responses."""
    client = tg.InferenceServerClient(url)
    try:
        if req.transport == "grpc":
            return answer(client.infer(name, inputs(tg, req)))
        got: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        try:
            client.async_stream_infer(name + "-stream", inputs(tg, req, stream_input=True),
                                      enable_empty_final_response=True)
            responses = 0
            while True:
                result, error = got.get(timeout=timeout)
                if error is not None:
                    raise RuntimeError(f"{req}: {error}")
                responses += 1
                if req.cancel_after is not None and responses >= req.cancel_after:
                    client.stop_stream(cancel_requests=True)
                    return {"cancelled": True}
                if result.get_response().parameters["triton_final_response"].bool_param:
                    return answer(result)
        finally:
            client.stop_stream()
    finally:
        client.close()


def reference_answer(session, req: Request) -> dict:
    """The request decoded alone in-process: what the server must answer."""
    settings: dict = {"max_new_tokens": req.max_new_tokens, "num_beams": req.num_beams, "return_scores": True}
    if req.prefix is not None:
        settings["target_prefix"] = [Translator(session).policy.target_ids(req.prefix)]
    if req.repetition_penalty is not None:
        settings["repetition_penalty"] = req.repetition_penalty
    if req.no_repeat_ngram_size is not None:
        settings["no_repeat_ngram_size"] = req.no_repeat_ngram_size
    ids, scores = session.generate(Translator(session).policy.encode_texts([req.text]), **settings)
    return {"ids": ids, "text": session.tokenizer.decode(ids[0]), "score": float(scores[0])}
