"""The two error shapes of the config system: `ConfigError` (raised) and `ConfigProblem` (collected).

Both carry the same three parts, kept apart: `field` (which key, override or file), `message` (what is
wrong) and `hint` (what to change). Their one-line form `field: message — hint` is what the CLI prints.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


@dataclass(frozen=True)
class ConfigProblem:
    """One problem found by `validate`: which field, what is wrong, what to do about it."""

    field: str
    message: str
    hint: str

    def __str__(self) -> str:
        return _line(self.field, self.message, self.hint)


def _line(label: str, message: str, hint: str) -> str:
    return (f"{label}: " if label else "") + message + (f" — {hint}" if hint else "")


class ConfigError(Exception):
    """A config, override or component the user can fix.

    Args:
        message (str): what is wrong, without the field (`must be >= 1, got 0`).
        field (str): the config field, override or file it is about ("" when none applies).
        hint (str): what to change (`lower batch_size`); "" when the message says it all.
        label (str | None): the words that open the line when they are not `field` (an override's
            `override 'lr=x'`); None: `field`.

    `str(exc)` is one line, `label: message — hint`; the CLI prints it and exits 2. `exc.problem` is
    the same as a `ConfigProblem` (its `field` is the label the line opens with).
    """

    def __init__(self, message: str, *, field: str = "", hint: str = "", label: str | None = None) -> None:
        self.field = field
        self.message = _one_line(message)
        self.hint = _one_line(hint)
        self.label = field if label is None else _one_line(label)
        super().__init__(_line(self.label, self.message, self.hint))

    @property
    def problem(self) -> ConfigProblem:
        """This error as a collected problem (what `validate` lists)."""
        return ConfigProblem(self.label or "<config>", self.message, self.hint or "fix it")

    @classmethod
    def from_problem(cls, problem: ConfigProblem, *, more: str = "") -> ConfigError:
        """Raise a collected problem; `more` is appended to its hint (`(and 2 more: ...)`)."""
        field = "" if problem.field == "<config>" else problem.field
        return cls(problem.message, field=field, hint=problem.hint + more, label=problem.field)

    @classmethod
    def from_problems(cls, problems: list[ConfigProblem]) -> ConfigError:
        """The first of several problems, saying how many more `tunebench validate` lists."""
        more = (
            f" (and {len(problems) - 1} more: tunebench validate CONFIG lists them)"
            if len(problems) > 1
            else ""
        )
        return cls.from_problem(problems[0], more=more)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the closest choice, or "" when nothing is close."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def dotted(path: tuple) -> str:
    """`("a", 0, "b")` -> `a.0.b`; the empty path is `<root>`."""
    return ".".join(str(p) for p in path) if path else "<root>"
