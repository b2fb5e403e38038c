"""Built-in configs under the repository's `configs/` folder, and finding a config by name or path.

A built-in run config is `configs/<family>/<size>_<method>.yaml`, named `<family>/<size>_<method>`
(exactly one folder deep; deeper folders hold other YAML, such as eval task files).
Its recipe comes from the launch line in its opening comment:
`# tunebench run sft --config llama3_2/1B_lora` (or `... -m engine.recipes.sft ...`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import engine
from engine.config._errors import ConfigError, did_you_mean

_LAUNCH_RE = re.compile(r"^#.*?\btunebench\s+run\s+([A-Za-z_]\w*)")
_MODULE_RE = re.compile(r"^#.*?-m\s+engine\.recipes\.([A-Za-z_]\w*)")


@dataclass(frozen=True)
class BuiltinConfig:
    """A config shipped under `configs/`: `name` like `llama3_2/1B_lora`, its file, its recipe (or None)."""

    name: str
    path: Path
    recipe: str | None


def builtin_config_dir() -> Path:
    """The repository's `configs/` folder (beside the `engine` package)."""
    return Path(engine.__file__).resolve().parent.parent / "configs"


def recipe_from_text(text: str) -> str | None:
    """The recipe named by the launch line in the leading comment block of a config, or None."""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            break
        m = _LAUNCH_RE.match(stripped) or _MODULE_RE.match(stripped)
        if m:
            return m.group(1)
    return None


def list_builtin_configs() -> list[BuiltinConfig]:
    """Every run config `configs/<family>/<name>.yaml`, sorted by name, with the recipe from its launch line.

    Deeper folders (e.g. `configs/eval/tasks/`, lm-eval task files) are not run configs and are skipped.
    """
    root = builtin_config_dir()
    if not root.is_dir():
        return []
    out = []
    for path in sorted(
        root.glob("*/*.yaml")
    ):  # <family>/<size>_<method>.yaml; deeper folders hold other YAML
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = ""
        name = path.relative_to(root).with_suffix("").as_posix()
        out.append(BuiltinConfig(name=name, path=path, recipe=recipe_from_text(text)))
    return out


def find_config(name_or_path: str | Path) -> Path:
    """A config file: an existing path, or a built-in name like `llama3_2/1B_lora` (`.yaml` optional).

    Raises ConfigError naming the argument, with a did-you-mean over the built-in names.
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        raise ConfigError("is a folder, not a config file", hint="give a .yaml file", field=text)
    root = builtin_config_dir()
    stem = text[:-5] if text.endswith(".yaml") else text[:-4] if text.endswith(".yml") else text
    for candidate in (root / f"{stem}.yaml", root / f"{stem}.yml"):
        if ".." not in Path(stem).parts and candidate.is_file():
            return candidate
    names = [c.name for c in list_builtin_configs()]
    raise ConfigError(
        f"no such file and no built-in config of that name{did_you_mean(stem, names)}",
        hint="give a path to a YAML file or run `tunebench ls` for the built-in ones",
        field=text,
    )
