"""Starting, stopping, resuming, cloning and exporting runs, without the CLI (the workbench calls these).

A run is registered `queued` with its config written to `runs/<id>/config.yaml` (`output_dir` set to
that folder), then `launch` hands it to a detached `workbench.supervisor` that starts torchrun and
records how it ended. See docs/ARCHITECTURE.md, "Launcher". Bad input raises `UserError` or
`engine.config.ConfigError` (one line); nothing is left half-written.

Length: just over 500 lines: every run action (create, launch, stop, resume, clone, export, multi-node)
shares the registration and config-writing helpers kept here; SLURM and multi-node specifics are apart.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from engine.checkpoint.layout import latest_checkpoint_step
from engine.tracking.db import open_db, write_tx
from engine.tracking.paths import db_path, ensure_private_dir, run_dir, tunebench_home
from engine.tracking.readers import active_runs, get_run
from engine.tracking.records import ACTIVE_STATUSES, RunRecord
from engine.tracking.run_rows import add_event, new_run_id, truncate_after, update_run
from engine.tracking.run_rows import create_run as _register
from workbench import component_grants, run_manifest
from workbench.errors import UserError

CONFIG_NAME = "config.yaml"
LOST_ERROR = "process lost: its supervisor and processes vanished without recording an end"


# -- registering ---------------------------------------------------------------------------------------


def empty_config_error(source: str):
    """The `ConfigError` for a config file with no keys (empty, or only comments)."""
    from engine.config import ConfigError

    return ConfigError(
        "the config is empty (no keys)",
        field=source,
        hint="write the recipe's keys, or start from a built-in one: `tunebench ls`, then `tunebench cp NAME FILE`",
    )


def empty_config_message(source: str) -> str:
    """The one line for a config file with no keys (what `tunebench validate` prints)."""
    return str(empty_config_error(source))


def create_run(
    recipe: str,
    *,
    config_path: str | os.PathLike | None = None,
    config_text: str | None = None,
    overrides: Iterable[str] = (),
    nproc: int = 1,
    name: str | None = None,
    module: str | None = None,
    tags: Iterable[str] = (),
    notes: str = "",
    parent_id: str | None = None,
    kind: str = "new",
    validate: bool = True,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    output_dir: str | os.PathLike | None = None,
    slurm: bool = False,
) -> RunRecord:
    """Register a `queued` run from a config file (a path or built-in name) or YAML text, with
    `key=value` overrides applied, `output_dir` set to `runs/<id>`, written to `runs/<id>/config.yaml`.

    `module` replaces `engine.recipes.<recipe>` as the torchrun entry (tests use their own recipe).
    With `validate`, every config problem is reported at once as one `ConfigError` line.
    A multi-node run (`nnodes` > 1, this host node rank 0, `workbench.multinode_launch`) needs `rdzv_endpoint`
    and `output_dir`, a folder every node mounts at the same path, which replaces `runs/<id>`. That
    folder may hold other files: the run records what it creates there (`workbench.run_manifest`), so
    deleting it removes only that, and never changes the mode of a folder it did not create.
    """
    from engine.config import dump_config

    if not re.match(r"^[A-Za-z_]\w*$", recipe):
        raise UserError(f"recipe {recipe!r}: give a recipe name such as sft, dpo, kd or grpo")
    if nproc < 1:
        raise UserError(f"--nproc {nproc}: use 1 or more processes")
    from workbench.multinode_launch import check_launch, shared_run_dir

    if slurm:  # the job's first node is the rendezvous (workbench.slurm); its folder must be shared
        if output_dir is None:
            raise UserError("--slurm: give --output-dir DIR, a folder every node of the cluster mounts")
        from workbench.slurm import check_script_path, check_script_value

        check_script_path("--output-dir", str(Path(output_dir).expanduser().resolve()))
        if module is not None:
            check_script_value("--module", module)
    else:
        check_launch(nnodes=nnodes, node_rank=0, rdzv_endpoint=rdzv_endpoint, output_dir=output_dir)
    run_id = new_run_id()
    while run_dir(run_id).exists():
        run_id = new_run_id()
    out = run_dir(run_id) if output_dir is None else shared_run_dir(output_dir)
    cfg = compose_config(
        recipe, config_path=config_path, config_text=config_text, overrides=overrides, output_dir=out,
        validate=validate, module=module, nproc=nproc * nnodes,
    )  # fmt: skip
    text = dump_config(
        cfg, header=f"run {run_id} of recipe {recipe}: written by tunebench; output_dir is this folder"
    )
    made = not out.exists()
    if made:
        ensure_private_dir(out)  # a folder this run creates: private (0700); the user's keeps its mode
    try:
        if output_dir is not None:  # a folder that may hold other files: record what the run writes
            try:
                run_manifest.begin(out, run_id=run_id, made_folder=made)
                run_manifest.record(out, CONFIG_NAME)
            except OSError as exc:
                raise UserError(
                    f"--output-dir {out}: cannot write into it ({exc.strerror or exc}); choose a folder "
                    "you can write"
                ) from None
        _atomic_write(out / CONFIG_NAME, text)
        with open_db() as db:
            rec = _register(
                db=db,
                recipe=recipe,
                config_text=text,
                module=module,
                name=name,
                nproc=nproc,
                model=_model_label(cfg),
                parent_id=parent_id,
                kind=kind,
                tags=list(tags),
                notes=notes,
                run_id=run_id,
                output_dir=None if output_dir is None else out,
                nnodes=nnodes,
                rdzv_endpoint=rdzv_endpoint,
            )
            component_grants.record(rec.id, db=db)  # the user's allow-list widening, if any
            return rec
    except BaseException:
        if made:
            shutil.rmtree(out, ignore_errors=True)
        else:  # a folder the user named: remove only what was written here
            (out / CONFIG_NAME).unlink(missing_ok=True)
            (out / run_manifest.MANIFEST_NAME).unlink(missing_ok=True)
        raise


def compose_config(
    recipe: str,
    *,
    config_path: str | os.PathLike | None = None,
    config_text: str | None = None,
    overrides: Iterable[str] = (),
    output_dir: str | os.PathLike,
    validate: bool = True,
    module: str | None = None,
    nproc: int = 1,
) -> dict:
    """The config a run of `recipe` would get (file or text, overrides applied, `output_dir` set), checked
    as `create_run` checks it (with `validate`: every problem in one `ConfigError` line; `nproc`, all
    ranks, against the recipe's limits); writes nothing. `workbench.sweeps` checks every run of a sweep
    with it before queueing any."""
    from engine.config import (
        ConfigError,
        apply_overrides,
        find_config,
        load_yaml,
        parse_yaml,
        refuse_untrusted,
    )
    from engine.config import validate as validate_config

    if (config_path is None) == (config_text is None):
        raise UserError("give exactly one of a config file or config text")
    if config_path is not None:
        source = str(find_config(config_path))
        cfg = load_yaml(source)
    else:
        source = "config"
        cfg = parse_yaml(config_text or "", source=source)
    if not isinstance(cfg, dict):
        raise ConfigError("the config is not a mapping of key: value", hint="write one", field=source)
    if not cfg:
        raise empty_config_error(source)
    cfg = apply_overrides(cfg, list(overrides))
    refuse_untrusted(cfg)  # a refused component or `allowed_components:` key: one line, before anything
    # Set before validating: a config may refer to it (`${output_dir}/samples`).
    cfg["output_dir"] = str(output_dir)
    if validate:
        problems = validate_config(cfg, recipe=recipe if module is None else None)
        if problems:
            more = (
                f" (and {len(problems) - 3} more; `tunebench validate` lists all)"
                if len(problems) > 3
                else ""
            )
            raise ConfigError("; ".join(str(p) for p in problems[:3]) + more, field=source)
        if module is None:
            _check_nproc(recipe, nproc, cfg)
    return cfg


def _check_nproc(recipe: str, nproc: int, cfg: dict) -> None:
    """Refuse a process count (all nodes' ranks) the recipe's `CONFIG_SCHEMA` rules out, before a run is
    registered: more than its `max_nproc` (one-process recipes), or one its parallel degrees do not fit
    (`nproc_check`)."""
    import importlib

    schema = getattr(importlib.import_module(f"engine.recipes.{recipe}"), "CONFIG_SCHEMA", None)
    why = schema.nproc_problem(nproc, cfg, recipe=recipe) if schema is not None else None
    if why is not None:
        raise UserError(f"--nproc {nproc}: {why}")


def _model_label(cfg: dict) -> str | None:
    model = cfg.get("model")
    if isinstance(model, dict):
        for key in ("checkpoint_dir", "path", "_component_"):
            if isinstance(model.get(key), str):
                return model[key]
    return model if isinstance(model, str) else None


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UserError(f"{path}: cannot write it ({exc.strerror}): choose a writable place") from None


# -- launching and stopping ----------------------------------------------------------------------------
def launch(
    run_id: str, *, extra_args: Iterable[str] = (), extra_env: dict[str, str] | None = None
) -> RunRecord:
    """Start the run's supervisor (detached, new session); returns the row once it is recorded.

    `extra_env` is added to the supervisor's environment (`resume --trust-checkpoint`); the run's
    `TUNEBENCH_ALLOW` is always the prefixes it was registered with (`workbench.component_grants`).
    Raises `UserError` when the run is already running or the supervisor cannot start.
    """
    with open_db() as db:
        run = get_run(run_id, db=db)
        live = run.supervisor_pid is not None and _alive(run.supervisor_pid, run.supervisor_started)
        if run.status == "running" or (run.status == "queued" and live):
            raise UserError(
                f"run {run.name} is already {run.status}: stop it first (tunebench stop {run.name})"
            )
        out = run_folder(run)  # before the row changes: a folder that is gone is one line, nothing else
        try:
            run_manifest.record(out, "supervisor.log")
        except OSError as exc:
            raise UserError(
                f"run {run.name}: cannot write into {out} ({exc.strerror or exc}): free space or fix its rights"
            ) from None
        # queue_pos=None: a run launched by hand (or by the scheduler) no longer waits in the run queue
        update_run(
            run.id, db=db, status="queued", stop_requested=False, exit_code=None, error=None, ended_at=None,
            pid=None, pgid=None, supervisor_pid=None, supervisor_started=None, queue_pos=None,
        )  # fmt: skip
    env = dict(os.environ, TUNEBENCH_HOME=str(tunebench_home()), **(extra_env or {}))
    with open_db() as db:  # the allow-list widening the run was registered with, not this process's
        env = component_grants.launch_env(env, run.id, db=db)
    with open(out / "supervisor.log", "ab") as err:
        proc = subprocess.run(
            [sys.executable, "-m", "workbench.supervisor", "--fork", run.id, "--", *extra_args],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=env, timeout=120, check=False,
        )  # fmt: skip
    try:
        pid = int(proc.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        reason = (out / "supervisor.log").read_text(errors="replace").strip().splitlines()[-1:] or [
            "no output"
        ]
        with open_db() as db:
            update_run(run.id, db=db, status="failed", ended_at=time.time(), error=f"supervisor: {reason[0]}")
        raise UserError(
            f"run {run.name}: the supervisor did not start ({reason[0]}); see {out / 'supervisor.log'}"
        ) from None
    with open_db() as db:
        update_run(run.id, db=db, supervisor_pid=pid, supervisor_started=_create_time(pid))
        return get_run(run.id, db=db)


def owns_folder(run: RunRecord) -> bool:
    """True when the run's folder is its own: `runs/<id>/` under `TUNEBENCH_HOME`, or a `--output-dir`
    that the run created (its manifest says so). Only such a folder may have its mode changed or be
    removed whole."""
    out = Path(run.output_dir)
    if out.resolve() == run_dir(run.id).resolve():
        return True
    return run_manifest.may_set_mode(out, run_id=run.id)


def run_folder(run: RunRecord) -> Path:
    """The run's folder, ready for a launch: its own folder is (re)created private (0700); a folder
    the user gave is used as it is (never re-created, its mode never changed). `UserError` when that
    one is gone."""
    out = Path(run.output_dir)
    if owns_folder(run):
        return ensure_private_dir(out)
    if not out.is_dir():
        raise UserError(
            f"run {run.name}: its folder {out} is gone; start it over with `tunebench clone {run.name}`"
        )
    return out


def wait(run_id: str, *, timeout: float | None = None, poll_s: float = 0.2) -> RunRecord:
    """Block until the run is no longer queued/running (or `timeout` seconds); returns its row."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        with open_db() as db:
            run = get_run(run_id, db=db)
        if run.status not in ACTIVE_STATUSES:
            return run
        if deadline is not None and time.monotonic() > deadline:
            return run
        reconcile_lost()
        time.sleep(poll_s)


DEFAULT_GRACE_S = 120.0


def stop(run_id: str, *, grace_s: float = DEFAULT_GRACE_S, wait_s: float = 60.0) -> RunRecord:
    """Ask a run to stop: record the request and SIGTERM its rank processes (the recipe saves a
    checkpoint and exits 0; torchrun then ends normally), SIGKILL everything left after `grace_s`
    seconds; returns the row once the supervisor recorded the end (or after `wait_s` more seconds).

    The ranks are signalled directly, not through torchrun: torchrun's own shutdown kills workers
    that take more than 30 s, which a slow step plus a large checkpoint can. Raises `UserError` when
    the run is not queued/running. A run waiting in the run queue is cancelled instead (it never ran).
    """
    with open_db() as db:
        run = get_run(run_id, db=db)
        if run.status not in ACTIVE_STATUSES:
            raise UserError(f"run {run.name} is {run.status}, not running: nothing to stop")
        if run.status == "queued" and run.queue_pos is not None:
            from engine.tracking.queue_rows import cancel
            from engine.tracking.tracker_errors import TrackerError

            try:
                return cancel(run.id, db=db)
            except TrackerError:  # the scheduler took it this instant: stop it as a started run
                run = get_run(run.id, db=db)
        update_run(run.id, db=db, stop_requested=True)
        add_event(run.id, run.step, "stop", "stop requested", db=db)
    if run.slurm_job_id is not None:  # the ranks run on the cluster: SLURM signals them
        from workbench import slurm

        slurm.cancel(run)
        return run
    deadline = time.monotonic() + grace_s
    while run.pgid is None and time.monotonic() < deadline:  # queued: the supervisor will see the request
        time.sleep(0.1)
        with open_db() as db:
            run = get_run(run.id, db=db)
        if run.status not in ACTIVE_STATUSES:
            return run
    if run.pgid is not None:
        everything = signal_ranks(run, signal.SIGTERM)
        while (_group_alive(run.pgid) or _any_alive(everything)) and time.monotonic() < deadline:
            time.sleep(0.1)
        _killpg(run.pgid, signal.SIGKILL)
        for proc in everything + run_workers(run.id):
            _kill(proc)
    return wait(run.id, timeout=wait_s)


def rank_processes(run: RunRecord) -> list:
    """The run's rank processes (torchrun's direct children, as `psutil.Process`); when torchrun is
    gone, the top-most processes that carry the run's `TUNEBENCH_RUN_ID`."""
    import psutil

    if run.pid is not None:
        try:
            torchrun = psutil.Process(run.pid)
            if run.started_at is None or torchrun.create_time() <= run.started_at + 1:
                children = torchrun.children(recursive=False)
                if children:
                    return children
        except psutil.Error:
            pass
    procs = run_workers(run.id)
    pids = {p.pid for p in procs}
    top = []
    for proc in procs:
        try:
            if proc.ppid() not in pids and proc.pid != run.pid:
                top.append(proc)
        except psutil.Error:
            continue
    return top


def signal_ranks(run: RunRecord, sig: int) -> list:
    """Send `sig` to the run's rank processes (or to torchrun's group when no rank exists yet);
    returns every process of the run found (ranks and torchrun) for a later SIGKILL."""
    import psutil

    ranks = rank_processes(run)
    for proc in ranks:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            continue
    if not ranks and run.pgid is not None:
        _killpg(run.pgid, sig)
    return ranks + [p for p in run_workers(run.id) if p not in ranks]


def delete(run_id: str, *, remove_files: bool = True) -> str | None:
    """Delete the run's tracker rows and, with `remove_files`, what the run wrote: its own `runs/<id>/`
    whole; in a folder the user gave (`--output-dir`), only the entries the run created there
    (`workbench.run_manifest`), and the folder itself only when the run made it and nothing else is in
    it. Returns None, or one line saying what was left and why. `UserError` for a queued/running run."""
    from engine.tracking.run_rows import delete_run

    with open_db() as db:
        run = get_run(run_id, db=db)
        if run.status in ACTIVE_STATUSES:
            raise UserError(f"run {run.name} is {run.status}: stop it before deleting it")
        delete_run(run.id, db=db)
    if not remove_files:
        return None
    out = Path(run.output_dir)
    if out.resolve() == run_dir(run.id).resolve():
        shutil.rmtree(out, ignore_errors=True)
        return None
    return run_manifest.remove_created(out, run_id=run.id)


# -- resume, clone, export -----------------------------------------------------------------------------
def resume(run_id: str, *, trust_checkpoint: bool = False) -> RunRecord:
    """Restart a finished/stopped/failed run from its newest checkpoint: tracker rows past that step
    are deleted (one transaction), then the run is launched with the override `resume=true`.
    A checkpoint without this home's mark (`engine.checkpoint.provenance`: not written by this run in
    this folder) is refused unless `trust_checkpoint` (`--trust-checkpoint`: the run's processes get
    `TUNEBENCH_TRUST_CHECKPOINT=1`, and the resume event says so).
    Raises `UserError` when it is still running, has no checkpoint or an untrusted one."""
    from engine.checkpoint import provenance

    with open_db() as db:
        run = get_run(run_id, db=db)
        never_launched = run.status == "queued" and run.supervisor_pid is None
        if run.status in ACTIVE_STATUSES and not never_launched:
            raise UserError(f"run {run.name} is {run.status}: stop it first (tunebench stop {run.name})")
        step = latest_checkpoint_step(run.output_dir)
        if step is None:
            raise UserError(
                f"run {run.name} has no checkpoint under {run.output_dir}/checkpoints: "
                f"start it over with `tunebench clone {run.name}`"
            )
        folder = Path(run.output_dir) / "checkpoints" / f"step_{step}"
        why = None if trust_checkpoint else provenance.why_foreign(folder)
        if why is not None:
            raise UserError(
                f"run {run.name}: {folder} was not written by this run ({why}); resuming unpickles its"
                f" metadata, which can run code: if you trust it, `tunebench resume {run.name} --trust-checkpoint`"
            )
        truncate_after(run.id, step, db=db)
        update_run(run.id, db=db, kind="resume", resumes=run.resumes + 1)
        trusted = " (a foreign checkpoint, trusted by --trust-checkpoint)" if trust_checkpoint else ""
        add_event(run.id, step, "resume", f"resumed from checkpoints/step_{step}{trusted}", db=db)
    extra_env = {provenance.TRUST_ENV: "1"} if trust_checkpoint else None
    return launch(run.id, extra_args=["resume=true"], extra_env=extra_env)


def clone(
    run_id: str, overrides: Iterable[str] = (), *, name: str | None = None, nproc: int | None = None
) -> RunRecord:
    """A new `queued` run with this run's config, `overrides` applied, and this run as parent."""
    with open_db() as db:
        run = get_run(run_id, db=db)
    return create_run(
        run.recipe,
        config_text=run.config_text,
        overrides=overrides,
        nproc=nproc or run.nproc,
        name=name,
        module=None if run.module == f"engine.recipes.{run.recipe}" else run.module,
        tags=run.tag_list,
        parent_id=run.id,
        kind="clone",
    )


def export(run_id: str, path: str | os.PathLike, *, overwrite: bool = True) -> Path:
    """Write the run's config as a standalone YAML that `tunebench run` accepts (launch line first,
    `output_dir` removed: `tunebench run` sets it). Atomic; returns the path. With
    `overwrite=False` an existing file is left alone and `UserError` is raised."""
    from engine.config import dump_config, parse_yaml

    with open_db() as db:
        run = get_run(run_id, db=db)
    cfg = parse_yaml(run.config_text, source=f"run {run.name}")
    cfg.pop("output_dir", None)
    dest = Path(path).expanduser()
    if dest.is_dir():
        raise UserError(f"{dest} is a folder: give a file name such as {dest / (run.name + '.yaml')}")
    if not dest.parent.is_dir():
        raise UserError(f"{dest.parent} does not exist: create it or choose another -o path")
    if not overwrite and dest.exists():
        raise UserError(f"{dest} already exists: choose another -o path, or add --force to replace it")
    header = (
        f"tunebench run {run.recipe} --config {dest.name}\n"
        f"exported from run {run.name} ({run.id}); by hand add output_dir=DIR"
    )
    _atomic_write(dest, dump_config(cfg, header=header))
    return dest


# -- lost processes ------------------------------------------------------------------------------------
def reconcile_lost() -> list[str]:
    """Mark `failed` ("process lost") the queued/running runs of this host whose supervisor and process
    group are both gone (reboot, kill -9 of everything); returns their ids. One indexed query when
    nothing is active; does nothing when no database exists yet."""
    if not db_path().exists():
        return []
    host = socket.gethostname()
    lost: list[str] = []
    with open_db() as db:
        for run in active_runs(db=db):
            if run.host != host or run.supervisor_pid is None:
                continue
            if _alive(run.supervisor_pid, run.supervisor_started):
                continue
            if run.pgid is not None and _group_alive(run.pgid) and not _reused(run.pgid, run.started_at):
                continue
            if run_workers(run.id):  # torchrun starts each worker in a session of its own
                continue
            with write_tx(db):  # conditional: the supervisor may have recorded the end meanwhile
                changed = db.execute(
                    "UPDATE runs SET status = 'failed', ended_at = ?, error = ? "
                    "WHERE id = ? AND status IN ('queued', 'running')",
                    (time.time(), LOST_ERROR, run.id),
                ).rowcount
            if not changed:
                continue
            add_event(run.id, run.step, "end", "failed (process lost)", db=db)
            lost.append(run.id)
    return lost


def run_workers(run_id: str) -> list:
    """The live processes started for a run (their environment holds `TUNEBENCH_RUN_ID=<id>`): torchrun
    and its workers, which torchrun places in sessions of their own. Returns `psutil.Process` objects."""
    import psutil

    found = []
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            if proc.environ().get("TUNEBENCH_RUN_ID") == run_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _any_alive(procs: list) -> bool:
    import psutil

    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            continue
    return False


def _kill(proc) -> None:
    import psutil

    try:
        proc.kill()  # psutil checks the pid still names the same process
    except psutil.Error:
        pass


def _create_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _alive(pid: int, started: float | None) -> bool:
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(proc.create_time() - started) < 1.0
    except psutil.Error:
        return False


def _reused(pid: int, started_at: float | None) -> bool:
    """True when `pid` now names a process younger than the run's start (the id was reused, e.g.
    after a reboot); a group whose leader is gone is not judged here."""
    import psutil

    try:
        return started_at is not None and psutil.Process(pid).create_time() > started_at + 5
    except psutil.Error:
        return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
