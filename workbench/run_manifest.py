"""What a run created inside a folder it shares with other files, so that deleting the run removes
only that (and tunebench changes the mode of no folder it did not make).

A one-node run's folder is its own `runs/<id>/` under `TUNEBENCH_HOME`, created with the run: deleting
the run removes it whole. A multi-node or SLURM run writes into the user's `--output-dir`, which may
already hold other files. Its manifest, `OUTPUT/.tunebench-created.json` (JSON), records:

- `run_id`: the run it belongs to (a manifest of another run is not obeyed);
- `made_folder`: whether the run created OUTPUT itself (only then may its mode be set to 0700, and
  only then is OUTPUT removed, once empty, when the run is deleted);
- `preexisting`: the top-level names OUTPUT held when the run was registered, and those that
  appeared before a launch of it started (`settle`): never the run's;
- `created`: the top-level names the run created, recorded as they appear. The launcher names what
  it writes (`config.yaml`, `supervisor.log`, `sbatch.sh`); `record_new` adds every other new name:
  the supervisor calls it every few seconds while the run lives and at its end, the SLURM job script
  at the job's start and exit, `slurm.reconcile` when it sees the job end. A name is a whole entry:
  a folder the run created (`checkpoints/`) is removed with everything inside it, at any depth.

The run never writes inside an entry that was there before: `multinode_launch.shared_run_dir`
refuses a folder that already holds one of the names a run writes (`RUN_NAMES`). A name that someone
else adds to OUTPUT while the run is live is counted as the run's (the one thing this cannot tell
apart); one added before a launch or after the run ended is left alone.

`python -m workbench.run_manifest record-new DIR` is `record_new(DIR)` for the SLURM job script; it
always exits 0 (recording must never fail the job).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

MANIFEST_NAME = ".tunebench-created.json"
VERSION = 1
# Top-level names a run writes into its folder (the launcher, the supervisor, the recipes, SLURM's
# script): a shared --output-dir that already holds one is refused, so the run never writes into an
# entry it did not create.
RUN_NAMES = (
    "config.yaml", "checkpoints", "stdout.log", "supervisor.log", "sbatch.sh", ".exit_codes", ".nodes",
    "merged", "eval", "samples.jsonl", MANIFEST_NAME,
)  # fmt: skip


@dataclass(frozen=True)
class Manifest:
    """One folder's record (see the module docstring); names are single path components."""

    run_id: str
    made_folder: bool
    preexisting: tuple[str, ...]
    created: tuple[str, ...]


def _plain_name(name: object) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def _listing(folder: Path) -> set[str]:
    """Top-level names in `folder`, without the manifest's own temp files."""
    return {n for n in os.listdir(folder) if not (n.startswith(MANIFEST_NAME) and n != MANIFEST_NAME)}


def read(folder: str | os.PathLike) -> Manifest | None:
    """The folder's manifest, or None when it is absent, unreadable or not one this module wrote."""
    try:
        data = json.loads((Path(folder) / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (
        not isinstance(data, dict)
        or data.get("version") != VERSION
        or not isinstance(data.get("run_id"), str)
    ):
        return None
    pre, made = data.get("preexisting"), data.get("created")
    if not isinstance(pre, list) or not isinstance(made, list):
        return None
    if not all(_plain_name(n) for n in pre + made):
        return None
    return Manifest(data["run_id"], data.get("made_folder") is True, tuple(pre), tuple(made))


def _write(folder: Path, manifest: Manifest) -> None:
    """Replace the manifest atomically (temp file + rename: a reader never sees half of one)."""
    data = {
        "version": VERSION,
        "run_id": manifest.run_id,
        "made_folder": manifest.made_folder,
        "preexisting": sorted(manifest.preexisting),
        "created": list(manifest.created),
    }
    tmp = folder / f"{MANIFEST_NAME}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, folder / MANIFEST_NAME)
    finally:
        tmp.unlink(missing_ok=True)


def begin(folder: str | os.PathLike, *, run_id: str, made_folder: bool) -> Manifest:
    """Start the manifest of `run_id` in `folder` (which exists): what the folder holds now is
    `preexisting`; the manifest itself is the run's first entry. Raises `OSError` when it cannot be
    written (the caller reports it)."""
    folder = Path(folder)
    manifest = Manifest(run_id, made_folder, tuple(sorted(_listing(folder))), (MANIFEST_NAME,))
    _write(folder, manifest)
    return manifest


def record(folder: str | os.PathLike, *names: str) -> None:
    """Add `names` (top-level entries the caller is about to write) to the folder's manifest; nothing
    happens when the folder has none (a run's own `runs/<id>/`)."""
    folder = Path(folder)
    manifest = read(folder)
    if manifest is None:
        return
    new = [n for n in names if n not in manifest.created and n not in manifest.preexisting]
    if new:
        _write(folder, Manifest(manifest.run_id, manifest.made_folder, manifest.preexisting,
                                manifest.created + tuple(new)))  # fmt: skip


def record_new(folder: str | os.PathLike) -> list[str]:
    """Add every top-level name of `folder` that is neither preexisting nor recorded; returns them.
    Nothing happens (and [] is returned) when the folder has no manifest or cannot be listed."""
    folder = Path(folder)
    manifest = read(folder)
    if manifest is None:
        return []
    try:
        present = _listing(folder)
    except OSError:
        return []
    new = sorted(present - set(manifest.preexisting) - set(manifest.created))
    if new:
        _write(folder, Manifest(manifest.run_id, manifest.made_folder, manifest.preexisting,
                                manifest.created + tuple(new)))  # fmt: skip
    return new


def settle(folder: str | os.PathLike) -> list[str]:
    """Count every name in `folder` that is not recorded as the run's as someone else's (add it to
    `preexisting`); returns those names. The supervisor calls it just before it starts the run's
    processes, so what appeared while a run waited (in the run queue, or between a stop and its resume)
    is never taken for the run's; an entry of an earlier launch that was not recorded (its supervisor
    was killed) is then left by a delete, the safe side. Nothing happens without a manifest."""
    folder = Path(folder)
    manifest = read(folder)
    if manifest is None:
        return []
    try:
        present = _listing(folder)
    except OSError:
        return []
    other = sorted(present - set(manifest.preexisting) - set(manifest.created))
    if other:
        _write(folder, Manifest(manifest.run_id, manifest.made_folder, manifest.preexisting + tuple(other),
                                manifest.created))  # fmt: skip
    return other


def may_set_mode(folder: str | os.PathLike, *, run_id: str) -> bool:
    """True when `folder` is one that `run_id` created (its manifest says so): only then may its mode
    be changed."""
    manifest = read(folder)
    return manifest is not None and manifest.run_id == run_id and manifest.made_folder


def remove_created(folder: str | os.PathLike, *, run_id: str) -> str | None:
    """Remove what `run_id` created in `folder` (each recorded entry; a folder with all it holds),
    then `folder` itself when the run made it and it is now empty. Symbolic links are removed, never
    followed. Returns None when nothing of the run is left, else one line saying what was left and why.
    """
    folder = Path(folder)
    if not folder.exists():
        return None
    manifest = read(folder)
    if manifest is None or manifest.run_id != run_id:
        return (
            f"left {folder} as it is: it has no record of what this run created there "
            f"({MANIFEST_NAME}); remove what you do not need by hand"
        )
    kept = []
    for name in manifest.created:
        if name == MANIFEST_NAME or name in manifest.preexisting:
            continue
        path = folder / name
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        except OSError as exc:
            kept.append(f"{name} ({exc.strerror or exc})")
    if kept:
        return f"left {folder}: could not remove {', '.join(kept)}; remove them by hand"
    (folder / MANIFEST_NAME).unlink(missing_ok=True)
    if not manifest.made_folder:
        return None
    try:
        folder.rmdir()
    except OSError:
        return f"left {folder}: it holds files this run did not create"
    return None


def main(argv: list[str] | None = None) -> int:
    """`record-new DIR`: `record_new(DIR)`, for the SLURM job script. Always 0."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "record-new":
        try:
            record_new(args[1])
        except OSError as exc:  # a full or read-only disk: the job goes on, the delete will leave more
            print(f"tunebench: could not record the run's files in {args[1]}: {exc}", file=sys.stderr)
    else:
        print("usage: python -m workbench.run_manifest record-new DIR", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
