"""Where the tracker keeps its files: `TUNEBENCH_HOME` (default `~/.tunebench`) holds `tunebench.db`
and one folder per run, `runs/<id>/`. Folders are created private to the user (0700)."""

from __future__ import annotations

import os
from pathlib import Path

DB_NAME = "tunebench.db"


def tunebench_home() -> Path:
    """`TUNEBENCH_HOME`, or `~/.tunebench` when unset; not created here.

    Raises `TrackerError` when that path exists and is not a folder."""
    home = Path(os.environ.get("TUNEBENCH_HOME") or "~/.tunebench").expanduser()
    if home.exists() and not home.is_dir():
        from engine.tracking.tracker_errors import TrackerError

        raise TrackerError(
            f"TUNEBENCH_HOME={home} is a file, not a folder: point TUNEBENCH_HOME at a folder (or unset it)"
        )
    return home


def db_path(home: Path | None = None) -> Path:
    """The SQLite file of the tracker under `home` (default: `tunebench_home()`)."""
    return Path(home or tunebench_home()) / DB_NAME


def runs_root(home: Path | None = None) -> Path:
    """The folder holding one sub-folder per run."""
    return Path(home or tunebench_home()) / "runs"


def run_dir(run_id: str, home: Path | None = None) -> Path:
    """`runs/<id>/` of one run (the recipe's `output_dir`)."""
    return runs_root(home) / run_id


def ensure_private_dir(path: Path) -> Path:
    """Create `path` (and parents) with mode 0700; tighten it to 0700 when it exists and is ours.
    Raises `TrackerError` naming the folder when it cannot be created (a file in the way, no rights)."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        from engine.tracking.tracker_errors import TrackerError

        raise TrackerError(
            f"{path}: cannot create this folder ({exc.strerror or exc}); point TUNEBENCH_HOME at a "
            "folder you can write"
        ) from None
    st = path.stat()
    if st.st_uid == os.getuid() and (st.st_mode & 0o777) != 0o700:
        path.chmod(0o700)
    return path
