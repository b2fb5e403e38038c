"""The one error the data pipeline raises for bad input: a file, column, row or setting to change."""

from __future__ import annotations

from engine.config import ConfigError


class DataError(ConfigError):
    """Unusable dataset input. `str()` is one line naming the source, the row and the field, and the fix."""


def where(source: str, row: int | None = None, field: str | None = None) -> str:
    """`"source 'x.json' row 12 field 'output'"`-style location prefix for a `DataError` message."""
    parts = [f"source {source!r}"]
    if row is not None:
        parts.append(f"row {row}")
    if field is not None:
        parts.append(f"field {field!r}")
    return " ".join(parts)
