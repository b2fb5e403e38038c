"""`ConfigError` keeps field, message and hint apart; `str(exc)` joins them into the CLI's one line."""

from __future__ import annotations

import ast
from pathlib import Path

from engine.config import ConfigError, ConfigProblem

REPO = Path(__file__).resolve().parents[3]


def test_the_line_is_built_from_the_parts():
    exc = ConfigError("must be >= 1, got 0", field="batch_size", hint="set it to 1 or more")
    assert str(exc) == "batch_size: must be >= 1, got 0 — set it to 1 or more"
    assert (exc.field, exc.message, exc.hint) == ("batch_size", "must be >= 1, got 0", "set it to 1 or more")
    assert exc.problem == ConfigProblem("batch_size", "must be >= 1, got 0", "set it to 1 or more")
    # An override's line opens with its own words; the field stays the override text.
    over = ConfigError("no '=' in it", field="lr", hint="write key=value", label="override 'lr'")
    assert str(over) == "override 'lr': no '=' in it — write key=value" and over.field == "lr"
    # Raised again from a collected problem (with how many more there are), the line is the same.
    many = [
        ConfigProblem("seed", "expects an integer", "change it"),
        ConfigProblem("x", "unknown", "remove it"),
    ]
    again = ConfigError.from_problems(many)
    assert (
        str(again)
        == "seed: expects an integer — change it (and 1 more: tunebench validate CONFIG lists them)"
    )
    assert again.field == "seed" and again.message == "expects an integer"


def test_no_call_site_writes_the_field_or_the_hint_into_the_message():
    """A message like f"{field}: ... — do this" would print the field twice and hide the hint."""
    bad = []
    for path in sorted([*REPO.glob("engine/**/*.py"), *REPO.glob("workbench/**/*.py")]):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", "")) == "ConfigError"
            ):
                continue
            if not node.args or any(k.arg == "hint" for k in node.keywords):
                continue
            first = node.args[0]
            texts = [first.value] if isinstance(first, ast.Constant) else []
            if isinstance(first, ast.JoinedStr):
                texts = [v.value for v in first.values if isinstance(v, ast.Constant)]
            if any(isinstance(t, str) and " — " in t for t in texts):
                bad.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert bad == [], f"pass the fix as hint=..., not after ' — ' in the message: {bad}"
