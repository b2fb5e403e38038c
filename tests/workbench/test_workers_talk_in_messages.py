"""Screen workers take their inputs as arguments and answer with messages: inside a `@work` method of a
screen nothing assigns or reads screen attributes, queries widgets or calls back into the UI thread."""

from __future__ import annotations

import ast
from pathlib import Path

SCREENS = Path(__file__).resolve().parents[2] / "workbench" / "screens"
ALLOWED = {"post_message"}  # the one way out of a worker


def _workers(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(
            isinstance(d, ast.Call) and getattr(d.func, "id", "") == "work" for d in node.decorator_list
        ):
            yield node


def test_screen_workers_touch_no_screen_state():
    found = []
    for path in sorted(SCREENS.glob("*.py")):
        for worker in _workers(ast.parse(path.read_text(encoding="utf-8"))):
            for node in ast.walk(worker):
                if isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == "self":
                    if node.attr not in ALLOWED:
                        found.append(f"{path.name}:{node.lineno} {worker.name} uses self.{node.attr}")
                if isinstance(node, ast.Attribute) and node.attr in (
                    "call_from_thread",
                    "query_one",
                    "query",
                ):
                    found.append(f"{path.name}:{node.lineno} {worker.name} calls {node.attr}")
    assert found == []


def test_every_screen_module_defines_a_screen():
    """Modules that are not screens (services, option tables, diffs) live beside, in workbench/."""
    for path in sorted(SCREENS.glob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bases = {
            getattr(b.value if isinstance(b, ast.Subscript) else b, "id", "")  # ModalScreen[bool]
            for n in ast.walk(tree)
            if isinstance(n, ast.ClassDef)
            for b in n.bases
        }
        assert bases & {"Screen", "ModalScreen"}, f"{path.name} defines no screen"
