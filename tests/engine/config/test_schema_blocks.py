"""Nested config blocks (`validation`, `fsdp`) are declared in the recipe's schema like top-level keys:
their defaults are filled in by the schema (the recipe reads `cfg["validation"]["fraction"]`, no default
of its own), unknown keys in them are named with a did-you-mean, and their docs are looked up by path."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from engine.config import ConfigError
from engine.config._validate import validate

REPO = Path(__file__).resolve().parents[3]
RECIPES = ("sft", "dpo", "kd", "ppo", "grpo", "grpo_async", "reward_model", "eval")


def schema(recipe):
    return importlib.import_module(f"engine.recipes.{recipe}").CONFIG_SCHEMA


def test_a_given_validation_block_gets_each_recipe_s_own_defaults():
    sft, rm = schema("sft"), schema("reward_model")
    assert sft.fill({"validation": {"every_n_steps": 5}})["validation"] == {
        "fraction": 0.05, "dataset": None, "every_n_steps": 5, "max_batches": None,
    }  # fmt: skip
    assert rm.fill({"validation": {"max_batches": 2}})["validation"] == {
        "fraction": 0.1, "dataset": None, "every_n_steps": 50, "max_batches": 2,
    }  # fmt: skip
    assert sft.fill({})["validation"] is None and sft.fill({"validation": None})["validation"] is None  # off


def test_fsdp_absent_or_null_is_the_parallelize_defaults():
    from engine.training.parallelize import parallelize

    params = inspect.signature(parallelize).parameters
    expected = {k: params[k].default for k in ("reshard_after_forward", "cpu_offload")}
    for recipe in ("sft", "dpo", "reward_model"):
        s = schema(recipe)
        assert s.fill({})["fsdp"] == expected, recipe
        assert s.fill({"fsdp": None})["fsdp"] == expected, recipe
        assert s.fill({"fsdp": {"cpu_offload": True}})["fsdp"] == dict(expected, cpu_offload=True), recipe
    shared = schema("sft").fields["fsdp"]
    assert shared.default == {} and schema("sft").fill({})["fsdp"] is not shared.default  # the run's own copy


def test_unknown_and_bad_nested_keys_are_named_with_a_did_you_mean():
    cfg = {"fsdp": {"cpu_ofload": True}, "validation": {"fractoin": 0.1, "every_n_steps": 0}}
    problems = {str(p) for p in schema("sft").problems(cfg)}
    assert any(
        p.startswith("fsdp.cpu_ofload: unknown key under fsdp (did you mean 'cpu_offload'?)")
        for p in problems
    )
    assert any(
        p.startswith("validation.fractoin: unknown key under validation (did you mean 'fraction'?)")
        for p in problems
    )
    assert any(p.startswith("validation.every_n_steps: expects an integer >= 1, got int 0") for p in problems)
    with pytest.raises(ConfigError) as err:
        schema("reward_model").check({"fsdp": {"reshard_after_foward": False}})
    assert err.value.field in ("fsdp.reshard_after_foward", "checkpoint_dir", "model", "tokenizer", "dataset")
    found = [
        p
        for p in validate({"fsdp": {"reshard_after_foward": False}}, recipe="dpo")
        if p.field.startswith("fsdp")
    ]
    assert [(p.field, "did you mean 'reshard_after_forward'" in p.message) for p in found] == [
        ("fsdp.reshard_after_foward", True)
    ]


def test_nested_fields_are_found_by_path_with_their_docs():
    s = schema("sft")
    assert s.field_at("validation.fraction").default == 0.05
    assert s.doc("validation.fraction") == "share of the training data held out"
    assert s.doc("fsdp.cpu_offload").startswith("keep sharded parameters")
    assert s.field_at("batch_size").minimum == 1
    assert (
        s.field_at("validation.nope") is None
        and s.field_at("model._component_") is None
        and s.doc("x.y") == ""
    )


CONFIG_NAMES = {"cfg", "val", "val_cfg", "fsdp_cfg", "block"}  # what recipes call the config and its blocks


def _reads_config(node: ast.expr) -> bool:
    """`cfg`, `self.cfg`, a block variable, or a subscript of them (`cfg["fsdp"]`)."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr == "cfg"
    return isinstance(node, ast.Name) and node.id in CONFIG_NAMES


def _defaulted_reads(path: Path, declared: set[str]) -> list[str]:
    """`x.get("key", default)` calls in a module where "key" is a declared config key (top-level or
    in a block): a second default beside the schema's."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and len(node.args) == 2
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in declared
            and _reads_config(node.func.value)
        ):
            found.append(f"{path.name}:{node.lineno} .get({node.args[0].value!r}, ...)")
    return found


def test_recipes_read_declared_keys_without_defaults_of_their_own():
    found = []
    for recipe in RECIPES:
        s = schema(recipe)
        declared = set(s.fields) | {sub for f in s.fields.values() if f.keys for sub in f.keys}
        found += _defaulted_reads(REPO / "engine" / "recipes" / f"{recipe}.py", declared)
    assert found == []


def test_the_defaulted_read_check_sees_one(tmp_path):
    module = tmp_path / "r.py"
    module.write_text(
        "def f(self, cfg, state):\n"
        '    a = cfg.get("seed", 0)\n'
        '    b = cfg["validation"].get("fraction", 0.1)\n'
        '    c = self.cfg.get("epochs", 1)\n'
        '    d = cfg["epochs"] + state.get("seed", 0)\n'  # a resume state's key is not the config's
    )
    assert _defaulted_reads(module, {"seed", "fraction", "epochs"}) == [
        "r.py:2 .get('seed', ...)", "r.py:3 .get('fraction', ...)", "r.py:4 .get('epochs', ...)",
    ]  # fmt: skip
