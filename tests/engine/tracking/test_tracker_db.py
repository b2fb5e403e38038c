"""The database: private files, WAL, schema creation, migration and clear refusals."""

import sqlite3
import stat

import pytest

from engine.tracking import db as dbmod
from engine.tracking.db import connect, open_db, write_tx
from engine.tracking.paths import db_path
from engine.tracking.run_rows import create_run
from engine.tracking.tracker_errors import SchemaError, TrackerError


def test_created_private_with_wal(tunebench_home):
    with open_db() as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA busy_timeout").fetchone()[0] == dbmod.BUSY_TIMEOUT_MS
        run = create_run(db=db, recipe="sft", config_text="a: 1\n")
    assert stat.S_IMODE(db_path().stat().st_mode) == 0o600
    assert stat.S_IMODE(tunebench_home.stat().st_mode) == 0o700
    assert stat.S_IMODE((tunebench_home / "runs" / run.id).stat().st_mode) == 0o700


def test_schema_version_matches_models(tunebench_home):
    from engine.tracking.tables import SCHEMA_VERSION

    assert SCHEMA_VERSION == dbmod.SCHEMA_VERSION
    with open_db() as db:
        assert db.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"runs", "metrics", "events", "eval_results", "schema_version"} <= tables


def test_absent_without_create(tunebench_home):
    with pytest.raises(TrackerError, match="does not exist"):
        connect(create=False)


def test_newer_schema_is_refused_clearly(tunebench_home):
    with open_db() as db:
        db.execute("UPDATE schema_version SET version = 99")
    with pytest.raises(SchemaError, match="newer tunebench .*upgrade tunebench"):
        connect()


def test_foreign_database_is_refused(tunebench_home):
    tunebench_home.mkdir()
    con = sqlite3.connect(db_path())
    con.execute("CREATE TABLE stuff (x)")
    con.commit()
    con.close()
    with pytest.raises(SchemaError, match="not a tunebench database"):
        connect()


def test_garbage_file_is_refused(tunebench_home):
    tunebench_home.mkdir()
    db_path().write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(TrackerError, match="cannot be opened"):
        connect()


def test_migration_runs_each_step_in_one_transaction(tunebench_home, monkeypatch):
    with open_db() as db:
        create_run(db=db, recipe="sft", config_text="a: 1\n", name="old")

    def add_color(conn):
        conn.execute("ALTER TABLE runs ADD COLUMN color VARCHAR NOT NULL DEFAULT 'blue'")

    monkeypatch.setattr(dbmod, "SCHEMA_VERSION", dbmod.SCHEMA_VERSION + 1)
    monkeypatch.setitem(dbmod.MIGRATIONS, dbmod.SCHEMA_VERSION - 1, add_color)
    with open_db() as db:
        assert db.execute("SELECT version FROM schema_version").fetchone()[0] == dbmod.SCHEMA_VERSION
        assert db.execute("SELECT name, color FROM runs").fetchall() == [("old", "blue")]


def test_version_1_database_gets_the_value_index(tunebench_home):
    with open_db() as db:
        create_run(db=db, recipe="sft", config_text="", name="kept")
        db.execute("DROP INDEX ix_metrics_run_name_value")
        db.execute("DROP INDEX ix_metrics_run_name_rank_step")
        db.execute("CREATE INDEX ix_metrics_run_name_step ON metrics (run_id, name, step)")  # as in version 1
        db.execute("UPDATE schema_version SET version = 1")
    with open_db() as db:
        assert db.execute("SELECT version FROM schema_version").fetchone()[0] == dbmod.SCHEMA_VERSION
        names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert {"ix_metrics_run_name_value", "ix_metrics_run_name_rank_step"} <= names
        assert "ix_metrics_run_name_step" not in names
        assert db.execute("SELECT name FROM runs").fetchall() == [("kept",)]


def test_missing_migration_is_refused(tunebench_home, monkeypatch):
    with open_db():
        pass
    current = dbmod.SCHEMA_VERSION
    monkeypatch.setattr(dbmod, "SCHEMA_VERSION", current + 2)
    with pytest.raises(SchemaError, match=f"no migration to {current + 1}"):
        connect()


def test_write_tx_rolls_back(tunebench_home):
    with open_db() as db:
        with pytest.raises(ZeroDivisionError):
            with write_tx(db):
                create_args = ("x", "n", "sft", "m", "queued", "new", "", None, 0.0)
                db.execute(
                    "INSERT INTO runs (id, name, recipe, module, status, kind, config_text, model, created_at,"
                    " nproc, host, output_dir, tags, notes, step, stop_requested, resumes)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1, 'h', 'o', '', '', 0, 0, 0)",
                    create_args,
                )
                raise ZeroDivisionError("abort the transaction")
        assert db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


def test_version_2_database_gets_the_launch_columns(tunebench_home):
    with open_db() as db:
        create_run(db=db, recipe="sft", config_text="", name="kept2")
        for col in ("nnodes", "rdzv_endpoint", "slurm_job_id"):
            db.execute(f"ALTER TABLE runs DROP COLUMN {col}")  # as in version 2
        db.execute("UPDATE schema_version SET version = 2")
    with open_db() as db:
        assert db.execute("SELECT version FROM schema_version").fetchone()[0] == dbmod.SCHEMA_VERSION
        assert db.execute("SELECT name, nnodes, rdzv_endpoint, slurm_job_id FROM runs").fetchall() == [
            ("kept2", 1, None, None)
        ]
