"""Option groups: flags that go together reach a command as one object.

A group's decorator declares its click options (they keep their names, help, defaults and
their place in --help) and wraps the command: the options' values are taken out of the
keywords click passes, built into one object, and that object is passed instead, under one
name. `pass_group` does the same for options declared one by one among a command's own
(several commands share a group whose flags' help differs, or whose flags lie apart in --help).

A builder only gathers values (it raises nothing), so that a command checks its flags in the
order it always has: a group whose values need checking against each other (batching,
decoding) says so with a method the command calls where it checked them before.

    Placement          --backend --device --threads --allow-tf32 --no-cuda-graph: where a bundle runs
                       (pass_placement: each command declares the ones it has, with its own help)
    options.py         BatchingFlags (batching_options), TextOptions (text_options),
                       GenerationFlags (generation_options)
    documents.py       DocumentFlags (document_options)
    decode.py          run's own: Sources, Output (measure.py: CheckFlags, BenchmarkFlags)
    corpus.py          RayRun (--ray and its workers' flags)
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Callable, Sequence


def pass_group(param: str, build: Callable[..., Any], names: Sequence[str]):
    """A decorator over a click command's function: the values of the options `names` (declared
    anywhere among the command's options) given to `build` as keywords, and what it builds
    passed to the function as `param` in their place."""
    def decorate(fn):
        @functools.wraps(fn)
        def command(*args, **kwargs):
            kwargs[param] = build(**{name: kwargs.pop(name) for name in names})
            return fn(*args, **kwargs)
        return command
    return decorate


def option_group(param: str, build: Callable[..., Any], options: Sequence[Callable], also: Sequence[str] = ()):
    """A decorator declaring click `options` (the first listed first in --help) whose values, with
    those of the options `also` names (declared elsewhere), `build` turns into the one object the
    command's function gets as `param`."""
    def decorate(fn):
        names = list(also)  # the options' parameter names, known once click has made them
        command = pass_group(param, build, names)(fn)
        before = len(getattr(command, "__click_params__", ()))
        for option in reversed(options):
            command = option(command)
        names.extend(p.name for p in command.__click_params__[before:])
        return command
    return decorate


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a command runs its bundle: the backend, the device (None: the backend's default),
    intra-op threads (None: all cores), TF32 matmuls, the decoder step captured as a CUDA graph
    (None: where it can be; False: --no-cuda-graph)."""
    backend: str = "ort"
    device: str | None = None
    threads: int | None = None
    allow_tf32: bool = False
    cuda_graph: bool | None = None

    @classmethod
    def of(cls, backend: str = "ort", device: str | None = None, threads: int | None = None,
           allow_tf32: bool = False, uncaptured: bool = False) -> "Placement":
        """From the flags (--no-cuda-graph's parameter is `uncaptured`)."""
        return cls(backend, device, threads, allow_tf32, False if uncaptured else None)

    def load(self, bundle: Path):
        """The bundle's session, opened here."""
        import xform
        return xform.load(bundle, backend=self.backend, device=self.device, threads=self.threads,
                          allow_tf32=self.allow_tf32, cuda_graph=self.cuda_graph)

    def open(self, bundle: Path):
        """The bundle's translator (its session opened here): what a command holds and passes on."""
        from xform.runtime.text.translator import Translator
        return Translator(self.load(bundle))


def pass_placement(*names: str):
    """A Placement `where` from the command's own options `names` (--backend, --device, --threads;
    run's also --allow-tf32 and --no-cuda-graph, `uncaptured`)."""
    return pass_group("where", Placement.of, names)
