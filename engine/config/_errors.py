"""The two error shapes of the config system: `ConfigError` (raised) and `ConfigProblem` (collected)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass


class ConfigError(Exception):
    """A config, override or component the user can fix.

    `str(exc)` is one line: `field: what is wrong — what to do`. The CLI prints it and exits 2.
    `field` names the config field, override or file ("" when none applies).
    """

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(" ".join(str(message).split()))
        self.field = field


@dataclass(frozen=True)
class ConfigProblem:
    """One problem found by `validate`: which field, what is wrong, what to do about it."""

    field: str
    message: str
    hint: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message} — {self.hint}"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the closest choice, or "" when nothing is close."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def dotted(path: tuple) -> str:
    """`("a", 0, "b")` -> `a.0.b`; the empty path is `<root>`."""
    return ".".join(str(p) for p in path) if path else "<root>"
