"""Request parameters: what a client sent that is no input of the model, refused naming the key
and the input it likely means (Triton's generate door makes each such key of a body a parameter)."""
from __future__ import annotations

import difflib
import json
from typing import Any, Iterable, Mapping

from xform.errors import InputError
from xform.runtime.decoding.controls import CT2_NAMES
from xform.serving import tensors

# Triton 2.51's generate door (POST /v2/models/NAME/generate) makes each key of the body that names
# an input of the model a tensor, and every other key (a string, an integer, a float or a bool) a
# request parameter, which reaches the model beside its tensors; the infer door's and gRPC's
# `parameters` arrive the same way. The body's `id` is the request's id (Triton makes it a
# parameter too); Triton's own (`triton_...`, sequence_id, priority, timeout) never reach a model.
GENERATE_ID = "id"


def parameters_of(raw: str | None) -> dict[str, Any]:
    """A request's parameters from Triton's JSON of them (`request.parameters()`; {} where none)."""
    try:
        given = json.loads(raw or "{}")
    except ValueError:
        return {}
    return given if isinstance(given, dict) else {}


def meant(key: str, known: Iterable[str]) -> str | None:
    """The input a foreign or misspelt key means: by CTranslate2's name (`beam_size`), by the
    setting an input gives (`bad_words_ids`), else the nearest by its spelling; None where none is
    near."""
    known = sorted(known)
    setting = CT2_NAMES.get(key, key)
    named = next((t.name for t in tensors.inputs() if setting in (t.name, t.setting)), None)
    if named in known:
        return named
    near = difflib.get_close_matches(key, known, 1)
    return near[0] if near else None


def refuse_parameters(parameters: Mapping[str, Any], known: Mapping[str, str], taken: Iterable[str] = ()) -> None:
    """InputError for a request parameter the model does not take: none does but `taken` (xform's
    own) and the generate door's `id`. `known`: the model's inputs (name -> Triton's TYPE_*). One
    named as an input is that input sent as a parameter (the infer door's `parameters`), refused
    naming the tensor expected and the parameter found; any other is unknown (a misspelt key of a
    generate body, say), refused with the input it likely means and the model's inputs."""
    given = sorted(k for k in parameters if k not in {*taken, GENERATE_ID} and not k.startswith("triton_"))
    for key in given:
        if key in known:
            raise InputError(f"input {key!r}: expected a {known[key]} tensor (an entry of the body's 'inputs', or "
                             f"a key of a generate body), found a request parameter {key!r} = "
                             f"{parameters[key]!r} ({type(parameters[key]).__name__}); send it as the tensor")
    if given:
        said = [f"{k!r} (did you mean {m!r}?)" if (m := meant(k, known)) else repr(k) for k in given]
        many = len(given) > 1
        raise InputError(f"unknown key{'s' if many else ''} {', '.join(said)}: no input of this model (Triton passed "
                         f"{'them as request parameters' if many else 'it as a request parameter'}, which it does not "
                         f"take); its inputs: {', '.join(sorted(known))}")
