"""Pilot test of the Recipe screen's mesh form: nodes and each parallel degree change the YAML, the mesh
line and the per-rank estimate (for every node's processes), a multi-node launch needs its rendezvous and
shared folder, and the launched run records them."""

from __future__ import annotations

import pytest

from engine.config import parse_yaml
from workbench.app import make_app

from .test_recipe_controls_screen import SIZE, recipe_env, wait_for  # noqa: F401  (its fixture: the tiny full.yaml)


async def test_nodes_and_degrees_reach_the_mesh_the_estimate_and_the_launched_run(recipe_env, monkeypatch):  # noqa: F811
    from engine.tracking.db import open_db
    from engine.tracking.readers import list_runs
    from workbench import launcher
    from workbench.screens.live import LiveRunScreen
    from workbench.screens.recipe import RecipeScreen
    from workbench.widgets.memory_panel import MemoryPanel

    monkeypatch.setattr(launcher, "launch", lambda run_id, **kw: None)  # register the run, start nothing
    app = make_app(interval=5)
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(app.make_screen("recipe", config="full.yaml"))
        screen = await wait_for(pilot, lambda: isinstance(app.screen, RecipeScreen) and app.screen)
        await wait_for(pilot, lambda: screen.base.get("batch_size") == 4, what="config loaded")
        panel = screen.query_one(MemoryPanel)
        line = screen.query_one("#mesh-line")

        def mesh_shown(text: str):
            return wait_for(pilot, lambda: text in str(line.render()), what=f"mesh line {text!r}")

        def estimate_with(note: str):
            return wait_for(
                pilot,
                lambda: (
                    panel.last_estimate
                    and any(note in n for n in panel.last_estimate.notes)
                    and panel.last_estimate
                ),
                what=f"estimate noting {note!r}",
            )

        await mesh_shown(
            "mesh dp_replicate=1 x dp_shard=1 x cp=1 x tp=1 (1 node(s) x 1 process(es) = 1 rank(s))"
        )
        screen.query_one("#nproc").value = "4"
        screen.query_one("#mesh-nnodes").value = "2"
        await mesh_shown("dp_shard=8 x cp=1 x tp=1 (2 node(s) x 4 process(es) = 8 rank(s))")
        fsdp8 = await estimate_with("FSDP over 8 ranks")
        await wait_for(
            pilot, lambda: "--nnodes 2: give --rdzv-endpoint" in str(screen.query_one("#problems").render()),
            what="the missing rendezvous",
        )  # fmt: skip

        screen.query_one("#mesh-tensor_parallel_dim").value = "2"
        await mesh_shown("dp_replicate=1 x dp_shard=4 x cp=1 x tp=2")
        tp2 = await estimate_with("weights and activations / 2 (tensor parallel)")
        assert parse_yaml(screen.yaml_text)["tensor_parallel_dim"] == 2
        assert tp2.weights_bytes == pytest.approx(fsdp8.weights_bytes)  # 4 shards x 2 slices = 8
        assert tp2.activations_bytes == pytest.approx(fsdp8.activations_bytes / 2)

        screen.query_one("#mesh-data_parallel_replicate_dim").value = "2"
        await mesh_shown("dp_replicate=2 x dp_shard=2 x cp=1 x tp=2")
        hsdp = await estimate_with("2 replicas (HSDP)")
        assert hsdp.weights_bytes == pytest.approx(2 * tp2.weights_bytes)  # replicas save nothing

        screen.query_one("#mesh-tensor_parallel_dim").value = "3"  # 2 x 3 does not divide 8 ranks
        await mesh_shown("needs a multiple of 6 ranks, but the run has 8")
        screen.query_one("#mesh-tensor_parallel_dim").value = "2"
        screen.query_one("#mesh-rdzv").value = "node0:29500"
        screen.query_one("#mesh-shared").value = str(recipe_env / "shared")
        await wait_for(pilot, lambda: not screen.mesh_problems, what="mesh problems gone")
        await pilot.press("f9")
        await wait_for(pilot, lambda: isinstance(app.screen, LiveRunScreen) and app.screen, 60, "launched")
        with open_db() as db:
            (run,) = list_runs(db=db)
    assert (run.nproc, run.nnodes, run.rdzv_endpoint) == (4, 2, "node0:29500")
    assert run.output_dir == str((recipe_env / "shared").resolve())
    cfg = parse_yaml(run.config_text)
    assert (cfg["tensor_parallel_dim"], cfg["data_parallel_replicate_dim"]) == (2, 2)
