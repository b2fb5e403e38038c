"""SLURM: the sbatch script of a 2-node run (golden file), submission, and the job-state mapping with
`sbatch` / `squeue` / `sacct` absent (one clear line) and present (stand-in commands put on PATH)."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest

from engine.tracking import open_db, readers
from engine.tracking.records import RunRecord
from workbench import slurm
from workbench.cli import main
from workbench.errors import UserError

GOLDEN = Path(__file__).resolve().parent / "golden" / "sbatch_2node.sh"
RUN = RunRecord(
    id="261202-ab12", name="llama70b", recipe="sft", module="engine.recipes.sft", status="queued", kind="new",
    config_text="", model=None, created_at=0.0, started_at=None, ended_at=None, exit_code=None, error=None,
    parent_id=None, pid=None, pgid=None, supervisor_pid=None, supervisor_started=None, nproc=8, host="login1",
    output_dir="/shared/runs/llama70b", tags="", notes="", step=0, total_steps=None, stop_requested=False,
    resumes=0, nnodes=2,
)  # fmt: skip
RES = slurm.SlurmResources(
    nnodes=2, gpus_per_node=8, partition="gpu", time="24:00:00", account="ml", sbatch_args=("--qos=high",)
)


def test_sbatch_script_for_two_nodes_matches_golden():
    text = slurm.sbatch_script(RUN, RES, python="/opt/venv/bin/python", pythonpath="/opt/tunebench")
    assert text == GOLDEN.read_text()


def test_sbatch_script_is_valid_bash(tmp_path):
    import shutil
    import subprocess

    script = tmp_path / "s.sh"
    script.write_text(slurm.sbatch_script(RUN, RES, python="/opt/venv/bin/python"))
    assert subprocess.run([shutil.which("bash"), "-n", str(script)]).returncode == 0


@pytest.mark.parametrize(
    "kw, line",
    [
        ({"time": "1 day"}, "--time '1 day': use SLURM's format"),
        ({"nnodes": 0}, "--nnodes 0: use 1 or more nodes"),
        ({"sbatch_args": ("qos=high",)}, "--sbatch-arg 'qos=high': give one long sbatch option"),
    ],
)
def test_bad_resources_are_one_line(kw, line):
    with pytest.raises(UserError, match=line.replace("(", r"\(")):
        slurm.SlurmResources(**kw)


def _stand_ins(folder: Path, **scripts: str) -> Path:
    """Executable stand-ins for SLURM commands (`name=body` of a bash script) in `folder`."""
    folder.mkdir(exist_ok=True)
    for name, body in scripts.items():
        path = folder / name
        path.write_text("#!/bin/bash\n" + body + "\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return folder


@pytest.fixture
def config(tunebench_home, tmp_path) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text("steps: 3\nlr: 0.1\n")
    return path


def _slurm_run(config, tmp_path, *extra):
    return main(
        ["run", "lsq", "--config", str(config), "--module", "lsq_recipe", "--slurm", "--nnodes", "2",
         "--nproc", "4", "--output-dir", str(tmp_path / "shared"), *extra]
    )  # fmt: skip


def test_without_sbatch_the_script_is_printed_and_nothing_registered(config, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(_stand_ins(tmp_path / "bin")))  # no SLURM commands at all
    assert _slurm_run(config, tmp_path, "--partition", "gpu", "--sbatch-arg=--qos=high") == 0
    out, err = capsys.readouterr()
    assert out.startswith("#!/bin/bash\n") and "#SBATCH --nodes=2" in out and "#SBATCH --partition=gpu" in out
    assert "#SBATCH --qos=high\n" in out and "#SBATCH --gpus-per-node=4\n" in out
    assert "sbatch is not on PATH, so nothing was submitted or registered" in err
    assert (tmp_path / "shared" / "sbatch.sh").read_text() == out
    with open_db() as db:
        assert readers.list_runs(db=db) == []


def test_submitted_job_is_recorded_and_its_state_followed(config, tmp_path, monkeypatch, capsys):
    state = tmp_path / "state"  # what the stand-in squeue/sacct report
    bin_ = _stand_ins(
        tmp_path / "bin",
        sbatch=f'echo "$@" > {tmp_path}/sbatch_args; echo "4242;cluster"',
        squeue=f'[[ -s {state}.q ]] && cat {state}.q; exit 0',
        sacct=f'cat {state}.a',
        scancel=f'echo "$@" > {tmp_path}/scancel_args',
    )  # fmt: skip
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    (state.with_suffix(".q")).write_text("PENDING\n")
    assert _slurm_run(config, tmp_path, "--time", "1:00:00") == 0
    assert "submitted as SLURM job 4242" in capsys.readouterr().out
    assert (tmp_path / "sbatch_args").read_text().split() == [
        "--parsable",
        str(tmp_path / "shared" / "sbatch.sh"),
    ]
    with open_db() as db:
        (run,) = readers.list_runs(db=db)
    assert (run.slurm_job_id, run.status, run.nnodes, run.nproc) == ("4242", "queued", 2, 4)

    def status_after(q: str, a: str = ""):
        state.with_suffix(".q").write_text(q)
        state.with_suffix(".a").write_text(a)
        assert main(["runs"]) == 0  # every command reconciles SLURM runs first
        with open_db() as db:
            return readers.get_run(run.id, db=db)

    assert status_after("RUNNING\n").status == "running"
    done = status_after("", "TIMEOUT|0:15\n")  # left the queue: sacct has the end
    assert (done.status, done.exit_code) == ("failed", 0)
    assert done.error.startswith("SLURM job 4242 reached its --time limit (TIMEOUT)")
    with open_db() as db:
        assert [e.text for e in readers.events_since(run.id, db=db)][-1] == "SLURM job 4242: TIMEOUT"


@pytest.mark.parametrize(
    "line, status, code",
    [
        ("COMPLETED|0:0", "completed", 0),
        ("FAILED|2:0", "failed", 2),
        ("CANCELLED by 1000|0:15", "stopped", 0),
        ("OUT_OF_MEMORY|0:125", "failed", 0),
        ("NODE_FAIL|1:0", "failed", 1),
    ],
)
def test_ended_job_states_map_to_run_statuses(tunebench_home, tmp_path, monkeypatch, line, status, code):
    from engine.tracking.run_rows import create_run, update_run

    monkeypatch.setenv("PATH", str(_stand_ins(tmp_path / "bin", squeue="exit 0", sacct=f"echo '{line}'")))
    with open_db() as db:
        rec = create_run(db=db, recipe="sft", config_text="")
        update_run(rec.id, db=db, slurm_job_id="77")
        rec = readers.get_run(rec.id, db=db)
    assert slurm.reconcile(rec) is None
    with open_db() as db:
        end = readers.get_run(rec.id, db=db)
    assert (end.status, end.exit_code) == (status, code)


def test_without_squeue_and_sacct_the_state_is_one_clear_line(tunebench_home, tmp_path, monkeypatch, capsys):
    from engine.tracking.run_rows import create_run, update_run

    monkeypatch.setenv("PATH", str(_stand_ins(tmp_path / "bin")))
    with open_db() as db:
        rec = create_run(db=db, recipe="sft", config_text="")
        update_run(rec.id, db=db, slurm_job_id="77")
    assert main(["runs"]) == 0
    err = capsys.readouterr().err.strip()
    assert err == (
        "tunebench: squeue and sacct are not on PATH: the state of SLURM job 77 cannot be read here "
        "(look from the cluster's login node)"
    )
    with open_db() as db:
        assert readers.get_run(rec.id, db=db).status == "queued"  # unchanged: nothing known


def test_unknown_state_is_left_alone_with_a_line(tunebench_home, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(_stand_ins(tmp_path / "bin", squeue="echo WEIRD")))
    rec = dataclasses.replace(RUN, slurm_job_id="9")
    assert slurm.reconcile(rec) == "SLURM job 9 is in state WEIRD, which tunebench does not know: left queued"


def test_slurm_only_options_need_slurm(config, capsys):
    assert main(["run", "lsq", "--config", str(config), "--partition", "gpu"]) == 2
    assert "--partition: only with --slurm" in capsys.readouterr().err
