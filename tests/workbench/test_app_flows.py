"""Pilot tests of the workbench flows against real runs.

Runs are real: the launcher starts torchrun with the least-squares recipe of
`tests/workbench/recipes_for_tests/lsq_recipe.py` (SGD on a regression problem, logging through
`MetricLogger`, checkpointing, honouring SIGTERM and resume), so launch, watch, stop, resume, clone,
compare and export are exercised end to end through the app's keys.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import yaml

from tests.workbench.pilot_wait import wait_for
from workbench.app import make_app

RECIPES = Path(__file__).resolve().parent / "recipes_for_tests"
SIZE = (110, 36)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def lsq_env(tunebench_home, tmp_path, monkeypatch):
    """A private TUNEBENCH_HOME, the test recipe importable by torchrun, and a config file `lsq.yaml`
    in the working directory."""
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(RECIPES), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.setenv("TUNEBENCH_DEVICE_MEMORY_GB", "24")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lsq.yaml").write_text(
        "# tunebench run lsq --config lsq.yaml\n"
        "steps: 60\nlr: 0.05\ndim: 8\nbatch_size: 16\nseed: 0\ncheckpoint_every: 10\nstep_delay_s: 0.1\n"
    )
    yield tunebench_home
    _stop_all()


def _stop_all() -> None:
    """Never leave a run behind: stop whatever is still active in this home."""
    from engine.tracking.db import open_db
    from engine.tracking.readers import active_runs
    from workbench import launcher

    with open_db() as db:
        active = [r.id for r in active_runs(db=db)]
    for rid in active:
        try:
            launcher.stop(rid, grace_s=10, wait_s=10)
        except Exception:  # already ended between the query and the stop
            pass


def _run(run_id: str):
    from engine.tracking.db import open_db
    from engine.tracking.readers import get_run

    with open_db() as db:
        return get_run(run_id, db=db)


def _runs():
    from engine.tracking.db import open_db
    from engine.tracking.readers import list_runs

    with open_db() as db:
        return list_runs(db=db)


async def type_text(pilot, text: str) -> None:
    for ch in text:
        await pilot.press(ch if ch != "." else "full_stop")


@pytest.mark.distributed
async def test_configure_validate_launch_watch_stop_resume_clone_compare_export(lsq_env, tmp_path):
    from workbench.screens.compare_screen import CompareScreen
    from workbench.screens.live import LiveRunScreen
    from workbench.screens.recipe import RecipeScreen
    from workbench.screens.runs_screen import RunsScreen
    from workbench.widgets.metric_plot import MetricPlot
    from workbench.widgets.runs_table import RunsTable

    app = make_app(interval=0.2, recipe_module="lsq_recipe")
    async with app.run_test(size=SIZE) as pilot:
        # Configure: open the Recipe screen, load the config file, change the learning rate.
        await pilot.press("f4")
        screen = await wait_for(
            pilot, lambda: isinstance(app.screen, RecipeScreen) and app.screen, what="recipe"
        )
        app.set_focus(screen.query_one("#config-path"))
        await type_text(pilot, "lsq.yaml")
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.base.get("steps") == 60, what="config loaded")
        lr_input = next(w for w in screen.query("#knobs Input") if screen.knob_keys.get(w.id) == "lr")
        lr_input.value = "0.02"
        await wait_for(pilot, lambda: "lr: 0.02" in screen.yaml_text, what="YAML shows the new lr")
        assert yaml.safe_load(screen.yaml_text)["lr"] == 0.02

        # Validate: the same checks as `tunebench validate`; a malformed value is reported at once.
        await pilot.press("f5")
        await wait_for(
            pilot, lambda: any("valid" in str(n.message) for n in app._notifications), what="valid"
        )
        lr_input.value = "[0.1"
        await wait_for(
            pilot, lambda: "lr=[0.1" in str(screen.query_one("#problems").render()), what="problem"
        )
        lr_input.value = "0.02"
        await wait_for(pilot, lambda: not str(screen.query_one("#problems").render()), what="problem cleared")

        # Export the composed YAML (atomic write) and check it round-trips.
        await pilot.press("f6")
        await wait_for(pilot, lambda: app.screen.query("#text"), what="the export dialog")
        app.screen.query_one("#text").value = str(tmp_path / "composed.yaml")
        await pilot.press("enter")
        await wait_for(pilot, lambda: (tmp_path / "composed.yaml").is_file(), what="composed.yaml")
        assert yaml.safe_load((tmp_path / "composed.yaml").read_text())["lr"] == 0.02

        # Launch a real run; the Live run screen follows it.
        await pilot.press("f9")
        live = await wait_for(pilot, lambda: isinstance(app.screen, LiveRunScreen) and app.screen, 60, "live")
        run_id = live.run_id
        await wait_for(pilot, lambda: len(live.series.get("loss", {}).get(0, ([], []))[0]) >= 3, 90, "loss")
        first = len(live.series["loss"][0][0])
        await wait_for(pilot, lambda: len(live.series["loss"][0][0]) > first, 30, "more loss points")
        assert live.query_one("#plot-loss", MetricPlot).series, "the loss plot has a curve"
        assert _run(run_id).config_text and yaml.safe_load(_run(run_id).config_text)["lr"] == 0.02

        # Stop (confirm with y): the recipe checkpoints and the run ends as stopped.
        await pilot.press("x")
        await wait_for(pilot, lambda: app.screen is not live, what="the stop confirmation")
        await pilot.press("y")
        await wait_for(pilot, lambda: _run(run_id).status == "stopped", 120, "stopped")
        await wait_for(pilot, lambda: live.run.get("status") == "stopped", 10, "live screen shows stopped")
        stopped_at = _run(run_id).step
        assert 0 < stopped_at < 60

        # Resume from the Live screen: it continues from the checkpoint and completes.
        await pilot.press("r")
        await wait_for(pilot, lambda: _run(run_id).status == "completed", 120, "resumed run completes")
        await wait_for(pilot, lambda: live.run.get("step") == 60, 10, "live screen at the last step")
        steps = live.series["loss"][0][0]
        assert steps[-1] == 60 and len(steps) == len(set(steps)) == 60, "each step once after resume"

        # Back to Runs; clone the run: the Recipe screen opens prefilled with the parent recorded.
        await pilot.press("q")
        runs = await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen, what="runs")
        table = runs.query_one(RunsTable)
        await wait_for(pilot, lambda: run_id in table.rows_by_id, what="run in table")
        table.move_cursor(row=table.visible_ids.index(run_id))
        await pilot.press("k")
        clone = await wait_for(
            pilot, lambda: isinstance(app.screen, RecipeScreen) and app.screen, what="clone"
        )
        await wait_for(pilot, lambda: clone.base.get("steps") == 60, what="clone prefilled")
        assert clone.clone_of == run_id and "clone of" in str(clone.query_one("#recipe-info").render())
        lr_clone = next(w for w in clone.query("#knobs Input") if clone.knob_keys.get(w.id) == "lr")
        lr_clone.value = "0.08"
        await wait_for(pilot, lambda: "lr: 0.08" in clone.yaml_text, what="clone lr")
        await pilot.press("f9")
        live2 = await wait_for(
            pilot,
            lambda: isinstance(app.screen, LiveRunScreen) and app.screen.run_id != run_id and app.screen,
        )
        child = live2.run_id
        await wait_for(pilot, lambda: _run(child).status == "completed", 120, "clone completes")
        assert _run(child).parent_id == run_id and _run(child).kind == "clone"

        # Compare the two runs: marks with space, c opens Compare with both curves and a config diff.
        await pilot.press("escape")
        runs = await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen)
        table = runs.query_one(RunsTable)
        await wait_for(pilot, lambda: {run_id, child} <= set(table.rows_by_id), what="both runs listed")
        await wait_for(pilot, lambda: table.rows_by_id[child]["status"] == "completed", what="table status")
        for rid in (run_id, child):
            table.move_cursor(row=table.visible_ids.index(rid))
            await pilot.press("space")
        assert table.marked == {run_id, child}
        await pilot.press("c")
        cmp = await wait_for(
            pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen, what="compare"
        )
        await wait_for(pilot, lambda: len(cmp.data) == 2, 30, "compare data")
        plot = cmp.query_one("#compare-plot", MetricPlot)
        assert len(plot.series) == 2
        summary = cmp.query_one("#summary")
        assert summary.row_count == 2
        from workbench.config_diff import config_diff

        configs = [yaml.safe_load(cmp.runs[r]["config_text"]) for r in cmp.run_ids]
        expected = [str(yaml.safe_load(cmp.runs[r]["config_text"])["lr"]) for r in cmp.run_ids]
        assert sorted(expected) == ["0.02", "0.08"]
        assert ("lr", expected) in config_diff(configs)["hyperparameters"]
        await pilot.press("q")

        # Export the parent run's YAML from the Runs screen; it runs headless (the launch line first).
        runs = await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen)
        table = runs.query_one(RunsTable)
        table.marked.clear()
        table.move_cursor(row=table.visible_ids.index(run_id))
        await pilot.press("e")
        await pilot.pause(0.2)
        app.screen.query_one("#text").value = str(tmp_path / "exported.yaml")
        await pilot.press("enter")
        await wait_for(pilot, lambda: (tmp_path / "exported.yaml").is_file(), what="exported.yaml")
        text = (tmp_path / "exported.yaml").read_text()
        assert text.startswith("# tunebench run lsq") and yaml.safe_load(text)["lr"] == 0.02
        await asyncio.sleep(0)


TINY_SFT = """# tunebench run sft --config tiny_sft.yaml
seed: 0
device: cpu
dtype: fp32
checkpoint_dir: null
model:
  _component_: engine.models.llama3.llama3
  vocab_size: 49152
  num_layers: 2
  num_heads: 4
  num_kv_heads: 2
  embed_dim: 64
  intermediate_dim: 128
  max_seq_len: 256
  rope_base: 10000.0
tokenizer:
  _component_: engine.data.tokenizers.load_tokenizer
  path: {tokenizer}
dataset:
  _component_: engine.data.instruct_dataset
  source: {data}
  template: engine.data.AlpacaInstructTemplate
  max_seq_len: 48
batch_size: 4
gradient_accumulation_steps: 1
epochs: 1
max_steps_per_epoch: 12
optimizer:
  _component_: torch.optim.AdamW
  lr: 0.003
lr_scheduler:
  _component_: engine.training.cosine_schedule_with_warmup
  num_warmup_steps: 2
loss:
  _component_: engine.modules.loss.LinearCrossEntropyLoss
save_every_n_steps: null
keep_last_n_checkpoints: 1
"""


@pytest.mark.slow
@pytest.mark.distributed
async def test_launch_a_tiny_sft_run_and_watch_it(tunebench_home, tmp_path, monkeypatch, shared_assets):
    """The real SFT recipe (2-layer, 64-dim Llama on alpaca-cleaned rows) launched from the Recipe
    screen: the estimate is shown, the Live screen plots loss and memory, and the run completes."""
    from workbench.screens.live import LiveRunScreen
    from workbench.screens.recipe import RecipeScreen

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny_sft.yaml").write_text(
        TINY_SFT.format(
            tokenizer=shared_assets / "tokenizers" / "smollm2",
            data=shared_assets / "data" / "alpaca_data_cleaned_1000.json",
        )
    )
    app = make_app(interval=0.3)
    try:
        async with app.run_test(size=SIZE) as pilot:
            app.push_screen(app.make_screen("recipe", config="tiny_sft.yaml"))
            screen = await wait_for(pilot, lambda: isinstance(app.screen, RecipeScreen) and app.screen)
            await wait_for(pilot, lambda: screen.base.get("max_steps_per_epoch") == 12, what="loaded")
            await wait_for(pilot, lambda: screen.query_one("MemoryPanel").last_estimate, 120, "estimate")
            await pilot.press("f5")
            await wait_for(pilot, lambda: any("valid" in str(n.message) for n in app._notifications), 60)
            await pilot.press("f9")
            live = await wait_for(pilot, lambda: isinstance(app.screen, LiveRunScreen) and app.screen, 120)
            await wait_for(pilot, lambda: _run(live.run_id).status in ("completed", "failed"), 400, "end")
            await wait_for(pilot, lambda: live.run.get("status") == "completed", 20, "live shows completed")
            await wait_for(pilot, lambda: len(live.series.get("loss", {}).get(0, ([], []))[0]) == 12, 20)
            losses = live.series["loss"][0][1]
            assert losses[-1] < losses[0], "the loss falls"
            assert live.series.get("mem_peak_gb"), "memory per rank is plotted"
    finally:
        _stop_all()
