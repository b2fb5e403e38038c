"""`tunebench ls`, `tunebench cp CONFIG DEST [--force]`, `tunebench cat CONFIG`: the built-in configs.

Built-in configs live under the repository's `configs/<family>/<size>_<method>.yaml` and are named
`<family>/<size>_<method>`; CONFIG may also be a path to any YAML file.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from workbench.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    ls = subparsers.add_parser("ls", help="list the built-in configs, grouped by recipe")
    ls.set_defaults(func=run_ls)

    cp = subparsers.add_parser("cp", help="copy a config (built-in name or file) to a file you can edit")
    cp.add_argument("config", metavar="CONFIG", help="a built-in name (see `tunebench ls`) or a YAML file")
    cp.add_argument("dest", metavar="DEST", help="destination file, or an existing folder")
    cp.add_argument("--force", action="store_true", help="overwrite DEST when it exists")
    cp.set_defaults(func=run_cp)

    cat = subparsers.add_parser("cat", help="print a config (built-in name or file)")
    cat.add_argument("config", metavar="CONFIG", help="a built-in name (see `tunebench ls`) or a YAML file")
    cat.set_defaults(func=run_cat)


def run_ls(args: argparse.Namespace) -> int:
    from engine.config import builtin_config_dir, list_builtin_configs

    configs = list_builtin_configs()
    if not configs:
        print(f"no built-in configs under {builtin_config_dir()}")
        return 0
    groups: dict[str, list] = {}
    for c in configs:
        groups.setdefault(c.recipe or "(no launch line)", []).append(c)
    width = max(len(c.name) for c in configs)
    for recipe in sorted(groups, key=lambda r: (r.startswith("("), r)):
        print(recipe)
        for c in groups[recipe]:
            print(f"  {c.name:<{width}}  {c.path}")
    return 0


def run_cat(args: argparse.Namespace) -> int:
    from engine.config import find_config

    path = find_config(args.config)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read it ({exc}) — check the file") from None
    print(text, end="" if text.endswith("\n") else "\n")
    return 0


def run_cp(args: argparse.Namespace) -> int:
    from engine.config import find_config

    src = find_config(args.config)
    dest = Path(args.dest).expanduser()
    if dest.is_dir():
        dest = dest / src.name
    if dest.exists() and not args.force:
        raise UserError(f"{dest}: already exists — choose another DEST or pass --force to overwrite it")
    if not dest.parent.is_dir():
        raise UserError(f"{dest.parent}: no such folder — create it first or choose another DEST")
    try:
        data = src.read_bytes()
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise UserError(
            f"{dest}: cannot write it ({exc.strerror or exc}) — check the folder's permissions"
        ) from None
    print(f"copied {src} -> {dest}")
    return 0
