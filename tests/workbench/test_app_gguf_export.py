"""Pilot tests of the GGUF export key (`g`) on the Runs and Live run screens: a finished run with a
checkpoint (a tiny random Qwen2 model folder), a storage type picked in the modal, the file written
by a worker in the run folder, the toast naming it, and the file read back by gguf's reader and
tunebench's importer."""

from __future__ import annotations

import shutil

import pytest

from tests.workbench.test_app_runs_data import SIZE, make_finished_run, wait_for
from workbench.app import make_app

pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory):
    from tests.engine.checkpoint.test_gguf_families import _source

    _, _, folder = _source("qwen2", tmp_path_factory.mktemp("qwen"))
    return folder


def _finished_run_with_checkpoint(home, folder, name: str) -> str:
    run_id = make_finished_run(name, "sft", [2.0, 1.5, 1.2], "lr: 0.001\n")
    ckpt = home / "runs" / run_id / "checkpoints" / "step_3"
    shutil.copytree(folder, ckpt / "model")
    (ckpt / "recipe_state.pt").write_bytes(b"")  # marks the checkpoint complete
    return run_id


def _toasts(app) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def test_g_on_runs_and_live_screens_writes_a_gguf(tunebench_home, qwen_folder):
    from engine.checkpoint.gguf import load_gguf
    from workbench.screens.confirm import ChoiceScreen
    from workbench.screens.live import LiveRunScreen
    from workbench.widgets.runs_table import RunsTable

    run_id = _finished_run_with_checkpoint(tunebench_home, qwen_folder, "qwen-run")
    app = make_app(interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: run_id in table.rows_by_id, what="the run listed")

        # Runs screen: `g`, then `3` picks q8_0.
        await pilot.press("g")
        dialog = await wait_for(pilot, lambda: isinstance(app.screen, ChoiceScreen) and app.screen)
        assert dialog.choices == ["f16", "bf16", "q8_0"]
        await pilot.press("3")
        q8 = tunebench_home / "runs" / run_id / "qwen-run.step_3.q8_0.gguf"
        await wait_for(
            pilot, lambda: any(f"wrote {q8}" in t for t in _toasts(app)), timeout=120, what="q8_0 toast"
        )
        reader = gguf.GGUFReader(str(q8))
        assert reader.fields["general.architecture"].contents() == "qwen2"
        types = {t.name: t.tensor_type.name for t in reader.tensors}
        assert types["blk.0.attn_q.weight"] == "Q8_0" and types["blk.0.attn_q.bias"] == "F32"

        # Live run screen: `g`, then the first button (f16) with enter.
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, LiveRunScreen), what="live screen")
        await pilot.press("g")
        await wait_for(pilot, lambda: isinstance(app.screen, ChoiceScreen))
        await pilot.press("enter")
        f16 = q8.with_name("qwen-run.step_3.f16.gguf")
        await wait_for(
            pilot, lambda: any(f"wrote {f16}" in t for t in _toasts(app)), timeout=120, what="f16 toast"
        )
        ckpt = load_gguf(f16)
        assert ckpt.config["architectures"] == ["Qwen2ForCausalLM"]
        assert ckpt.tensor_types["model.layers.0.self_attn.q_proj.weight"] == "F16"

        # escape in the modal exports nothing.
        await pilot.press("g")
        await wait_for(pilot, lambda: isinstance(app.screen, ChoiceScreen))
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, LiveRunScreen))
    assert sorted(p.name for p in (tunebench_home / "runs" / run_id).glob("*.gguf")) == [f16.name, q8.name]


async def test_g_on_a_run_without_a_checkpoint_says_so(tunebench_home):
    from workbench.screens.confirm import ChoiceScreen
    from workbench.widgets.runs_table import RunsTable

    run_id = make_finished_run("no-ckpt", "sft", [2.0, 1.5], "lr: 0.001\n")
    app = make_app(interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: run_id in table.rows_by_id, what="the run listed")
        await pilot.press("g")
        await wait_for(pilot, lambda: isinstance(app.screen, ChoiceScreen))
        await pilot.press("1")
        await wait_for(
            pilot,
            lambda: any("GGUF export failed: run no-ckpt: no complete checkpoint" in t for t in _toasts(app)),
            timeout=60,
            what="the error toast",
        )
    assert list((tunebench_home / "runs" / run_id).glob("*.gguf*")) == []
