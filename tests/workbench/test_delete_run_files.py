"""Deleting a run removes only what the run wrote (`workbench.run_manifest`): a `--output-dir` the user
gave keeps its own files and its mode; a run's own `runs/<id>/` goes whole. One real run of the
least-squares test recipe (tests/workbench/recipes_for_tests/lsq_recipe.py) through the supervisor."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from engine.tracking import open_db, readers
from workbench import launcher, run_manifest, services
from workbench.errors import UserError

RECIPES = Path(__file__).resolve().parent / "recipes_for_tests"
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def lsq_config(tunebench_home, monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(RECIPES), os.environ.get("PYTHONPATH")]))
    )
    path = tmp_path / "lsq.yaml"
    path.write_text("steps: 3\nlr: 0.05\ncheckpoint_every: 1\n")
    return path


def _users_folder(tmp_path: Path) -> Path:
    """A folder of the user's, mode 0755, with a file and a sub-folder of their own."""
    folder = tmp_path / "my project"
    (folder / "data").mkdir(parents=True)
    (folder / "notes.txt").write_text("mine\n")
    (folder / "data" / "rows.jsonl").write_text("{}\n")
    folder.chmod(0o755)
    return folder


def _registered(**kw):
    """A run registered (no process) and marked ended, as a finished run is."""
    from engine.tracking.run_rows import update_run

    rec = launcher.create_run("lsq", config_text="steps: 2\n", module="lsq_recipe", **kw)
    with open_db() as db:
        update_run(rec.id, db=db, status="completed", exit_code=0)
    return rec


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_delete_after_a_run_in_the_users_folder_leaves_the_folder_its_files_and_mode(lsq_config, tmp_path):
    folder = _users_folder(tmp_path)
    rec = launcher.create_run("lsq", config_path=lsq_config, module="lsq_recipe", output_dir=folder)
    (folder / "while-queued.txt").write_text("added before the run started\n")
    run = launcher.wait(launcher.launch(rec.id).id, timeout=240)
    assert (run.status, Path(run.output_dir)) == ("completed", folder.resolve())
    assert _mode(folder) == 0o755, "the run changed the mode of a folder it did not create"
    made = run_manifest.read(folder)
    assert made is not None and not made.made_folder
    assert made.preexisting == ("data", "notes.txt", "while-queued.txt")
    assert {"config.yaml", "supervisor.log", "stdout.log", "checkpoints", run_manifest.MANIFEST_NAME} <= set(
        made.created
    )
    assert (folder / "checkpoints" / "step_3").is_dir()
    (folder / "later.txt").write_text("added after the run ended\n")

    assert services.delete_run(run.id, remove_files=True) is None
    assert sorted(p.name for p in folder.iterdir()) == ["data", "later.txt", "notes.txt", "while-queued.txt"]
    assert (folder / "notes.txt").read_text() == "mine\n" and (folder / "data" / "rows.jsonl").is_file()
    assert _mode(folder) == 0o755
    with open_db() as db:
        assert readers.list_runs(db=db) == []


def test_a_folder_the_run_created_is_private_and_removed_once_empty(tunebench_home, tmp_path):
    out = tmp_path / "fresh" / "run"
    rec = _registered(output_dir=out)
    assert _mode(out) == 0o700 and run_manifest.read(out).made_folder
    (out / "checkpoints" / "step_1").mkdir(parents=True)  # as the recipe would
    assert run_manifest.record_new(out) == ["checkpoints"]
    assert launcher.delete(rec.id) is None
    assert not out.exists() and out.parent.is_dir()

    rec = _registered(output_dir=out)
    (out / "theirs.txt").write_text("x")  # someone else's file, added after the run ended
    assert launcher.delete(rec.id) == f"left {out}: it holds files this run did not create"
    assert sorted(p.name for p in out.iterdir()) == ["theirs.txt"]


def test_a_local_run_folder_is_removed_whole(tunebench_home):
    rec = _registered()
    own = Path(rec.output_dir)
    assert own == tunebench_home / "runs" / rec.id and not (own / run_manifest.MANIFEST_NAME).exists()
    (own / "checkpoints" / "step_1").mkdir(parents=True)
    (own / "stdout.log").write_text("log\n")
    assert services.delete_run(rec.id, remove_files=True) is None
    assert not own.exists()


def test_without_a_manifest_of_this_run_nothing_is_removed(tunebench_home, tmp_path):
    folder = _users_folder(tmp_path)
    rec = _registered(output_dir=folder)
    manifest = folder / run_manifest.MANIFEST_NAME
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "run_id": "another-run", "created": ["notes.txt", "data"]}))
    assert launcher.delete(rec.id).startswith(f"left {folder} as it is: it has no record of what this run")
    assert {"notes.txt", "data", "config.yaml"} <= {p.name for p in folder.iterdir()}


def test_a_manifest_cannot_name_anything_outside_its_folder(tunebench_home, tmp_path):
    folder = _users_folder(tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    rec = _registered(output_dir=folder)
    manifest = folder / run_manifest.MANIFEST_NAME
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "created": [*data["created"], "../outside.txt"]}))
    assert run_manifest.read(folder) is None
    assert launcher.delete(rec.id).startswith(f"left {folder} as it is")
    assert outside.read_text() == "keep"


def test_a_symlink_the_run_made_is_removed_not_followed(tunebench_home, tmp_path):
    folder = _users_folder(tmp_path)
    rec = _registered(output_dir=folder)
    (folder / "latest").symlink_to(folder / "data", target_is_directory=True)
    run_manifest.record_new(folder)
    assert launcher.delete(rec.id) is None
    assert (folder / "data" / "rows.jsonl").is_file() and not (folder / "latest").exists()


def test_failed_registration_leaves_the_users_folder_as_it_was(tunebench_home, tmp_path):
    folder = _users_folder(tmp_path)
    launcher.create_run("lsq", config_text="steps: 2\n", module="lsq_recipe", name="taken")
    with pytest.raises(Exception, match="taken"):
        launcher.create_run(
            "lsq", config_text="steps: 2\n", module="lsq_recipe", name="taken", output_dir=folder
        )
    assert sorted(p.name for p in folder.iterdir()) == ["data", "notes.txt"] and _mode(folder) == 0o755


def test_a_folder_holding_a_name_the_run_writes_is_refused(tunebench_home, tmp_path, capsys):
    folder = _users_folder(tmp_path)
    (folder / "eval").mkdir()
    with pytest.raises(
        UserError, match=r"already holds eval, a name the run writes there: choose a new folder"
    ):
        launcher.create_run("lsq", config_text="steps: 2\n", module="lsq_recipe", output_dir=folder)
    assert sorted(p.name for p in folder.iterdir()) == ["data", "eval", "notes.txt"]


def test_deleting_a_live_run_is_refused(tunebench_home, tmp_path):
    rec = launcher.create_run("lsq", config_text="steps: 2\n", module="lsq_recipe")
    with pytest.raises(UserError, match="is queued: stop it before deleting it"):
        services.delete_run(rec.id, remove_files=True)
    assert Path(rec.output_dir).is_dir()


async def test_D_on_the_runs_screen_leaves_the_users_folder(tunebench_home, tmp_path):
    from tests.workbench.pilot_wait import wait_for
    from workbench.app import make_app
    from workbench.screens.confirm import TypedConfirmScreen
    from workbench.widgets.runs_table import RunsTable

    folder = _users_folder(tmp_path)
    rec = _registered(output_dir=folder, name="shared-one")
    (folder / "checkpoints" / "step_1").mkdir(parents=True)
    run_manifest.record_new(folder)
    app = make_app()
    async with app.run_test(size=(110, 36)) as pilot:
        table = await wait_for(
            pilot, lambda: rec.id in app.query_one(RunsTable).rows_by_id and app.query_one(RunsTable)
        )
        await pilot.press("D")
        dialog = await wait_for(pilot, lambda: isinstance(app.screen, TypedConfirmScreen) and app.screen)
        dialog.query_one("#typed").value = "shared-one"
        await pilot.press("enter")
        await wait_for(pilot, lambda: rec.id not in table.rows_by_id, what="shared-one deleted")
    assert sorted(p.name for p in folder.iterdir()) == ["data", "notes.txt"] and _mode(folder) == 0o755


def test_the_manifest_command_of_the_job_script_records_and_never_fails(tunebench_home, tmp_path):
    import subprocess
    import sys

    folder = _users_folder(tmp_path)
    rec = _registered(output_dir=folder)
    (folder / "slurm-7.log").write_text("step 1\n")
    cmd = [sys.executable, "-m", "workbench.run_manifest", "record-new"]
    root = Path(__file__).resolve().parents[2]
    assert subprocess.run([*cmd, str(folder)], cwd=root, timeout=60).returncode == 0
    assert "slurm-7.log" in run_manifest.read(folder).created
    gone = subprocess.run([*cmd, str(tmp_path / "nowhere")], cwd=root, capture_output=True, timeout=60)
    assert gone.returncode == 0  # nothing to record: the job goes on
    assert launcher.delete(rec.id) is None and sorted(p.name for p in folder.iterdir()) == [
        "data",
        "notes.txt",
    ]


def test_launch_into_a_users_folder_that_is_gone_is_one_line_and_no_folder_is_made(tunebench_home, tmp_path):
    import shutil

    folder = _users_folder(tmp_path)
    rec = _registered(output_dir=folder)
    shutil.rmtree(folder)
    with pytest.raises(UserError, match=f"its folder {folder} is gone; start it over with `tunebench clone"):
        launcher.launch(rec.id)
    assert not folder.exists()  # not re-created (nor set to 0700): it was the user's
    with open_db() as db:
        assert readers.get_run(rec.id, db=db).status == "completed"  # the row is as it was
