"""Opening the MLflow store safely, and one process per run identity.

An embedded SQLite store is created by MLflow on first use by running its schema migrations (alembic), and
MLflow does that without any lock: processes that open a new store together (a parallel Hydra multirun,
several terminals) race through the migrations and can leave the file half-migrated (`_alembic_tmp_*`
tables, a missing table, a stale `alembic_version`), after which every later process fails. Here the first
opening in each process happens under an inter-process file lock beside the database, after a check that
refuses (or, when it holds no run, sets aside and recreates) a half-migrated store. A tracking server
(`http://...`) migrates its own database, so only `sqlite:///` URIs take the lock.

`IdentityLock` makes a second process with the same run identity (the same pre-training or fine-tuning
config) stop at once with a message naming the process that holds it, instead of writing the same
checkpoint folder and the same MLflow run twice. Both locks are `flock` locks (the `filelock` package):
the kernel releases them when their process dies, even by SIGKILL, so a crash never leaves a stale lock.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sqlite3
import time
from pathlib import Path

from filelock import FileLock, Timeout

from electra_ablate.tracking.origin import OriginClient

log = logging.getLogger(__name__)

# Creating a store takes ~2 s (MLflow's migrations); a process waiting this long is stuck behind a hung one.
STORE_LOCK_TIMEOUT_S = 600.0
_CHECKED: set[str] = set()  # SQLite files this process has opened (MLflow caches the engine per URI)


class StoreError(RuntimeError):
    """An MLflow store that cannot be used as it is; the message says how to recover."""


class RunBusyError(RuntimeError):
    """Another live process holds the lock of this run identity."""


def sqlite_path(uri: str) -> Path | None:
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///") :]).expanduser().resolve()
    return None


def _schema_head() -> str:
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()


def _known_revision(revision: str) -> bool:
    """Whether this MLflow's migration scripts know `revision` (False: a newer MLflow made the store)."""
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    try:
        return ScriptDirectory.from_config(_get_alembic_config(db_url="")).get_revision(revision) is not None
    except Exception:  # noqa: BLE001 - alembic raises several types for an unknown revision
        return False


def inspect_sqlite(path: Path) -> tuple[str | None, int]:
    """(what is wrong with the store at `path`, or None; how many runs it holds). A missing or empty file is
    a store to create, not a problem."""
    if not path.is_file() or path.stat().st_size == 0:
        return None, 0
    from mlflow.store.db.base_sql_model import Base

    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=60)
        try:
            tables = {r[0] for r in con.execute("select name from sqlite_master where type = 'table'")}
            version = None
            if "alembic_version" in tables:
                row = con.execute("select version_num from alembic_version").fetchone()
                version = row[0] if row else None
            runs = con.execute("select count(*) from runs").fetchone()[0] if "runs" in tables else 0
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        return f"it is not a readable SQLite database ({e})", -1
    if not tables:
        return None, 0
    leftovers = sorted(t for t in tables if t.startswith("_alembic_tmp_"))
    if leftovers:
        return f"a schema migration was interrupted half-way (leftover tables {leftovers})", runs
    missing = sorted(set(Base.metadata.tables) - tables)
    if missing:
        return f"tables {missing} are missing (its creation was interrupted)", runs
    head = _schema_head()
    if version != head:
        if version is not None and not _known_revision(version):
            return (f"its schema version {version} is newer than this MLflow's ({head}); it was written by a newer "
                    "MLflow: install that version (pip install -U mlflow)"), runs
        return f"its schema version is {version}, this MLflow expects {head}", runs
    return None, runs


def _recovery(path: Path, problem: str, runs: int) -> str:
    uri = f"sqlite:///{path}"
    return (
        f"the MLflow store {path} cannot be used: {problem}. It holds {runs} run(s). To recover: take a copy "
        f"(cp {path} {path}.bak), then run `mlflow db upgrade {uri}`; if that fails, restore a backup or move the "
        f"file aside (mv {path} {path}.broken) so a new store is created (the runs in it are then not seen), "
        "or point logger.tracking_uri (MLFLOW_TRACKING_URI) at another store"
    )


def open_client(uri: str):
    """An MlflowClient for `uri` in which imported runs go by their original ids (tracking/origin.py); a SQLite
    store is checked, created and migrated under a file lock."""
    from mlflow.tracking import MlflowClient

    path = sqlite_path(uri)
    if path is None or str(path) in _CHECKED:
        return OriginClient(MlflowClient(uri))
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(f"{path}.lock", timeout=STORE_LOCK_TIMEOUT_S)
    try:
        lock.acquire()
    except Timeout:
        raise StoreError(
            f"waited {STORE_LOCK_TIMEOUT_S:.0f} s for the lock {path}.lock of the MLflow store {path}: another "
            "process is creating or migrating it and seems stuck; stop it and re-run"
        ) from None
    try:
        problem, runs = inspect_sqlite(path)
        if problem is not None:
            if runs != 0:
                raise StoreError(_recovery(path, problem, runs))
            # No run was ever recorded in it: nothing to lose. Keep the file for inspection, start afresh.
            aside = path.with_name(f"{path.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
            path.replace(aside)
            log.warning("the MLflow store %s held no runs and %s; moved it to %s and created a new one",
                        path, problem, aside)
        try:
            client = MlflowClient(uri)  # creates and migrates a new store (MLflow caches it per process)
        except Exception as e:
            raise StoreError(_recovery(path, f"MLflow could not open it ({e})", runs)) from e
        _CHECKED.add(str(path))
        return OriginClient(client)
    finally:
        lock.release()


def store_lock(uri: str) -> FileLock | None:
    """The lock that serialises structural changes of a SQLite store (experiment creation); None for servers."""
    path = sqlite_path(uri)
    return None if path is None else FileLock(f"{path}.lock", timeout=STORE_LOCK_TIMEOUT_S)


class IdentityLock:
    """Held while one run identity is worked on; a second process gets `RunBusyError` naming the first.

    The owner (pid, host, start time, command) is written beside the lock for that message; the lock itself
    is the kernel's, so the owner file of a dead process is simply overwritten by the next one.
    """

    def __init__(self, path: str | Path, what: str):
        self.path = Path(path)
        self.what = what
        self.owner_path = self.path.with_name(self.path.name + ".owner")
        self._lock = FileLock(str(self.path), timeout=0)

    def __enter__(self) -> IdentityLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire()
        except Timeout:
            try:
                owner = json.loads(self.owner_path.read_text())
            except (OSError, ValueError):
                owner = {}
            who = (f"pid {owner.get('pid', '?')} on {owner.get('host', '?')}, started "
                   f"{owner.get('started', '?')}") if owner else "another process"
            raise RunBusyError(
                f"{self.what} is already running in {who} (lock {self.path}). Wait for it to finish, or stop it "
                f"(kill {owner.get('pid', '<pid>')}) and run this again: it picks up where the other stopped"
            ) from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        tmp = self.owner_path.with_name(f".{self.owner_path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(info))
        tmp.replace(self.owner_path)
        return self

    def __exit__(self, *exc) -> None:
        self.owner_path.unlink(missing_ok=True)
        self._lock.release()
