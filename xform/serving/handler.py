"""One Triton `execute` call: requests in, one response (outputs or an error) per request out.

The tensors are serving/tensors.py's table (docs/serving.md lists it). `parse` is Triton's
door into the runtime's one Request (runtime/decoding/request.py), a bad request getting an error that
names the input at fault, from that table; `execute` decodes the good ones together through the
runtime's Scheduler, as the in-flight model does: each request keeps its own strategy and length,
so each response, carrying only its own rows, equals what `Session.generate` / `translate` gives
for that request alone. With `num_return_sequences` k > 1, `output_ids` / `translation` /
`scores` are each row's best and `hypothesis_ids`, `hypotheses` and `hypothesis_scores` all k,
best first.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from xform.errors import InputError, SettingError, XformError, render
from xform.runtime.decoding import controls
from xform.runtime.decoding.controls import Control
from xform.runtime.decoding.request import Request, Result, TextOptions, refuse_unknown
from xform.runtime.documents.translate import AUTO
from xform.runtime.scheduling.scheduler import Scheduler
from xform.runtime.text.glossary import Glossary
from xform.runtime.text.results import confidences, unmet
from xform.runtime.text.terminology import Terminology
from xform.runtime.text.text_request import SourceError, TextRequest, blank, generation
from xform.runtime.text.translator import Translator
from xform.serving import tensors
from xform.serving.documents import NOT_WITH_DOCUMENTS, DocumentJob, document_outputs


class ServerFault(str):
    """An error message that is the server's, not the request's (Triton INTERNAL, HTTP 500); a plain
    message is the request's fault (INVALID_ARG, HTTP 400)."""


@dataclass
class Job:
    """A parsed request: its place in the call and the one Request every door builds."""

    index: int  # the request's position in the call
    request: Request
    asked: TextRequest | None = None  # what `request` was converted from: its confidence and unmet terms

    @property
    def rows(self) -> list[list[int]]:
        """Source ids, one list per row of the request."""
        return self.request.sources()

    @property
    def texts(self) -> list[str] | None:
        return None if self.request.texts is None else list(self.request.texts)


# -- tensors -----------------------------------------------------------------------------------------
# the numpy kinds a control's tensor may come as (Triton's dtype for it, or what a Python caller
# gives: any integer for an INT32, an integer for a float, an integer for a flag, bytes or str)
ACCEPTS = {"int": "iu", "float": "iuf", "bool": "biu", "choice": "OSU", "ids": "iu"}


def typed(name: str, value: np.ndarray, kind: str) -> np.ndarray:
    """`value` as an array, InputError naming the input where its type is not `kind`'s
    (tensors.KIND_TYPES: an INT32 that came as strings or None, say)."""
    arr = np.asarray(value)
    if arr.dtype.kind not in ACCEPTS[kind]:
        found = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in arr.reshape(-1)[:3].tolist()]
        raise InputError(f"input {name!r}: expected {tensors.KIND_TYPES[kind][0]} values, found {arr.dtype} "
                         f"{found}")
    return arr


def one(name: str, value: np.ndarray | None, dtype=None):
    """A numeric input that holds one value per request (every row the same): that value, or None."""
    if value is None:
        return None
    flat = np.asarray(value, dtype).reshape(-1)
    if flat.size == 0 or (flat != flat[0]).any():
        raise InputError(f"input '{name}': one value per request, found {flat.tolist()}")
    return flat[0]


def one_flag(name: str, value: np.ndarray | None) -> bool:
    return bool(one(name, None if value is None else typed(name, value, "bool")))


def one_row(name: str, value: np.ndarray | None) -> list | None:
    """A list input ([b, n]) that every row of the request repeats: its first row."""
    if value is None:
        return None
    arr = np.asarray(value, dtype=object if np.asarray(value).dtype == object else None)
    arr = arr.reshape(arr.shape[0], -1) if arr.ndim > 1 else arr.reshape(1, -1)
    if any(list(r) != list(arr[0]) for r in arr):
        raise InputError(f"input '{name}': the same list in every row of a request, found {arr.tolist()}")
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in arr[0]]


def strings(name: str, value: np.ndarray) -> list[str]:
    out = []
    for item in np.asarray(value, dtype=object).reshape(-1):
        try:
            out.append(item.decode("utf-8") if isinstance(item, bytes) else str(item))
        except UnicodeDecodeError as e:
            raise InputError(f"input '{name}': not UTF-8 ({e})") from None
    return out


def one_string(name: str, value: np.ndarray | None) -> str | None:
    if value is None:
        return None
    flat = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
            for v in np.asarray(value, dtype=object).reshape(-1)]
    if not flat or any(v != flat[0] for v in flat):
        raise InputError(f"input '{name}': one value per request, found {flat}")
    return flat[0]


def control_value(control: Control, value: np.ndarray | None) -> Any:
    """A served control's value from its tensor (None where absent), by its kind (runtime/decoding/controls.py)."""
    name = control.tensor or control.name
    if value is None:
        return None
    value = typed(name, value, control.kind)
    if control.kind == "int":
        v = int(one(name, value))
        if control.least is not None and v < control.least:
            raise InputError(f"input '{name}': must be at least {control.least}, found {v}")
        return v
    if control.kind == "float":
        return float(one(name, value, np.float64))
    if control.kind == "bool":
        return one_flag(name, value) or None  # false: the bundle's default
    if control.kind == "choice":
        word, choices = one_string(name, value), control.choices or {}
        if word is None or word not in choices:
            raise InputError(f"input '{name}': one of {sorted(choices)}, found {word!r}")
        return choices[word]
    ids = one_row(name, value)
    return [int(i) for i in ids] if ids else None


def said(e: Exception, **words: str) -> str:
    """The runtime's error in the server's words: each setting it names as the input that gives
    it (tensors.names: `input 'num_beams'`), or as `words` says."""
    names = {**tensors.names(), **words}
    return render(e, lambda setting: names.get(setting, setting))


def about(name: str, e: Exception, **words: str) -> InputError:
    """The runtime's error `e` as one about the input `name`, unless it names its input itself."""
    text = said(e, **words)
    return InputError(text if text.startswith("input '") else f"input '{name}': {text}")


def request_error(e: InputError) -> InputError:
    """A request error in the server's words, named by the input at fault: the table's input for
    the settings a SettingError names, else the error as it is."""
    if isinstance(e, SettingError):
        return about(tensors.input_for(e.settings), e)
    return InputError(said(e)) if e.settings else e


def source_inputs(session, inputs: dict[str, np.ndarray | None]) -> tuple[str, tuple]:
    """(the input named, its sources) of a request's `text` (texts) or `src_ids` (id rows, checked
    as tensors: int64, two dimensions)."""
    text, ids = inputs.get("text"), inputs.get("src_ids")
    if (text is None) == (ids is None):
        raise InputError(f"exactly one of the inputs 'text' and 'src_ids' per request; found "
                         f"{'both' if text is not None else 'neither'}")
    if text is not None:
        if session.tokenizer is None:
            raise InputError("input 'text': this bundle has no tokenizer; send token ids as 'src_ids'")
        return "text", tuple(strings("text", text))
    src = np.asarray(ids)
    if src.dtype != np.int64:
        raise InputError(f"input 'src_ids': expected INT64, found {src.dtype}")
    try:
        src, lengths = session.prepare(np.ascontiguousarray(src), None)
    except InputError as e:
        raise InputError(f"input 'src_ids': {e}") from None
    return "src_ids", tuple(tuple(int(i) for i in row[:n]) for row, n in zip(src, lengths))


def settings_of(inputs: dict[str, np.ndarray | None]) -> dict[str, Any]:
    """The request's generation settings from its control inputs (None: the bundle's default)."""
    return {c.name: control_value(c, inputs.get(c.tensor)) for c in controls.CONTROLS if c.tensor}


def glossary_input(value: np.ndarray | None) -> tuple[bool, Glossary | None]:
    """(whether the request gives a `glossary`, the glossary read: TSV text, or TBX, text
    starting with `<`); a blank one is given and None: no glossary, not even the model's. A
    malformed one is refused naming the input and its line."""
    if value is None:
        return False, None
    texts = strings("glossary", value)
    if not texts or any(t != texts[0] for t in texts):
        raise InputError("input 'glossary': one glossary per request (the same in every row)")
    data = texts[0].removeprefix("\ufeff")
    if not data.strip():
        return True, None
    tbx = data.lstrip().startswith("<")
    return True, (Glossary.from_tbx if tbx else Glossary.from_tsv)(data, name="(TBX)" if tbx else "(TSV)")


PAIRED: dict[tuple, tuple[Glossary, Glossary]] = {}  # the model's glossary for a language pair, made once


def paired(glossary: Glossary, src_lang: str | None, tgt_lang: str | None, cached: bool) -> Glossary:
    """The glossary's entries for the pair (Glossary.pair); the model's (`cached`) kept for the
    next request of the pair, its terms' patterns compiled once."""
    if not cached:
        return glossary.pair(src_lang, tgt_lang)
    key = (id(glossary), src_lang, tgt_lang)
    hit = PAIRED.get(key)
    if hit is None or hit[0] is not glossary:
        if len(PAIRED) >= 64:
            PAIRED.clear()
        hit = PAIRED[key] = (glossary, glossary.pair(src_lang, tgt_lang))
    return hit[1]


def model_glossary(text: Translator) -> Glossary | None:
    """The glossary the model's translator holds (triton_model.py gives it a Glossary read once)."""
    held = text.glossary
    if held is None or isinstance(held, Glossary):
        return held
    return Glossary.load(held) if isinstance(held, (str, Path)) else Glossary.of(held)


def request_terminology(text: Translator, inputs: dict[str, np.ndarray | None], src_lang: str | None,
                        tgt_lang: str | None) -> Terminology | None:
    """The terms a text request's translations must hold: its `glossary` (else the model's; a
    blank one: none) for the pair, and its `keep` patterns (else the model's); None for none."""
    given, glossary = glossary_input(inputs.get("glossary"))
    keep = tuple(one_row("keep", inputs.get("keep")) or ()) or tuple(
        [text.keep] if isinstance(text.keep, str) else text.keep)
    if not given:
        glossary = model_glossary(text)
    if glossary is None and not keep:
        return None
    src = None if src_lang == AUTO else src_lang  # a document's paragraphs: any source language
    return Terminology(None if glossary is None else paired(glossary, src, tgt_lang, not given), keep)


def text_request(session, inputs: dict[str, np.ndarray | None], truncate: bool,
                 text: Translator | None = None) -> tuple[str, TextRequest]:
    """(the sources' input, the request's TextRequest) from its tensors, parsed only: what they
    mean is the one conversion's (text_request.convert). `text`: the model's translator, whose
    glossary a request of texts without its own takes."""
    src_lang, tgt_lang = one_string("src_lang", inputs.get("src_lang")), one_string("tgt_lang", inputs.get("tgt_lang"))
    replace_unknowns = one_flag("replace_unknowns", inputs.get("replace_unknowns"))
    if replace_unknowns and inputs.get("text") is None:
        raise InputError("input 'replace_unknowns': goes with 'text' (it copies source text)")
    name, sources = source_inputs(session, inputs)
    prefix = inputs.get("target_prefix")
    scores = one_flag("return_scores", inputs.get("return_scores"))
    terms = None
    if name == "text" and text is not None:
        terms = request_terminology(text, inputs, src_lang, tgt_lang)
    elif inputs.get("glossary") is not None or inputs.get("keep") is not None:
        raise InputError(f"input '{'glossary' if inputs.get('glossary') is not None else 'keep'}': finds its terms "
                         "in text: send the sources as 'text', not 'src_ids'")
    return name, TextRequest(sources, None if prefix is None else tuple(strings("target_prefix", prefix)),
                             tuple(one_row("bad_words", inputs.get("bad_words")) or ()),
                             TextOptions("tokens" if scores else False, src_lang, tgt_lang, truncate,
                                         replace_unknowns=replace_unknowns, terminology=terms,
                                         qe=one_flag("qe", inputs.get("qe"))),
                             settings_of(inputs),
                             return_attention=one_flag("return_attention", inputs.get("return_attention")))


def parse(text: Translator, index: int, inputs: dict[str, np.ndarray | None], max_rows: int | None = None
          ) -> Job | DocumentJob:
    """Triton's door: a request's tensors (None where absent) as a Job holding its Request (with
    `document_format`, a DocumentJob: serving/documents.py), through the translator the model
    holds; InputError names the tensor at fault. `max_rows`: the decoder rows (sources x beams or
    sequences) one request may ask for, so that no request can make the server allocate beyond it.
    An input the model does not declare is refused with the nearest (Triton itself refuses one
    before the model sees it; a caller of this function gets the same)."""
    refuse_unknown([k for k, v in inputs.items() if v is not None], (t.name for t in tensors.inputs()), "input")
    truncate = one_flag("truncate", inputs.get("truncate"))
    if inputs.get("document_format") is not None:
        src_lang = one_string("src_lang", inputs.get("src_lang"))
        return document_job(text, index, inputs, src_lang, one_string("tgt_lang", inputs.get("tgt_lang")),
                            truncate)
    name = "text" if inputs.get("text") is not None else "src_ids"
    try:
        name, asked = text_request(text.session, inputs, truncate, text)
        request = text.request(asked)
    except SourceError as e:
        raise about(name, e, truncate="send truncate=true") from None
    except InputError as e:  # the settings' own checks, named by their input
        raise request_error(e) from None
    if max_rows is not None and request.rows > max_rows:
        width = request.rows // request.batch
        raise InputError(f"input '{'num_beams' if request.generation.strategy == 'beam' else name}': "
                         f"{request.batch} rows x {width} = {request.rows} decoder rows, more than this model's "
                         f"max_rows {max_rows}")
    return Job(index, request, asked)


def document_job(text: Translator, index: int, inputs: dict[str, np.ndarray | None], src_lang: str | None,
                 tgt_lang: str | None, truncate: bool) -> DocumentJob:
    """A request with `document_format` as a DocumentJob; InputError names the input at fault."""
    markup = one_string("document_format", inputs["document_format"])
    for name in NOT_WITH_DOCUMENTS:
        if inputs.get(name) is not None:
            raise InputError(f"input '{name}': goes with lines, not with 'document_format' (a document's "
                             "translation is one text)")
    rows = inputs.get("text")
    if rows is None:
        raise InputError("input 'document_format': goes with 'text' (each row a document)")
    if src_lang is not None and src_lang != AUTO:
        text.policy.check_src_lang(src_lang)
    asked = TextRequest((), bad_words=tuple(one_row("bad_words", inputs.get("bad_words")) or ()),
                        options=TextOptions(False, src_lang, tgt_lang, truncate), settings=settings_of(inputs))
    try:
        gen = generation(text.policy, asked)
        terms = request_terminology(text, inputs, src_lang, tgt_lang)  # each sentence's terms
    except InputError as e:
        raise request_error(e) from None
    if gen.num_return_sequences > 1:
        raise InputError("input 'num_return_sequences': a document's translation is one text")
    return DocumentJob(index, strings("text", rows), gen,
                       TextOptions(False, src_lang, tgt_lang, truncate, terminology=terms),
                       markup or "text", one_flag("skip_target_language", inputs.get("skip_target_language")))


def trim(out: np.ndarray, pad: int) -> np.ndarray:
    """Drop trailing columns that are pad in every row (what decoding these rows alone returns)."""
    keep = out.shape[1]
    while keep > 0 and (out[:, keep - 1] == pad).all():
        keep -= 1
    return out[:, :keep]


def blanked(result: Result, texts: list[str] | None, n: int, pad: int) -> Result:
    """An empty (or blank) source text translates to nothing, as a blank line does at every other
    door: its n hypotheses' ids all pad (no token), their scores 0, whatever the decode made of it."""
    blank = [i for i, t in enumerate(texts or []) if not t.strip()]
    if not blank:
        return result
    rows = np.concatenate([np.arange(i * n, (i + 1) * n) for i in blank])
    ids = result.ids.copy()
    ids[rows] = pad

    def zeroed(a: np.ndarray | None) -> np.ndarray | None:
        if a is None:
            return None
        a = a.copy()
        a[rows] = 0
        return a
    return Result(ids, zeroed(result.scores), zeroed(result.token_scores), zeroed(result.attention))


def job_outputs(text: Translator, job: Job, result: Result) -> dict[str, np.ndarray]:
    """A request's outputs from its Result."""
    request, session = job.request, text.session
    n = len(result) // request.batch  # hypotheses a row: num_return_sequences
    terms = terms_outputs(text, job, result, n)
    result = blanked(result, job.texts, n, session.pad_id)
    ids = trim(result.ids, session.pad_id)
    outputs = {"output_ids": np.ascontiguousarray(ids[::n], np.int64)}  # each row's best
    if session.tokenizer is not None:
        texts = text.policy.decode_rows(ids, n, job.rows, job.texts,
                                                result.attention if request.replace_unknowns else None)
        outputs["translation"] = np.array([[t.encode("utf-8")] for t in texts[::n]], dtype=object)
        if n > 1:
            outputs["hypotheses"] = np.array([t.encode("utf-8") for t in texts], dtype=object).reshape(-1, n)
    if n > 1:
        outputs["hypothesis_ids"] = np.ascontiguousarray(ids.reshape(request.batch, n, -1), np.int64)
    if request.return_attention:  # each row's best: (rows, its tokens, src_len)
        assert result.attention is not None  # asked for: the decode returned it
        outputs["attention"] = np.ascontiguousarray(result.attention[::n, :ids.shape[1]], np.float32)
    if request.return_scores:
        assert result.scores is not None and result.token_scores is not None  # asked for: returned
        outputs["scores"] = result.scores[::n, None].astype(np.float32)
        outputs["token_scores"] = np.ascontiguousarray(result.token_scores[::n, :ids.shape[1]], np.float32)
        if n > 1:
            outputs["hypothesis_scores"] = result.scores.reshape(-1, n).astype(np.float32)
    return {**outputs, **terms}


def terms_outputs(text: Translator, job: Job, result: Result, n: int) -> dict[str, np.ndarray]:
    """With qe, each row's best hypothesis' `confidence` (results.confidences; a blank row's 1:
    nothing decoded, as its score 0 says); with a terminology, the terms each row's best lacks
    (`unmet`, joined by tabs)."""
    asked, out = job.asked, dict[str, np.ndarray]()
    if asked is None:
        return out
    if asked.options.qe:
        sure = confidences(text.policy, job.request, result)[::n]
        empty = [blank(s) for s in asked.sources]
        out["confidence"] = np.array([[1.0 if e else c] for c, e in zip(sure, empty)], np.float32)
    if asked.options.terminology is not None:
        missed = unmet(text.policy, asked, result)[::n]
        out["unmet"] = np.array([["\t".join(m).encode("utf-8")] for m in missed], dtype=object)
    return out


def execute(text: Translator, requests: list[dict[str, np.ndarray | None]],
            vocab_map=None, max_rows: int | None = None) -> list[dict[str, np.ndarray] | str]:
    """For each request, its outputs (`output_ids` [b, n] int64, `translation` [b, 1] bytes when
    the bundle has a tokenizer, `scores` and `token_scores` when asked), or an error message (a
    ServerFault when the server is at fault, else the request is). The requests decode together
    through the runtime's Scheduler (the in-flight model's one running batch, here for one call):
    each keeps its own strategy and length, so each answer is what it gives alone. With a
    `vocab_map` (the model's --vocab-map), a text request decodes alone over what its sources allow."""
    results: list[Any] = [None] * len(requests)
    jobs: list[Job] = []
    documents: list[DocumentJob] = []
    for i, inputs in enumerate(requests):
        try:
            job = parse(text, i, inputs, max_rows)
        except XformError as e:
            results[i] = said(e)
            continue
        (jobs if isinstance(job, Job) else documents).append(job)  # type: ignore[arg-type]
    alone = [j for j in jobs if vocab_map is not None and j.request.texts is not None]
    together = [j for j in jobs if j not in alone]
    for job, outcome in [*decoded_together(text, together, max_rows), *decoded_alone(text, alone, vocab_map)]:
        results[job.index] = outcome
    for document in documents:
        results[document.index] = document_outcome(text, document)
    return results


def document_outcome(text: Translator, job: DocumentJob) -> dict[str, np.ndarray] | str:
    """A document request's outputs, or its error (the request's, named by its input, or the server's)."""
    try:
        return document_outputs(text, job)
    except InputError as e:
        return str(request_error(e))
    except Exception as e:  # noqa: BLE001 - a backend failure fails this request, not the server
        return ServerFault(f"decoding failed: {type(e).__name__}: {e}")


def decoded_together(text: Translator, jobs: list[Job], max_rows: int | None):
    """(job, outputs or error) for requests decoded through one Scheduler."""
    if not jobs:
        return []
    session = text.session
    rows = max_rows or sum(j.request.rows for j in jobs)
    scheduler = Scheduler(session, max_rows=max(rows, max(j.request.rows for j in jobs)), max_queue=len(jobs))
    futures = []
    out: list[tuple[Job, Any]] = []
    for job in jobs:
        try:
            futures.append((job, scheduler.enqueue(session.decode_item(job.request))))
        except InputError as e:
            out.append((job, str(request_error(e))))
    scheduler.run_until_idle()
    for job, future in futures:
        out.append((job, outcome(text, job, future.result)))
    return out


def decoded_alone(text: Translator, jobs: list[Job], vocab_map):
    """(job, outputs or error) for text requests restricted to what their sources allow."""
    out, session = [], text.session
    for job in jobs:
        texts = job.texts or []
        restricted = replace(job.request, vocabulary=text.policy.allowed_ids(vocab_map, texts))
        out.append((job, outcome(text, job, lambda r=restricted: session.run(r))))
    return out


def outcome(text: Translator, job: Job, result) -> dict[str, np.ndarray] | str:
    """The job's outputs from `result()`, or its error: the request's (named by its input) or,
    for anything else, the server's."""
    try:
        return job_outputs(text, job, result())
    except InputError as e:
        return str(request_error(e))
    except Exception as e:  # noqa: BLE001 - a backend failure fails these requests, not the server
        return ServerFault(f"decoding failed: {type(e).__name__}: {e}")
