"""The config system: YAML files, `${a.b}` interpolation, command-line overrides, allow-listed
`_component_` instantiation, and validation that reports every problem at once.

    cfg = load_config("configs/llama3_2/1B_lora.yaml", ["lr=1e-4", "~compile"])
    model = instantiate(cfg["model"])
    opt = instantiate(cfg["optimizer"], model.parameters())
    problems = validate(load_yaml(path), recipe="sft")   # list[ConfigProblem]

See docs/ARCHITECTURE.md, section "Config", for the rules.
"""

from engine.config._components import (
    BUILTIN_PREFIXES,
    ComponentRefused,
    allow_components,
    check_allowed,
    import_component,
    reset_allowed_components,
)
from engine.config._errors import ConfigError, ConfigProblem
from engine.config._find import (
    BuiltinConfig,
    builtin_config_dir,
    find_config,
    list_builtin_configs,
    recipe_from_text,
)
from engine.config._grants import Grant, describe_grants, grant_components, user_grants, user_prefixes
from engine.config._instantiate import instantiate
from engine.config._interpolate import resolve_interpolations
from engine.config._load import load_config, load_config_from_argv, split_config_argv
from engine.config._overrides import Override, apply_overrides, parse_overrides
from engine.config._validate import CALL_SITE_ARGS, refuse_untrusted, validate, validate_file
from engine.config._yaml import dump_config, load_yaml, parse_yaml
from engine.config.recipe_schema import REQUIRED, Field, Schema

__all__ = [
    "BUILTIN_PREFIXES",
    "BuiltinConfig",
    "CALL_SITE_ARGS",
    "ComponentRefused",
    "ConfigError",
    "ConfigProblem",
    "Field",
    "Grant",
    "Override",
    "REQUIRED",
    "Schema",
    "allow_components",
    "apply_overrides",
    "builtin_config_dir",
    "check_allowed",
    "describe_grants",
    "dump_config",
    "find_config",
    "grant_components",
    "import_component",
    "instantiate",
    "list_builtin_configs",
    "load_config",
    "load_config_from_argv",
    "load_yaml",
    "parse_overrides",
    "parse_yaml",
    "recipe_from_text",
    "refuse_untrusted",
    "reset_allowed_components",
    "resolve_interpolations",
    "split_config_argv",
    "user_grants",
    "user_prefixes",
    "validate",
    "validate_file",
]
