"""Text and JSON helpers of the run commands: plain aligned tables, JSON-safe floats, config diffs."""

from __future__ import annotations

import math
from typing import Any


def table(header: list[str], rows: list[list[str]]) -> str:
    """Left-aligned columns separated by two spaces."""
    cols = [header, *rows]
    widths = [max(len(str(r[i])) for r in cols) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in cols)


def json_safe(value: Any) -> Any:
    """`value` with non-finite floats as the strings "nan", "inf", "-inf" (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """`{"a.b": 1, "c.0": "x"}` from a nested config (lists indexed by position)."""
    out: dict[str, Any] = {}
    if isinstance(cfg, dict) and cfg:
        for k, v in cfg.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(cfg, list) and cfg:
        for i, v in enumerate(cfg):
            out.update(flatten(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = cfg
    return out


def config_diff(configs: list[dict], *, ignore: tuple[str, ...] = ("output_dir",)) -> dict[str, list[Any]]:
    """Keys whose values differ between configs: `{key: [value in config 0, value in 1, ...]}`
    (a key absent from a config shows as None)."""
    flats = [flatten(c) for c in configs]
    keys: list[str] = []
    for f in flats:
        keys.extend(k for k in f if k not in keys)
    diff = {}
    for k in keys:
        if k in ignore:
            continue
        vals = [f.get(k) for f in flats]
        if any(v != vals[0] for v in vals[1:]):
            diff[k] = vals
    return diff


def emit(text: str) -> None:
    """Print `text` to stdout; a closed pipe (`tunebench runs | head`) ends the output quietly."""
    import os
    import sys

    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail again
