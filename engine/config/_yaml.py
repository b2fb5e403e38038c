"""YAML in and out, with YAML 1.2-style scalars so that configs mean what they look like.

PyYAML follows YAML 1.1, where `1e-4` is a string and `no`/`off` are booleans; both surprise people
writing training configs. The loader here resolves `1e-4` as a float, only `true`/`false` as booleans,
never builds dates, and refuses duplicate keys. `dump_config` writes text the loader reads back to an
equal dict.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import yaml

from engine.config._errors import ConfigError

_BOOL_TAG = "tag:yaml.org,2002:bool"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"

_BOOL_RE = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_FLOAT_RE = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


def _resolvers(base: dict, *, keep_yaml11_bools: bool) -> dict:
    """A copy of `base`'s implicit resolvers with our bool/float rules and without timestamps."""
    drop = {_FLOAT_TAG, _TIMESTAMP_TAG} | (set() if keep_yaml11_bools else {_BOOL_TAG})
    out = {ch: [(tag, rx) for tag, rx in rules if tag not in drop] for ch, rules in base.items()}
    for ch in "tTfF":
        out.setdefault(ch, []).append((_BOOL_TAG, _BOOL_RE))
    for ch in "-+0123456789.":
        out.setdefault(ch, []).append((_FLOAT_TAG, _FLOAT_RE))
    return out


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2-style floats and booleans, no dates, no duplicate keys."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                mark = key_node.start_mark
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {seen[key].line + 1})", mark
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


_Loader.yaml_implicit_resolvers = _resolvers(yaml.SafeLoader.yaml_implicit_resolvers, keep_yaml11_bools=False)


class _Dumper(yaml.SafeDumper):
    """SafeDumper that quotes every string our loader would read as something else."""

    def ignore_aliases(self, data):  # configs are trees: repeat values instead of writing &anchors
        return True


# The dumper keeps the YAML 1.1 booleans too, so a string "no" is quoted (harmless) rather than bare.
_Dumper.yaml_implicit_resolvers = _resolvers(yaml.SafeDumper.yaml_implicit_resolvers, keep_yaml11_bools=True)


def _represent_float(dumper: yaml.SafeDumper, value: float):
    if math.isnan(value):
        text = ".nan"
    elif math.isinf(value):
        text = ".inf" if value > 0 else "-.inf"
    else:
        text = repr(value)  # shortest text that reads back to the same float, e.g. 0.0001, 1e-05
    return dumper.represent_scalar(_FLOAT_TAG, text)


_Dumper.add_representer(float, _represent_float)
_Dumper.add_representer(tuple, lambda d, v: d.represent_list(list(v)))
_Dumper.add_multi_representer(os.PathLike, lambda d, v: d.represent_str(os.fspath(v)))


# What was left open when the parser gives up at the end of it: the hint names it.
_OPENERS = {
    "while scanning a quoted scalar": "quote",
    "while parsing a flow sequence": "[ bracket",
    "while parsing a flow mapping": "{ brace",
}


def parse_yaml(text: str, *, source: str = "<string>") -> Any:
    """Parse YAML text with the config loader.

    Raises ConfigError `source:LINE:COL: malformed YAML: ...` (1-based line and column).
    """
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader derives from SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        what = exc.problem or exc.context or "cannot parse"
        start = exc.context_mark
        if exc.problem and exc.context and start is not None and mark is not None and start.line != mark.line:
            # Where the unclosed thing began is what to fix: `seed: "abc` fails only at the end of the file.
            what += f" ({exc.context} that starts at line {start.line + 1}, column {start.column + 1})"
        hint = "fix the YAML at that line and column"
        if "'\\t'" in what:
            hint = "indent with spaces: YAML does not allow tabs"
        elif start is not None and exc.context in _OPENERS:
            hint = f"close the {_OPENERS[exc.context]} opened at line {start.line + 1}, column {start.column + 1}"
        raise ConfigError(f"malformed YAML: {what}", hint=hint, field=where) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"malformed YAML: {exc}", hint="fix the YAML syntax", field=source) from None
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise ConfigError(
            f"bad YAML value: {exc}", hint="quote it to make it a string", field=source
        ) from None


def load_yaml(path: str | os.PathLike) -> dict:
    """Read a YAML config file into a dict (no overrides, no interpolation).

    Raises ConfigError when the file is missing, unreadable, malformed or not a mapping.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            "no such config file", hint="check the path or run `tunebench ls`", field=str(p)
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the config ({exc})", hint="check the file", field=str(p)) from None
    data = parse_yaml(text, source=str(p))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"the config is a {type(data).__name__}, not a mapping",
            hint="write `key: value` lines at the top level",
            field=str(p),
        )
    return data


def dump_config(cfg: Any, *, header: str | None = None) -> str:
    """YAML text for `cfg` that `parse_yaml` reads back to an equal value.

    `header` (optional) is written first as `# ` comment lines, e.g. the launch line.
    Keys keep their order; tuples become lists; paths become strings.
    """
    body = yaml.dump(
        cfg, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=10_000
    )
    if header:
        lines = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
        return lines + body
    return body
