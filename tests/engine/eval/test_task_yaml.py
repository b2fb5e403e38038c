"""Our task-YAML reader against lm-eval's own loader on the same files: the built-in tasks, a
`!function` tag and an `include:` chain (lm-eval's loader is private, so the product owns one)."""

from __future__ import annotations

import pytest

from engine.eval.task_yaml import load_task_yaml
from engine.eval.tasks import BUILTIN_TASK_DIR, load_task_file

lm_eval = pytest.importorskip("lm_eval")


def _reference(path):
    from lm_eval.tasks._yaml_loader import load_yaml  # the reference only: tests may read lm-eval's

    return load_yaml(path)


def _comparable(cfg: dict) -> dict:
    """Callables by module file and name (two imports of one file give two function objects)."""
    return {k: (v.__code__.co_filename, v.__name__) if callable(v) else v for k, v in sorted(cfg.items())}


@pytest.mark.parametrize("name", sorted(p.name for p in BUILTIN_TASK_DIR.glob("*.yaml")))
def test_builtin_tasks_read_as_lm_eval_reads_them(name):
    path = BUILTIN_TASK_DIR / name
    assert load_task_yaml(path) == _reference(path)


def test_function_tags_and_includes_equal_lm_eval(tmp_path):
    (tmp_path / "utils.py").write_text(
        "def process_docs(ds):\n    return ds\n\ndef score(d, r):\n    return {}\n"
    )
    (tmp_path / "base.yaml").write_text(
        "output_type: generate_until\nprocess_docs: !function utils.process_docs\ndoc_to_text: base\n"
        "metadata:\n  version: 1.0\n"
    )
    (tmp_path / "task.yaml").write_text(
        "include: base.yaml\ntask: mine\ndoc_to_text: 'Q: {{q}}'\nprocess_results: !function utils.score\n"
    )
    ours, ref = load_task_yaml(tmp_path / "task.yaml"), _reference(tmp_path / "task.yaml")
    assert ours["doc_to_text"] == "Q: {{q}}" and ours["output_type"] == "generate_until"
    assert callable(ours["process_docs"]) and ours["process_docs"]([1]) == [1]
    assert _comparable(ours) == _comparable(ref)


def test_bad_task_files_are_one_line(tmp_path):
    from engine.eval.eval_errors import EvalError

    bad = tmp_path / "bad.yaml"
    bad.write_text("task: x\nprocess_docs: !function missing.fn\n")
    with pytest.raises(
        EvalError, match=r"bad\.yaml: cannot read this task file .*missing\.py does not exist"
    ):
        load_task_file(bad)
    loop = tmp_path / "loop.yaml"
    loop.write_text("include: loop.yaml\ntask: x\n")
    with pytest.raises(EvalError, match="include cycle"):
        load_task_file(loop)
