"""Opening the tracker database: private file, WAL, busy timeout, schema check and migration.

Every connection is a stdlib `sqlite3.Connection` in autocommit mode (`isolation_level=None`);
writes go through `write_tx()`, which opens the transaction with `BEGIN IMMEDIATE` so a writer takes
the write lock up front and waits (busy timeout) instead of failing with "database is locked" when
it would upgrade a read transaction.

A tracker that cannot be written (a file mode, an immutable file, a read-only filesystem) is one
`TrackerReadOnly` line naming the file: `write_tx()` is the one place every write of the CLI and the
workbench goes through (a test checks that no write statement is outside one), and it turns SQLite's
"attempt to write a readonly database" / "unable to open database file" into that error.
"""

from __future__ import annotations

import errno
import math
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.tracking.paths import db_path, ensure_private_dir
from engine.tracking.tracker_errors import SchemaError, TrackerError, TrackerReadOnly

BUSY_TIMEOUT_MS = 60_000
SCHEMA_VERSION = 4  # keep equal to engine.tracking.tables.SCHEMA_VERSION (checked by a test)


def _v1_to_v2(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE INDEX IF NOT EXISTS ix_metrics_run_name_value ON metrics (run_id, name, value)")
    conn.execute(
        "CREATE INDEX IF NOT EXISTS ix_metrics_run_name_rank_step ON metrics (run_id, name, rank, step, value)"
    )
    conn.execute("DROP INDEX IF EXISTS ix_metrics_run_name_step")


def _v2_to_v3(conn: sqlite3.Connection) -> None:
    have = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
    for column, ddl in (
        ("nnodes", "INTEGER NOT NULL DEFAULT 1"), ("rdzv_endpoint", "VARCHAR"), ("slurm_job_id", "VARCHAR")
    ):  # fmt: skip
        if column not in have:  # (as the indexes of 1 -> 2: a re-run migration changes nothing)
            conn.execute(f"ALTER TABLE runs ADD COLUMN {column} {ddl}")


def _v3_to_v4(conn: sqlite3.Connection) -> None:
    have = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
    if "queue_pos" not in have:
        conn.execute("ALTER TABLE runs ADD COLUMN queue_pos INTEGER")
    from engine.tracking.tables import table_statement

    conn.execute(table_statement("queue_state").replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1))


# version N -> function migrating a database at version N to N+1, run inside one write transaction.
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4}

_TABLES = ("runs", "metrics", "events", "eval_results", "queue_state", "schema_version")


def connect(home: Path | None = None, *, create: bool = True) -> sqlite3.Connection:
    """Open `tunebench.db` under `home` (default `TUNEBENCH_HOME`), creating it (0600, folder 0700)
    when `create` and absent; migrates an older schema.

    Raises `TrackerError` when the database is absent and `create` is False, `SchemaError` when it was
    made by a newer tunebench or is not a tunebench database.
    """
    path = db_path(home)
    if path.exists() and not path.is_file():
        raise TrackerError(f"{path} is not a file: move it aside (or set TUNEBENCH_HOME to another folder)")
    if not path.exists():
        if not create:
            raise TrackerError(f"{path} does not exist: start a run first (tunebench run ...)")
        ensure_private_dir(path.parent)
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        except OSError as exc:
            if exc.errno in _READ_ONLY_ERRNOS:
                raise TrackerReadOnly(path, f"cannot create it: {exc.strerror}") from None
            raise TrackerError(f"{path}: cannot create it ({exc.strerror}): check its folder") from None
        os.close(fd)
    try:
        conn = sqlite3.connect(
            path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as exc:  # e.g. no permission to read it
        raise TrackerError(f"{path} cannot be opened ({exc}): check its permissions") from exc
    try:
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        if mode.lower() != "wal":
            conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: commits do not fsync (a power cut may lose the last transactions, never
        # corrupt the file); the writer commits every step, so this is what keeps it well under 1 ms.
        conn.execute("PRAGMA synchronous=NORMAL")
        _ensure_schema(conn, path)
    except sqlite3.DatabaseError as exc:
        conn.close()
        if is_read_only_error(exc):  # a journal mode or schema it cannot write
            raise TrackerReadOnly(path, str(exc)) from None
        raise TrackerError(f"{path} cannot be opened as a tunebench database ({exc}): move it aside") from exc
    except BaseException:
        conn.close()
        raise
    return conn


@contextmanager
def open_db(home: Path | None = None, *, create: bool = True) -> Iterator[sqlite3.Connection]:
    """`connect()` as a context manager that closes the connection."""
    conn = connect(home, create=create)
    try:
        yield conn
    finally:
        conn.close()


@contextmanager
def write_tx(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction (`BEGIN IMMEDIATE` ... `COMMIT`; `ROLLBACK` on any exception).

    Raises `TrackerReadOnly` (naming the database file) when SQLite refuses the write because the file
    or its folder is read-only, at BEGIN, at any statement inside or at COMMIT; other errors as they are.
    """
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        _raise_if_read_only(conn, exc)
        raise
    try:
        yield conn
    except sqlite3.OperationalError as exc:
        _rollback(conn)
        _raise_if_read_only(conn, exc)
        raise
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    try:
        conn.execute("COMMIT")
    except sqlite3.OperationalError as exc:
        _rollback(conn)
        _raise_if_read_only(conn, exc)
        raise


# errno values that mean "this process may not write here" (EPERM: an immutable file, even for root).
_READ_ONLY_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def is_read_only_error(exc: BaseException) -> bool:
    """True for SQLite's refusals to write a read-only database or to create its journal files
    (SQLITE_READONLY*, SQLITE_CANTOPEN*; by message when the error code is unavailable)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return (code & 0xFF) in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN)
    text = str(exc).lower()
    return "readonly database" in text or "unable to open database file" in text


def database_file(conn: sqlite3.Connection) -> str:
    """The file of `conn`'s main database ("" for an in-memory one or when it cannot be asked)."""
    try:
        row = conn.execute("PRAGMA database_list").fetchone()
    except sqlite3.Error:
        return ""
    return str(row[2]) if row and row[2] else ""


def require_writable(home: Path | None = None) -> None:
    """Raise `TrackerReadOnly` when this process cannot write the tracker database under `home`
    (default `TUNEBENCH_HOME`), or, while it does not exist, the nearest existing folder it would go
    in. A command calls it before it writes anything else (a run's folder), so a read-only tracker
    leaves nothing behind; `write_tx` catches the cases this check cannot see (root ignores file
    modes, and so does SQLite run as root: the check agrees with it)."""
    path = db_path(home)
    target = path if path.exists() else next((p for p in path.parents if p.exists()), None)
    if target is None:
        return
    if not os.access(target, os.W_OK):
        why = "read-only filesystem" if _read_only_fs(target) else "no write permission"
        raise TrackerReadOnly(path, why if target == path else f"{why} on {target}")
    wal = path.with_name(path.name + "-wal")
    if wal.exists() and not os.access(wal, os.W_OK):
        raise TrackerReadOnly(path, f"no write permission on {wal.name}")


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _raise_if_read_only(conn: sqlite3.Connection, exc: sqlite3.OperationalError) -> None:
    if is_read_only_error(exc):
        raise TrackerReadOnly(database_file(conn) or "the tracker database", str(exc)) from None


def _rollback(conn: sqlite3.Connection) -> None:
    try:
        conn.execute("ROLLBACK")
    except sqlite3.OperationalError:  # no transaction is open any more (SQLite ended it itself)
        pass


def _ensure_schema(conn: sqlite3.Connection, path: Path) -> None:
    version = _read_version(conn)
    if version == SCHEMA_VERSION:
        return
    with write_tx(conn):
        version = _read_version(conn)  # another process may have created/migrated it meanwhile
        if version is None:
            names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if names - {"sqlite_sequence"}:
                raise SchemaError(
                    f"{path} is not a tunebench database (tables: {', '.join(sorted(names))}): "
                    "point TUNEBENCH_HOME elsewhere or move the file aside"
                )
            from engine.tracking.tables import create_statements

            for stmt in create_statements():
                conn.execute(stmt)
            conn.execute("INSERT INTO schema_version(version) VALUES (?)", (SCHEMA_VERSION,))
            return
        if version > SCHEMA_VERSION:
            raise SchemaError(
                f"{path} was made by a newer tunebench (schema {version}, this one reads {SCHEMA_VERSION}): "
                "upgrade tunebench or point TUNEBENCH_HOME elsewhere"
            )
        while version < SCHEMA_VERSION:
            step = MIGRATIONS.get(version)
            if step is None:
                raise SchemaError(
                    f"{path} has schema {version} and no migration to {version + 1} exists: "
                    "move the file aside to start a fresh tracker"
                )
            step(conn)
            version += 1
        conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))


def _read_version(conn: sqlite3.Connection) -> int | None:
    try:
        row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return None
        raise
    return None if row is None or row[0] is None else int(row[0])


def to_db_float(value: object) -> float:
    """A metric value as a float for SQLite (NaN becomes NULL there; readers turn it back). SQLite stores
    an integral REAL as an integer, so -0.0 comes back as 0.0; every other float keeps its bits."""
    return float(value)  # type: ignore[arg-type]


def from_db_float(value: float | None) -> float:
    """A stored metric value back as a float: NULL is NaN."""
    return math.nan if value is None else float(value)
