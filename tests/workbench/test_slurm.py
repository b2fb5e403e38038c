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
    shared = tmp_path / "shared"
    (shared / "slurm-4242.log").write_text("step 1\n")  # what the job writes, seen when its end is
    (shared / "checkpoints" / "step_1").mkdir(parents=True)
    done = status_after("", "TIMEOUT|0:15\n")  # left the queue: sacct has the end
    assert (done.status, done.exit_code) == ("failed", 0)
    assert done.error.startswith("SLURM job 4242 reached its --time limit (TIMEOUT)")
    with open_db() as db:
        assert [e.text for e in readers.events_since(run.id, db=db)][-1] == "SLURM job 4242: TIMEOUT"
    from workbench import launcher, run_manifest

    assert {"sbatch.sh", "config.yaml", "slurm-4242.log", "checkpoints"} <= set(
        run_manifest.read(shared).created
    )
    assert launcher.delete(run.id) is None and not shared.exists()  # the run made the folder: all of it went


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


# -- quoting: what sbatch and bash read back from the script ---------------------------------------------
# The stand-in sbatch reads `#SBATCH` lines by the rules of Slurm's own parser (src/sbatch/opt.c,
# `_opt_batch_script` and `_get_argument`): lines are read until the first one that is not a comment;
# an argument ends at unquoted white space; a backslash makes the next character literal (inside quotes
# too); '...' or "..." group; an unquoted `#` ends the line's arguments; `packjob` is blanked out.
# SBATCH_RULES=legacy gives the older releases' rules: only "..." groups and any `#` ends the line.
STAND_IN_SBATCH = r"""
import json, os, re, sys

def arguments(text, legacy):
    text = re.sub("packjob", "       ", text, count=1, flags=re.IGNORECASE)
    found, i, n = [], 0, len(text)
    while True:
        while i < n and text[i] in " \t\v\f\r":
            i += 1
        if i >= n:
            return found
        arg, quoted, q, escaped, comment = [], False, "", False, False
        while i < n and (quoted or text[i] not in " \t\v\f\r") and text[i] != "\n":
            c = text[i]
            if escaped:
                escaped = False
            elif c == "\\":
                escaped, i = True, i + 1
                continue
            elif legacy and c == '"':
                quoted, i = not quoted, i + 1
                continue
            elif legacy and c == "#":
                comment = True
                break
            elif not legacy and quoted and c == q:
                quoted, i = False, i + 1
                continue
            elif not legacy and not quoted and c in "\"'":
                quoted, q, i = True, c, i + 1
                continue
            elif not legacy and not quoted and c == "#":
                comment = True
                break
            arg.append(c)
            i += 1
        if quoted and not legacy:
            sys.exit(f"sbatch: error: unmatched {q}")
        if arg:
            found.append("".join(arg))
        if comment or not arg:
            return found

legacy = os.environ.get("SBATCH_RULES") == "legacy"
seen = []
for line in open(sys.argv[-1], encoding="utf-8").read().split("\n"):
    if line.startswith("#SBATCH"):
        seen += arguments(line[len("#SBATCH"):], legacy)
    elif line.strip() and not line.strip().startswith("#"):
        break  # the first command ends the directives
json.dump(seen, open(os.environ["SBATCH_RECORD"], "w"))
print("4242;cluster")
"""


def _python_stand_in(folder: Path, name: str, body: str) -> Path:
    import sys

    path = folder / name
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)
    return path


ODD = {
    "partition": "gpu x#1",
    "account": "a'b\"c\\d $HOME",
    "sbatch_arg": ["--comment=hello world # not a comment", "--exclusive"],
    "folder": "shared run $HOME 100%",
}


def _expected_directives(out: Path) -> list[str]:
    """The arguments sbatch must find in the script of run `odd` with the `ODD` values."""
    return [
        "--job-name=tunebench-odd", "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=4",
        f"--partition={ODD['partition']}", "--time=1:00:00", f"--account={ODD['account']}",
        *ODD["sbatch_arg"], f"--output={str(out).replace('%', '%%')}/slurm-%j.log",
    ]  # fmt: skip


@pytest.mark.parametrize("rules", ["current", "legacy"])
def test_sbatch_reads_every_directive_back_exactly(config, tmp_path, monkeypatch, capsys, rules):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    _python_stand_in(bin_, "sbatch", STAND_IN_SBATCH)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SBATCH_RECORD", str(tmp_path / "seen.json"))
    monkeypatch.setenv("SBATCH_RULES", rules)
    out = tmp_path / ODD["folder"]
    args = ["run", "lsq", "--config", str(config), "--module", "lsq_recipe", "--slurm", "--nnodes", "2",
            "--nproc", "4", "--output-dir", str(out), "--name", "odd", "--partition", ODD["partition"],
            "--account", ODD["account"], "--time", "1:00:00", *[f"--sbatch-arg={a}" for a in ODD["sbatch_arg"]]]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    import json
    import shutil
    import subprocess

    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == _expected_directives(out)
    assert subprocess.run([shutil.which("bash"), "-n", str(out / "sbatch.sh")]).returncode == 0


def test_the_script_runs_torchrun_with_the_exact_paths(tmp_path):
    """The script's shell lines, run by bash with stand-ins for srun, scontrol and python: torchrun's
    arguments and the manifest calls arrive exactly, for a folder whose name has a space and a `$`."""
    import json
    import shutil
    import subprocess

    out = tmp_path / ODD["folder"]
    out.mkdir()
    bin_ = _stand_ins(
        tmp_path / "bin",
        srun='while [[ "$1" == --* ]]; do shift; done; SLURM_NODEID=0 exec "$@"',  # one node: run the task
        scontrol="echo node-a; for i in $(seq 5000); do echo node-b$i; done",  # a long list: no SIGPIPE
    )  # fmt: skip
    python = _python_stand_in(
        bin_,
        "python",
        f"import json, sys\nopen({str(tmp_path / 'calls')!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n",
    )
    run = dataclasses.replace(RUN, output_dir=str(out), module="lsq_recipe")
    res = slurm.SlurmResources(nnodes=2, gpus_per_node=4, partition=ODD["partition"])
    script = out / "sbatch.sh"
    script.write_text(slurm.sbatch_script(run, res, python=str(python), pythonpath=str(tmp_path / "a b")))
    env = {
        "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "SLURM_JOB_ID": "17",
    }
    proc = subprocess.run(
        [shutil.which("bash"), str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    calls = [json.loads(line) for line in (tmp_path / "calls").read_text().splitlines()]
    record = ["-m", "workbench.run_manifest", "record-new", str(out)]
    assert calls == [
        record,
        ["-m", "torch.distributed.run", "--nnodes=2", "--node-rank=0", "--rdzv-backend=static",
         "--rdzv-endpoint=node-a:29517", "--max-restarts=0", "--nproc_per_node=4", "-m", "lsq_recipe",
         "--config", f"{out}/config.yaml"],
        record,  # the EXIT trap: what the job left is recorded as the run's
    ]  # fmt: skip


@pytest.mark.parametrize(
    "extra, option",
    [
        (["--partition", "gpu\ntouch /tmp/x"], "--partition 'gpu\\ntouch /tmp/x'"),
        (["--account", "ml\r"], "--account 'ml\\r'"),
        (["--time", "1:00:00\n"], "--time '1:00:00\\n'"),
        (["--sbatch-arg=--qos=high\n#SBATCH --x"], "--sbatch-arg '--qos=high\\n#SBATCH --x'"),
        (["--module", "lsq_recipe\nrm -rf ~"], "--module 'lsq_recipe\\nrm -rf ~'"),
    ],
)
def test_a_newline_in_any_value_is_one_line_and_nothing_is_written(
    config, tmp_path, monkeypatch, capsys, extra, option
):
    monkeypatch.setenv("PATH", str(_stand_ins(tmp_path / "bin")))
    args = ["run", "lsq", "--config", str(config), "--slurm", "--nnodes", "2", "--nproc", "4",
            "--output-dir", str(tmp_path / "shared"), *extra]  # fmt: skip
    if "--module" not in extra:
        args += ["--module", "lsq_recipe"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tunebench: {option}: remove the control character") and err.count("\n") == 1
    assert not (tmp_path / "shared").exists()
    with open_db() as db:
        assert readers.list_runs(db=db) == []


@pytest.mark.parametrize(
    "folder, line",
    [
        ("a\nb", "remove the control character '\\n'"),
        ("back\\slash", "SLURM reads a backslash in --output specially"),
    ],
)
def test_an_output_dir_no_script_can_hold_is_refused(config, tmp_path, monkeypatch, capsys, folder, line):
    monkeypatch.setenv("PATH", str(_stand_ins(tmp_path / "bin")))
    assert _slurm_run(config, tmp_path, "--output-dir", str(tmp_path / folder)) == 2
    err = capsys.readouterr().err
    assert err.startswith("tunebench: --output-dir ") and line in err and err.count("\n") == 1
    assert not (tmp_path / folder).exists()
    with open_db() as db:
        assert readers.list_runs(db=db) == []


@pytest.mark.skipif(
    not Path("/usr/bin/sbatch").is_file(), reason="Slurm's own sbatch is not installed (apt: slurm-client)"
)
def test_slurms_own_sbatch_reads_the_same_directives(tmp_path):
    """The reference: Slurm's sbatch, at -vvv, prints each argument it found in the script, then tries
    the controller (none here: a config naming an unused port); the directives must be the ones the
    stand-in saw."""
    import subprocess
    import time

    out = tmp_path / ODD["folder"]
    out.mkdir()
    (tmp_path / "slurm.conf").write_text(
        "ClusterName=t\nSlurmctldHost=localhost\nSlurmctldPort=9\nNodeName=localhost CPUs=1\n"
        "PartitionName=p Nodes=localhost Default=YES\n"
    )
    run = dataclasses.replace(RUN, name="odd", output_dir=str(out))
    res = slurm.SlurmResources(
        nnodes=2, gpus_per_node=4, partition=ODD["partition"], time="1:00:00", account=ODD["account"],
        sbatch_args=tuple(ODD["sbatch_arg"]),
    )  # fmt: skip
    script = out / "sbatch.sh"
    script.write_text(slurm.sbatch_script(run, res, python="/opt/venv/bin/python"))
    env = dict(os.environ, SLURM_CONF=str(tmp_path / "slurm.conf"))
    proc = subprocess.Popen(
        ["/usr/bin/sbatch", "-vvv", str(script)],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    found, deadline = [], time.monotonic() + 120
    try:
        for line in proc.stderr:  # read until sbatch has listed its options, then stop it
            if "Found in script, argument" in line:
                found.append(line.split("argument ", 1)[1].strip()[1:-1])
            if "end of defined options" in line or time.monotonic() > deadline:
                break
    finally:
        proc.kill()
        proc.wait()
    assert found == _expected_directives(out)


def test_sbatch_separator_words_are_refused():
    with pytest.raises(
        UserError, match=r"--partition 'gpu-hetjob': sbatch reads 'hetjob' in an #SBATCH line"
    ):
        slurm.SlurmResources(partition="gpu-hetjob")
    with pytest.raises(UserError, match=r"--sbatch-arg '--qos high': give one long sbatch option"):
        slurm.SlurmResources(sbatch_args=("--qos high",))


def test_the_architecture_doc_shows_lines_of_the_script_slurm_writes():
    """docs/ARCHITECTURE.md's SLURM snippet is an excerpt of the golden script (so it is what
    `sbatch_script` writes, not another launch recipe)."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "ARCHITECTURE.md").read_text()
    block = doc.split("Under SLURM (`--slurm`)", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    shown = [line[2:] for line in block.splitlines() if line.strip()]
    golden = GOLDEN.read_text().splitlines()
    assert len(shown) >= 10 and [line for line in shown if line not in golden] == []
    assert [line for line in golden if line in shown] == shown, "the excerpt keeps the script's order"
