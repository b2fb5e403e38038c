"""`tunebench export RUN -o FILE.yaml [--force]`: the run's config as a YAML that `tunebench run`
reproduces. An existing FILE.yaml is replaced only with --force."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a run's config as YAML (runs headless with `tunebench run`)")
    p.add_argument("run", metavar="RUN", help="run id or name")
    p.add_argument("-o", "--output", required=True, metavar="FILE.yaml", help="where to write it")
    p.add_argument("--force", action="store_true", help="replace FILE.yaml when it already exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engine.tracking.db import open_db
    from engine.tracking.readers import get_run
    from workbench import launcher

    path = launcher.export(args.run, args.output, overwrite=args.force)
    with open_db(create=False) as db:
        rec = get_run(args.run, db=db)
    print(f"wrote {path}; run it with: tunebench run {rec.recipe} --config {path}")
    return 0
