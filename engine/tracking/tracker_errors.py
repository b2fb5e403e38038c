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


class TrackerReadOnly(TrackerError):
    """The tracker database (or its folder) cannot be written: a file mode, an immutable file, a
    read-only filesystem. `path` is the database file; `why` what SQLite or the OS said (optional)."""

    def __init__(self, path: object, why: str = "") -> None:
        self.path = path
        super().__init__(
            "the tracker database is read-only" + (f" ({why})" if why else ""),
            field=str(path),
            hint="make it and its folder writable for this user, or point TUNEBENCH_HOME at a folder you can write",
        )
