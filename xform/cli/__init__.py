"""The `xform` command line: thin click commands over the library, one module a command group.

Each command turns flags into one library call and prints a summary. Errors: an XformError is a
message on stderr and exit 1 (no traceback), a failed check is exit 1, bad usage is exit 2 (click),
Ctrl-C is exit 130.

    build.py     export, build-engine             decode.py    run, score
    evaluate.py  eval                             serving.py   triton, serve
    corpus.py    corpus (files, sharded, on Ray or in-process)
    options.py   the flags and helpers the commands share (decoding flags from runtime/decoding/controls.py)
    flags.py     the flag of each runtime setting, which the CLI's messages name (errors.py's markers)
    groups.py    option groups: flags that go together reach a command as one object (TextOptions, ...)
"""
from __future__ import annotations

import contextlib
import functools
import signal
import sys
import threading
import time
from typing import Callable, Iterator

import click
from rich.console import Console
from rich.markup import escape

from xform import __version__
from xform.cli.flags import said
from xform.errors import XformError
from xform.manifest import VERSION as BUNDLE_VERSION

out = Console(highlight=False, soft_wrap=True)


err = Console(stderr=True, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def stages(first: str) -> Iterator[Callable[[str], None]]:
    """What a long command is doing, stage by stage: a spinner on a terminal; elsewhere (a log, a
    CI job, a pipe) one line a stage on stderr with the seconds so far, so no step is silent.
    Yields the function that announces the next stage."""
    if err.is_terminal:
        with err.status(first) as status:
            yield status.update
        return
    start = time.monotonic()

    def announce(stage: str) -> None:
        err.print(f"[{time.monotonic() - start:6.1f} s] {escape(stage)}", highlight=False)
    announce(first)
    yield announce


INTERRUPTED = 130  # 128 + SIGINT, what shells report for a command Ctrl-C stopped
TERMINATED = 143  # 128 + SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, systemd, a job scheduler) raised where the command is, as Ctrl-C is, so that
    it leaves what Ctrl-C leaves: temporaries removed, what is kept kept (`run --output`'s
    translations so far), workers stopped. Without it the process died on the spot."""


def raise_terminated(signum, frame) -> None:
    raise Terminated()


def stopped_code(e: KeyboardInterrupt) -> int:
    """The exit code of a command a signal stopped: 143 for SIGTERM, 130 for Ctrl-C."""
    return TERMINATED if isinstance(e, Terminated) else INTERRUPTED


def handle_errors(fn):
    """The one place where library errors become exit codes (their message in the CLI's words:
    a setting named as its flag, flags.py); Ctrl-C is exit 130 with one line,
    not click's "Aborted!" and exit 1, and SIGTERM exit 143 after the same clean-up (a command
    with a stop of its own, `serve`, installs its handler over this one while it runs)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, raise_terminated) if main_thread else None
        try:
            return fn(*args, **kwargs)
        except XformError as e:
            err.print(f"[bold red]error:[/] {escape(said(e))}")  # the settings it names, as flags
            sys.exit(1)
        except KeyboardInterrupt as e:
            err.print("terminated" if isinstance(e, Terminated) else "interrupted")
            sys.exit(stopped_code(e))
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="xform",
                      message=f"%(prog)s %(version)s (bundle format {BUNDLE_VERSION})")
def main() -> None:
    """Export encoder-decoder Transformers to ONNX / TensorRT and run them, checked against PyTorch."""
    import logging

    from rich.logging import RichHandler
    logging.basicConfig(level=logging.WARNING, format="%(message)s",
                        handlers=[RichHandler(console=err, show_time=False, show_path=False)])


# the commands register themselves on `main` as they are imported
from xform.cli import build, corpus, decode, evaluate, score, serving  # noqa: E402,F401
