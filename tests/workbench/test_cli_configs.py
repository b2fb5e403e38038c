"""`tunebench validate`, `ls`, `cp`, `cat` through `workbench.cli.main`, with a temporary configs/ folder."""

import sys
import types

import pytest

from engine.config import Field, Schema
from workbench.cli import main

SFT_LORA = """\
# tunebench run toyrecipe --config fam/1B_lora
#   common overrides: lr=1e-4
lr: 3e-4
optimizer: {_component_: torch.optim.AdamW, lr: "${lr}"}
"""
DPO = """\
# Launch: tunebench run dpo --config fam/1B_dpo
beta: 0.1
"""


@pytest.fixture
def configs_dir(tmp_path, monkeypatch):
    root = tmp_path / "configs"
    (root / "fam").mkdir(parents=True)
    (root / "fam" / "1B_lora.yaml").write_text(SFT_LORA)
    (root / "fam" / "1B_dpo.yaml").write_text(DPO)
    (root / "other").mkdir()
    (root / "other" / "plain.yaml").write_text("x: 1\n")
    (root / "eval" / "tasks").mkdir(parents=True)
    (root / "eval" / "tasks" / "task.yaml").write_text("task: not a run config\n")
    monkeypatch.setattr("engine.config._find.builtin_config_dir", lambda: root)
    monkeypatch.setattr("engine.config.builtin_config_dir", lambda: root)
    recipe = types.ModuleType("engine.recipes.toyrecipe")
    recipe.CONFIG_SCHEMA = Schema(
        {
            "lr": Field(float, 1e-3, "learning rate"),
            "optimizer": Field(dict | None, None, "optimizer", component=True),
        }
    )
    monkeypatch.setitem(sys.modules, "engine.recipes.toyrecipe", recipe)
    monkeypatch.delenv("TUNEBENCH_ALLOW", raising=False)
    return root


def test_validate_ok_builtin_name(configs_dir, capsys):
    assert main(["validate", "fam/1B_lora"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: ") and "for recipe toyrecipe" in out and out.count("\n") == 1


def test_validate_reports_every_problem_and_exits_2(configs_dir, capsys):
    code = main(["validate", "fam/1B_lora", "lrr=1", "optimizer.betas=fast", "~nope"])
    out = capsys.readouterr().out.splitlines()
    assert code == 2
    assert out[0].startswith("override '~nope': no key nope to delete")
    assert any(
        line.startswith("lrr: unknown top-level key for this recipe (did you mean 'lr'?)") for line in out
    )
    assert any(line.startswith("optimizer.betas: torch.optim.AdamW expects") for line in out)
    assert out[-1].startswith("3 problems in ")


def test_validate_recipe_flag_overrides_launch_line(configs_dir, capsys):
    assert main(["validate", "other/plain", "--recipe", "toyrecipe"]) == 2
    assert capsys.readouterr().out.startswith("x: unknown top-level key")


def test_validate_malformed_yaml_line_column(tmp_path, configs_dir, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: 1\nb: {c: 2\n")
    assert main(["validate", str(bad)]) == 2
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"{bad}:3:1: malformed YAML")


def test_unknown_config_exits_2_with_one_line(configs_dir, capsys):
    assert main(["validate", "fam/1B_lroa"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean 'fam/1B_lora'" in err and "tunebench ls" in err


def test_ls_groups_by_recipe(configs_dir, capsys):
    assert main(["ls"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if not line.startswith(" ")] == ["dpo", "toyrecipe", "(no launch line)"]
    assert lines[1].split()[0] == "fam/1B_dpo" and lines[3].split()[0] == "fam/1B_lora"
    assert "eval/tasks/task" not in "\n".join(lines)  # deeper folders are not run configs


def test_ls_empty(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("engine.config._find.builtin_config_dir", lambda: tmp_path / "none")
    monkeypatch.setattr("engine.config.builtin_config_dir", lambda: tmp_path / "none")
    assert main(["ls"]) == 0
    assert "no built-in configs" in capsys.readouterr().out


def test_cat_prints_verbatim(configs_dir, capsys):
    assert main(["cat", "fam/1B_lora.yaml"]) == 0
    assert capsys.readouterr().out == SFT_LORA


def test_cp_copies_refuses_overwrite_and_forces(configs_dir, tmp_path, capsys):
    dest = tmp_path / "mine.yaml"
    assert main(["cp", "fam/1B_lora", str(dest)]) == 0
    assert dest.read_text() == SFT_LORA
    dest.write_text("edited: true\n")
    assert main(["cp", "fam/1B_lora", str(dest)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "--force" in err
    assert dest.read_text() == "edited: true\n"
    assert main(["cp", "fam/1B_dpo", str(dest), "--force"]) == 0
    assert dest.read_text() == DPO
    folder = tmp_path / "out"
    folder.mkdir()
    assert main(["cp", "fam/1B_dpo", str(folder)]) == 0
    assert (folder / "1B_dpo.yaml").read_text() == DPO
    assert sorted(p.name for p in folder.iterdir()) == ["1B_dpo.yaml"]  # no temp file left behind


def test_cp_into_missing_folder(configs_dir, tmp_path, capsys):
    assert main(["cp", "fam/1B_dpo", str(tmp_path / "no" / "x.yaml")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_validate_recipe_flag_anywhere_after_config(configs_dir, capsys):
    assert main(["validate", "other/plain", "--recipe", "toyrecipe", "y=2", "~x"]) == 2
    assert capsys.readouterr().out.startswith("y: unknown top-level key")
    assert main(["validate", "other/plain", "~x", "--recipe=toyrecipe"]) == 0
    capsys.readouterr()
    assert main(["validate", "other/plain", "x=2", "--fast"]) == 2
    assert "--fast: unknown option" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n"])
def test_validate_an_empty_config_is_one_line_and_exit_2(tmp_path, configs_dir, capsys, text):
    empty = tmp_path / "empty.yaml"
    empty.write_text(text)
    assert main(["validate", str(empty)]) == 2
    assert main(["validate", str(empty), "--recipe", "toyrecipe"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{empty}: the config is empty (no keys) — write the recipe's keys, or start from a "
                   "built-in one: `tunebench ls`, then `tunebench cp NAME FILE`"] * 2  # fmt: skip


def test_run_an_empty_config_is_one_line_and_exit_2(tmp_path, configs_dir, capsys, tunebench_home):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    assert main(["run", "sft", "--config", str(empty)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the config is empty (no keys)" in err and "Traceback" not in err
    assert not (tunebench_home / "runs").exists() or not any((tunebench_home / "runs").iterdir())
