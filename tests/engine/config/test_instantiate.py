"""instantiate: recursion, call-site kwargs, missing arguments, and the allow-list."""

import pytest
import torch

from engine.config import ConfigError, allow_components, import_component, instantiate, load_config


def test_builds_a_real_optimizer_equal_to_a_direct_one():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    node = {"_component_": "torch.optim.SGD", "lr": 0.1, "momentum": 0.9}
    opt = instantiate(node, model.parameters())
    assert isinstance(opt, torch.optim.SGD)
    assert opt.defaults["lr"] == 0.1 and opt.defaults["momentum"] == 0.9
    # One step of the instantiated optimizer matches a directly built one (the reference).
    ref_model = torch.nn.Linear(4, 2)
    ref_model.load_state_dict(model.state_dict())
    ref = torch.optim.SGD(ref_model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(3, 4)
    for m, o in ((model, opt), (ref_model, ref)):
        o.zero_grad()
        m(x).square().sum().backward()
        o.step()
    torch.testing.assert_close(model.weight, ref_model.weight, rtol=0, atol=0)


def test_call_site_kwargs_override_yaml():
    opt = instantiate(
        {"_component_": "torch.optim.SGD", "lr": 0.1}, [torch.nn.Parameter(torch.zeros(1))], lr=0.5
    )
    assert opt.defaults["lr"] == 0.5


def test_recursive_components_in_dicts_and_lists():
    node = {
        "_component_": "torch.nn.Sequential",
    }
    assert isinstance(instantiate(node), torch.nn.Sequential)
    node = {
        "_component_": "torch.nn.ModuleDict",
        "modules": {
            "a": {"_component_": "torch.nn.Linear", "in_features": 2, "out_features": 3},
            "b": {"_component_": "torch.nn.ReLU"},
        },
    }
    built = instantiate(node)
    assert isinstance(built["a"], torch.nn.Linear) and built["a"].out_features == 3
    assert isinstance(built["b"], torch.nn.ReLU)
    node = {
        "_component_": "torch.nn.ModuleList",
        "modules": [{"_component_": "torch.nn.Identity"}, {"_component_": "torch.nn.Tanh"}],
    }
    assert [type(m) for m in instantiate(node)] == [torch.nn.Identity, torch.nn.Tanh]


def test_none_node_is_none():
    assert instantiate(None) is None


def test_missing_required_argument_names_the_key():
    with pytest.raises(
        ConfigError, match=r"torch\.nn\.Linear\.out_features: missing required argument 'out_features'"
    ):
        instantiate({"_component_": "torch.nn.Linear", "in_features": 2})
    with pytest.raises(ConfigError, match=r"modules\.a\.out_features: missing required argument"):
        instantiate(
            {
                "_component_": "torch.nn.ModuleDict",
                "modules": {"a": {"_component_": "torch.nn.Linear", "in_features": 2}},
            }
        )


def test_unknown_argument_and_rejected_values():
    with pytest.raises(ConfigError, match=r"cannot take these arguments .*'lrr'"):
        instantiate({"_component_": "torch.optim.SGD", "lrr": 0.1}, [torch.nn.Parameter(torch.zeros(1))])
    with pytest.raises(
        ConfigError, match=r"torch\.optim\.SGD\(\.\.\.\) refused its arguments: Invalid learning rate"
    ):
        instantiate({"_component_": "torch.optim.SGD", "lr": -1.0}, [torch.nn.Parameter(torch.zeros(1))])


def test_node_without_component():
    with pytest.raises(ConfigError, match=r"no _component_ key \(keys: lr\)"):
        instantiate({"lr": 1})
    with pytest.raises(ConfigError, match=r"expected a mapping with _component_"):
        instantiate(3)


def test_unknown_component_did_you_mean():
    with pytest.raises(ConfigError, match=r"torch\.nn has no 'Linaer' \(did you mean 'Linear'\?\)"):
        instantiate({"_component_": "torch.nn.Linaer"})
    with pytest.raises(ConfigError, match=r"engine has no 'modelz' \(did you mean 'models'\?\)"):
        instantiate({"_component_": "engine.modelz.x"})


def test_refuses_components_outside_the_allow_list(tmp_path):
    marker = tmp_path / "ran"
    node = {"_component_": "pathlib.Path.touch", "self": str(marker)}
    with pytest.raises(ConfigError) as info:
        instantiate(node)
    msg = str(info.value)
    assert "pathlib.Path.touch is not under an allowed prefix" in msg
    assert "allowed_components: [pathlib]" in msg and "TUNEBENCH_ALLOW=pathlib" in msg
    assert "\n" not in msg
    assert not marker.exists()


@pytest.mark.parametrize("name", ["torch.load", "torch.hub.load", "torch.jit.load"])
def test_code_loading_torch_callables_are_refused(name):
    with pytest.raises(ConfigError, match=r"can run code from outside the config"):
        instantiate({"_component_": name})


def test_prefix_matches_at_dot_boundaries(monkeypatch):
    monkeypatch.setenv("TUNEBENCH_ALLOW", "collections")
    assert instantiate({"_component_": "collections.OrderedDict"}) == {}
    with pytest.raises(ConfigError, match=r"not under an allowed prefix"):
        instantiate({"_component_": "collectionsx.thing"})  # "collections" does not cover "collectionsx"


def test_allowed_via_env(monkeypatch):
    monkeypatch.setenv("TUNEBENCH_ALLOW", " json , fractions.")
    assert instantiate({"_component_": "fractions.Fraction", "numerator": 3, "denominator": 6}) == 0.5
    assert instantiate({"_component_": "json.loads", "s": "[1]"}) == [1]


def test_allowed_via_config_key(write_yaml):
    path = write_yaml(
        """
        allowed_components: [fractions]
        half: {_component_: fractions.Fraction, numerator: 1, denominator: 2}
        """
    )
    cfg = load_config(path)
    assert instantiate(cfg["half"]) == 0.5


def test_allowed_via_allow_components():
    with pytest.raises(ConfigError):
        instantiate({"_component_": "decimal.Decimal", "value": "1.5"})
    allow_components(["decimal"])
    assert float(instantiate({"_component_": "decimal.Decimal", "value": "1.5"})) == 1.5


def test_bad_allowed_components_value(write_yaml):
    with pytest.raises(ConfigError, match=r"allowed_components: must be a list of module prefixes"):
        load_config(write_yaml("allowed_components: [1, 2]\n"))


def test_bad_component_path():
    with pytest.raises(ConfigError, match=r"is not a dotted import path"):
        instantiate({"_component_": "torch.nn.Linear()"})


@pytest.mark.parametrize(
    "name, pattern",
    [
        ("torch.os.system", r"leads to module os, which is not under an allowed prefix"),
        ("torch.builtins.exec", r"leads to module builtins"),
        ("torch._C._get_tracing_state", r"is private to torch"),
        ("torch.nn.Linear.__class__", r"reaches a dunder attribute"),
        ("engine.config.allow_components", r"is the config system itself"),
    ],
)
def test_paths_that_escape_the_prefix_are_refused(name, pattern):
    with pytest.raises(ConfigError, match=pattern):
        instantiate({"_component_": name, "command": "true"})


def test_user_prefix_does_not_cover_modules_reached_through_it(monkeypatch):
    monkeypatch.setenv("TUNEBENCH_ALLOW", "torch")
    with pytest.raises(ConfigError, match=r"leads to module sys"):
        instantiate({"_component_": "torch.sys.getrecursionlimit"})
    monkeypatch.setenv("TUNEBENCH_ALLOW", "torch,sys")
    assert isinstance(instantiate({"_component_": "torch.sys.getrecursionlimit"}), int)


def test_import_component_direct_use():
    assert import_component("torch.nn.Linear") is torch.nn.Linear
    with pytest.raises(
        ConfigError, match=r"^os\.system: component os\.system is not under an allowed prefix"
    ):
        import_component("os.system")


def test_partial_objects_under_an_allowed_module_are_allowed(monkeypatch):
    import functools
    import sys
    import types

    module = types.ModuleType("engine._tb_partial")
    module.linear_2_to = functools.partial(torch.nn.Linear, 2)
    module.leaked_system = __import__("os").system  # a stdlib routine re-exported: still refused
    monkeypatch.setitem(sys.modules, "engine._tb_partial", module)
    assert instantiate({"_component_": "engine._tb_partial.linear_2_to", "out_features": 3}).in_features == 2
    with pytest.raises(ConfigError, match=r"leads to module (os|posix)"):
        instantiate({"_component_": "engine._tb_partial.leaked_system", "command": "true"})
