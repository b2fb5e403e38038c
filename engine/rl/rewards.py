"""Reward functions for GRPO. A reward is any allow-listed callable

    fn(*, completions: list[str], answers: list[str], prompts: list[str], **settings) -> list[float]

named in the config under `rewards: {name: {_component_: dotted.path, **settings}}`; the recipe calls
it through `engine.config.instantiate` at every step with the step's completions (so user functions
go through the same allow-list as every component: the user allows their package with
`tunebench run ... --allow-component mypkg.rewards`, `TUNEBENCH_ALLOW` or `TUNEBENCH_HOME/settings.yaml`;
a config cannot).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*)?\.?\d+(?:[eE][-+]?\d+)?(?:\s*/\s*\d+)?")


def _boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def final_answer(text: str) -> str | None:
    """A completion's final answer: the text after the last `####`, else the last `\\boxed{}`; None."""
    if "####" in text:
        tail = text[text.rindex("####") + 4 :].strip()
        return tail.splitlines()[0].strip() if tail else None
    return _boxed(text)


def parse_number(text: str | None) -> float | None:
    """The first number in `text` as a float (`1,234` -> 1234, `3/4` -> 0.75, `$5.00` -> 5), or None."""
    if not text:
        return None
    cleaned = (
        text.replace("\\!", "").replace("$", "").replace("\\frac{", "").replace("}{", "/").replace("}", "")
    )
    m = _NUMBER.search(cleaned)
    if m is None:
        return None
    s = m.group(0).replace(",", "").replace(" ", "")
    try:
        return float(Fraction(s)) if "/" in s else float(s)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(predicted: str | None, reference: str | None, *, rel_tol: float = 1e-6) -> bool:
    """Numeric comparison when both parse as numbers, else an exact (whitespace-trimmed) text match."""
    if predicted is None or reference is None:
        return False
    ref = final_answer(reference) or reference  # GSM8K references hold the worked solution + "#### n"
    a, b = parse_number(predicted), parse_number(ref)
    if a is not None and b is not None:
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-9)
    return predicted.strip() == ref.strip()


def math_reward(
    *, completions: list[str], answers: list[str], correct: float = 1.0, wrong: float = 0.0, **_: object
) -> list[float]:
    """`correct` when the completion's final answer (`#### x` or `\\boxed{x}`) equals the reference
    numerically (GSM8K / MATH style), else `wrong` (also when no final answer is given)."""
    return [
        correct if answers_match(final_answer(c), a) else wrong
        for c, a in zip(completions, answers, strict=True)
    ]


def format_reward(
    *, completions: list[str], pattern: str = r"####\s*\S+\s*$", value: float = 1.0, **_: object
) -> list[float]:
    """`value` when the completion matches the regular expression `pattern` (searched, DOTALL),
    else 0. The default asks for a final `#### answer` line at the end."""
    rx = re.compile(pattern, re.S)
    return [value if rx.search(c) else 0.0 for c in completions]


def length_penalty(
    *, completions: list[str], max_chars: int = 1000, scale: float = 1.0, **_: object
) -> list[float]:
    """`-scale * max(0, len - max_chars) / max_chars` per completion: discourages rambling."""
    return [-scale * max(0, len(c) - max_chars) / max_chars for c in completions]
