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
    with pytest.raises(
        ConfigError, match=r"torch\.nn\.Linaer is not on the allow-list .*did you mean 'torch\.nn\.Linear'"
    ):
        instantiate({"_component_": "torch.nn.Linaer"})
    with pytest.raises(ConfigError, match=r"did you mean 'engine\.models\.x'\?\) — fix the path"):
        instantiate({"_component_": "engine.modelz.x"})
    with pytest.raises(ConfigError, match=r"engine\.models has no 'nope'"):
        instantiate({"_component_": "engine.models.nope"})


def test_refuses_components_outside_the_allow_list(tmp_path):
    marker = tmp_path / "ran"
    node = {"_component_": "pathlib.Path.touch", "self": str(marker)}
    with pytest.raises(ConfigError) as info:
        instantiate(node)
    msg = str(info.value)
    assert "component pathlib.Path.touch is not on the allow-list of components" in msg
    assert "--allow-component pathlib.Path.touch" in msg and "TUNEBENCH_ALLOW=pathlib.Path.touch" in msg
    assert "\n" not in msg
    assert not marker.exists()


@pytest.mark.parametrize(
    "name",
    [
        "torch.utils.collect_env.run",  # subprocess.Popen(command, shell=True) on a config string
        "torch.save",  # writes any path
        "torch.distributed.run.main",  # starts processes
        "torch.load", "torch.hub.load", "torch.jit.load", "torch.package.PackageImporter",
        "subprocess.Popen", "subprocess.run", "os.system", "builtins.eval", "builtins.exec",
        "engine.checkpoint.save_checkpoint", "engine.tracking.run_rows.delete_run",
        "engine.data.cache.clear", "engine.modules.torchao_import.import_torchao",
        "engine.training.parallelize", "engine.recipes.sft.main",
    ],
)  # fmt: skip
def test_commands_writers_and_loaders_are_refused_before_import(name, monkeypatch):
    import sys

    top = ".".join(name.split(".")[:3])
    monkeypatch.delitem(sys.modules, "torch.utils.collect_env", raising=False)
    with pytest.raises(ConfigError, match=rf"component {name} .*(not on the allow-list|config system)"):
        instantiate({"_component_": name, "command": "touch /tmp/tunebench-owned"})
    if name == "torch.utils.collect_env.run":
        assert top not in sys.modules  # refused by name: the module was never imported


def test_prefix_matches_at_dot_boundaries():
    allow_components(["collections"])
    assert instantiate({"_component_": "collections.OrderedDict"}) == {}
    with pytest.raises(ConfigError, match=r"not on the allow-list"):
        instantiate({"_component_": "collectionsx.thing"})  # "collections" does not cover "collectionsx"


def test_allowed_via_env(monkeypatch):
    monkeypatch.setenv("TUNEBENCH_ALLOW", " json , fractions.")
    assert instantiate({"_component_": "fractions.Fraction", "numerator": 3, "denominator": 6}) == 0.5
    assert instantiate({"_component_": "json.loads", "s": "[1]"}) == [1]
    monkeypatch.setenv("TUNEBENCH_ALLOW", "json,not a prefix")
    with pytest.raises(ConfigError, match=r"^TUNEBENCH_ALLOW: 'not a prefix' is not a dotted module prefix"):
        instantiate({"_component_": "json.loads", "s": "[1]"})


def test_allowed_via_settings_under_the_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEBENCH_HOME", str(tmp_path))
    node = {"_component_": "fractions.Fraction", "numerator": 1, "denominator": 2}
    with pytest.raises(ConfigError, match=r"not on the allow-list"):
        instantiate(node)
    (tmp_path / "settings.yaml").write_text("allowed_components: [fractions]\n")
    assert instantiate(node) == 0.5
    (tmp_path / "settings.yaml").write_text("allowed_components: [1]\n")
    with pytest.raises(
        ConfigError, match=r"settings\.yaml: allowed_components: must be a list of module prefixes"
    ):
        instantiate(node)


def test_a_config_cannot_widen_its_own_allow_list(write_yaml):
    path = write_yaml(
        """
        allowed_components: [fractions]
        half: {_component_: fractions.Fraction, numerator: 1, denominator: 2}
        """
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert msg.startswith("allowed_components: a config cannot widen its own allow-list")
    assert "--allow-component PREFIX" in msg and "settings.yaml" in msg and "\n" not in msg
    with pytest.raises(ConfigError, match=r"a config cannot widen"):
        load_config(write_yaml("allowed_components: [1, 2]\n"))
    # the config system itself is not reachable from a config either
    with pytest.raises(ConfigError, match=r"is the config system itself"):
        instantiate({"_component_": "engine.config.allow_components", "prefixes": ["os"]})


def test_allowed_via_allow_components():
    with pytest.raises(ConfigError):
        instantiate({"_component_": "decimal.Decimal", "value": "1.5"})
    allow_components(["decimal"])
    assert float(instantiate({"_component_": "decimal.Decimal", "value": "1.5"})) == 1.5


def test_bad_component_path():
    with pytest.raises(ConfigError, match=r"is not a dotted import path"):
        instantiate({"_component_": "torch.nn.Linear()"})


@pytest.mark.parametrize(
    "name, pattern",
    [
        ("torch.os.system", r"torch\.os\.system is not on the allow-list"),
        ("engine.models.llama3.torch.save", r"leads to (module )?torch|has no 'torch'"),
        ("engine.data.dataset.pickle.loads", r"leads to pickle|has no 'pickle'"),
        ("torch._C._get_tracing_state", r"is private"),
        ("engine.models._decoder_builder.build_decoder", r"is private"),
        ("torch.nn.Linear.__class__", r"reaches a dunder attribute"),
        (
            "torch.optim.AdamW.register_step_pre_hook",
            r"not on the allow-list",
        ),  # named exactly: nothing under it
    ],
)
def test_paths_that_escape_the_list_are_refused(name, pattern):
    with pytest.raises(ConfigError, match=pattern):
        instantiate({"_component_": name, "command": "true"})


def test_an_engine_module_re_exporting_another_modules_function_is_refused(monkeypatch):
    import sys
    import types

    module = types.ModuleType("engine.data._tb_leak")
    module.save = torch.save
    monkeypatch.setitem(sys.modules, "engine.data._tb_leak", module)
    monkeypatch.setattr("engine.data.tb_leaked_save", torch.save, raising=False)
    with pytest.raises(
        ConfigError, match=r"leads to torch\.serialization\.save, which is not on the allow-list"
    ):
        instantiate({"_component_": "engine.data.tb_leaked_save", "obj": 1, "f": "/tmp/x"})


def test_user_prefix_does_not_cover_modules_reached_through_it():
    allow_components(["torch"])
    with pytest.raises(ConfigError, match=r"leads to sys"):
        instantiate({"_component_": "torch.sys.getrecursionlimit"})
    allow_components(["sys"])
    assert isinstance(instantiate({"_component_": "torch.sys.getrecursionlimit"}), int)


def test_an_exact_user_grant_allows_just_that_function():
    allow_components(["os.path.join"])
    assert instantiate({"_component_": "os.path.join", "a": "x"}) == "x"
    with pytest.raises(ConfigError, match=r"not on the allow-list"):
        instantiate({"_component_": "os.path.exists", "path": "x"})


def test_import_component_direct_use():
    assert import_component("torch.nn.Linear") is torch.nn.Linear
    with pytest.raises(ConfigError, match=r"^os\.system: component os\.system is not on the allow-list"):
        import_component("os.system")


def test_partial_objects_under_a_granted_module_are_allowed(monkeypatch):
    import functools
    import sys
    import types

    module = types.ModuleType("tb_partial")
    module.linear_2_to = functools.partial(torch.nn.Linear, 2)
    module.leaked_system = __import__("os").system  # a stdlib routine re-exported: still refused
    monkeypatch.setitem(sys.modules, "tb_partial", module)
    allow_components(["tb_partial"])
    assert instantiate({"_component_": "tb_partial.linear_2_to", "out_features": 3}).in_features == 2
    with pytest.raises(ConfigError, match=r"leads to (os|posix)\.system"):
        instantiate({"_component_": "tb_partial.leaked_system", "command": "true"})
