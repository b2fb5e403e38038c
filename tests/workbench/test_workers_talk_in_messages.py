"""Workers take their inputs as arguments and answer with messages: inside a `@work` method of a screen
or a widget (or any workbench module) nothing assigns or reads screen/widget attributes, queries
widgets or calls back into the UI thread."""

from __future__ import annotations

import ast
from pathlib import Path

WORKBENCH = Path(__file__).resolve().parents[2] / "workbench"
SCREENS = WORKBENCH / "screens"
ALLOWED = {"post_message"}  # the one way out of a worker


def _workers(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(
            isinstance(d, ast.Call) and getattr(d.func, "id", "") == "work" for d in node.decorator_list
        ):
            yield node


def _misuses(source: str, name: str) -> list[str]:
    found = []
    for worker in _workers(ast.parse(source)):
        for node in ast.walk(worker):
            if isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == "self":
                if node.attr not in ALLOWED:
                    found.append(f"{name}:{node.lineno} {worker.name} uses self.{node.attr}")
            if isinstance(node, ast.Attribute) and node.attr in ("call_from_thread", "query_one", "query"):
                found.append(f"{name}:{node.lineno} {worker.name} calls {node.attr}")
    return found


def test_workers_touch_no_screen_or_widget_state():
    found = []
    paths = sorted(WORKBENCH.rglob("*.py"))
    assert {"metric_plot.py", "recipe.py", "live.py"} <= {p.name for p in paths}
    for path in paths:
        found += _misuses(path.read_text(encoding="utf-8"), path.relative_to(WORKBENCH).as_posix())
    assert found == []


def test_the_check_sees_a_worker_reaching_into_the_ui():
    source = """
@work(thread=True)
def _load(self, path):
    rows = read(path)
    self.app.call_from_thread(self.show, rows)
    self.query_one(Table).rows = rows
    self.post_message(Loaded(rows))
"""
    found = _misuses(source, "w.py")
    assert any("uses self.app" in f for f in found) and any("calls call_from_thread" in f for f in found)
    assert any("calls query_one" in f for f in found) and not any("post_message" in f for f in found)


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
