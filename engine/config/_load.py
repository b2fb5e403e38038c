"""`load_config`: YAML file -> overrides -> interpolation -> a plain dict."""

from __future__ import annotations

import os
from collections.abc import Iterable

from engine.config._components import config_widening_error
from engine.config._errors import ConfigError
from engine.config._find import find_config
from engine.config._interpolate import resolve_interpolations
from engine.config._overrides import Override, apply_overrides
from engine.config._yaml import load_yaml


def load_config(path: str | os.PathLike, overrides: Iterable[str | Override] = ()) -> dict:
    """Load a config file, apply `overrides` in order, then resolve every `${...}`.

    Raises ConfigError (one line naming the file, field or override) for a missing or malformed file,
    a bad override or a broken interpolation, and for an `allowed_components:` key (a config cannot
    widen its own allow-list: `engine.config._grants` says where the user does).
    """
    cfg = apply_overrides(load_yaml(path), overrides)
    cfg = resolve_interpolations(cfg)
    refused = config_widening_error(cfg)
    if refused is not None:
        raise refused
    return cfg


def split_config_argv(argv: list[str]) -> tuple[str, list[str]]:
    """`["--config", FILE, "a=1", "~b"]` -> `(FILE, ["a=1", "~b"])`; `--config=FILE` works too.

    Raises ConfigError when `--config` is missing or given twice, or another `--flag` appears.
    """
    config: str | None = None
    overrides: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg == "--config" or arg.startswith("--config="):
            if config is not None:
                raise ConfigError("given twice", hint="pass one config file", field="--config")
            config = arg.split("=", 1)[1] if "=" in arg else next(it, None)
            if not config:
                raise ConfigError("no file after it", hint="write --config FILE", field="--config")
        elif arg.startswith("--"):
            raise ConfigError(
                "unknown option",
                hint="recipes take --config FILE followed by key=value overrides",
                field=arg,
            )
        else:
            overrides.append(arg)
    if config is None:
        raise ConfigError("missing", hint="write --config FILE [key=value ...]", field="--config")
    return config, overrides


def load_config_from_argv(argv: list[str] | None = None) -> dict:
    """The config a recipe was started with: `--config FILE_OR_BUILTIN_NAME [key=value ...]`.

    `argv` defaults to `sys.argv[1:]`. Raises ConfigError as `split_config_argv` and `load_config` do.
    """
    import sys

    config, overrides = split_config_argv(sys.argv[1:] if argv is None else list(argv))
    return load_config(find_config(config), overrides)
