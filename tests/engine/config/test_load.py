"""load_config: YAML scalars, overrides of every form, interpolation, dump round trip."""

import math

import pytest

from engine.config import (
    ConfigError,
    apply_overrides,
    dump_config,
    load_config,
    load_config_from_argv,
    parse_overrides,
    parse_yaml,
    resolve_interpolations,
    split_config_argv,
)

BASE = """
# tunebench run sft --config x
output_dir: /runs/7
checkpoint_dir: ${output_dir}/ckpt
lr: 3e-4
steps: 10
compile: false
lora_attn_modules: [q_proj, v_proj]
optimizer:
  _component_: torch.optim.AdamW
  lr: ${lr}
  weight_decay: 0.01
  betas: [0.9, 0.95]
dataset:
  - source: alpaca
    weight: 2
  - source: ${dataset.0.source}_extra
    weight: 1
model:
  dim: 64
  layers: ${model.dim}
"""


def test_yaml_scalars_follow_yaml_1_2(write_yaml):
    cfg = load_config(write_yaml("a: 1e-4\nb: no\nc: true\nd: 2026-01-02\ne: .inf\nf: -1.5E+3\ng: 0x10\n"))
    assert cfg["a"] == 1e-4 and isinstance(cfg["a"], float)
    assert cfg["b"] == "no"
    assert cfg["c"] is True
    assert cfg["d"] == "2026-01-02"
    assert cfg["e"] == math.inf
    assert cfg["f"] == -1500.0
    assert cfg["g"] == 16


def test_interpolation_whole_partial_lists_nested(write_yaml):
    cfg = load_config(write_yaml(BASE))
    assert cfg["checkpoint_dir"] == "/runs/7/ckpt"
    assert cfg["optimizer"]["lr"] == 3e-4 and isinstance(cfg["optimizer"]["lr"], float)
    assert cfg["dataset"][1]["source"] == "alpaca_extra"
    assert cfg["model"]["layers"] == 64


def test_interpolation_chains_mappings_and_escape(write_yaml):
    cfg = load_config(
        write_yaml(
            """
            base: {dim: 8, name: tiny}
            model: ${base}
            width: ${model.dim}
            tag: "${model.name}-${width}-${flag}-${none}"
            flag: true
            none: null
            literal: "$${not_a_ref}"
            items: ["${width}", "x${width}"]
            """
        )
    )
    assert cfg["model"] == {"dim": 8, "name": "tiny"}
    assert cfg["width"] == 8
    assert cfg["tag"] == "tiny-8-true-null"
    assert cfg["literal"] == "${not_a_ref}"
    assert cfg["items"] == [8, "x8"]
    cfg["model"]["dim"] = 99  # whole-value references are copies
    assert cfg["base"]["dim"] == 8


def test_interpolation_after_overrides(write_yaml):
    cfg = load_config(write_yaml(BASE), ["output_dir=/elsewhere", "lr=1e-3"])
    assert cfg["checkpoint_dir"] == "/elsewhere/ckpt"
    assert cfg["optimizer"]["lr"] == 1e-3


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("a: ${b}\nb: ${c}\nc: ${a}\n", r"circular interpolation .*a -> b -> c -> a"),
        ("a: ${a}\n", r"circular interpolation a -> a"),
        ("a: x${a}\n", r"circular interpolation"),
        ('a: [1, "${a}"]\n', r"circular interpolation a -> a.1 -> a"),
        (
            "a: ${missing}\nmisssing: 1\n",
            r"a: interpolation \$\{missing\} refers to missing, which does not exist \(did you mean 'misssing'\?\)",
        ),
        ("a: [1]\nb: ${a.3}\n", r"b: interpolation \$\{a.3\}: a has 1 items, no index 3"),
        ("a: 1\nb: ${a.x}\n", r"a is a int, it has no key 'x'"),
        ("a: ${}\n", r"malformed interpolation"),
        ("a: {x: 1}\nb: pre-${a}\n", r"b: \$\{a\} is a dict and cannot be part of a string"),
    ],
)
def test_interpolation_errors_name_the_field(write_yaml, text, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(write_yaml(text))


def test_override_forms(write_yaml):
    cfg = load_config(
        write_yaml(BASE),
        [
            "steps=20",  # key=value, YAML-typed
            "compile=true",
            "model.dim=128",  # nested
            "optimizer.weight_decay=null",
            "lora_attn_modules=[q_proj,k_proj,v_proj]",  # list value
            "dataset.0.source=slimorca",  # list index
            "dataset.1.weight=0.5",
            "+seed=42",  # add a new key
            "new.deep.key=x",  # key=value creates parents
            "~optimizer.betas",  # deletion
            "label=",  # empty string
            "opts={a: 1, b: [2]}",
        ],
    )
    assert cfg["steps"] == 20 and cfg["compile"] is True
    assert cfg["model"] == {"dim": 128, "layers": 128}
    assert cfg["optimizer"] == {"_component_": "torch.optim.AdamW", "lr": 3e-4, "weight_decay": None}
    assert cfg["lora_attn_modules"] == ["q_proj", "k_proj", "v_proj"]
    assert cfg["dataset"][0]["source"] == "slimorca"
    assert cfg["dataset"][1] == {"source": "slimorca_extra", "weight": 0.5}
    assert cfg["seed"] == 42
    assert cfg["new"] == {"deep": {"key": "x"}}
    assert cfg["label"] == ""
    assert cfg["opts"] == {"a": 1, "b": [2]}


def test_delete_top_level_and_list_item(write_yaml):
    cfg = load_config(write_yaml(BASE), ["~compile", "~dataset.1", "~lora_attn_modules.0"])
    assert "compile" not in cfg
    assert len(cfg["dataset"]) == 1
    assert cfg["lora_attn_modules"] == ["v_proj"]


def test_component_swap_keeps_compatible_args(write_yaml):
    cfg = load_config(write_yaml(BASE), ["optimizer=torch.optim.SGD"])
    # SGD takes lr and weight_decay but not betas: betas is dropped, the rest is kept.
    assert cfg["optimizer"] == {"_component_": "torch.optim.SGD", "lr": 3e-4, "weight_decay": 0.01}
    cfg = load_config(write_yaml(BASE), ["optimizer={_component_: torch.optim.SGD, lr: 0.1}"])
    assert cfg["optimizer"] == {"_component_": "torch.optim.SGD", "lr": 0.1}


def test_component_swap_goes_through_the_allow_list(write_yaml):
    with pytest.raises(ConfigError, match=r"os\.getcwd is not on the allow-list.*TUNEBENCH_ALLOW=os\.getcwd"):
        load_config(write_yaml(BASE), ["optimizer=os.getcwd"])
    with pytest.raises(ConfigError, match=r"optimizer is a component — give a dotted path"):
        load_config(write_yaml(BASE), ["optimizer=SGD"])
    with pytest.raises(
        ConfigError,
        match=r"torch\.optim\.SGDD is not on the allow-list of components \(did you mean 'torch\.optim\.SGD'\?\) — fix the path",
    ):
        load_config(write_yaml(BASE), ["optimizer=torch.optim.SGDD"])


@pytest.mark.parametrize(
    "override, pattern",
    [
        ("steps", r"override 'steps': no '=' in it"),
        ("=3", r"override '=3': '' is not a key path"),
        ("a..b=1", r"'a..b' is not a key path"),
        ("a b=1", r"'a b' is not a key path"),
        ("~steps=3", r"a deletion takes no value — write ~steps"),
        ("~nope", r"no key nope to delete"),
        ("~stepz", r"\(did you mean 'steps'\?\)"),
        ("+steps=3", r"steps already exists — write steps=3 \(without '\+'\)"),
        ("steps.x=1", r"steps is a int, not a mapping or list"),
        ("dataset.5.source=x", r"dataset is a list of 2 items — use an index from 0 to 1"),
        ("dataset.x=1", r"dataset is a list of 2 items"),
        ("lr=[1", r"override 'lr=\[1':1:\d+: malformed YAML"),
        ("lr=!!python/object:os.system x", r"malformed YAML"),
        ("d=2026-13-45", None),
    ],
)
def test_malformed_overrides_name_the_override(write_yaml, override, pattern):
    path = write_yaml(BASE)
    if pattern is None:  # not an error: dates stay strings
        assert load_config(path, [override])["d"] == "2026-13-45"
        return
    with pytest.raises(ConfigError, match=pattern):
        load_config(path, [override])


def test_parse_overrides_shapes():
    ovs = parse_overrides(["a.0.b=1", "~x", "+y=[1, 2]"])
    assert [(o.op, o.path, o.value) for o in ovs] == [
        ("set", ("a", 0, "b"), 1),
        ("delete", ("x",), None),
        ("add", ("y",), [1, 2]),
    ]


def test_apply_overrides_does_not_mutate_input():
    cfg = {"a": {"b": 1}}
    out = apply_overrides(cfg, ["a.b=2"])
    assert cfg == {"a": {"b": 1}} and out == {"a": {"b": 2}}


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("a: 1\n  b: 2\n", r"cfg.yaml:2:4: malformed YAML: mapping values are not allowed here"),
        ("a: [1, 2\nb: 3\n", r"cfg.yaml:2:\d+: malformed YAML"),
        ("a: 1\na: 2\n", r"cfg.yaml:2:1: malformed YAML: duplicate key 'a' \(first at line 1\)"),
        ("- 1\n- 2\n", r"the config is a list, not a mapping"),
    ],
)
def test_malformed_yaml_reports_line_and_column(write_yaml, text, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(write_yaml(text))


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"no such config file"):
        load_config(tmp_path / "nope.yaml")


def test_dump_round_trips(write_yaml):
    cfg = load_config(write_yaml(BASE))
    cfg.update(
        {
            "s_float": "1e-4",
            "s_bool": "no",
            "s_true": "true",
            "s_null": "null",
            "s_num": "12",
            "s_date": "2026-01-02",
            "inf": float("-inf"),
            "tiny": 1e-12,
            "tuple": (1, 2),
            "multi": "line one\nline two",
            "unicode": "héllo",
            "empty": "",
            "refs": ["${output_dir}/ckpt", "$${literal}", "${lr}"],
            "tricky": ["a: b", "#not a comment", "- x", "{x}", "[1]", " lead", "trail ", "@at", "`tick"],
            "keys": {"1": "str key", 2: "int key", "null": None},
        }
    )
    text = dump_config(cfg, header="tunebench run sft --config x\nsecond line")
    assert text.startswith("# tunebench run sft --config x\n# second line\n")
    back = parse_yaml(text)
    expected = dict(cfg, tuple=[1, 2])
    assert back == expected


def test_dump_round_trips_nan():
    back = parse_yaml(dump_config({"x": float("nan")}))
    assert math.isnan(back["x"])


def test_load_config_from_argv(write_yaml):
    path = write_yaml(BASE)
    cfg = load_config_from_argv(["--config", str(path), "steps=3", "~compile"])
    assert cfg["steps"] == 3 and "compile" not in cfg
    assert load_config_from_argv([f"--config={path}"])["steps"] == 10
    assert split_config_argv(["a=1", "--config", "x.yaml", "~b"]) == ("x.yaml", ["a=1", "~b"])


@pytest.mark.parametrize(
    "argv, pattern",
    [
        ([], r"--config: missing"),
        (["--config"], r"--config: no file after it"),
        (["--config", "a", "--config", "b"], r"--config: given twice"),
        (["--config", "a", "--nproc", "2"], r"--nproc: unknown option"),
    ],
)
def test_split_config_argv_errors(argv, pattern):
    with pytest.raises(ConfigError, match=pattern):
        split_config_argv(argv)


def test_absurdly_deep_chain_is_a_config_error():
    cfg = {f"k{i}": f"${{k{i + 1}}}" for i in range(3000)}
    cfg["k3000"] = 1
    with pytest.raises(ConfigError, match=r"too deeply"):
        resolve_interpolations(cfg)
    assert resolve_interpolations({f"k{i}": f"${{k{i + 1}}}" for i in range(50)} | {"k50": 1})["k0"] == 1
