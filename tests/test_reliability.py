"""Nothing lost, nothing stuck, nothing corrupted: the MLflow store under concurrent processes, half-migrated
stores, one process and one run per identity, metrics exactly once across restarts, and (slow) SIGKILL at
several points of pre-training and fine-tuning followed by a re-run."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from conftest import read_only_rows

from electra_ablate.tracking import store
from electra_ablate.tracking import runs as tracking

REPO = Path(__file__).resolve().parent.parent

# One process of the concurrency test: open the store (creating it if it is new) and record `n` runs with a
# three-step metric history each.
WRITER = textwrap.dedent(
    """
    import sys
    from electra_ablate.tracking import runs as tracking
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
    from electra_ablate.tracking.store import IdentityLock
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


def composed(config: str, overrides: list[str]):
    """The config a command line with these overrides composes (its paths.output_dir set: only a run has one)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config, overrides=[*overrides, "paths.output_dir=/unused"])


def job_logs(sweep_dir: Path) -> dict[str, str]:
    return {p.parent.name: p.read_text() for p in sorted(sweep_dir.glob("*/*.log"))}


def run_while_held(lock: Path, cmd: list[str]) -> tuple[subprocess.CompletedProcess, subprocess.Popen]:
    """Run `cmd` while another process holds the identity lock `lock`; (its result, the holder, now ended)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], env=env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        return subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=600), holder
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


@pytest.mark.slow
def test_a_multirun_job_that_cannot_run_says_why_and_the_command_fails(tmp_path, data_dir, token_cache):
    # Job 0's identity is busy (another process holds its lock), job 1's config is refused (a negative learning
    # rate): neither can run, each job's log says why, and the multirun exits non-zero.
    from conftest import TINY_PRETRAIN

    settings = [*(f"{k}={v}" for k, v in TINY_PRETRAIN.items()), f"paths.root_dir={tmp_path}",
                f"paths.data_dir={data_dir}", f"paths.cache_dir={token_cache}", "objective=bert"]
    cfg = composed("pretrain", [*settings, "optim.lr=2e-3"])
    lock = tmp_path / "outputs" / "pretrain" / cfg.logger.experiment / tracking.config_hash(cfg) / "run.lock"
    done, holder = run_while_held(lock, [sys.executable, "-m", "electra_ablate.pretrain", "-m", *settings,
                                         "optim.lr=2e-3,-1", f"hydra.sweep.dir={tmp_path / 'multirun'}"])
    assert done.returncode != 0, done.stderr[-3000:]
    assert "is already running in pid" in done.stderr
    logs = job_logs(tmp_path / "multirun")
    assert len(logs) == 2, logs
    first, second = (logs[k] for k in sorted(logs))
    assert f"is already running in pid {holder.pid}" in first
    assert "optim.lr" in second


@pytest.mark.slow
def test_a_busy_fine_tuning_identity_fails_the_job_even_with_keep_going(tmp_path, data_dir):
    # sweep.keep_going lets a job go on past a task that failed; a task that could not run at all (its identity
    # busy) still makes the job, and so the multirun, fail.
    from electra_ablate.finetuning import run as finetuning
    from electra_ablate.finetuning.source import normalise_spec

    cmd = finetune_command(tmp_path, data_dir)
    overrides = [a for a in cmd[3:] if not a.startswith("hydra.")]
    cfg = composed("finetune", overrides)
    (_, task_cfg), = finetuning.selected_tasks(cfg)
    cfg_hash = tracking.config_hash(finetuning.run_identity(cfg, task_cfg, normalise_spec(cfg.pretrained)))
    lock = tmp_path / "outputs" / "finetune" / cfg.logger.experiment / cfg_hash / "run.lock"
    done, holder = run_while_held(lock, [*cmd[:3], "-m", *overrides, "sweep.keep_going=true",
                                         f"hydra.sweep.dir={tmp_path / 'multirun'}"])
    assert done.returncode != 0, done.stderr[-3000:]
    (log,) = job_logs(tmp_path / "multirun").values()
    assert f"is already running in pid {holder.pid}" in log and not all_runs(tmp_path)


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


# --- fault injection: SIGKILL (and SIGTERM) at several points, then the same command again -------------------

PRETRAIN_ARGS = ["objective=electra", "trainer.max_steps=24", "trainer.checkpoint_every_n_steps=8",
                 "logger.log_every_n_steps=4", "trainer.export_fractions=[0.5]"]


def pretrain_command(root: Path, data_dir: Path, cache: Path) -> list[str]:
    from conftest import TINY_PRETRAIN

    settings = {**TINY_PRETRAIN, "paths.root_dir": str(root), "paths.data_dir": str(data_dir),
                "paths.cache_dir": str(cache), "hydra.run.dir": str(root / "run")}
    return [sys.executable, "-m", "electra_ablate.pretrain", *PRETRAIN_ARGS, *(f"{k}={v}" for k, v in settings.items())]


def finetune_command(root: Path, data_dir: Path) -> list[str]:
    return [sys.executable, "-m", "electra_ablate.finetune", "pretrained=none", "task=rte", "task.epochs=3",
            "model.hidden_size=32", "model.embedding_size=32", "model.num_hidden_layers=2",
            "model.num_attention_heads=2", "model.intermediate_size=64", "glue_data.max_seq_length=64",
            "glue_data.batch_size=8", "glue_data.max_train_examples=96", "glue_data.max_eval_examples=32",
            "logger.log_every_n_steps=2", "runtime.num_workers=0", "trainer.enable_progress_bar=false",
            f"paths.root_dir={root}", f"paths.data_dir={data_dir}", f"hydra.run.dir={root / 'run'}"]


def client_of(root: Path) -> MlflowClient:
    return store.open_client(f"sqlite:///{root}/outputs/mlflow.db")


def all_runs(root: Path) -> list:
    client = client_of(root)
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def polled(root: Path) -> list[tuple[str, int]]:
    """(status, number of metric rows) of each run, read-only: a poller must never create or migrate the store
    the process under test is creating (an MlflowClient would, without the lock)."""
    return read_only_rows(root / "outputs" / "mlflow.db",
                          "select status, (select count(*) from metrics m where m.run_uuid = r.run_uuid) from runs r")


def run_to_completion(cmd: list[str]) -> None:
    out = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-4000:]


def kill_when(cmd: list[str], ready, sig: int = signal.SIGKILL, timeout: float = 900) -> float:
    """Start `cmd`, send `sig` as soon as `ready()` is true; returns the seconds it ran."""
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    tic = time.perf_counter()
    try:
        while not ready():
            assert proc.poll() is None, f"finished before the fault could be injected: {proc.stderr.read()[-3000:]}"
            assert time.perf_counter() - tic < timeout, "fault point never reached"
            time.sleep(0.05)
        proc.send_signal(sig)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return time.perf_counter() - tic


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


@pytest.fixture(scope="module")
def straight_pretraining(tmp_path_factory, data_dir, token_cache):
    root = tmp_path_factory.mktemp("straight_pretrain")
    run_to_completion(pretrain_command(root, data_dir, token_cache))
    (run,) = all_runs(root)
    return client_of(root), run


def first_checkpoint(root: Path):
    return lambda: any(root.glob("outputs/pretrain/*/*/checkpoints/last.ckpt"))


def second_checkpoint(root: Path):
    return lambda: any(root.glob("outputs/pretrain/*/*/checkpoints.json"))  # written at step 12, after ckpt 8


def run_recorded(root: Path):
    return lambda: any(status == "RUNNING" for status, _ in polled(root))


KILL_POINTS = {
    "after the run is recorded, before any checkpoint": run_recorded,
    "after the first checkpoint": first_checkpoint,
    "after the half-way export": second_checkpoint,
}


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("point", KILL_POINTS, ids=list(KILL_POINTS))
def test_pretraining_killed_and_rerun_matches_a_straight_run(tmp_path, data_dir, token_cache, straight_pretraining,
                                                             point, sig):
    expected_client, expected = straight_pretraining
    cmd = pretrain_command(tmp_path, data_dir, token_cache)
    seconds = kill_when(cmd, KILL_POINTS[point](tmp_path), sig)
    run_to_completion(cmd)
    runs = all_runs(tmp_path)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED", [(r.info.run_id, r.info.status) for r in runs]
    client, run = client_of(tmp_path), runs[0]
    assert int(run.data.tags[tracking.TAG_ATTEMPTS]) == 2
    for key in ("train/loss", "train/disc_loss", "train/masked_lm_accuracy", "train/disc_auc", "flops/total"):
        got, want = history(client, run.info.run_id, key), history(expected_client, expected.info.run_id, key)
        assert [s for s, _ in got] == [s for s, _ in want], (key, got, want)  # complete, each step once
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-5, abs=1e-6), key
    print(f"pre-training, {sig.name} {point}: killed after {seconds:.1f} s; re-run matches the straight run")


@pytest.fixture(scope="module")
def straight_finetuning(tmp_path_factory, data_dir):
    root = tmp_path_factory.mktemp("straight_finetune")
    run_to_completion(finetune_command(root, data_dir))
    (run,) = all_runs(root)
    return client_of(root), run


def has_metrics(root: Path):
    return lambda: any(status == "RUNNING" and n for status, n in polled(root))


FINETUNE_POINTS = {"after the run is recorded": run_recorded, "once metrics are in the store": has_metrics}


@pytest.mark.slow
@pytest.mark.parametrize("point", FINETUNE_POINTS, ids=list(FINETUNE_POINTS))
def test_finetuning_killed_and_rerun_restarts_in_the_same_run(tmp_path, data_dir, straight_finetuning, point):
    expected_client, expected = straight_finetuning
    cmd = finetune_command(tmp_path, data_dir)
    kill_when(cmd, FINETUNE_POINTS[point](tmp_path))
    run_to_completion(cmd)
    runs = all_runs(tmp_path)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED", [(r.info.run_id, r.info.status) for r in runs]
    client, run = client_of(tmp_path), runs[0]
    assert int(run.data.tags[tracking.TAG_ATTEMPTS]) == 2
    assert "restarted from step 0 in place" in run.data.tags[tracking.TAG_RESTARTS]
    for key in ("train/loss", "dev/accuracy", "final/score"):
        got, want = history(client, run.info.run_id, key), history(expected_client, expected.info.run_id, key)
        assert [s for s, _ in got] == [s for s, _ in want], (key, got, want)
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-5, abs=1e-6), key


# --- launchers: every launcher the docs name runs a multirun with the default runtime settings ---------------

LAUNCHERS = {
    "basic": [],
    "joblib": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
    "submitit_local": ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=60"],
    "ray": ["hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2"],
}


@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS, ids=list(LAUNCHERS))
def test_every_launcher_runs_a_multirun_with_the_default_runtime(tmp_path, data_dir, token_cache, launcher, monkeypatch):
    from conftest import TINY_PRETRAIN

    extra = []
    if launcher == "ray":
        pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="pip install -e '.[ray]'")
        # Ray's session files under the run folder; its socket paths must stay under ~100 characters.
        ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
        extra = [f"+hydra.launcher.ray.init._temp_dir={ray_tmp}"]
        monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # a local Ray started for this test only
    # The default runtime group (runtime.num_workers=2: DataLoader worker processes inside launcher workers).
    settings = {k: v for k, v in TINY_PRETRAIN.items() if not k.startswith("runtime.")}
    settings.update({"paths.root_dir": str(tmp_path), "paths.data_dir": str(data_dir), "paths.cache_dir": str(token_cache),
                     "trainer.max_steps": "4", "optim.warmup_steps": "1", "hydra.sweep.dir": str(tmp_path / "multirun")})
    cmd = [sys.executable, "-m", "electra_ablate.pretrain", "-m", "objective=bert", "seed=0,1",
           *(f"{k}={v}" for k, v in settings.items()), *LAUNCHERS[launcher], *extra]
    tic = time.perf_counter()
    try:
        run_to_completion(cmd)
    finally:
        if launcher == "ray":
            shutil.rmtree(ray_tmp, ignore_errors=True)
    runs = all_runs(tmp_path)
    assert sorted((r.data.tags["seed"], r.info.status) for r in runs) == [("0", "FINISHED"), ("1", "FINISHED")]
    print(f"launcher {launcher}: 2 pre-training jobs in {time.perf_counter() - tic:.0f} s")


# --- clean stops: SIGINT / SIGTERM to a sweep ends every process it started, and a re-run resumes -----------


def processes() -> dict[int, tuple[int, str]]:
    """Every live process: pid -> (parent pid, start time: with the pid, one process)."""
    import psutil

    return {p.pid: (p.info["ppid"], f"{p.info['create_time']:.2f}")
            for p in psutil.process_iter(["ppid", "create_time", "status"])
            if p.info["status"] not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD) and p.info["create_time"] is not None}


def descendants(root: int, table: dict[int, tuple[int, str]]) -> set[tuple[int, str]]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add((child, table[child][1]))
            todo.append(child)
    return found


STOPS = {"basic-SIGINT": ([], signal.SIGINT),
         "joblib-SIGTERM": (["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], signal.SIGTERM)}


@pytest.mark.slow
@pytest.mark.parametrize("stop", STOPS, ids=list(STOPS))
def test_a_stopped_sweep_leaves_no_process_and_its_rerun_resumes(tmp_path, data_dir, token_cache, stop):
    from test_sweeps import write_mini

    launcher, sig = STOPS[stop]
    # Three pre-training jobs (two at a time under joblib: one waits in its queue), long enough to be stopped
    # mid-training, with DataLoader workers and a checkpoint every 10 steps.
    path = write_mini(tmp_path / "stop.yaml", name="stop", seeds=[0], pretrain_seeds=[0, 1, 2])
    spec = yaml.safe_load(path.read_text())
    spec["variants"] = {"electra": {"objective": "electra"}}
    spec["pretrain"].update({"trainer.max_steps": 200, "trainer.checkpoint_every_n_steps": 10,
                             "logger.log_every_n_steps": 5, "runtime.num_workers": 1})
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    cmd = [sys.executable, "-m", "electra_ablate.sweep", f"sweep={path}", f"paths.root_dir={tmp_path}",
           f"paths.data_dir={data_dir}", f"paths.cache_dir={token_cache}", f"report_dir={tmp_path}/reports", *launcher]
    runner = subprocess.Popen(cmd, cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    seen: set[tuple[int, str]] = set()
    tic = time.perf_counter()
    try:
        while not any(tmp_path.glob("outputs/pretrain/*/*/checkpoints/last.ckpt")):
            assert runner.poll() is None, f"the sweep ended before it could be stopped: {runner.stdout.read()[-3000:]}"
            assert time.perf_counter() - tic < 600, "no checkpoint within 10 minutes"
            seen |= descendants(runner.pid, processes())
            time.sleep(0.2)
        seen |= descendants(runner.pid, processes())
        runner.send_signal(sig)
        deadline = time.perf_counter() + 180
        while runner.poll() is None and time.perf_counter() < deadline:
            seen |= descendants(runner.pid, processes())
            time.sleep(0.2)
        out = runner.communicate(timeout=5)[0]
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    stop_s = time.perf_counter() - tic
    assert runner.returncode == 128 + sig, out[-3000:]  # 130 for SIGINT, 143 for SIGTERM: never a success
    last = [x for x in out.strip().splitlines() if x.strip()][-1]
    assert last.startswith(f"stopped by {sig.name}: sweep stop ") and "is recorded KILLED" in last, out[-3000:]
    assert len(seen) >= 2 + bool(launcher), seen  # the multirun, its job(s) or loky workers, DataLoader workers
    time.sleep(1)
    alive = seen & {(pid, start) for pid, (_, start) in processes().items()}
    for pid, _ in alive:  # leave nothing behind, even when the check fails
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not alive, f"processes of the stopped sweep still alive: {alive}\n{out[-3000:]}"

    uri = f"sqlite:///{tmp_path}/outputs/mlflow.db"
    client = store.open_client(uri)
    exp = client.get_experiment_by_name("stop")
    stopped = client.search_runs([exp.experiment_id])
    statuses = {r.info.run_id: (r.data.tags.get("kind"), r.info.status) for r in stopped}
    assert "RUNNING" not in {s for _, s in statuses.values()}, statuses
    killed = [r for r in stopped if r.data.tags.get("kind") == "pretrain" and r.info.status == "KILLED"]
    assert killed, statuses
    assert [r.info.status for r in stopped if r.data.tags.get("kind") == "sweep"] == ["KILLED"]

    rerun = subprocess.run(cmd, cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=1200)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    after = {r.info.run_id: r for r in client.search_runs([exp.experiment_id], max_results=1000)}
    pre = [r for r in after.values() if r.data.tags.get("kind") == "pretrain"]
    assert len(pre) == 3 and {r.info.status for r in pre} == {"FINISHED"}
    for r in killed:  # the interrupted runs went on in place, from their checkpoint
        again = after[r.info.run_id]
        assert again.info.status == "FINISHED" and again.data.tags[tracking.TAG_ATTEMPTS] == "2"
        assert [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")] == list(range(5, 201, 5))
    hows = [json.loads(after[r.info.run_id].data.tags[tracking.TAG_RESTARTS])[-1]["how"] for r in killed]
    assert any(how.startswith("resumed from") for how in hows), hows
    print(f"sweep ({stop}): stopped after {stop_s:.0f} s with {len(seen)} processes seen, none left; "
          f"{len(killed)} run(s) KILLED, resumed and FINISHED by the re-run")


# --- a real MLflow tracking server: a sweep through MLFLOW_TRACKING_URI, and the server going away ----------


class Server:
    """`mlflow server` on 127.0.0.1 (a free port), a SQLite backend and a local artifact root in `folder`; it
    runs in a process group of its own, which `stop` ends whole."""

    def __init__(self, folder: Path, backend: str | None = None, artifacts: str | None = None,
                 server_env: dict[str, str] | None = None):
        import socket

        self.folder = folder
        # Its database, its artifact root and its environment: SQLite and a folder in `folder` unless given.
        self.backend = backend or f"sqlite:///{folder}/server.db"
        self.artifacts = artifacts or str(folder / "artifacts")
        self.env = server_env or env()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 300) -> None:
        import urllib.request

        log = open(self.folder / "server.log", "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers",
             "1", "--backend-store-uri", self.backend, "--artifacts-destination", self.artifacts],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=self.env)
        tic = time.perf_counter()
        while time.perf_counter() - tic < timeout:
            assert self.proc.poll() is None, (self.folder / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"mlflow server did not answer within {timeout} s")

    def stop(self) -> None:
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                tic = time.perf_counter()  # the group (uvicorn and its job runner) outlives the launcher
                while time.perf_counter() - tic < wait:
                    os.killpg(self.proc.pid, 0)
                    time.sleep(0.2)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                continue
        self.proc = None


@pytest.fixture
def server(tmp_path):
    folder = tmp_path / "server"
    folder.mkdir()
    served = Server(folder)
    served.start()
    try:
        yield served
    finally:
        served.stop()


def served_env(uri: str, **extra: str) -> dict[str, str]:
    return {**env(), "MLFLOW_TRACKING_URI": uri, **extra}


def test_a_tracking_server_that_does_not_answer_stops_the_run_with_one_message(monkeypatch):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with pytest.raises(tracking.TrackingUnavailable, match=f"server {uri} does not answer .*nothing was run"):
        tracking.setup(uri, "exp")
    run = tracking.RunLogger(MlflowClient(uri), "0" * 32)
    run.log_metrics({"train/loss": 1.0}, 10)
    run.log_metrics({"train/loss": 0.5}, 20)
    with pytest.raises(tracking.TrackingUnavailable, match="steps 10-20 unsent; it stays RUNNING.*run the same command"):
        run.flush()
    assert len(run._buffer) == 2  # kept: nothing is dropped that was not written
    calls = []
    monkeypatch.setattr(run.client, "set_terminated", lambda *a, **k: calls.append(a))
    with pytest.raises(tracking.TrackingUnavailable):  # at once: no second wait for the server, no end written
        run.finish("KILLED", "stopped")
    assert not calls
    from electra_ablate.common.cli import refusal_message

    assert refusal_message(tracking.TrackingUnavailable("gone")) == "gone"  # `error: gone`, one line, no stack


@pytest.mark.slow
def test_a_sweep_through_an_mlflow_server(tmp_path, data_dir, token_cache, server):
    from test_sweeps import write_mini

    path = write_mini(tmp_path / "served.yaml", name="served", seeds=[0], pretrain_seeds=[0])
    spec = yaml.safe_load(path.read_text())
    spec["pretrain"]["logger.log_every_n_steps"] = 2  # a metric history of two windows per pre-training run
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    cmd = [sys.executable, "-m", "electra_ablate.sweep", f"sweep={path}", f"paths.root_dir={tmp_path}",
           f"paths.data_dir={data_dir}", f"paths.cache_dir={token_cache}", f"report_dir={tmp_path}/reports"]
    tic = time.perf_counter()
    done = subprocess.run(cmd, cwd=tmp_path, env=served_env(server.uri), capture_output=True, text=True, timeout=1200)
    seconds = time.perf_counter() - tic
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not (tmp_path / "outputs" / "mlflow.db").exists()  # everything went to the server

    client = MlflowClient(server.uri)
    exp = client.get_experiment_by_name("served")
    runs = {}
    for r in client.search_runs([exp.experiment_id], max_results=1000):
        runs.setdefault(r.data.tags.get(tracking.TAG_KIND), []).append(r)
    pre, ft = runs["pretrain"], runs["finetune"]
    assert len(pre) == 2 and len(ft) == 2 and {r.info.status for r in pre + ft + runs["sweep"]} == {"FINISHED"}
    for r in pre:
        assert [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")] == [2, 4]
        final = Path(r.data.tags[tracking.TAG_CHECKPOINT])  # what fine-tuning loaded
        assert (final / "config.json").is_file() and (final / "model.pt").is_file()
    parents = {r.info.run_id for r in pre}
    for r in ft:  # nested under its pre-training run, its scores and predictions on the server
        assert r.data.tags["mlflow.parentRunId"] in parents and "final/score" in r.data.metrics
        (artifact,) = client.list_artifacts(r.info.run_id, "predictions")
        assert list((server.folder / "artifacts").rglob(Path(artifact.path).name))
    report = (tmp_path / "reports" / "served.md").read_text()
    assert all(any(line.startswith(f"| {v} (") for line in report.splitlines()) for v in ("electra", "bert"))
    (sweep,) = runs["sweep"]  # its report kept with the sweep's run, and each job's config and log with its run
    assert {a.path for a in client.list_artifacts(sweep.info.run_id, "report")} >= {"report/served.md",
                                                                                      "report/served"}
    assert {a.path for a in client.list_artifacts(pre[0].info.run_id, "job/attempt_1")} >= {
        "job/attempt_1/.hydra", "job/attempt_1/pretrain.log"}

    again = subprocess.run(cmd, cwd=tmp_path, env=served_env(server.uri), capture_output=True, text=True,
                           timeout=1200)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "pretrain: 0 job(s) launched" in again.stdout and "finetune: 0 job(s) launched" in again.stdout
    print(f"sweep through mlflow server {server.uri}: 2 pre-training + 2 fine-tuning runs in {seconds:.0f} s; "
          "the re-run launched nothing")


@pytest.mark.slow
def test_the_server_going_away_stops_the_run_with_one_message_and_the_rerun_leaves_no_gap(
        tmp_path, data_dir, token_cache, server):
    from conftest import TINY_PRETRAIN

    settings = {**TINY_PRETRAIN, "paths.root_dir": str(tmp_path), "paths.data_dir": str(data_dir),
                "paths.cache_dir": str(token_cache), "hydra.run.dir": str(tmp_path / "run")}
    cmd = [sys.executable, "-m", "electra_ablate.pretrain", "objective=electra", "trainer.max_steps=400",
           "trainer.checkpoint_every_n_steps=20", "logger.log_every_n_steps=10",
           *(f"{k}={v}" for k, v in settings.items())]
    # MLflow's client retries a server that does not answer for about 4 minutes by default; a few seconds here.
    job_env = served_env(server.uri, MLFLOW_HTTP_REQUEST_MAX_RETRIES="2", MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR="1")
    proc = subprocess.Popen(cmd, env=job_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        tic = time.perf_counter()
        while not any(tmp_path.glob("outputs/pretrain/*/*/checkpoints/last.ckpt")):
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.perf_counter() - tic < 600, "no checkpoint within 10 minutes"
            time.sleep(0.1)
        server.stop()
        stderr = proc.communicate(timeout=600)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: the MLflow tracking server {server.uri} does not answer"), stderr[-3000:]
    assert "run the same command again" in last

    server.start()
    client = MlflowClient(server.uri)
    (run,) = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert run.info.status == "RUNNING"  # nothing could end it; the next attempt resumes it
    logged = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
    out = subprocess.run(cmd, env=job_env, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    run = client.get_run(run.info.run_id)
    assert run.info.status == "FINISHED" and run.data.tags[tracking.TAG_ATTEMPTS] == "2"
    assert json.loads(run.data.tags[tracking.TAG_RESTARTS])[-1]["how"].startswith("resumed from")
    for key in ("train/loss", "train/disc_loss"):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert steps == list(range(10, 401, 10)), (key, steps)  # every window once: no gap, no duplicate
    print(f"server stopped after the first checkpoint: the run stopped with one message ({len(logged)} windows "
          "logged); after a restart of the server the re-run resumed it, 40 of 40 windows, each once")
