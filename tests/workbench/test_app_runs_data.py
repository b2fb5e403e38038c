"""Pilot tests of the Runs table (filter, sort, marks, tag, note, typed-confirm delete), the Data
screen (compose a mix with a live preview) and app-level behaviour (help, themes, redraw rate,
lazy imports). Runs here are written straight into the tracker (no processes), so these are quick."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.workbench.pilot_wait import wait_for
from workbench.app import make_app, refresh_interval

SIZE = (110, 36)


def make_finished_run(name: str, recipe: str, losses: list[float], config: str, *, started: float = 1.7e9):
    """A completed run with a loss curve, written through the tracker's own writer."""
    from engine.tracking import MetricLogger
    from engine.tracking.db import open_db
    from engine.tracking.run_rows import create_run, update_run

    with open_db() as db:
        run = create_run(db=db, recipe=recipe, config_text=config, name=name, model="smollm2_135m")
        update_run(run.id, db=db, status="completed", started_at=started, ended_at=started + 90, exit_code=0)
    log = MetricLogger(run_id=run.id, echo=False, max_delay_s=0)
    for step, loss in enumerate(losses, start=1):
        log.log(step, {"loss": loss, "lr": 1e-3, "tokens_per_sec": 1000.0 + step})
        log.log(step, {"mem_peak_gb": 1.5}, rank=0)
        log.set_progress(step, len(losses))
    log.event(len(losses), "checkpoint", f"checkpoints/step_{len(losses)}")
    log.close()
    return run.id


async def test_runs_filter_sort_mark_tag_note_and_typed_delete(tunebench_home):
    from workbench.screens.confirm import TextPromptScreen, TypedConfirmScreen
    from workbench.widgets.runs_table import RunsTable

    a = make_finished_run("alpha", "sft", [2.0, 1.5, 1.2], "lr: 0.001\n", started=1.7e9)
    b = make_finished_run("beta", "dpo", [0.7, 0.6], "lr: 0.0005\n", started=1.7e9 + 100)
    app = make_app(interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: len(table.rows_by_id) == 2, what="two runs")
        assert table.visible_ids == [b, a], "newest first"
        assert table.rows_by_id[a]["last_loss"] == pytest.approx(1.2)

        # `/` filters by words in name/status/recipe/model/tags.
        await pilot.press("slash")
        for ch in "dpo":
            await pilot.press(ch)
        await wait_for(pilot, lambda: table.visible_ids == [b], what="filtered")
        await pilot.press("enter")
        await pilot.press("escape")
        await wait_for(pilot, lambda: len(table.visible_ids) == 2, what="filter cleared")

        # Sort: `s` cycles the column; sorting by loss ascending puts beta (0.6) first.
        table.sort_by("last_loss")
        assert table.sort_column == "last_loss" and table.visible_ids == [b, a]
        table.sort_by("last_loss")
        assert table.visible_ids == [a, b], "same column again flips the order"
        await pilot.press("s")
        assert table.sort_column != "last_loss"

        # Space marks runs; marks survive a live refresh.
        table.move_cursor(row=table.visible_ids.index(a))
        await pilot.press("space")
        table.move_cursor(row=table.visible_ids.index(b))
        await pilot.press("space")
        assert table.marked == {a, b}
        app.screen.refresh_runs()
        await pilot.pause(0.5)
        assert table.marked == {a, b}
        await pilot.press("space")  # unmark beta
        assert table.selected_ids() == [a]

        # Tag and note the marked run (alpha).
        await pilot.press("t")
        prompt = await wait_for(pilot, lambda: isinstance(app.screen, TextPromptScreen) and app.screen)
        prompt.query_one("#text").value = "baseline, lora"
        await pilot.press("enter")
        await wait_for(pilot, lambda: table.rows_by_id[a].get("tags") == "baseline,lora", what="tags saved")
        await pilot.press("o")
        prompt = await wait_for(pilot, lambda: isinstance(app.screen, TextPromptScreen) and app.screen)
        prompt.query_one("#text").value = "first try"
        await pilot.press("enter")
        await wait_for(pilot, lambda: table.rows_by_id[a].get("notes") == "first try", what="note saved")
        table.set_filter("baseline")
        assert table.visible_ids == [a], "tags are searchable"
        table.set_filter("")

        # Delete asks for the run's name typed out; a wrong name keeps the run.
        run_dir = tunebench_home / "runs" / a
        assert run_dir.is_dir()
        await pilot.press("D")
        dialog = await wait_for(pilot, lambda: isinstance(app.screen, TypedConfirmScreen) and app.screen)
        dialog.query_one("#typed").value = "alph"
        await pilot.press("enter")
        await pilot.pause(0.3)
        assert isinstance(app.screen, TypedConfirmScreen) and run_dir.is_dir()
        dialog.query_one("#typed").value = "alpha"
        await pilot.press("enter")
        await wait_for(pilot, lambda: a not in table.rows_by_id, what="alpha deleted")
        assert not run_dir.exists() and list(table.rows_by_id) == [b]


async def test_live_screen_of_a_finished_run_and_recipe_panels(tunebench_home):
    from engine.tracking import MetricLogger
    from workbench.screens.live import LiveRunScreen
    from workbench.widgets.metric_plot import MetricPlot

    rid = make_finished_run("gamma", "dpo", [0.69, 0.6, 0.5, 0.45], "lr: 0.0001\n")
    log = MetricLogger(run_id=rid, echo=False, max_delay_s=0)
    for step in range(1, 5):
        log.log(step, {"rewards/chosen": 0.1 * step, "rewards/margins": 0.2 * step})
        log.log(step, {"mem_peak_gb": 1.7}, rank=1)
    log.close()
    (tunebench_home / "runs" / rid / "stdout.log").write_text("step 4/4 | loss 0.45\ndone\n")
    app = make_app(interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(app.make_screen("live", run_id=rid))
        live = await wait_for(pilot, lambda: isinstance(app.screen, LiveRunScreen) and app.screen)
        await wait_for(pilot, lambda: live.query("#plot-recipe"), what="recipe panel")
        await pilot.pause(0.3)
        assert live.series["loss"][0] == ([1, 2, 3, 4], [0.69, 0.6, 0.5, 0.45])
        mem = live.query_one("#plot-mem", MetricPlot).series
        assert set(mem) == {"mem_peak_gb r0", "mem_peak_gb r1"}, "memory per rank"
        recipe = live.query_one("#plot-recipe", MetricPlot).series
        assert set(recipe) == {"rewards/chosen", "rewards/margins"}
        assert "done" in "\n".join(live.query_one("LogTail").lines)
        assert "step 4/4" in str(live.query_one("#progress-text").render())


async def test_compose_a_mix_with_preview_and_stats(tunebench_home, shared_assets):
    from workbench.recipe_options import get_path
    from workbench.screens.data import DataScreen

    tok = str(shared_assets / "tokenizers" / "smollm2" / "tokenizer.json")
    gsm8k = str(shared_assets / "data" / "gsm8k_test.jsonl")
    app = make_app(interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f3")
        data = await wait_for(pilot, lambda: isinstance(app.screen, DataScreen) and app.screen)
        data.query_one("#tokenizer").value = tok
        # Source 1: the built-in demo preset (generated offline).
        data.action_add()
        await wait_for(pilot, lambda: data.stats[0], 60, "demo stats")
        spans = data.query_one("SamplePreview").content.spans
        assert any(s.style == "dim" for s in spans) and any(s.style == "bold" for s in spans), "masked dimmed"
        assert data.stats[0]["count"] > 100 and data.stats[0]["max"] >= data.stats[0]["p95"]
        # Source 2: GSM8K from a local file through the preset, weight 3.
        data.query_one("#source").value = gsm8k
        data.query_one("#preset").value = "gsm8k"
        data.query_one("#weight").value = "3"
        data.action_add()
        await wait_for(pilot, lambda: data.stats[1], 90, "gsm8k stats")
        assert data.stats[1]["count"] == 1319
        node = app.dataset_node
        assert node["_component_"] == "engine.data.mix" and node["weights"] == [1.0, 3.0]
        assert get_path(node, "datasets.1.source") == gsm8k
        # A bad column map is one line naming the field.
        data.query_one("#kind").value = "local file"
        data.query_one("#source").value = gsm8k
        data.query_one("#column-map").value = "question"
        data.action_add()
        assert "column map" in str(data.query_one("#data-status").render())
        # Next sample moves the preview.
        before = data.sample_index
        await pilot.press("ctrl+n")
        assert data.sample_index == before + 1


async def test_help_themes_and_navigation(tunebench_home, monkeypatch):
    from workbench.screens.help import HelpScreen
    from workbench.screens.runs_screen import RunsScreen

    app = make_app(interval=0.2, theme="light")
    async with app.run_test(size=(80, 24)) as pilot:
        assert app.theme == "textual-light"
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        await pilot.press("escape")
        await pilot.press("ctrl+t")
        assert app.theme == "ansi-dark"
        for key in ("f2", "f3", "f4"):
            await pilot.press(key)
            await pilot.pause(0.2)
        assert len(app.screen_stack) == 4
        await pilot.press("f1")
        assert isinstance(app.screen, RunsScreen) and len(app.screen_stack) == 1
    monkeypatch.setenv("SSH_CONNECTION", "10.0.0.1 5000 10.0.0.2 22")
    assert refresh_interval() == 1.0
    monkeypatch.delenv("SSH_CONNECTION")
    assert refresh_interval() == 0.5


def test_app_import_is_light():
    """The workbench imports neither torch nor datasets at startup (they load inside workers)."""
    code = "import sys, workbench.app, workbench.screens.runs_screen; print(sorted(m for m in ('torch', 'datasets', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_progress_eta_and_downsampling_keep_what_matters():
    from workbench.widgets.metric_plot import downsample
    from workbench.widgets.run_progress import estimate_eta, format_eta, recent_rate

    # ETA from the recent rate ignores a slow first step: 10 steps in the last 20 s -> 2 s/step.
    assert recent_rate([(5, 100.0), (15, 120.0)]) == 0.5
    assert recent_rate([(5, 100.0)]) is None
    assert estimate_eta(10, 100, 50.0) == 450.0 and format_eta(450.0) == "7m30s" and format_eta(None) == "--"
    # Downsampling 50,000 points keeps a one-step spike and the extremes, drops NaN, stays sorted.
    xs = list(range(1, 50_001))
    ys = [1.0 + (i % 7) * 0.01 for i in xs]
    ys[31_337] = 9.0
    ys[100] = float("nan")
    dx, dy = downsample(xs, ys, 160)
    assert len(dx) <= 170 and max(dy) == 9.0 and dx[dy.index(9.0)] == 31_338
    assert dx == sorted(dx) and all(y == y for y in dy)
    assert downsample([1, 2], [3.0, 4.0], 160) == ([1.0, 2.0], [3.0, 4.0])


async def test_toasts_for_new_nan_and_checkpoint_events(tunebench_home):
    from engine.tracking import MetricLogger
    from workbench.screens.live import LiveRunScreen

    rid = make_finished_run("delta", "sft", [1.0, 0.9], "lr: 0.001\n")
    app = make_app(interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(app.make_screen("live", run_id=rid))
        live = await wait_for(pilot, lambda: isinstance(app.screen, LiveRunScreen) and app.screen)
        await wait_for(pilot, lambda: live._caught_up, what="history shown")
        assert not [n for n in app._notifications if "checkpoint" in n.message], "no toasts for history"
        log = MetricLogger(run_id=rid, echo=False, max_delay_s=0)
        log.event(3, "nan", "loss is nan at step 3")
        log.event(3, "checkpoint", "checkpoints/step_3")
        log.close()
        await wait_for(pilot, lambda: len(app._notifications) >= 2, what="toasts")
        messages = [(n.severity, n.message) for n in app._notifications]
        assert ("error", "loss is NaN: loss is nan at step 3") in messages
        assert ("information", "checkpoint saved: checkpoints/step_3") in messages


async def test_models_download_without_a_hub_is_one_clear_line(tunebench_home, monkeypatch):
    from workbench.screens.confirm import TextPromptScreen
    from workbench.screens.models_screen import ModelsScreen

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    app = make_app(interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f2")
        models = await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen)
        await pilot.press("d")
        prompt = await wait_for(pilot, lambda: isinstance(app.screen, TextPromptScreen) and app.screen)
        prompt.query_one("#text").value = "Qwen/Qwen3-0.6B"
        await pilot.press("enter")
        status = models.query_one("#download-status")
        await wait_for(pilot, lambda: "cannot download" in str(status.render()), 60, "offline message")
        text = str(status.render())
        assert "Qwen/Qwen3-0.6B" in text and "TUNEBENCH_HOME/models" in text and "\n" not in text
        assert not (tunebench_home / "models" / "Qwen--Qwen3-0.6B" / "config.json").exists()


async def test_command_palette_offers_screens_and_themes(tunebench_home):
    from workbench.screens.data import DataScreen

    app = make_app(interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        titles = {c.title: c for c in app.get_system_commands(app.screen)}
        assert {"Go to runs", "Go to models", "Go to data", "Go to recipe", "Theme: ansi"} <= set(titles)
        titles["Go to data"].callback()
        await wait_for(pilot, lambda: isinstance(app.screen, DataScreen), what="data screen")
        await pilot.pause(0.3)
        titles["Theme: ansi"].callback()
        await pilot.pause(0.1)
        assert app.theme == "ansi-dark"


async def test_recipe_switches_configs_and_keeps_the_form_in_sync(tunebench_home, tmp_path, monkeypatch):
    """Loading one config after another rebuilds the knobs (no duplicate widgets) and edits apply."""
    from workbench.screens.recipe import RecipeScreen

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.yaml").write_text("# tunebench run sft --config a.yaml\nbatch_size: 8\nepochs: 1\n")
    (tmp_path / "b.yaml").write_text("# tunebench run sft --config b.yaml\nbatch_size: 2\ncompile: false\n")
    app = make_app(interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(app.make_screen("recipe", config="a.yaml"))
        screen = await wait_for(pilot, lambda: isinstance(app.screen, RecipeScreen) and app.screen)
        await wait_for(pilot, lambda: screen.base.get("batch_size") == 8, what="a.yaml")
        for name, batch in (("b.yaml", 2), ("a.yaml", 8), ("b.yaml", 2)):
            await pilot.press("ctrl+o")
            box = screen.query_one("#config-path")
            box.value = name
            await pilot.press("enter")
            await wait_for(pilot, lambda b=batch: screen.base.get("batch_size") == b, what=name)
            await pilot.pause(0.3)
        keys = sorted(screen.knob_keys.values())
        assert keys == ["batch_size"], keys
        # The memory/parallel controls (compile among them) are rebuilt once, not duplicated.
        names = sorted(screen.control_ids.values())
        assert len(screen.query("#controls Checkbox")) == len(names) - 1, names  # all but the optimizer
        check = next(
            w for w in screen.query("#controls Checkbox") if screen.control_ids.get(w.id) == "compile"
        )
        check.value = True
        await wait_for(pilot, lambda: "compile: true" in screen.yaml_text, what="compile on")


async def test_grpo_panels_and_samples_newest_first(tunebench_home):
    """GRPO rollout statistics and KD loss terms get their own panels beside reward/KL; `s` shows
    samples.jsonl newest first with the highlighted sample in full."""
    import json

    from engine.tracking import MetricLogger
    from workbench.screens.live import LiveRunScreen
    from workbench.screens.samples import SamplesScreen
    from workbench.widgets.metric_plot import MetricPlot

    rid = make_finished_run("delta", "grpo", [0.1, 0.05, 0.02], "lr: 0.0001\n")
    log = MetricLogger(run_id=rid, echo=False, max_delay_s=0)
    for step in range(1, 4):
        log.log(
            step,
            {
                "reward/mean": 0.3 * step, "kl": 0.01 * step, "clip_fraction": 0.1,
                "completion_length": 10.0 + step, "staleness": 1.0, "buffer_dropped": 0.0,
                "actor_restarts": 0.0, "loss/kd": 0.5, "loss/ce": 1.5,
            },
        )  # fmt: skip
    log.eval_result(2, "gsm8k_local", "exact_match", 0.25)
    log.eval_result(3, "gsm8k_local", "exact_match", 0.5)
    log.eval_result(3, "arith_mc", "acc", 0.75)
    log.close()
    run_dir = tunebench_home / "runs" / rid
    lines = [
        {
            "step": s,
            "prompt": f"what is {s}+[1]?",
            "completion": f"answer {s}",
            "answer": str(s + 1),
            "reward": s / 3,
        }
        for s in (1, 2, 3)
    ]
    (run_dir / "samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 4, "pro')
    app = make_app(interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(app.make_screen("live", run_id=rid))
        live = await wait_for(pilot, lambda: isinstance(app.screen, LiveRunScreen) and app.screen)
        await wait_for(
            pilot, lambda: live.query("#plot-rollout") and live.query("#plot-terms"), what="panels"
        )
        await pilot.pause(0.3)
        assert set(live.query_one("#plot-recipe", MetricPlot).series) == {
            "reward/mean",
            "kl",
            "clip_fraction",
        }
        assert set(live.query_one("#plot-rollout", MetricPlot).series) == {
            "completion_length", "staleness", "buffer_dropped", "actor_restarts",
        }  # fmt: skip
        assert set(live.query_one("#plot-terms", MetricPlot).series) == {"loss/kd", "loss/ce"}
        evals = live.query_one("#evals")
        assert evals.display and evals.row_count == 2
        assert [str(c) for c in evals.get_row_at(1)] == ["gsm8k_local / exact_match", "0.25", "0.5"]
        assert [str(c) for c in evals.get_row_at(0)] == ["arith_mc / acc", "-", "0.75"]
        await pilot.press("s")
        samples = await wait_for(pilot, lambda: isinstance(app.screen, SamplesScreen) and app.screen)
        await wait_for(pilot, lambda: samples.rows, what="samples read")
        assert [r["step"] for r in samples.rows] == [3, 2, 1], "newest first; the torn last line is skipped"
        full = str(samples.query_one("#sample-full").render())
        assert "what is 3+[1]?" in full and "answer 3" in full
        await pilot.press("down")
        await pilot.pause(0.1)
        assert "what is 2+[1]?" in str(samples.query_one("#sample-full").render())
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, LiveRunScreen), what="back to live")


async def test_compare_shows_eval_scores_per_run_at_their_step(tunebench_home):
    """Compare: the latest score of each task/metric per run with its step."""
    from engine.tracking import MetricLogger
    from workbench.screens.compare_screen import CompareScreen

    a = make_finished_run("ra", "sft", [2.0, 1.5, 1.2], "lr: 0.0001\n")
    b = make_finished_run("rb", "sft", [2.0, 1.4, 1.0], "lr: 0.0002\n")
    for rid, scores in ((a, [(2, "arith_mc", 0.2), (3, "arith_mc", 0.3)]), (b, [(3, "arith_mc", 0.45)])):
        log = MetricLogger(run_id=rid, echo=False, max_delay_s=0)
        for step, task, v in scores:
            log.eval_result(step, task, "acc", v)
        log.close()
    log = MetricLogger(run_id=b, echo=False, max_delay_s=0)
    log.eval_result(3, "gsm8k_local", "exact_match", 0.125)
    log.close()
    app = make_app(interval=60)
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(app.make_screen("compare", run_ids=[a, b]))
        cmp = await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen)
        await wait_for(pilot, lambda: len(cmp.data) == 2, what="compare data")
        await pilot.pause(0.1)
        table = cmp.query_one("#evals")
        assert table.display
        assert [str(c.label) for c in table.ordered_columns] == ["task / metric", "ra", "rb"]
        assert [str(c) for c in table.get_row_at(0)] == ["arith_mc / acc", "0.3 @3", "0.45 @3"]
        assert [str(c) for c in table.get_row_at(1)] == ["gsm8k_local / exact_match", "-", "0.125 @3"]


async def test_compare_shows_the_base_model_beside_the_run(tunebench_home):
    """`tunebench eval RUN --base` rows (checkpoint `base`, step 0) get their own column, and the
    run's column keeps its latest checkpoint's score."""
    from engine.tracking import MetricLogger
    from workbench.screens.compare_screen import CompareScreen

    a = make_finished_run("ra", "sft", [2.0, 1.5, 1.2], "lr: 0.0001\n")
    b = make_finished_run("rb", "sft", [2.0, 1.4, 1.0], "lr: 0.0002\n")
    log = MetricLogger(run_id=a, echo=False, max_delay_s=0)
    log.eval_result(3, "demo_em", "exact_match,strict-match", 0.61)
    log.eval_result(0, "demo_em", "exact_match,strict-match", 0.02, checkpoint="base")
    log.close()
    log = MetricLogger(run_id=b, echo=False, max_delay_s=0)
    log.eval_result(3, "demo_em", "exact_match,strict-match", 0.55)
    log.close()
    app = make_app(interval=60)
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(app.make_screen("compare", run_ids=[a, b]))
        cmp = await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen)
        await wait_for(pilot, lambda: len(cmp.data) == 2, what="compare data")
        await pilot.pause(0.1)
        table = cmp.query_one("#evals")
        assert [str(c.label) for c in table.ordered_columns] == ["task / metric", "ra", "ra base", "rb"]
        assert [str(c) for c in table.get_row_at(0)] == [
            "demo_em / exact_match,strict-match", "0.61 @3", "0.02", "0.55 @3",
        ]  # fmt: skip


def test_eval_table_steps_view_puts_the_base_first():
    from workbench.widgets.eval_table import base_scores, latest_scores

    rows = [
        {"step": 0, "task": "t", "metric": "m", "value": 0.1, "checkpoint": "base"},
        {"step": 20, "task": "t", "metric": "m", "value": 0.4, "checkpoint": "/r/step_20/model"},
    ]
    assert latest_scores(rows) == {("t", "m"): (20, 0.4)}
    assert base_scores(rows) == {("t", "m"): 0.1}
    from engine.tracking.records import BASE_CHECKPOINT
    from workbench.widgets import eval_table

    assert eval_table.BASE == BASE_CHECKPOINT
