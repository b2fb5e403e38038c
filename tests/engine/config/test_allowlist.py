"""The component allow-list: everything the project ships resolves under it, and what it lets a config
reach cannot start a process or write a file."""

import re
from pathlib import Path

import pytest

from engine.config import import_component, load_yaml
from engine.config._allowlist import ENGINE_EXCLUDED, ENGINE_MODULES, NAMED

REPO = Path(__file__).resolve().parents[3]
# A swap a config's comment offers: `_component_: torch.optim.AdamW    # torchao.optim.AdamW8bit: ...`
_COMMENTED_SWAP = re.compile(r"_component_:.*#\s*((?:engine|torch|torchao)\.[\w.]*\w)\s*:")
_SOURCE_COMPONENT = re.compile(r"""["']_component_["']\s*:\s*["']((?:engine|torch|torchao)\.[\w.]+)["']""")


def _components(node):
    if isinstance(node, dict):
        name = node.get("_component_")
        if isinstance(name, str) and "${" not in name:
            yield name
        for value in node.values():
            yield from _components(value)
    elif isinstance(node, list):
        for value in node:
            yield from _components(value)


def _shipped_names() -> dict[str, str]:
    """component -> where it appears: every shipped config (and the swaps its comments offer), the
    workbench's choices, the `_component_` literals in engine/, workbench/ and bench/ sources."""
    from workbench import recipe_options

    found: dict[str, str] = {}
    for path in sorted((REPO / "configs").rglob("*.yaml")):
        names = [*_components(load_yaml(path)), *_COMMENTED_SWAP.findall(path.read_text(encoding="utf-8"))]
        for name in names:
            found.setdefault(name, str(path.relative_to(REPO)))
    for _label, name in recipe_options.OPTIMIZERS.values():
        found.setdefault(name, "workbench/recipe_options.py")
    for name in (recipe_options.LINEAR_CE, recipe_options.CHUNKED_CE):
        found.setdefault(name, "workbench/recipe_options.py")
    for folder in ("engine", "workbench", "bench"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for name in _SOURCE_COMPONENT.findall(path.read_text(encoding="utf-8")):
                found.setdefault(name, str(path.relative_to(REPO)))
    return found


def test_every_shipped_component_resolves_under_the_allow_list():
    found = _shipped_names()
    assert len(found) > 40 and "torchao.optim.AdamW8bit" in found and "engine.data.mix" in found
    failures = []
    for name, where in sorted(found.items()):
        try:
            import_component(name)
        except Exception as exc:  # noqa: BLE001 - each failure is reported with its file
            failures.append(f"{where}: {exc}")
    assert failures == []


def test_named_entries_are_exact_names_that_exist():
    assert all(name.count(".") >= 2 for name in NAMED)  # no bare package such as `torch.optim`
    assert not {n for n in NAMED if n.split(".")[0] not in ("torch", "torchao", "engine")}
    for name in sorted(NAMED):
        if name.startswith("torchao."):
            pytest.importorskip("torchao")
        assert callable(import_component(name)), name


# Calls that start processes, write or delete files, unpickle, or import by name.
_DANGEROUS = re.compile(
    r"\bsubprocess\b|\bos\.system\b|\bPopen\b|\btorch\.save\b|\bpickle\.loads?\(|(?<![.\w])exec\(|(?<![.\w])eval\("
    r"|\bshutil\.|\bos\.(remove|unlink|replace|rename)\(|\.unlink\(|\.write_(text|bytes)\("
    r"|\bopen\([^)]*['\"][wax]|import_module\(|__import__\(|\bctypes\b|\bsocket\b|urlopen|requests\."
)
# Reviewed: what each of these lines does is fixed by the code, not by a config.
_REVIEWED = {
    ("engine/data/sources.py", "importlib.import_module(opener)"),  # opener: gzip, bz2 or lzma
    ("engine/data/tokenizers/rank_bpe.py", "tmp.write_text("),  # a verdict cache under TUNEBENCH_HOME
}


def test_engine_modules_on_the_list_neither_run_commands_nor_write_files():
    hits = []
    for module in ENGINE_MODULES:
        base = REPO / Path(*module.split("."))
        files = sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]
        assert files and all(f.is_file() for f in files), module
        for path in files:
            dotted = ".".join(path.relative_to(REPO).with_suffix("").parts)
            if any(dotted == e or dotted.startswith(e + ".") for e in ENGINE_EXCLUDED):
                continue
            rel = str(path.relative_to(REPO))
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                code = line.split("#", 1)[0]
                if _DANGEROUS.search(code) and not any(rel == f and s in code for f, s in _REVIEWED):
                    hits.append(f"{rel}:{i}: {line.strip()}")
    assert hits == [], "an allow-listed engine module can now run commands or write files: exclude it"
