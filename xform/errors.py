"""The one error hierarchy of xform.

Library code raises these; the CLI turns them into exit code 1 with the message on stderr.
Messages say what went wrong, which file / tensor / setting, what was expected and what was found.

A message names a setting (a Python keyword, a GenerationConfig field, ...) by a marker, its
name in braces (`{src_lang}`), and the error lists the settings it names (`settings`). Each front
door words them its own way (`render`): `str(e)` with the names themselves (the Python door's
keywords), the CLI as its flags (cli/flags.py: `--src-lang`), the server as its inputs
(serving/tensors.py: `input 'src_lang'`). Only markers of the settings listed are words to
render, so braces elsewhere in a message (a value's repr) are left as they are. `Message` is the
same for a message that is not raised (a line's error, a warning, a plan described).
"""
from __future__ import annotations

import re
from typing import Callable, Iterable, TypeVar

MARKER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
E = TypeVar("E", bound="XformError")


def worded(template: str, settings: Iterable[str], name_of: Callable[[str], str] = str) -> str:
    """`template` with the marker of each setting in `settings` written as `name_of(setting)` (by
    default the setting's own name); other braces are left as they are."""
    named = set(settings)
    if not named:
        return template
    return MARKER.sub(lambda m: name_of(m[1]) if m[1] in named else m[0], template)


class Message(str):
    """A message that names settings by their markers: as a str, in the settings' own names (the
    Python door's words); `render(name_of)`, in a door's."""

    template: str
    settings: tuple[str, ...]

    def __new__(cls, template: str, *settings: str) -> "Message":
        self = super().__new__(cls, worded(template, settings))
        self.template, self.settings = template, settings
        return self

    def __reduce__(self):  # kept whole across processes (a corpus's workers)
        return Message, (self.template, *self.settings)

    def render(self, name_of: Callable[[str], str]) -> str:
        return worded(self.template, self.settings, name_of)

    def after(self, prefix: str) -> "Message":
        """The message behind `prefix` (a line's label, say), still naming its settings."""
        return Message(prefix + self.template, *self.settings)


def message(said: object) -> Message:
    """An error or a message as a Message, keeping the settings it names."""
    if isinstance(said, Message):
        return said
    if isinstance(said, XformError):
        return Message(said.template, *said.settings)
    return Message(str(said))


def render(said: object, name_of: Callable[[str], str]) -> str:
    """An error or a message in a door's words (`name_of`: its name for a setting); anything else
    as str gives it."""
    if isinstance(said, (XformError, Message)):
        return said.render(name_of)
    return str(said)


class XformError(Exception):
    """Base class of every error xform raises on purpose. `settings`: those its message names by
    their markers (`naming`), which `str` words as their names and `render` as a door asks."""

    settings: tuple[str, ...] = ()

    def naming(self: E, *settings: str) -> E:
        """This error, its message naming `settings` by their markers."""
        self.settings = settings
        return self

    @property
    def template(self) -> str:
        """The message as written, its markers unrendered."""
        return str(self.args[0]) if self.args else ""

    def render(self, name_of: Callable[[str], str]) -> str:
        return worded(self.template, self.settings, name_of) if self.settings else super().__str__()

    def __str__(self) -> str:
        return self.render(str)


class ConfigError(XformError, ValueError):
    """A model configuration that is inconsistent or cannot be expressed; `problems`: each reason
    (the message alone when there is one)."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems or [message]


class CheckpointError(XformError):
    """A checkpoint that is missing, corrupt, or does not match its config."""


class BundleError(XformError):
    """A bundle that is missing files, fails its hashes, or has an unknown manifest version."""


class InputError(XformError, ValueError):
    """Bad input to generate / translate: shapes, dtypes, ids outside the vocabulary, lengths."""


class SettingError(InputError):
    """A request setting out of range: `settings` names the settings at fault (GenerationConfig
    fields, or `target_prefix`), first the first, then any other its message names, so each
    front door names them its own way (the server: the input of the first it takes)."""

    def __init__(self, message: str, *settings: str):
        super().__init__(message, *settings)  # both in args: the error pickles whole
        self.settings = settings


class JoinRefused(InputError):
    """Sources that could not join a running batch, which is untouched: only they fail."""


class ToleranceError(XformError):
    """A numerical check that exceeded its tolerance."""

    def __init__(self, message: str, report=None):
        super().__init__(message)
        self.report = report


class BackendUnavailableError(XformError):
    """A backend whose package or hardware is not present."""
