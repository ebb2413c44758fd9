"""The one error hierarchy of xform.

Library code raises these; the CLI turns them into exit code 1 with the message on stderr.
Messages say what went wrong, which file / tensor / flag, what was expected and what was found.
"""
from __future__ import annotations


class XformError(Exception):
    """Base class of every error xform raises on purpose."""


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
    fields, or `target_prefix`), first the first, so each front door names them its own way."""

    def __init__(self, message: str, *settings: str):
        super().__init__(message)
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
