"""Bad inputs of the commands that write the tracker (issue 28), through the public CLI: each is one
`tunebench:` line on stderr, exit code 2, no traceback, and the tracker's rows and `TUNEBENCH_HOME`'s
files are what they were before.

- a queued run and every run of a sweep are validated as a launched run is (`lr: -1`, `lora_rank: 0`,
  `lora_rank: eight`), and a sweep grid's dangling `x` is refused;
- a read-only tracker database (a file mode, an immutable file, a read-only filesystem) is one line
  naming the file for every command that writes it, and for the workbench's actions (a toast);
  `write_tx` is the one place that turns SQLite's refusal into that line, and a source check keeps
  every write statement inside it;
- `export-model -o FILE` into a read-only or missing folder; `queue move` past either end.

Root ignores file modes (and SQLite run as root writes a 0444 file), so as root "read-only" is made with
`chattr +i` (immutable: refused even to root), and the user's own case (a 0444 database, a normal user)
runs the CLI as `nobody` through `setpriv`; each skips, saying why, where that is impossible.
"""

from __future__ import annotations

import ast
import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from engine.tracking import open_db
from engine.tracking import queue_rows as tq
from engine.tracking.run_rows import create_run, update_run
from workbench.cli import build_parser, main

REPO = Path(__file__).resolve().parent.parent
DEMO = "demo/smollm2_135m_lora"
pytestmark = pytest.mark.timeout(300)


# -- helpers ---------------------------------------------------------------------------------------------
def _one_line_exit_2(capsys, argv: list[str], *needles: str) -> str:
    """Runs `tunebench argv` in this process; asserts exit 2 and one `tunebench:` line on stderr holding
    every needle, no traceback. Returns the line."""
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, (argv, captured.err)
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith("tunebench: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _tree(home: Path) -> dict[str, str]:
    """Every file and folder under `home` with a hash of its bytes; the database's own files by
    presence only (a reader may checkpoint the WAL or touch the -shm index; `_rows` compares them)."""
    out: dict[str, str] = {}
    for path in sorted(home.rglob("*")):
        rel = str(path.relative_to(home))
        if path.name.startswith("tunebench.db"):
            if path.name == "tunebench.db":
                out[rel] = "db"
        elif path.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _rows(home: Path) -> list[str]:
    """Every row of every table, as SQL (opened read-only: looking changes nothing)."""
    db = home / "tunebench.db"
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


@contextmanager
def _unchanged(home: Path):
    """Asserts that the block leaves `home`'s files and the tracker's rows as they were."""
    tree, rows = _tree(home), _rows(home)
    yield
    assert _tree(home) == tree
    assert _rows(home) == rows


@contextmanager
def read_only(*paths: Path):
    """Make `paths` read-only for this process: `chmod a-w` for a normal user; as root (which ignores
    modes) `chattr +i`, which refuses writes even to root (EPERM), as a read-only filesystem does."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in paths}
        for p in paths:
            p.chmod(modes[p] & ~0o222)
        try:
            yield
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
        return
    if shutil.which("chattr") is None:
        pytest.skip("root ignores file modes and chattr is not installed: no way to make a file read-only")
    done: list[Path] = []
    try:
        for p in paths:
            r = subprocess.run(["chattr", "+i", str(p)], capture_output=True, text=True)
            if r.returncode != 0:
                pytest.skip(f"root ignores file modes and chattr +i is refused here: {r.stderr.strip()}")
            done.append(p)
        yield
    finally:
        for p in done:
            subprocess.run(["chattr", "-i", str(p)], check=True)


def _db_files(home: Path) -> list[Path]:
    return [p for p in sorted(home.glob("tunebench.db*"))]


@pytest.fixture
def tracker(tunebench_home) -> dict[str, str]:
    """A tracker with a completed run `done` (a checkpoint with model files, so eval/resume/clone reach
    their writes), a run `waiting` in the paused queue (nothing starts) and a registered run `fresh`."""
    with open_db() as db:
        done = create_run(db=db, recipe="sft", config_text="seed: 0\n", name="done")
        update_run(done.id, db=db, status="completed", exit_code=0)
        waiting = create_run(db=db, recipe="sft", config_text="seed: 0\n", name="waiting")
        fresh = create_run(db=db, recipe="sft", config_text="seed: 0\n", name="fresh")  # never queued
        tq.set_paused(True, db=db)
        tq.enqueue([waiting.id], db=db)
    step = Path(done.output_dir) / "checkpoints" / "step_1"
    (step / "model").mkdir(parents=True)
    (step / "recipe_state.pt").write_bytes(b"")
    (step / "model" / "config.json").write_text("{}")
    return {"done": done.id, "waiting": waiting.id, "fresh": fresh.id}


# -- queued runs and sweeps are validated as launched runs are --------------------------------------------
@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--queue", "optimizer.lr=-1"], "optimizer.lr: must be 0 or more, got -1"),
        (["model.lora_rank=0", "--queue"], "model.lora_rank: must be a positive integer, got 0"),
        (["--queue", "model.lora_rank=eight"], "model.lora_rank: engine.models.smollm2.lora_smollm2 expects int"),
        (["--detach", "optimizer.lr=-1"], "optimizer.lr: must be 0 or more, got -1"),
    ],
)  # fmt: skip
def test_a_queued_run_is_validated_before_anything_is_written(extra, needle, tracker, tunebench_home, capsys):
    with _unchanged(tunebench_home):
        _one_line_exit_2(capsys, ["run", "sft", "--config", DEMO, *extra], needle)


def test_validate_refuses_what_a_queued_run_refuses(capsys):
    assert main(["validate", DEMO, "optimizer.lr=-1", "model.lora_rank=0"]) == 2
    out = capsys.readouterr().out
    assert "optimizer.lr: must be 0 or more, got -1" in out and "model.lora_rank: must be a positive" in out


def test_a_sweep_with_one_bad_value_queues_nothing(tracker, tunebench_home, capsys):
    with _unchanged(tunebench_home):
        _one_line_exit_2(
            capsys,
            ["sweep", "sft", "--config", DEMO, "model.lora_rank=8,eight"],
            "run 2 (model.lora_rank=eight)",
            "expects int",
            "nothing was queued",
        )


def test_a_sweep_on_a_fresh_home_with_a_bad_value_creates_no_tracker(tunebench_home, capsys):
    _one_line_exit_2(
        capsys, ["sweep", "sft", "--config", DEMO, "optimizer.lr=1e-4,-1"], "run 2 (optimizer.lr=-1)"
    )
    assert not tunebench_home.exists() or not any(tunebench_home.iterdir())


@pytest.mark.parametrize(
    ("terms", "needle"),
    [
        (["optimizer.lr=1e-4", "x"], "sweep term 2 ('x', last)"),
        (["x", "optimizer.lr=1e-4"], "sweep term 1 ('x', first)"),
        (["optimizer.lr=1e-4", "x", "x", "model.lora_rank=8"], "sweep term 2 ('x', next to another x)"),
    ],
)
def test_a_sweep_grid_with_a_dangling_x_is_refused(terms, needle, tracker, tunebench_home, capsys):
    with _unchanged(tunebench_home):
        _one_line_exit_2(capsys, ["sweep", "sft", "--config", DEMO, *terms], needle, "add the missing term")


def test_the_recipe_screens_sweep_line_refuses_a_dangling_x_too():
    from workbench.errors import UserError
    from workbench.sweeps import parse_spec

    assert parse_spec("optimizer.lr=1e-4,3e-4 x model.lora_rank=8") == [
        ["optimizer.lr=1e-4", "model.lora_rank=8"],
        ["optimizer.lr=3e-4", "model.lora_rank=8"],
    ]
    with pytest.raises(UserError, match=r"sweep term 2 \('x', last\)"):
        parse_spec("optimizer.lr=1e-4 x")


def _trusting(command: str) -> list[str]:
    """`--trust-checkpoint` when `command` has it: the fixture's checkpoint was not written by a run, and
    a command that refuses such a checkpoint first says that instead of reaching its tracker write."""
    import argparse

    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            flags = [o for a in action.choices[command]._actions for o in a.option_strings]
            return ["--trust-checkpoint"] if "--trust-checkpoint" in flags else []
    return []


# -- a read-only tracker: one line for every writer ---------------------------------------------------------
# Every subcommand either writes the tracker (here with an argv that reaches the write) or only reads
# it. A new subcommand that is in neither fails test_every_subcommand_is_classified.
WRITERS: dict[str, list[str]] = {
    "run --queue": ["run", "sft", "--config", DEMO, "--queue"],
    "run": ["run", "sft", "--config", DEMO, "--detach"],
    "sweep": ["sweep", "sft", "--config", DEMO, "model.lora_rank=8,16"],
    "queue add": ["queue", "add", "fresh"],
    "queue cancel": ["queue", "cancel", "waiting"],
    "queue move": ["queue", "move", "waiting", "top"],
    "queue pause": ["queue", "pause"],
    "queue resume": ["queue", "resume"],
    "resume": ["resume", "done", *_trusting("resume")],
    "clone": ["clone", "done", "--detach"],
    "stop": ["stop", "waiting"],
    "eval": ["eval", "done", "--tasks", "arith_mc"],
}
READERS = {
    "ls", "cp", "cat", "validate", "runs", "show", "compare", "export", "export-model", "generate",
    "models", "download", "queue ls",
}  # fmt: skip


def _subcommands() -> set[str]:
    import argparse

    def actions(parser):
        return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]

    names = set()
    for sub in actions(build_parser()):
        for name, parser in sub.choices.items():
            inner = [n for s in actions(parser) for n in s.choices]
            names.update({f"{name} {n}" for n in inner} if inner else {name})
    return names


def test_every_subcommand_is_classified():
    """So that a new command cannot write the tracker without a test of its read-only line here."""
    have = _subcommands()
    classified = {w.split(" --")[0] for w in WRITERS} | READERS
    assert have == classified, f"classify as a writer (with an argv) or a reader: {sorted(have ^ classified)}"


@pytest.mark.parametrize("case", sorted(WRITERS))
def test_every_tracker_writer_says_the_database_is_read_only(case, tracker, tunebench_home, capsys):
    db = tunebench_home / "tunebench.db"
    with _unchanged(tunebench_home), read_only(*_db_files(tunebench_home)):
        _one_line_exit_2(capsys, WRITERS[case], f"{db}: the tracker database is read-only", "TUNEBENCH_HOME")


@pytest.mark.parametrize("case", ["run --queue", "queue resume", "sweep", "queue move"])
def test_a_read_only_filesystem_is_one_line_too(case, tracker, tunebench_home, capsys):
    """Nothing under TUNEBENCH_HOME can be created (as on a read-only mount): the same line."""
    everything = [*_db_files(tunebench_home), *sorted(p for p in tunebench_home.rglob("*") if p.is_dir())]
    with _unchanged(tunebench_home), read_only(tunebench_home, *everything):
        _one_line_exit_2(capsys, WRITERS[case], "the tracker database is read-only")


def test_reading_a_read_only_tracker_still_works(tracker, tunebench_home, capsys):
    with _unchanged(tunebench_home), read_only(*_db_files(tunebench_home)):
        for argv in (["runs"], ["show", "done"], ["queue"], ["queue", "ls", "--json"]):
            assert main(argv) == 0, capsys.readouterr().err
        assert "waiting" in capsys.readouterr().out


def test_the_workbench_actions_raise_the_one_line(tracker, tunebench_home):
    """What the Runs and Recipe screens call (their toasts show `str(exc)`)."""
    from engine.tracking.tracker_errors import TrackerReadOnly
    from workbench import run_queue, services, sweeps

    text = (REPO / "configs" / f"{DEMO}.yaml").read_text()
    calls = {
        "tag": lambda: services.set_tags(tracker["done"], "a,b"),
        "note": lambda: services.set_notes(tracker["done"], "hi"),
        "queue": lambda: run_queue.queue_selected([tracker["fresh"]]),
        "cancel": lambda: run_queue.cancel(tracker["waiting"]),
        "move": lambda: run_queue.move(tracker["waiting"], "top"),
        "pause/resume": run_queue.toggle_paused,
        "queue config": lambda: run_queue.queue_config(recipe="sft", config_text=text),
        "sweep": lambda: sweeps.sweep_from_text("sft", "seed=1,2", config_text=text),
    }
    with _unchanged(tunebench_home), read_only(*_db_files(tunebench_home)):
        for what, call in calls.items():
            with pytest.raises(TrackerReadOnly, match="the tracker database is read-only") as info:
                call()
            assert "\n" not in str(info.value), what


async def test_the_runs_screen_toasts_the_read_only_line(tracker, tunebench_home):
    from tests.workbench.pilot_wait import wait_for
    from workbench.app import make_app
    from workbench.screens.confirm import TextPromptScreen
    from workbench.widgets.runs_table import RunsTable

    with read_only(*_db_files(tunebench_home)):
        app = make_app(interval=0.2)
        async with app.run_test(size=(110, 36)) as pilot:
            table = app.screen.query_one(RunsTable)
            await wait_for(pilot, lambda: len(table.rows_by_id) == 3, what="three runs")
            await pilot.press("t")
            prompt = await wait_for(pilot, lambda: isinstance(app.screen, TextPromptScreen) and app.screen)
            prompt.query_one("#text").value = "x"
            await pilot.press("enter")
            toast = await wait_for(
                pilot,
                lambda: next((n.message for n in app._notifications if "read-only" in n.message), None),
                what="the read-only toast",
            )
    assert "the tracker database is read-only" in toast and "\n" not in toast


def test_every_write_statement_is_inside_write_tx():
    """`write_tx` is where a read-only database becomes `TrackerReadOnly`: a write statement outside one
    (in the CLI's and the workbench's code) would bring the traceback back. A helper that writes without
    its own transaction counts when each of its calls is inside one (or inside another such helper).
    Exempt: the migrations in db.py (run inside `_ensure_schema`'s write_tx) and the recipes' metric
    writer, `MetricLogger` (its own BEGIN IMMEDIATE loop; a run's tracker is checked when it launches)."""
    files = [p for d in ("engine/tracking", "workbench") for p in sorted((REPO / d).rglob("*.py"))]
    exempt = {"engine/tracking/writer.py", "engine/tracking/db.py"}
    writes = ("INSERT", "UPDATE", "DELETE", "REPLACE")
    helpers: set[str] = set()
    calls: list[tuple[str, str, bool]] = []  # (file:line, called helper, inside write_tx or a helper)
    bare: list[str] = []

    def sql_of(call: ast.Call) -> str:
        if not call.args:
            return ""
        arg = call.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
        if isinstance(arg, ast.JoinedStr):
            return "".join(
                v.value for v in arg.values if isinstance(v, ast.Constant) and isinstance(v.value, str)
            )
        return ""

    def visit(node: ast.AST, rel: str, fn: str, in_tx: bool) -> None:
        for child in ast.iter_child_nodes(node):
            tx, name = in_tx, fn
            if isinstance(child, ast.With):
                tx = tx or any(
                    isinstance(i.context_expr, ast.Call) and getattr(i.context_expr.func, "id", getattr(i.context_expr.func, "attr", "")) == "write_tx"
                    for i in child.items
                )  # fmt: skip
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name, tx = child.name, False
            if isinstance(child, ast.Call):
                func = child.func
                called = getattr(func, "attr", getattr(func, "id", ""))
                if called in ("execute", "executemany") and sql_of(child).lstrip().upper().startswith(writes):
                    if not tx:
                        bare.append(f"{rel}:{child.lineno} in {fn}")
                        helpers.add(fn)
                calls.append((f"{rel}:{child.lineno} in {fn}", called, tx))
            visit(child, rel, name, tx)

    for path in files:
        rel = str(path.relative_to(REPO))
        if rel not in exempt:
            visit(ast.parse(path.read_text()), rel, "<module>", False)
    assert bare, "the check found no write at all: it is not looking where the writes are"
    # Each helper (a function with a bare write) must be called only inside write_tx or another helper.
    outside = [
        where for where, called, tx in calls
        if called in helpers and not tx and where.rsplit(" in ", 1)[1] not in helpers
    ]  # fmt: skip
    assert not outside, f"a write reached outside write_tx: {outside} (helpers: {sorted(helpers)})"


# -- the user's own case, for real: a 0444 database and a normal user --------------------------------------
def _as_nobody() -> list[str]:
    if os.geteuid() != 0:
        return []  # already a normal user: the in-process tests above are this case
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv is not installed: cannot run the CLI as a normal user")
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--"]


def test_a_0444_database_as_a_normal_user():
    """`chmod 0444 tunebench.db`, then `tunebench run --queue` and `tunebench queue resume` as a user
    who is not root: one line each (was a 26-line traceback)."""
    import tempfile

    prefix = _as_nobody()
    base = Path(tempfile.mkdtemp(prefix="tb-readonly-"))  # not under pytest's root-only tmp folder
    try:
        home = base / "home"
        if prefix:
            os.chown(base, 65534, 65534)
        env = dict(os.environ, TUNEBENCH_HOME=str(home), HOME=str(base))
        env.pop("TUNEBENCH_RUN_ID", None)
        setup = (
            "from engine.tracking import open_db\nfrom engine.tracking.run_rows import create_run\n"
            "with open_db() as db:\n    create_run(db=db, recipe='sft', config_text='seed: 0\\n', name='done')\n"
        )
        made = subprocess.run([*prefix, sys.executable, "-c", setup], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        if made.returncode != 0 and prefix:
            pytest.skip(f"python does not run as nobody here: {made.stderr.strip().splitlines()[-1:]}")
        assert made.returncode == 0, made.stderr
        (home / "tunebench.db").chmod(0o444)
        tree, rows = _tree(home), _rows(home)
        for argv in (["run", "sft", "--config", DEMO, "--queue"], ["queue", "resume"]):
            proc = subprocess.run([*prefix, sys.executable, "-m", "workbench.cli", *argv], cwd=REPO, env=env,
                                  capture_output=True, text=True, timeout=240)  # fmt: skip
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
            assert f"{home / 'tunebench.db'}: the tracker database is read-only" in lines[0]
        assert _tree(home) == tree and _rows(home) == rows
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_read_only_mount_of_the_home(tracker, tunebench_home):
    """The filesystem case for real: TUNEBENCH_HOME bind-mounted read-only in a private mount namespace
    (root only; skipped where the sandbox forbids mounts)."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        pytest.skip("a read-only mount needs root and unshare(1)")
    home = str(tunebench_home)
    mount = f"mount --bind {home} {home} && mount -o remount,bind,ro {home}"
    probe = subprocess.run([unshare, "-m", "sh", "-c", f"{mount} && ! touch {home}/probe 2>/dev/null"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"cannot make a read-only mount here: {probe.stderr.strip() or 'the probe could write'}")
    env = dict(os.environ, TUNEBENCH_HOME=home)
    before = _tree(tunebench_home), _rows(tunebench_home)
    for argv in ("queue resume", f"run sft --config {DEMO} --queue", "queue cancel waiting"):
        proc = subprocess.run([unshare, "-m", "sh", "-c", f"{mount} && exec {sys.executable} -m workbench.cli {argv}"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=240)  # fmt: skip
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, (
            argv,
            proc.stderr,
        )
        assert f"{home}/tunebench.db: the tracker database is read-only" in lines[0], lines[0]
    assert (_tree(tunebench_home), _rows(tunebench_home)) == before


# -- export-model's folder, queue move's ends -------------------------------------------------------------
def _model_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")  # enough to be taken for a model folder; nothing loads
    return folder


def test_export_model_into_a_read_only_folder_is_one_line(tmp_path, tunebench_home, capsys):
    folder, out = _model_folder(tmp_path), tmp_path / "ro"
    out.mkdir()
    with read_only(out):
        _one_line_exit_2(
            capsys, ["export-model", str(folder), "--gguf", "f16", "-o", str(out / "m.gguf")],
            f"{out}: this folder is", "choose -o FILE in a folder you can write",
        )  # fmt: skip
        assert list(out.iterdir()) == []


def test_export_model_into_a_missing_folder_is_refused_not_created(tmp_path, tunebench_home, capsys):
    folder, missing = _model_folder(tmp_path), tmp_path / "no" / "such"
    _one_line_exit_2(
        capsys, ["export-model", str(folder), "--gguf", "f16", "-o", str(missing / "m.gguf")],
        f"{missing}: no such folder", "mkdir -p",
    )  # fmt: skip
    assert not (tmp_path / "no").exists()


def test_queue_move_past_either_end_stops_there_and_says_so(tracker, capsys):
    with open_db() as db:
        second = create_run(db=db, recipe="sft", config_text="seed: 0\n", name="second")
        tq.enqueue([second.id], db=db)
    capsys.readouterr()
    assert main(["queue", "move", "waiting", "99"]) == 0
    assert capsys.readouterr().out.strip() == (
        "run waiting is now at place 2, the end of the queue (2 waiting; place 99 is past it)"
    )
    assert main(["queue", "move", "waiting", "down"]) == 0
    assert (
        capsys.readouterr().out.strip()
        == "run waiting stays at place 2: it is at the end of the queue already"
    )
    assert main(["queue", "move", "waiting", "up"]) == 0
    assert capsys.readouterr().out.strip() == "run waiting is now at place 1"
    assert main(["queue", "move", "waiting", "top"]) == 0
    assert (
        capsys.readouterr().out.strip()
        == "run waiting stays at place 1: it is at the top of the queue already"
    )
    _one_line_exit_2(capsys, ["queue", "move", "waiting", "0"], "places start at 1")
