"""Errors of the run tracker. `str()` is one line naming the file or run and what to do."""

from __future__ import annotations

from engine.config import ConfigError


class TrackerError(ConfigError):
    """The tracker database or a run cannot be used as asked (a `ConfigError`: the CLI prints it as one
    line and exits 2)."""


class RunNotFound(TrackerError):
    """No run has the given id or name."""


class SchemaError(TrackerError):
    """The database was made by another (newer or unknown) program or version."""
