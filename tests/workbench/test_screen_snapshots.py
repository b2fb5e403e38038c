"""Snapshot tests (pytest-textual-snapshot) of every workbench screen on fixed tracker data.

Update after an intended visual change with
`pytest tests/workbench/test_screen_snapshots.py --snapshot-update`; the SVGs under
`__snapshots__/` are also the README screenshots (copied to docs/screenshots/).
"""

from __future__ import annotations

import json
import math
import shutil
import time

import pytest

from workbench.app import make_app

SIZE = (110, 34)
T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC
SMOLLM2_CONFIG = {
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
}
RECIPE_YAML = """# tunebench run sft --config sft_smollm2.yaml
model:
  _component_: engine.models.lora_from_pretrained
  checkpoint_dir: model
  lora_rank: 16
  lora_alpha: 32
dataset:
  _component_: engine.data.demo_dataset
optimizer:
  _component_: torch.optim.AdamW
  lr: 0.0002
batch_size: 8
max_seq_len: 1024
epochs: 1
gradient_accumulation_steps: 2
enable_activation_checkpointing: true
compile: false
dtype: bf16
"""


def _curve(n: int, start: float, end: float, wiggle: float) -> list[float]:
    return [end + (start - end) * math.exp(-4 * i / n) + wiggle * math.sin(i * 0.7) for i in range(n)]


def _finished(name, recipe, config, losses, *, started, extra=None, ranks=1):
    from engine.tracking import MetricLogger
    from engine.tracking.db import open_db
    from engine.tracking.run_rows import create_run, update_run

    with open_db() as db:
        run = create_run(
            db=db, recipe=recipe, config_text=config, name=name, model="smollm2-135m", nproc=ranks
        )
        update_run(
            run.id,
            db=db,
            status="completed",
            started_at=started,
            ended_at=started + 20 * len(losses),
            exit_code=0,
        )
    log = MetricLogger(run_id=run.id, echo=False, max_delay_s=0)
    for step, loss in enumerate(losses, start=1):
        log.log(
            step,
            {"loss": loss, "lr": 2e-4 * min(1.0, step / 10), "tokens_per_sec": 2100 + 15 * math.sin(step)},
        )
        for r in range(ranks):
            log.log(step, {"mem_peak_gb": 2.1 + 0.05 * r + 0.002 * step}, rank=r)
        for key, fn in (extra or {}).items():
            log.log(step, {key: fn(step)})
        log.set_progress(step, len(losses))
    log.close()
    (run_dir := __import__("pathlib").Path(run.output_dir)).mkdir(parents=True, exist_ok=True)
    (run_dir / "stdout.log").write_text(
        "".join(
            f"step {s}/{len(losses)} | loss {v:.4f}\n" for s, v in enumerate(losses[-6:], len(losses) - 5)
        )
    )
    return run.id


@pytest.fixture
def snap_home(tunebench_home, tmp_path, monkeypatch):
    """Fixed tracker content, UTC clock, no Hugging Face cache, a planned 24 GiB device."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-empty"))
    monkeypatch.setenv("TUNEBENCH_DEVICE_MEMORY_GB", "24")
    monkeypatch.setenv("TUNEBENCH_MATMUL_GFLOPS", "100")  # a fixed machine speed for the time estimate
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    (tmp_path / "sft_smollm2.yaml").write_text(RECIPE_YAML)
    ids = {
        "a": _finished("lora-r16", "sft", RECIPE_YAML, _curve(60, 2.4, 1.1, 0.05), started=T0),
        "b": _finished(
            "lora-r32",
            "sft",
            RECIPE_YAML.replace("lora_rank: 16", "lora_rank: 32").replace("lr: 0.0002", "lr: 0.0001"),
            _curve(60, 2.4, 0.95, 0.04),
            started=T0 + 3600,
            ranks=2,
        ),
        "c": _finished(
            "dpo-beta0.1",
            "dpo",
            "beta: 0.1\n",
            _curve(40, 0.69, 0.42, 0.01),
            started=T0 + 7200,
            extra={"rewards/chosen": lambda s: 0.02 * s, "rewards/margins": lambda s: 0.035 * s},
        ),
    }
    from engine.tracking import MetricLogger

    for rid, scores in ((ids["a"], (0.42, 0.18)), (ids["b"], (0.47, 0.22))):  # Compare's evaluation table
        log = MetricLogger(run_id=rid, echo=False, max_delay_s=0)
        log.eval_result(60, "arith_mc", "acc", scores[0])
        log.eval_result(60, "gsm8k_local", "exact_match", scores[1])
        log.close()
    yield ids
    monkeypatch.delenv("TZ")
    time.tzset()


async def _until(pilot, predicate, timeout: float = 60.0, state=None) -> None:
    """Wait (generously: CI shares 2 cores) for `predicate`; on a timeout say what `state()` shows."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        await pilot.pause(0.1)
    assert predicate(), f"screen did not reach the state to snapshot: {state() if state else ''}"
    await pilot.pause(0.3)


def test_runs_screen(snap_compare, snap_home):
    async def ready(pilot):
        table = pilot.app.screen.query_one("RunsTable")
        await _until(pilot, lambda: len(table.rows_by_id) == 3)

    assert snap_compare(make_app(interval=60), terminal_size=SIZE, run_before=ready)


def test_runs_screen_with_queued_runs(snap_compare, snap_home):
    """Two runs of a sweep waiting in a paused queue (their places in the status column, the queue in the
    status line) and a third cancelled."""
    from engine.tracking.db import open_db
    from workbench import launcher, run_queue

    run_queue.pause()
    ids = []
    for i, lr in enumerate(("1e-4", "3e-4", "1e-3")):
        rec = launcher.create_run(
            "sft", config_path="sft_smollm2.yaml", overrides=[f"optimizer.lr={lr}"], name=f"lr-{i + 1}",
            tags=["sweep:lr"], notes=f"optimizer.lr={lr}", validate=False,
        )  # fmt: skip
        ids.append(rec.id)
        with open_db() as db:  # a fixed creation time: the started column shows it for runs not started
            db.execute("UPDATE runs SET created_at = ? WHERE id = ?", (T0 + 10800 + 60 * i, rec.id))
    run_queue.queue_runs(ids)
    run_queue.cancel(ids[1])

    async def ready(pilot):
        table = pilot.app.screen.query_one("RunsTable")
        status = pilot.app.screen.query_one("#runs-status")
        await _until(pilot, lambda: len(table.rows_by_id) == 6 and "paused" in str(status.render()))

    assert snap_compare(make_app(interval=60), terminal_size=SIZE, run_before=ready)


def test_runs_screen_80x24_light(snap_compare, snap_home):
    async def ready(pilot):
        table = pilot.app.screen.query_one("RunsTable")
        await _until(pilot, lambda: len(table.rows_by_id) == 3)

    assert snap_compare(make_app(interval=60, theme="light"), terminal_size=(80, 24), run_before=ready)


@pytest.fixture
def empty_home(tunebench_home, tmp_path, monkeypatch):
    """A first start: no run in the tracker; a planned 24 GiB device and a fixed machine speed."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-empty"))
    monkeypatch.setenv("TUNEBENCH_DEVICE_MEMORY_GB", "24")
    monkeypatch.setenv("TUNEBENCH_MATMUL_GFLOPS", "100")
    monkeypatch.chdir(tmp_path)
    return tunebench_home


def test_runs_screen_first_start(snap_compare, empty_home):
    async def ready(pilot):
        await _until(pilot, lambda: pilot.app.screen.empty is True)

    assert snap_compare(make_app(interval=60), terminal_size=SIZE, run_before=ready)


def test_recipe_screen_first_run_demo(snap_compare, empty_home):
    async def ready(pilot):
        await _until(pilot, lambda: pilot.app.screen.empty is True)
        await pilot.press("n")
        await _until(pilot, lambda: getattr(pilot.app.screen, "time_estimate", None) is not None)
        await _until(pilot, lambda: pilot.app.screen.query_one("MemoryPanel").last_estimate is not None)

    assert snap_compare(make_app(interval=60), terminal_size=SIZE, run_before=ready)


def test_live_run_screen(snap_compare, snap_home):
    async def ready(pilot):
        pilot.app.push_screen(pilot.app.make_screen("live", run_id=snap_home["c"]))
        await _until(pilot, lambda: bool(pilot.app.screen.query("#plot-recipe")) and pilot.app.screen.run)

    assert snap_compare(make_app(interval=60), terminal_size=SIZE, run_before=ready)


def test_compare_screen(snap_compare, snap_home):
    async def ready(pilot):
        pilot.app.push_screen(pilot.app.make_screen("compare", run_ids=[snap_home["a"], snap_home["b"]]))
        await _until(pilot, lambda: len(getattr(pilot.app.screen, "data", {})) == 2)
        # the evaluation table appears with the data and takes rows from the plot: wait for that layout
        table = pilot.app.screen.query_one("EvalTable")
        await _until(
            pilot,
            lambda: table.row_count == 2 and table.display and table.size.height > 0,
            state=lambda: (
                f"eval rows {table.row_count}, display {table.display}, height {table.size.height}, "
                f"classes {sorted(table.classes)}, evals {getattr(pilot.app.screen, 'evals', None)}"
            ),
        )

    assert snap_compare(make_app(interval=60), terminal_size=SIZE, run_before=ready)


def test_recipe_screen(snap_compare, snap_home):
    async def ready(pilot):
        app = pilot.app
        app.push_screen(app.make_screen("recipe", config="sft_smollm2.yaml"))
        await _until(pilot, lambda: "lora_rank: 16" in getattr(app.screen, "yaml_text", ""))
        await _until(pilot, lambda: app.screen.query_one("MemoryPanel").last_estimate is not None)
        await _until(pilot, lambda: app.screen.time_estimate is not None)

    assert snap_compare(make_app(interval=60), terminal_size=SIZE, run_before=ready)


def test_data_screen(snap_compare, snap_home, shared_assets, tmp_path):
    # A local file of fixed rows (not a generated preset) keeps the preview stable.
    (tmp_path / "tok").mkdir()
    shutil.copy(
        shared_assets / "tokenizers" / "smollm2" / "tokenizer.json", tmp_path / "tok" / "tokenizer.json"
    )
    rows = [
        {"input": f"What is {a} + {a + 3}?", "output": f"{a} + {a + 3} = {2 * a + 3}."} for a in range(1, 41)
    ]
    (tmp_path / "sums.json").write_text(json.dumps(rows))

    async def ready(pilot):
        app = pilot.app
        app.push_screen(app.make_screen("data"))
        await _until(pilot, lambda: type(app.screen).__name__ == "DataScreen")
        screen = app.screen
        screen.query_one("#tokenizer").value = "tok"
        screen.query_one("#kind").value = "local file"
        screen.query_one("#source").value = "sums.json"
        screen.query_one("#template").value = "Q: {input} A:"
        await pilot.pause(0.2)
        screen.action_add()
        await _until(pilot, lambda: screen.stats and screen.stats[0], 90)

    assert snap_compare(make_app(interval=60), terminal_size=SIZE, run_before=ready)


FIXED_CARDS = [
    {
        "name": name,
        "family": family,
        "params": params,
        "layers": layers,
        "embed_dim": dim,
        "num_heads": heads,
        "num_kv_heads": kv,
        "context_length": ctx,
        "vocab_size": vocab,
        "licence": licence,
    }
    for name, family, params, layers, dim, heads, kv, ctx, vocab, licence in (
        ("smollm2_135m", "SmolLM2", 134_515_008, 30, 576, 9, 3, 8192, 49152, "Apache-2.0"),
        ("qwen3_0_6b", "Qwen3", 596_049_920, 28, 1024, 16, 8, 40960, 151936, "Apache-2.0"),
        (
            "llama3_2_1b",
            "Llama 3.2",
            1_235_814_400,
            16,
            2048,
            32,
            8,
            131072,
            128256,
            "Llama 3.2 Community License",
        ),
    )
]


def test_models_screen(snap_compare, snap_home, tunebench_home, monkeypatch):
    from workbench import services

    # Fixed cards: the snapshot shows the screen, not whichever presets engine.models has today.
    monkeypatch.setattr(services, "model_cards", lambda: FIXED_CARDS)
    folder = tunebench_home / "models" / "smollm2-135m-instruct"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):  # a converted demo
        (folder / name).write_text("{}")

    async def ready(pilot):
        app = pilot.app
        app.push_screen(app.make_screen("models"))
        await _until(pilot, lambda: type(app.screen).__name__ == "ModelsScreen")
        await _until(pilot, lambda: app.screen.query_one("#local").row_count == 1)

    assert snap_compare(make_app(interval=60), terminal_size=SIZE, run_before=ready)


def test_help_screen(snap_compare, snap_home):
    assert snap_compare(make_app(interval=60), press=["question_mark"], terminal_size=SIZE)
