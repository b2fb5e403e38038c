"""Where recipe checkpoints live and which of them are complete: the one definition, shared by the
recipes (resume) and the launcher (`tunebench resume`, the workbench). Imports no torch, so the CLI
can use it.

    <output_dir>/checkpoints/step_<N>/     a checkpoint of optimizer step N
    <output_dir>/checkpoints/.tmp_step_<N>/  one being written (never complete)

A `step_<N>` folder is complete when it holds `recipe_state.pt`: `save_checkpoint` writes that file
last, into the temp folder, before the rename; a folder without it (a copy in progress, a crash of
something else writing there) is ignored by both resume paths.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

CHECKPOINTS_DIRNAME = "checkpoints"
RECIPE_STATE = "recipe_state.pt"
_STEP_RE = re.compile(r"^step_(\d+)$")


def checkpoints_root(output_dir: str | os.PathLike) -> Path:
    """`output_dir/checkpoints`."""
    return Path(output_dir) / CHECKPOINTS_DIRNAME


def is_complete_checkpoint(path: str | os.PathLike) -> bool:
    """True when `path` is a `step_<N>` folder holding `recipe_state.pt` (written last by a save)."""
    path = Path(path)
    return bool(_STEP_RE.match(path.name)) and path.is_dir() and (path / RECIPE_STATE).is_file()


def list_checkpoints(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints under `output_dir/checkpoints` as `(step, path)`, oldest first."""
    root = checkpoints_root(output_dir)
    if not root.is_dir():
        return []
    found = [
        (int(m.group(1)), child)
        for child in root.iterdir()
        if (m := _STEP_RE.match(child.name)) and is_complete_checkpoint(child)
    ]
    return sorted(found)


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint folder, or None when the run has none yet."""
    found = list_checkpoints(output_dir)
    return found[-1][1] if found else None


def latest_checkpoint_step(output_dir: str | os.PathLike) -> int | None:
    """N of the newest complete checkpoint, or None when the run has none yet."""
    found = list_checkpoints(output_dir)
    return found[-1][0] if found else None


def staging_folder(out_dir: Path) -> Path:
    """A fresh, uniquely named folder beside `out_dir` (same filesystem, so its files can be renamed
    into place atomically); the writer removes it when done or failed."""
    import tempfile

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))


def publish_files(staging: Path, out_dir: Path, stale: list[Path]) -> None:
    """Move every file of `staging` into `out_dir` (made when absent), one `os.replace` each, after
    deleting the files of `stale` (an earlier export's shards or index) that the new files do not
    replace; other files in `out_dir` stay."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in stale:
        if path.exists() and not (staging / path.name).exists():
            path.unlink()
    for item in staging.iterdir():
        os.replace(item, out_dir / item.name)
