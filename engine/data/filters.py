"""Row filters usable from YAML (``filter_fn: {_component_: engine.data.ColumnFilter, ...}``).

Any callable ``row -> bool`` works as `filter_fn`; this one covers the common cases and has a stable
`repr`, so datasets filtered with it stay cacheable (a lambda or a plain function disables the cache).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.data.data_errors import DataError


class ColumnFilter:
    """Keep rows whose `column` passes every given test (applied after `column_map`).

    Args:
      column: the column to test.
      equals: keep rows whose value equals this.
      one_of: keep rows whose value is in this list.
      min_chars / max_chars: keep rows whose text length is within these bounds.
    A row without `column` is dropped. Raises `DataError` when no test is given.
    """

    def __init__(
        self,
        column: str,
        equals: Any = None,
        one_of: list | None = None,
        min_chars: int | None = None,
        max_chars: int | None = None,
    ):
        if equals is None and one_of is None and min_chars is None and max_chars is None:
            raise DataError(
                f"filter_fn: ColumnFilter on {column!r} has no test; give equals, one_of, min_chars or max_chars"
            )
        self.column = column
        self.equals = equals
        self.one_of = list(one_of) if one_of is not None else None
        self.min_chars = min_chars
        self.max_chars = max_chars

    def __call__(self, row: Mapping[str, Any]) -> bool:
        if self.column not in row:
            return False
        v = row[self.column]
        if self.equals is not None and v != self.equals:
            return False
        if self.one_of is not None and v not in self.one_of:
            return False
        n = len(str(v)) if v is not None else 0
        if self.min_chars is not None and n < self.min_chars:
            return False
        return not (self.max_chars is not None and n > self.max_chars)

    def __repr__(self) -> str:
        return (
            f"ColumnFilter({self.column!r}, equals={self.equals!r}, one_of={self.one_of!r}, "
            f"min_chars={self.min_chars!r}, max_chars={self.max_chars!r})"
        )
