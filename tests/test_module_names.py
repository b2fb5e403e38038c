"""No two modules of engine/ and workbench/ share a file name (issue 15): a name says what a module is
without its folder, so `grep`, tracebacks and editor tabs never show two `schema.py`s."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_names(root: Path, *packages: str) -> dict[str, list[str]]:
    """basename -> the modules with it, over every non-`__init__` module below `root/package`."""
    seen: dict[str, list[str]] = defaultdict(list)
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if path.name != "__init__.py":
                seen[path.name].append(path.relative_to(root).as_posix())
    return seen


def test_no_two_modules_share_a_name():
    shared = {
        name: paths for name, paths in module_names(ROOT, "engine", "workbench").items() if len(paths) > 1
    }
    assert not shared, "modules sharing a name (rename one so the name says what it holds): " + "; ".join(
        f"{name}: {', '.join(paths)}" for name, paths in sorted(shared.items())
    )


def test_the_walk_sees_a_shared_name(tmp_path):
    """The check itself: two `errors.py` in different folders are reported, `__init__.py`s are not."""
    for folder in ("pkg/a", "pkg/b"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "__init__.py").write_text("")
        (tmp_path / folder / "errors.py").write_text("")
    (tmp_path / "pkg" / "a" / "only_here.py").write_text("")
    names = module_names(tmp_path, "pkg")
    assert {n: p for n, p in names.items() if len(p) > 1} == {
        "errors.py": ["pkg/a/errors.py", "pkg/b/errors.py"]
    }
    assert "__init__.py" not in names and names["only_here.py"] == ["pkg/a/only_here.py"]
