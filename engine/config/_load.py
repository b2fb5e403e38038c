"""`load_config`: YAML file -> overrides -> interpolation -> a plain dict."""

from __future__ import annotations

import os
from collections.abc import Iterable

from engine.config._components import allow_components, config_prefixes
from engine.config._interpolate import resolve_interpolations
from engine.config._overrides import Override, apply_overrides
from engine.config._yaml import load_yaml


def load_config(path: str | os.PathLike, overrides: Iterable[str | Override] = ()) -> dict:
    """Load a config file, apply `overrides` in order, then resolve every `${...}`.

    The config's `allowed_components` are registered for this process so that later
    `instantiate` calls honour them. Raises ConfigError (one line naming the file, field or
    override) for a missing or malformed file, a bad override or a broken interpolation.
    """
    cfg = apply_overrides(load_yaml(path), overrides)
    cfg = resolve_interpolations(cfg)
    allow_components(config_prefixes(cfg))
    return cfg
