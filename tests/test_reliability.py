"""Nothing lost, nothing stuck, nothing corrupted: the MLflow store under concurrent processes, half-migrated
stores, one process and one run per identity, metrics exactly once across restarts, and (slow) SIGKILL at
several points of pre-training and fine-tuning followed by a re-run."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from electra_ablate import store, tracking

REPO = Path(__file__).resolve().parent.parent

# One process of the concurrency test: open the store (creating it if it is new) and record `n` runs with a
# three-step metric history each.
WRITER = textwrap.dedent(
    """
    import sys
    from electra_ablate import tracking
    uri, experiment, n, tag = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    client = tracking.setup(uri, experiment)
    for i in range(n):
        run = tracking.RunLogger.start(client, experiment, f"{tag}-{i}", {"writer": tag}, {"i": str(i)})
        for step in (1, 2, 3):
            run.log_metrics({"train/loss": 1.0 / step}, step)
        run.finish()
    """
)


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def write_concurrently(tmp: Path, processes: int, runs_each: int) -> tuple[MlflowClient, float]:
    uri = f"sqlite:///{tmp}/new/mlflow.db"
    tic = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, uri, "exp", str(runs_each), f"w{k}"], env=env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for k in range(processes)]
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    seconds = time.perf_counter() - tic
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-3000:]
    return MlflowClient(uri), seconds


def check_all_recorded(client: MlflowClient, processes: int, runs_each: int) -> None:
    exp = client.get_experiment_by_name("exp")
    runs = client.search_runs([exp.experiment_id], max_results=10000)
    assert len(runs) == processes * runs_each, f"{processes * runs_each - len(runs)} runs lost"
    assert {r.info.status for r in runs} == {"FINISHED"}
    for r in runs:
        assert [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")] == [1, 2, 3]


def test_processes_creating_a_new_store_together_lose_nothing(tmp_path):
    client, _ = write_concurrently(tmp_path, processes=4, runs_each=3)
    check_all_recorded(client, 4, 3)
    assert store.inspect_sqlite(tmp_path / "new" / "mlflow.db") == (None, 12)


@pytest.mark.slow
def test_eight_processes_write_a_hundred_runs_to_a_new_store(tmp_path):
    client, seconds = write_concurrently(tmp_path, processes=8, runs_each=13)  # 104 runs
    check_all_recorded(client, 8, 13)
    print(f"8 processes, 104 runs on a new SQLite store: 0 lost, {seconds:.1f} s")


@pytest.fixture(scope="session")
def template_store(tmp_path_factory) -> Path:
    """A store with two runs, made once (MLflow's ~50 schema migrations take seconds); tests copy it."""
    path = tmp_path_factory.mktemp("template") / "mlflow.db"
    client = tracking.setup(f"sqlite:///{path}", "exp")
    for i in range(2):
        tracking.RunLogger.start(client, "exp", f"r{i}", {}).finish()
    return path


def copy_of(template: Path, tmp: Path) -> Path:
    db = tmp / "mlflow.db"
    db.write_bytes(template.read_bytes())
    return db


def test_a_half_migrated_store_with_runs_is_refused_with_how_to_recover(tmp_path, template_store):
    db = copy_of(template_store, tmp_path)
    with sqlite3.connect(db) as con:  # what an interrupted alembic batch migration leaves behind
        con.execute("create table _alembic_tmp_latest_metrics (key varchar(250))")
    before = db.read_bytes()
    with pytest.raises(store.StoreError) as error:
        tracking.setup(f"sqlite:///{db}", "exp")
    message = str(error.value)
    assert "interrupted half-way" in message and "_alembic_tmp_latest_metrics" in message
    assert "It holds 2 run(s)" in message and "mlflow db upgrade" in message and f"mv {db} {db}.broken" in message
    assert db.read_bytes() == before  # refused, untouched


def test_a_store_with_a_stale_schema_version_is_refused(tmp_path, template_store):
    db = copy_of(template_store, tmp_path)
    with sqlite3.connect(db) as con:
        con.execute("update alembic_version set version_num = '0a8213491aaa'")  # MLflow 1.x's first revision
    with pytest.raises(store.StoreError, match="schema version is 0a8213491aaa.*mlflow db upgrade"):
        tracking.setup(f"sqlite:///{db}", "exp")


def test_a_store_from_a_newer_mlflow_says_so(tmp_path, template_store):
    db = copy_of(template_store, tmp_path)
    with sqlite3.connect(db) as con:
        con.execute("update alembic_version set version_num = 'ffffffffffff'")
    with pytest.raises(store.StoreError, match="written by a newer MLflow"):
        tracking.setup(f"sqlite:///{db}", "exp")


def test_a_half_created_store_without_runs_is_set_aside_and_recreated(tmp_path):
    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as con:  # creation killed after the first tables
        con.execute("create table experiments (experiment_id integer primary key, name varchar(256))")
        con.execute("create table _alembic_tmp_runs (run_uuid varchar(32))")
    client = tracking.setup(f"sqlite:///{db}", "exp")
    tracking.RunLogger.start(client, "exp", "r", {}).finish()
    assert store.inspect_sqlite(db) == (None, 1)
    assert len(list(tmp_path.glob("mlflow.db.broken-*"))) == 1  # kept for inspection


HOLDER = textwrap.dedent(
    """
    import sys, time
    from electra_ablate.store import IdentityLock
    with IdentityLock(sys.argv[1], "pre-training x"):
        print("held", flush=True)
        time.sleep(120)
    """
)


def test_a_second_process_with_the_same_identity_stops_with_a_clear_message(tmp_path):
    lock = tmp_path / "run.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], env=env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(store.RunBusyError, match=rf"pre-training x is already running in pid {holder.pid} on .*kill {holder.pid}"):
            with store.IdentityLock(lock, "pre-training x"):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with store.IdentityLock(lock, "pre-training x"):  # the kernel released the dead holder's lock
        assert json.loads(lock.with_name("run.lock.owner").read_text())["pid"] == os.getpid()


def test_an_adopted_run_logs_each_step_once(tmp_path):
    client = tracking.setup(f"sqlite:///{tmp_path}/mlflow.db", "exp")
    first = tracking.RunLogger.start(client, "exp", "r", {tracking.TAG_CONFIG_HASH: "h"})
    for step in (1, 2, 3):
        first.log_metrics({"train/loss": float(step), "dev/acc": 0.5}, step)
    first.flush()  # then the process dies: the run stays RUNNING
    (stale,) = tracking.runs_of_identity(client, "exp", "h")
    again = tracking.RunLogger.adopt(client, stale, "resumed from step 2")
    for step in (2, 3, 4, 5):  # a resume from a checkpoint at step 2 recomputes 3
        again.log_metrics({"train/loss": float(step)}, step)
    again.finish()
    run = client.get_run(first.run_id)
    assert [m.step for m in client.get_metric_history(first.run_id, "train/loss")] == [1, 2, 3, 4, 5]
    assert run.info.status == "FINISHED" and run.data.tags[tracking.TAG_ATTEMPTS] == "2"
    assert json.loads(run.data.tags[tracking.TAG_RESTARTS])[0]["how"] == "resumed from step 2"


def test_stale_running_runs_are_marked_killed_with_a_reason(tmp_path):
    client = tracking.setup(f"sqlite:///{tmp_path}/mlflow.db", "exp")
    a = tracking.RunLogger.start(client, "exp", "a", {tracking.TAG_CONFIG_HASH: "h"})
    b = tracking.RunLogger.start(client, "exp", "b", {tracking.TAG_CONFIG_HASH: "h"})
    assert tracking.retire_stale(client, tracking.runs_of_identity(client, "exp", "h"), keep=b.run_id) == [a.run_id]
    old = client.get_run(a.run_id)
    assert old.info.status == "KILLED" and f"superseded by run {b.run_id}" in old.data.tags[tracking.TAG_END_REASON]
    assert client.get_run(b.run_id).info.status == "RUNNING"
