"""`tunebench export-model RUN_OR_DIR --gguf f16|bf16|q8_0 [-o FILE] [--force]`: a merged model (LoRA
adapters folded into the base) as one GGUF file for llama.cpp and Ollama.

RUN_OR_DIR is a run id or name (its latest checkpoint), a run folder, a checkpoint folder
(`checkpoints/step_<N>`), a model folder (HF `config.json` + safetensors, or PEFT adapters whose
`adapter_config.json` names the base), or `demo`. FILE defaults to `<name>.<type>.gguf` here; an
existing FILE is replaced only with --force. FILE's folder must exist and be writable (it is not
created, as with `tunebench export`); both are checked before the model loads. Families: Llama 2/3, SmolLM2, Mistral, Mixtral, Qwen2/2.5,
Qwen3, Qwen3-MoE.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from workbench.cli_args import add_documented_command
from workbench.errors import UserError

TYPES = ("f16", "bf16", "q8_0")


_HELP = "write a run's or folder's merged model as a GGUF file (llama.cpp, Ollama)"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_documented_command(subparsers, "export-model", _HELP, __doc__)
    p.add_argument(
        "source", metavar="RUN_OR_DIR", help="run id or name, checkpoint or model folder, or `demo`"
    )
    p.add_argument("--gguf", required=True, metavar="TYPE", help=f"storage type: {', '.join(TYPES)}")
    p.add_argument(
        "-o", "--output", default=None, metavar="FILE", help="where to write (default ./NAME.TYPE.gguf)"
    )
    p.add_argument("--force", action="store_true", help="replace FILE when it already exists")
    p.set_defaults(func=run)


def _model_folder(folder: Path) -> Path | None:
    """The weights folder inside `folder`: itself, a checkpoint's `model/`, or the latest checkpoint's."""
    from engine.checkpoint.layout import latest_checkpoint

    for candidate in (folder, folder / "model"):
        if (candidate / "config.json").is_file() or (candidate / "adapter_config.json").is_file():
            return candidate
    step = latest_checkpoint(folder)
    if step is not None and (step / "model").is_dir():
        return _model_folder(step / "model")
    return None


def resolve_source(spec: str) -> tuple[Path, str]:
    """`(weights folder, name)` of RUN_OR_DIR. Raises UserError saying what was looked for."""
    if spec == "demo":
        from engine.models.demo_model import demo_model_dir

        return Path(demo_model_dir()), "smollm2-135m-instruct"
    path = Path(spec).expanduser()
    if path.is_dir():
        found = _model_folder(path)
        if found is None:
            raise UserError(
                f"{path}: no model weights here (no config.json, adapter_config.json or checkpoints/step_<N>/model/); "
                "point RUN_OR_DIR at a model folder, a checkpoint or a run"
            )
        return found, path.resolve().name
    if path.exists():
        raise UserError(f"{path}: is a file; RUN_OR_DIR must be a run, a checkpoint or a model folder")
    from engine.tracking.db import open_db
    from engine.tracking.readers import get_run
    from engine.tracking.tracker_errors import TrackerError

    try:
        with open_db(create=False) as db:
            rec = get_run(spec, db=db)
    except TrackerError as exc:
        raise UserError(f"RUN_OR_DIR {spec!r}: not a folder, and {exc}") from None
    found = _model_folder(Path(rec.output_dir))
    if found is None:
        raise UserError(f"run {rec.id}: no complete checkpoint with model weights under {rec.output_dir} yet")
    return found, rec.name or rec.id


def check_output_folder(out: Path) -> None:
    """Refuse `-o FILE` before any model is loaded when FILE's folder does not exist (it is not created:
    as `tunebench export`, create it first) or this process cannot write into it (its mode, an immutable
    folder, a read-only filesystem: `os.access` sees all three, and agrees with what root may do)."""
    import os

    folder = out.parent if str(out.parent) else Path(".")
    if not folder.exists():
        raise UserError(
            f"{folder}: no such folder; create it first (mkdir -p {folder}) or choose another -o FILE"
        )
    if not folder.is_dir():
        raise UserError(f"{folder}: is a file, not a folder; choose another -o FILE")
    if not os.access(folder, os.W_OK | os.X_OK):
        try:
            read_only_fs = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
        except OSError:
            read_only_fs = False
        why = "on a read-only filesystem" if read_only_fs else "not writable by this user"
        raise UserError(f"{folder}: this folder is {why}; choose -o FILE in a folder you can write")


def run(args: argparse.Namespace) -> int:
    if args.gguf not in TYPES:
        raise UserError(f"--gguf {args.gguf!r}: unknown GGUF type; use one of {', '.join(TYPES)}")
    folder, name = resolve_source(args.source)
    out = Path(args.output or f"{name}.{args.gguf}.gguf").expanduser()
    if out.exists() and not args.force:
        raise UserError(f"{out}: already exists; pass --force to replace it or choose another -o FILE")
    if out.is_dir():
        raise UserError(f"{out}: is a folder; -o FILE must name a file")
    check_output_folder(out)
    from engine.checkpoint.gguf_export import export_gguf

    path = export_gguf(folder, out, args.gguf)
    size = path.stat().st_size / 2**20
    print(f"wrote {path} ({size:.1f} MiB, {args.gguf}) from {folder}")
    return 0


def export_run_gguf(run_id: str, qtype: str) -> Path:
    """The workbench's GGUF export (the `g` key of the Runs and Live run screens): run `run_id`'s
    latest complete checkpoint, merged, written to `<run folder>/<name>.step_<N>.<qtype>.gguf`
    (replaced when it exists: the same checkpoint gives the same file). Blocks; call it from a worker.
    Raises UserError / GGUFError (a ConfigError) with one line naming what to change."""
    if qtype not in TYPES:
        raise UserError(f"GGUF type {qtype!r} is unknown; use one of {', '.join(TYPES)}")
    from engine.tracking.db import open_db
    from engine.tracking.readers import get_run

    with open_db(create=False) as db:
        rec = get_run(run_id, db=db)
    folder = _model_folder(Path(rec.output_dir))
    if folder is None:
        raise UserError(f"run {rec.name or rec.id}: no complete checkpoint with model weights yet")
    step = next((p.name for p in (folder, *folder.parents) if p.name.startswith("step_")), None)
    name = ".".join(filter(None, [rec.name or rec.id, step, qtype, "gguf"]))
    from engine.checkpoint.gguf_export import export_gguf

    return export_gguf(folder, Path(rec.output_dir) / name, qtype)


def export_run_gguf_message(run_id: str, qtype: str):
    """`export_run_gguf` for a screen's thread worker: the `ModelExported` message to post, carrying the
    written path or the error's first line (the line names what to change)."""
    from workbench.ui_messages import ModelExported

    try:
        path = export_run_gguf(run_id, qtype)
    except Exception as exc:  # one line, shown as a notification
        return ModelExported(run_id, error=(str(exc).splitlines() or [type(exc).__name__])[0])
    return ModelExported(run_id, path=str(path))
