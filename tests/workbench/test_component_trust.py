"""Trust model through the CLI: a config cannot run commands or widen its own allow-list; the user widens
it (`--allow-component`), and the run records and keeps that; a checkpoint folder the run did not write
is not resumed unless the user says `--trust-checkpoint`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.tracking import open_db, readers
from workbench import launcher
from workbench.cli import main

RECIPES = Path(__file__).resolve().parent / "recipes_for_tests"
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def recipes_on_path(tunebench_home, monkeypatch):
    """Test recipes importable by torchrun's workers; no grant left over from the environment."""
    from engine.config import reset_allowed_components

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(RECIPES), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("TUNEBENCH_ALLOW", raising=False)
    monkeypatch.delenv("TUNEBENCH_TRUST_CHECKPOINT", raising=False)
    reset_allowed_components()
    yield tunebench_home
    reset_allowed_components()


def _evil(tmp_path: Path, component: str, mark: Path) -> Path:
    cfg = tmp_path / "downloaded.yaml"
    cfg.write_text(
        "# tunebench run sft --config downloaded.yaml\n"
        f"optimizer:\n  _component_: {component}\n  command: touch {mark}\n  f: {mark}\n  obj: 1\n"
    )
    return cfg


REFUSED = [
    "torch.utils.collect_env.run",  # runs subprocess.Popen(command, shell=True)
    "torch.save",  # writes any path
    "torch.distributed.run.main",  # starts processes
    "subprocess.Popen",
    "subprocess.run",
    "os.system",
    "builtins.eval",
    "builtins.exec",
]


@pytest.mark.parametrize("component", REFUSED)
@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_config_naming_a_command_or_writer_is_refused_in_one_line(
    command, component, recipes_on_path, tmp_path, capsys
):
    mark = tmp_path / "owned"
    cfg = _evil(tmp_path, component, mark)
    argv = ["validate", str(cfg)] if command == "validate" else ["run", "sft", "--config", str(cfg)]
    capsys.readouterr()
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith(
        f"tunebench: optimizer._component_: component {component} is not on the allow-list"
    )
    assert not mark.exists() and not (recipes_on_path / "runs").exists()  # nothing ran, nothing written


def test_an_override_and_a_widening_config_are_refused_in_one_line(recipes_on_path, tmp_path, capsys):
    ok = tmp_path / "ok.yaml"
    ok.write_text("optimizer: {_component_: torch.optim.SGD, lr: 0.1}\n")
    capsys.readouterr()
    assert main(["run", "sft", "--config", str(ok), "optimizer=os.system"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "override 'optimizer=os.system': component os.system is not on the allow-list" in line
    widening = tmp_path / "widening.yaml"
    widening.write_text("allowed_components: [os]\noptimizer: {_component_: os.system, command: 'true'}\n")
    for argv in (["validate", str(widening)], ["run", "sft", "--config", str(widening)]):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert err.strip().splitlines() == [
            "tunebench: allowed_components: a config cannot widen its own allow-list (it may come from anyone)"
            " — remove the key; if you trust it, allow it yourself (tunebench run/validate --allow-component"
            f" PREFIX, TUNEBENCH_ALLOW=PREFIX, or allowed_components in {recipes_on_path / 'settings.yaml'})"
        ]
    assert not (recipes_on_path / "runs").exists()


def test_the_tunebench_command_itself_prints_no_traceback(recipes_on_path, tmp_path):
    mark = tmp_path / "owned"
    cfg = _evil(tmp_path, "torch.utils.collect_env.run", mark)
    proc = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "validate", str(cfg)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == "" and not mark.exists()
    assert len(proc.stderr.strip().splitlines()) == 1 and "torch.utils.collect_env.run" in proc.stderr


def test_validate_allow_component_widens_for_that_command_only(recipes_on_path, tmp_path, capsys):
    cfg = tmp_path / "frac.yaml"
    cfg.write_text("thing: {_component_: fractions.Fraction, numerator: 1, denominator: 2}\n")
    assert main(["validate", str(cfg)]) == 2
    assert "fractions.Fraction is not on the allow-list" in capsys.readouterr().err
    assert main(["validate", str(cfg), "--allow-component", "fractions"]) == 0
    assert capsys.readouterr().out.startswith("OK:")
    assert main(["validate", "--allow-component=fractions", str(cfg)]) == 0
    assert main(["validate", str(cfg), "--allow-component", "not a prefix"]) == 2
    assert "'not a prefix' is not a dotted module prefix" in capsys.readouterr().err


def test_run_allow_component_reaches_the_run_is_recorded_and_kept_on_relaunch(
    recipes_on_path, tmp_path, capsys
):
    cfg = tmp_path / "probe.yaml"
    cfg.write_text("thing: {_component_: fractions.Fraction, numerator: 1, denominator: 2}\n")
    base = ["run", "probe", "--module", "allow_probe_recipe", "--config", str(cfg), "--name", "probe"]
    assert main(base) == 2  # not allowed: refused before anything is registered
    assert "fractions.Fraction is not on the allow-list" in capsys.readouterr().err
    assert not (recipes_on_path / "runs").exists()

    assert main([*base, "--allow-component", "fractions", "--detach"]) == 0
    with open_db() as db:
        run = readers.get_run("probe", db=db)
    done = launcher.wait(run.id, timeout=240)
    assert (done.status, done.exit_code) == ("completed", 0), done.error
    capsys.readouterr()
    assert main(["show", "probe", "--json"]) == 0
    events = [(e["kind"], e["text"]) for e in json.loads(capsys.readouterr().out)["events"]]
    assert ("allow", "component allow-list widened by the user: fractions (from --allow-component)") in events
    assert ("probe", "built Fraction(1, 2)") in events  # the run's own process had the grant

    # Launched again from a process that granted nothing (the queue, the workbench): the run keeps its grant.
    from engine.config import reset_allowed_components

    reset_allowed_components()
    again = launcher.wait(launcher.launch(run.id).id, timeout=240)
    assert (again.status, again.exit_code) == ("completed", 0), again.error
    with open_db() as db:
        probes = [e.text for e in readers.events_since(run.id, db=db) if e.kind == "probe"]
    assert probes == ["built Fraction(1, 2)"] * 2


def test_a_checkpoint_the_run_did_not_write_needs_trust_checkpoint(recipes_on_path, tmp_path, capsys):
    import torch

    cfg = tmp_path / "lsq.yaml"
    cfg.write_text("steps: 4\n")
    run = launcher.create_run("lsq", config_path=cfg, module="lsq_recipe", name="mine")
    # a checkpoint folder put there from elsewhere (a download, another machine): no mark of this home
    foreign = Path(run.output_dir) / "checkpoints/step_4"
    foreign.mkdir(parents=True)
    torch.save(
        {"step": 4, "w": torch.zeros(8), "rng": torch.Generator().get_state()}, foreign / "recipe_state.pt"
    )
    capsys.readouterr()
    assert main(["resume", "mine"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"tunebench: run mine: {foreign} was not written by this run (")
    assert line.endswith(
        "; resuming unpickles its metadata, which can run code: if you trust it,"
        " `tunebench resume mine --trust-checkpoint`"
    )
    with open_db() as db:
        assert readers.get_run("mine", db=db).supervisor_pid is None  # nothing launched
    assert main(["resume", "mine", "--trust-checkpoint", "--detach"]) == 0
    done = launcher.wait(run.id, timeout=240)
    assert (done.status, done.exit_code) == ("completed", 0), done.error  # the recipe got the user's trust
    with open_db() as db:
        texts = [e.text for e in readers.events_since(run.id, db=db) if e.kind == "resume"]
    assert "resumed from checkpoints/step_4 (a foreign checkpoint, trusted by --trust-checkpoint)" in texts
