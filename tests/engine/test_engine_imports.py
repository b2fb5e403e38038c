"""`engine/` never imports the workbench's UI stack: importing every module under engine/ (found with
pkgutil.walk_packages, in a fresh interpreter) loads no textual, rich or workbench module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
UI = ("textual", "rich", "workbench")
OPTIONAL = {"ray"}  # the `rl` extra: modules that need it are reported, not failed

SCRIPT = r"""
import importlib, json, pkgutil, sys
import engine

imported, missing, broken = [], [], []

def onerror(name):
    broken.append(name)

for info in pkgutil.walk_packages(engine.__path__, "engine.", onerror=onerror):
    try:
        importlib.import_module(info.name)
        imported.append(info.name)
    except ModuleNotFoundError as exc:
        missing.append([info.name, (exc.name or "").split(".")[0]])
ui = sorted(m for m in sys.modules if m.split(".")[0] in ("textual", "rich", "workbench"))
print(json.dumps({"imported": imported, "missing": missing, "broken": broken, "ui": ui}))
"""


def test_importing_all_of_engine_loads_no_textual_rich_or_workbench():
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=REPO, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert not found["broken"], found["broken"]
    assert all(dep in OPTIONAL for _, dep in found["missing"]), found["missing"]
    modules = sum(1 for p in (REPO / "engine").rglob("*.py"))
    assert len(found["imported"]) + len(found["missing"]) >= modules * 0.9, "walk_packages saw every module"
    assert {"engine.recipes.sft", "engine.training.cpu_fast_paths", "engine.tracking.db"} <= set(
        found["imported"]
    )
    assert found["ui"] == [], f"engine imported UI modules: {found['ui']}"
