"""validate: each kind of problem, all reported at once, nothing heavy built."""

import sys
import types

import pytest

from engine.config import ConfigProblem, Field, Schema, allow_components, load_yaml
from engine.config._validate import validate, validate_file


def fields(problems):
    return [p.field for p in problems]


def test_valid_config_has_no_problems(write_yaml):
    cfg = load_yaml(
        write_yaml(
            """
            lr: 1e-3
            optimizer: {_component_: torch.optim.AdamW, lr: "${lr}", betas: [0.9, 0.95], fused: null}
            sched: {_component_: torch.optim.lr_scheduler.StepLR, step_size: 10, gamma: 0.5}
            loss: {_component_: torch.nn.CrossEntropyLoss, ignore_index: -100, reduction: mean}
            """
        )
    )
    assert validate(cfg) == []


def test_every_problem_kind_at_once(write_yaml):
    cfg = load_yaml(
        write_yaml(
            """
            a: ${b}
            b: ${a}
            c: ${nope}
            optimizer:
              _component_: torch.optim.SGD
              lrr: 0.1
              momentum: fast
              nesterov: 1
            sched: {_component_: torch.optim.lr_scheduler.StepLRR}
            evil: {_component_: os.system, command: "echo hi"}
            lin: {_component_: torch.nn.Linear, in_features: 3}
            ce: {_component_: torch.nn.CrossEntropyLoss, reduction: avg}
            """
        )
    )
    problems = validate(cfg)
    assert all(isinstance(p, ConfigProblem) for p in problems)
    by_field = {p.field: str(p) for p in problems}
    assert "circular interpolation a -> b -> a" in by_field["a"]
    assert "refers to nope, which does not exist" in by_field["c"]
    assert "unknown argument 'lrr' for torch.optim.SGD (did you mean 'lr'?)" in by_field["optimizer.lrr"]
    assert "expects float, got str 'fast'" in by_field["optimizer.momentum"]
    assert "expects bool, got int 1" in by_field["optimizer.nesterov"]
    assert (
        "StepLRR is not on the allow-list of components (did you mean 'torch.optim.lr_scheduler.StepLR'?)"
        in (by_field["sched._component_"])
    )
    assert "component os.system is not on the allow-list" in by_field["evil._component_"]
    assert "missing required argument 'out_features'" in by_field["lin.out_features"]
    assert (
        "ce.reduction" not in by_field
    )  # a str where a str is expected; its value is the callable's business
    assert len(problems) == 8
    # Every line reads `field: what — what to do`.
    for p in problems:
        assert str(p).startswith(p.field + ": ") and " — " in str(p) and "\n" not in str(p)


def test_call_site_arguments_are_not_missing():
    assert (
        validate({"opt": {"_component_": "torch.optim.SGD", "lr": 0.1}}) == []
    )  # params come from the recipe


@pytest.mark.parametrize(
    "value, ok",
    [
        ("mean", True),
        ("avg", False),
        (3, False),
    ],
)
def test_literal_types(monkeypatch, value, ok):
    module = types.ModuleType("tb_literal")
    exec(
        "from typing import Literal, Optional\n"
        "def build(mode: Literal['mean', 'sum'] = 'mean', n: Optional[int] = None, xs: list[int] = (),"
        " opts: dict | None = None, name: str = 'x', f: float = 1.0):\n    return mode\n",
        module.__dict__,
    )
    monkeypatch.setitem(sys.modules, "tb_literal", module)
    allow_components(["tb_literal"])  # a user grant: the fake module is not on the list
    problems = validate({"x": {"_component_": "tb_literal.build", "mode": value}})
    assert (problems == []) is ok
    bad = validate(
        {
            "x": {
                "_component_": "tb_literal.build",
                "n": 1.5,
                "xs": [1, "a"],
                "opts": [1],
                "name": 3,
                "f": 2,
            }
        }
    )
    assert fields(bad) == ["x.n", "x.xs", "x.opts", "x.name"]  # f: an int is a fine float
    assert [p.hint for p in bad] == [
        "change it to int or null",
        "change it to a list of int",
        "change it to a mapping or null",
        "change it to str",
    ]
    literal = validate({"x": {"_component_": "tb_literal.build", "mode": "avg"}})
    assert literal and literal[0].hint == "change it to one of 'mean', 'sum'"
    assert validate({"x": {"_component_": "tb_literal.build", "n": None, "xs": [1, 2], "opts": {}}}) == []


def test_nested_component_is_some_object_and_is_checked_itself():
    cfg = {
        "m": {
            "_component_": "torch.nn.Sequential",
        },
        "d": {
            "_component_": "torch.nn.ModuleDict",
            "modules": {"a": {"_component_": "torch.nn.Linear", "in_features": 2, "out_feature": 3}},
        },
    }
    assert fields(validate(cfg)) == ["d.modules.a.out_feature", "d.modules.a.out_features"]


def test_allow_list_applies_to_validate(monkeypatch):
    cfg = {"f": {"_component_": "fractions.Fraction", "numerator": 1}}
    assert fields(validate(cfg)) == ["f._component_"]
    # the config's own key grants nothing and is itself the problem
    assert fields(validate(dict(cfg, allowed_components=["fractions"]))) == [
        "allowed_components",
        "f._component_",
    ]
    monkeypatch.setenv("TUNEBENCH_ALLOW", "fractions")
    assert validate(cfg) == []
    assert fields(validate({"allowed_components": 3})) == ["allowed_components"]


def test_validate_builds_nothing(monkeypatch):
    calls = []
    module = types.ModuleType("tb_heavy")

    class Heavy:
        def __init__(self, size: int):
            calls.append(size)

    Heavy.__module__ = "tb_heavy"  # defined in the granted module (else: a class from elsewhere, refused)
    module.Heavy = Heavy
    monkeypatch.setitem(sys.modules, "tb_heavy", module)
    allow_components(["tb_heavy"])  # a user grant: the fake module is not on the list
    assert validate({"h": {"_component_": "tb_heavy.Heavy", "size": 10**12}}) == []
    assert calls == []


def test_recipe_config_keys(monkeypatch):
    recipe = types.ModuleType("engine.recipes._tb_toy")
    recipe.CONFIG_SCHEMA = Schema(
        {
            "model": Field(dict, None, "the model", component=True),
            "optimizer": Field(dict | None, None, "the optimizer", component=True),
            "epochs": Field(int, 1, "passes over the data", minimum=1),
        },
        call_site_args=frozenset({"in_features"}),
    )
    monkeypatch.setitem(sys.modules, "engine.recipes._tb_toy", recipe)
    cfg = {
        "model": {"_component_": "torch.nn.Linear", "out_features": 2},  # in_features comes from the recipe
        "epochz": 1,
    }
    problems = validate(cfg, recipe="_tb_toy")
    assert [str(p) for p in problems] == [
        "epochz: unknown top-level key for this recipe (did you mean 'epochs'?) — remove it or fix the spelling"
        " (`tunebench cat` a built-in config for the known keys)"
    ]
    assert validate({"anything": 1}) == []  # without a recipe, top-level keys are free


def test_unknown_recipe():
    problems = validate({}, recipe="no_such_recipe_xyz")
    assert fields(problems) == ["recipe"] and "no recipe named 'no_such_recipe_xyz'" in str(problems[0])


def test_validate_file_reports_yaml_line_and_column(write_yaml):
    problems, _ = validate_file(write_yaml("a: 1\nb: [1, 2\nc: 3\n"))
    assert len(problems) == 1
    assert problems[0].field.endswith("cfg.yaml:3:2")
    assert "malformed YAML" in problems[0].message


def test_validate_file_collects_bad_overrides_and_reads_the_launch_line(write_yaml, monkeypatch):
    recipe = types.ModuleType("engine.recipes._tb_toy2")
    recipe.CONFIG_SCHEMA = Schema({"lr": Field(float, 1e-3, "learning rate")})
    monkeypatch.setitem(sys.modules, "engine.recipes._tb_toy2", recipe)
    path = write_yaml("# tunebench run _tb_toy2 --config cfg.yaml\nlr: 1\n")
    problems, found = validate_file(path, ["oops", "~nope", "lr=2", "+epochs=3"])
    assert found == "_tb_toy2"
    assert fields(problems) == ["override 'oops'", "override '~nope'", "epochs"]


def test_union_with_an_unknown_class_is_decided_by_its_simple_members():
    # torch.optim.AdamW: lr: float | Tensor, betas: tuple[float | Tensor, float | Tensor]
    node = {"_component_": "torch.optim.AdamW", "lr": "fast", "betas": [0.9], "weight_decay": [1]}
    problems = {p.field: p for p in validate({"opt": node})}
    assert sorted(problems) == ["opt.betas", "opt.lr", "opt.weight_decay"]
    assert problems["opt.lr"].hint == "change it to float"
    assert problems["opt.betas"].hint == "change it to a list of 2 (float, float)"
    assert validate({"opt": dict(node, lr=1e-3, betas=[0.9, 0.95], weight_decay=0)}) == []


def test_sequences_and_unknown_classes(monkeypatch):
    module = types.ModuleType("tb_seq")
    exec(
        "from collections.abc import Sequence, Mapping\n"
        "from pathlib import Path\n"
        "def build(xs: Sequence[int] = (), m: Mapping[str, int] | None = None, p: Path | None = None):\n"
        "    return xs\n",
        module.__dict__,
    )
    monkeypatch.setitem(sys.modules, "tb_seq", module)
    allow_components(["tb_seq"])  # a user grant: the fake module is not on the list
    ok = {"_component_": "tb_seq.build", "xs": [1, 2], "m": {"a": 1}, "p": "/some/where"}
    assert validate({"x": ok}) == []  # Path | None cannot tell about a str: not reported
    bad = validate({"x": dict(ok, xs=[1, "a"], m=[1])})
    assert [(p.field, p.hint) for p in bad] == [
        ("x.xs", "change it to a list of int"),
        ("x.m", "change it to a mapping or null"),
    ]
