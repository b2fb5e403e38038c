"""Pilot tests of the Recipe screen's memory/parallel controls: each control is there for a config
that lacks its key, changes the YAML and the estimate as it should, the result validates, and the
number of processes reaches the launched run; recipes that do not read a control say why."""

from __future__ import annotations

import pytest

from engine.config import parse_yaml
from tests.workbench.pilot_wait import wait_for
from workbench.app import make_app

SIZE = (110, 48)
FULL_YAML = """# tunebench run sft --config full.yaml
model:
  _component_: engine.models.llama3.llama3
  num_layers: 4
  num_heads: 8
  num_kv_heads: 2
  embed_dim: 512
  intermediate_dim: 1536
  vocab_size: 32000
tokenizer:
  _component_: engine.data.tokenizers.load_tokenizer
  path: demo
dataset:
  _component_: engine.data.demo_dataset
  max_seq_len: 512
optimizer:
  _component_: torch.optim.AdamW
  lr: 2.0e-05
  fused: true
loss:
  _component_: engine.modules.loss.ChunkedCrossEntropyLoss
batch_size: 4
gradient_accumulation_steps: 4
clip_grad_norm: 1.0
dtype: bf16
"""


@pytest.fixture
def recipe_env(tunebench_home, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TUNEBENCH_DEVICE_MEMORY_GB", "24")
    (tmp_path / "full.yaml").write_text(FULL_YAML)
    return tmp_path


def _widget(screen, name: str):
    return screen.query_one(f"#{next(w for w, n in screen.control_ids.items() if n == name)}")


async def test_each_control_changes_the_yaml_and_the_estimate_then_validates_and_launches(
    recipe_env, monkeypatch
):
    from engine.tracking.db import open_db
    from engine.tracking.readers import get_run
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
        est = await wait_for(pilot, lambda: panel.last_estimate, what="first estimate")

        # Every memory control is offered although the config has none of their keys but the loss
        # and optimizer; a full fine-tune says why it has no LoRA rank.
        assert set(screen.control_ids.values()) == {
            "optimizer",
            "activation_checkpointing",
            "optimizer_in_bwd",
            "linear_ce",
            "compile",
            "packing",
        }
        assert "LoRA rank: full fine-tune" in str(screen.query_one("#absent").render())

        async def changed(part: str, what: str):
            before = getattr(panel.last_estimate, part)
            return await wait_for(
                pilot,
                lambda: (
                    panel.last_estimate is not None
                    and getattr(panel.last_estimate, part) != before
                    and panel.last_estimate
                ),
                what=what,
            )

        _widget(screen, "activation_checkpointing").value = True
        after = await changed("activations_bytes", "AC estimate")
        assert after.activations_bytes < est.activations_bytes
        assert parse_yaml(screen.yaml_text)["enable_activation_checkpointing"] is True

        _widget(screen, "optimizer_in_bwd").value = True
        est, after = after, await changed("gradients_bytes", "optimizer-in-backward estimate")
        assert after.gradients_bytes < est.gradients_bytes
        cfg = parse_yaml(screen.yaml_text)
        assert (cfg["optimizer_in_bwd"], cfg["gradient_accumulation_steps"], cfg["clip_grad_norm"]) == (
            True,
            1,
            None,
        )
        accum = next(w for w, k in screen.knob_keys.items() if k == "gradient_accumulation_steps")
        assert screen.query_one(f"#{accum}").value == "1"  # the knob shows what the option set

        _widget(screen, "linear_ce").value = True
        est, after = after, await changed("activations_bytes", "linear CE estimate")
        assert after.activations_bytes < est.activations_bytes
        assert parse_yaml(screen.yaml_text)["loss"] == {
            "_component_": "engine.modules.loss.LinearCrossEntropyLoss"
        }

        _widget(screen, "optimizer").value = "adamw8bit"
        est, after = after, await changed("optimizer_bytes", "8-bit estimate")
        assert after.optimizer_bytes < est.optimizer_bytes
        assert parse_yaml(screen.yaml_text)["optimizer"] == {
            "_component_": "engine.training.low_bit_optimizers.adamw_8bit",
            "lr": 2e-05,
        }

        # Packing and compile: speed options, the estimate stays and says so.
        for name in ("packing", "compile"):
            assert "memory same" in str(_widget(screen, name).label)
            _widget(screen, name).value = True
            await wait_for(pilot, lambda n=name: f"{n}: speed option" in " ".join(panel.last_estimate.notes))
            assert panel.last_estimate.total_bytes == after.total_bytes
        assert parse_yaml(screen.yaml_text)["dataset"]["packed"] is True

        # Two processes: FSDP halves weights, gradients and state per rank.
        screen.query_one("#nproc").value = "2"
        two = await changed("weights_bytes", "2-rank estimate")
        assert (
            two.weights_bytes == after.weights_bytes / 2 and two.optimizer_bytes == after.optimizer_bytes / 2
        )

        # The composed config passes validation (static checks and the recipe's own).
        await pilot.press("f5")
        await wait_for(
            pilot, lambda: any(str(n.message) == "config is valid" for n in app._notifications), 60
        )
        assert not str(screen.query_one("#problems").render())

        # Too many processes is one line naming the field, and blocks the launch.
        screen.query_one("#nproc").value = "9"
        await wait_for(
            pilot, lambda: "processes: 9 — use 1..8" in str(screen.query_one("#problems").render())
        )
        screen.query_one("#nproc").value = "2"
        await wait_for(pilot, lambda: not str(screen.query_one("#problems").render()), what="cleared")

        # Launch: the run is registered with 2 processes and the composed config.
        await pilot.press("f9")
        live = await wait_for(pilot, lambda: isinstance(app.screen, LiveRunScreen) and app.screen, 60)
        with open_db() as db:
            run = get_run(live.run_id, db=db)
        assert run.nproc == 2
        launched = parse_yaml(run.config_text)
        assert launched["optimizer_in_bwd"] is True and launched["dataset"]["packed"] is True


async def test_recipes_that_do_not_read_a_control_say_why(recipe_env, monkeypatch):
    from workbench import launcher
    from workbench.screens.recipe import RecipeScreen

    monkeypatch.setattr(launcher, "launch", lambda run_id, **kw: None)  # never start a process here

    app = make_app(interval=5)
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(app.make_screen("recipe", config="demo/smollm2_135m_lora_dpo"))
        screen = await wait_for(pilot, lambda: isinstance(app.screen, RecipeScreen) and app.screen)
        await wait_for(pilot, lambda: screen.base.get("loss"), what="dpo config")
        await wait_for(pilot, lambda: "lora_rank" in screen.control_ids.values(), what="dpo controls")
        assert set(screen.control_ids.values()) == {
            "lora_rank",
            "optimizer",
            "activation_checkpointing",
            "compile",
        }
        absent = str(screen.query_one("#absent").render())
        assert "not read by dpo" in absent and "packing: preference pairs" in absent
        assert "optimizer in backward" in absent and "linear cross-entropy" in absent
        assert not screen.query_one("#nproc").disabled  # DPO runs on FSDP ranks

        # A higher LoRA rank raises the estimate.
        panel = screen.query_one("MemoryPanel")
        before = await wait_for(pilot, lambda: panel.last_estimate, 60, "dpo estimate")
        rank = next(w for w, n in screen.control_ids.items() if n == "lora_rank")
        # A value that cannot be used is one line that stays (and blocks a launch) until fixed.
        screen.query_one(f"#{rank}").value = ""
        problems = screen.query_one("#problems")
        await wait_for(pilot, lambda: "LoRA rank: '' is not a positive integer" in str(problems.render()))
        await pilot.press("f9")
        await wait_for(pilot, lambda: any("problem(s)" in str(n.message) for n in app._notifications), 60)
        assert isinstance(app.screen, RecipeScreen) and "LoRA rank: ''" in str(problems.render())
        screen.query_one(f"#{rank}").value = "64"
        await wait_for(pilot, lambda: panel.last_estimate.trainable_params > before.trainable_params)
        assert parse_yaml(screen.yaml_text)["model"]["lora_rank"] == 64

        # Distillation runs on one process: the processes box is locked at 1, with the reason.
        screen.query_one("#config-path").value = "llama3_2/1B_kd"
        screen.query_one("#config-path").focus()
        await pilot.press("enter")
        await wait_for(
            pilot, lambda: screen.recipe == "kd" and screen.query_one("#nproc").disabled, what="kd"
        )
        assert screen.query_one("#nproc").value == "1"
        assert "processes: distillation runs on one process" in str(screen.query_one("#absent").render())


async def test_a_clone_keeps_the_parents_number_of_processes(recipe_env):
    from engine.tracking.db import open_db
    from engine.tracking.run_rows import create_run
    from workbench.screens.recipe import RecipeScreen

    with open_db() as db:
        parent = create_run(db=db, recipe="sft", config_text=FULL_YAML, name="two-ranks", nproc=2)
    app = make_app(interval=5)
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(app.make_screen("recipe", clone_of=parent.id))
        screen = await wait_for(pilot, lambda: isinstance(app.screen, RecipeScreen) and app.screen)
        await wait_for(pilot, lambda: screen.base.get("batch_size") == 4, what="parent config")
        assert screen.query_one("#nproc").value == "2" and screen.nproc == 2
        panel = screen.query_one("MemoryPanel")
        await wait_for(
            pilot,
            lambda: panel.last_estimate and any("FSDP over 2 ranks" in n for n in panel.last_estimate.notes),
            what="a 2-rank estimate",
        )


async def test_packing_carries_over_to_every_source_of_a_data_mix(recipe_env):
    from workbench.screens.recipe import RecipeScreen

    mix = {
        "_component_": "engine.data.mix",
        "datasets": [
            {"_component_": "engine.data.demo_dataset", "max_seq_len": 256},
            {"_component_": "engine.data.demo_dataset", "max_seq_len": 256, "seed": 1},
        ],
        "weights": [1.0, 1.0],
        "names": ["a", "b"],
    }
    app = make_app(interval=5)
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(app.make_screen("recipe", config="full.yaml"))
        screen = await wait_for(pilot, lambda: isinstance(app.screen, RecipeScreen) and app.screen)
        await wait_for(pilot, lambda: "packing" in screen.control_ids.values(), what="controls")
        _widget(screen, "packing").value = True
        await wait_for(pilot, lambda: "packed: true" in screen.yaml_text, what="packed")
        app.dataset_node = mix  # what the Data screen leaves behind
        await pilot.press("ctrl+d")
        await wait_for(pilot, lambda: "engine.data.mix" in screen.yaml_text, what="mix applied")
        sources = parse_yaml(screen.yaml_text)["dataset"]["datasets"]
        assert [s.get("packed") for s in sources] == [True, True]
        assert "packed" not in parse_yaml(screen.yaml_text)["dataset"]  # not an argument of mix
        await pilot.press("f5")
        await wait_for(
            pilot, lambda: any(str(n.message) == "config is valid" for n in app._notifications), 60
        )


async def test_a_conflict_is_listed_once_and_fixed_by_the_control(recipe_env):
    """optimizer_in_bwd typed into a config with accumulation: validate and the recipe's own check
    both see it, the screen lists it once; the control's overrides fix it."""
    from workbench.screens.recipe import RecipeScreen

    (recipe_env / "bwd.yaml").write_text(
        FULL_YAML.replace("dtype: bf16", "dtype: bf16\noptimizer_in_bwd: true")
    )
    app = make_app(interval=5)
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(app.make_screen("recipe", config="bwd.yaml"))
        screen = await wait_for(pilot, lambda: isinstance(app.screen, RecipeScreen) and app.screen)
        await wait_for(pilot, lambda: "optimizer_in_bwd" in screen.control_ids.values(), what="controls")
        await pilot.press("f5")
        problems = screen.query_one("#problems")
        await wait_for(pilot, lambda: "1 problem(s)" in " ".join(str(n.message) for n in app._notifications))
        assert str(problems.render()).count("gradient_accumulation_steps: 4 cannot be used") == 1
        check = _widget(screen, "optimizer_in_bwd")
        assert check.value is True
        check.value = False
        check.value = True  # turned on from the form: accumulation 1, no clipping
        await wait_for(pilot, lambda: "clip_grad_norm: null" in screen.yaml_text, what="fixed")
        await pilot.press("f5")
        await wait_for(
            pilot, lambda: any(str(n.message) == "config is valid" for n in app._notifications), 60
        )


async def test_the_focused_or_hovered_setting_shows_its_schema_doc(recipe_env):
    """Focusing a knob or a control, or hovering one, shows the config key's one-line doc, what it
    accepts and its default from the recipe's schema (the sft schema here)."""
    from workbench.screens.recipe import RecipeScreen

    app = make_app(interval=5)
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(app.make_screen("recipe", config="full.yaml"))
        screen = await wait_for(pilot, lambda: isinstance(app.screen, RecipeScreen) and app.screen)
        await wait_for(pilot, lambda: screen.base.get("batch_size") == 4, what="config loaded")
        doc = screen.query_one("#field-doc")
        assert not doc.display  # nothing focused or hovered yet

        def shown() -> str:
            return str(doc.render()) if doc.display else ""

        batch = next(w for w, k in screen.knob_keys.items() if k == "batch_size")
        screen.query_one(f"#{batch}").focus()
        await wait_for(
            pilot,
            lambda: (
                shown() == "batch_size: samples per micro-batch on each rank · an integer >= 1 · default 1"
            ),
            what="batch_size doc on focus",
        )

        dtype = next(w for w, k in screen.knob_keys.items() if k == "dtype")
        await pilot.hover(f"#{dtype}")
        await wait_for(
            pilot,
            lambda: shown().startswith("dtype: fp32 or bf16 for weights") and 'default "fp32"' in shown(),
            what="dtype doc on hover",
        )

        _widget(screen, "activation_checkpointing").focus()
        await wait_for(
            pilot,
            lambda: (
                "sets enable_activation_checkpointing: recompute block activations" in shown()
                and shown().endswith("true or false · default false")
            ),
            what="the control's key doc",
        )
        await pilot.hover("#recipe-info")  # not a setting: the last line stays
        await pilot.pause(0.2)
        assert "enable_activation_checkpointing" in shown()
