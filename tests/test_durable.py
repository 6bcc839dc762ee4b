"""A run's resumable state on durable storage (`paths.durable_root`), on fsspec's in-memory and local file systems
and, in the slow run, the same store-level tests on moto's S3 server (tests/s3_server.py): the pointer is written
only after a whole upload, a download checks the hash and never picks a half-written object, the newest K are kept,
a store that stops answering is retried and then named in one line, one lease per run, bad input before compute,
and a pre-training run whose local folder is deleted resumes from the store to the same losses. The real
pre-training command against a real S3 server (SeaweedFS): tests/test_durable_s3.py (slow)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from s3_server import Moto, moto_binary, running

from electra_ablate import pretrain
from electra_ablate.common import io
from electra_ablate.tracking import durable, runs
from electra_ablate.tracking.durable import DurableStoreError, RunArea, Settings
from electra_ablate.tracking.lease import Lease, LeaseHeld

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    """moto's S3 server on loopback, for the whole module (each test gets a prefix of its own)."""
    pytest.importorskip("s3fs", reason="s3fs is missing: pip install 'electra-ablate[durable]'")
    if moto_binary() is None:
        pytest.skip("no moto_server: pip install 'electra-ablate[durable]'")
    with running(Moto(tmp_path_factory.mktemp("moto"))) as server:
        yield server


def client_of(server: Moto, monkeypatch) -> None:
    """This process as a client of `server`: its endpoint and keys, and no other AWS configuration."""
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in server.env().items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.slow)])
def area(request, tmp_path, monkeypatch):
    """A run's area under a local folder, or (slow) under a bucket of moto's S3 server; `root` names another."""
    base = f"file://{tmp_path}/bucket"
    if request.param == "s3":
        client_of(request.getfixturevalue("moto"), monkeypatch)
        base = f"s3://runs/{request.node.name.replace('[', '-').rstrip(']')}"

    def make(root: str | None = None, **settings) -> RunArea:
        return RunArea(Settings(root or base, **settings), "pretrain/exp/abc123")

    return make


def checkpoint(tmp: Path, step: int, size: int = 1000) -> Path:
    path = tmp / f"local-{step}.ckpt"
    path.write_bytes(bytes([step % 256]) * size)
    return path


def test_the_pointer_names_the_newest_whole_checkpoint_and_the_newest_k_are_kept(tmp_path, area):
    store = area(keep=2)
    for step in (8, 16, 24):
        store.upload_checkpoint(checkpoint(tmp_path, step), step, "run-1")
    pointer = store.pointer()
    assert (pointer["step"], pointer["mlflow_run_id"]) == (24, "run-1")
    assert pointer["sha256"] == io.sha256_file(checkpoint(tmp_path, 24))
    assert sorted(store._steps()) == [16, 24]
    assert store.download_checkpoint(tmp_path / "got.ckpt", None) == 24
    assert (tmp_path / "got.ckpt").read_bytes() == checkpoint(tmp_path, 24).read_bytes()
    assert store.download_checkpoint(tmp_path / "none.ckpt", 24) is None  # the local one is as new: nothing to do
    assert not (tmp_path / "none.ckpt").exists()


def test_a_kill_during_an_upload_leaves_the_pointer_on_the_previous_checkpoint(tmp_path, area, monkeypatch):
    store = area()
    store.upload_checkpoint(checkpoint(tmp_path, 8), 8, "run-1")

    def killed_half_way(local, remote, **kwargs):  # half of the object written, then the process is gone
        store.fs.makedirs(remote.rsplit("/", 1)[0], exist_ok=True)
        store.fs.pipe_file(remote, Path(local).read_bytes()[:300])
        raise KeyboardInterrupt

    monkeypatch.setattr(store.fs, "put_file", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        store.upload_checkpoint(checkpoint(tmp_path, 16), 16, "run-1")
    monkeypatch.undo()
    assert store.pointer()["step"] == 8 and 16 in store._steps()  # the half object is there, not pointed at
    assert store.download_checkpoint(tmp_path / "got.ckpt", None) == 8
    assert (tmp_path / "got.ckpt").read_bytes() == checkpoint(tmp_path, 8).read_bytes()
    store.upload_checkpoint(checkpoint(tmp_path, 12), 12, "run-1")  # the resumed run's next checkpoint
    assert sorted(store._steps()) == [8, 12]  # the leftover above the pointer is gone


def test_a_checkpoint_that_does_not_match_its_hash_is_never_picked(tmp_path, area):
    store = area()
    for step in (8, 16):
        store.upload_checkpoint(checkpoint(tmp_path, step), step, "run-1")
    store.fs.pipe_file(f"{store.path}/checkpoints/step-0000000016.ckpt", b"not whole")
    (tmp_path / "got.ckpt").write_bytes(b"before")
    assert store.download_checkpoint(tmp_path / "got.ckpt", None) == 8  # the older one, by its sidecar's hash
    assert (tmp_path / "got.ckpt").read_bytes() == checkpoint(tmp_path, 8).read_bytes()
    store.fs.rm_file(f"{store.path}/checkpoints/step-0000000008.ckpt")
    assert store.download_checkpoint(tmp_path / "none.ckpt", None) is None and not (tmp_path / "none.ckpt").exists()


def test_an_unanswering_store_is_retried_then_named_in_one_line(tmp_path, monkeypatch):
    store = RunArea(Settings("memory://bucket/prefix", retry_s=7, lease_s=60), "pretrain/exp/abc123")
    waits = []
    monkeypatch.setattr(durable.time, "sleep", waits.append)
    failures = iter([ConnectionError("refused"), ConnectionError("refused")])
    real = store.fs.put_file

    def flaky(*args, **kwargs):
        error = next(failures, None)
        if error:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(store.fs, "put_file", flaky)
    store.upload_checkpoint(checkpoint(tmp_path, 8), 8, None)
    assert waits == [1.0, 2.0] and store.pointer()["step"] == 8
    clock = iter(range(0, 100, 3))
    monkeypatch.setattr(durable.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(store.fs, "put_file", lambda *a, **k: (_ for _ in ()).throw(ConnectionError("refused")))
    with pytest.raises(DurableStoreError) as stopped:
        store.upload_checkpoint(checkpoint(tmp_path, 16), 16, None)
    message = str(stopped.value)
    assert "memory://bucket/prefix/pretrain/exp/abc123" in message and "paths.durable_root" in message
    assert "checkpoint step 16" in message and "ConnectionError: refused" in message and "\n" not in message
    assert store.pointer()["step"] == 8


def test_exported_networks_come_back_whole_or_not_at_all(tmp_path, area):
    store = area()
    export = tmp_path / "local" / "step_12"
    (export / "sub").mkdir(parents=True)
    (export / "config.json").write_text("{}")
    (export / "sub" / "weights.bin").write_bytes(b"w" * 100)
    store.upload_dir(export, "step_12", 12)
    got = store.download_dirs(tmp_path / "back", lambda name: True)
    assert got == {"step_12": (12, tmp_path / "back" / "step_12")}
    assert (tmp_path / "back" / "step_12" / "sub" / "weights.bin").read_bytes() == b"w" * 100
    store.fs.pipe_file(f"{store.path}/pretrained/step_12/sub/weights.bin", b"half")
    assert store.download_dirs(tmp_path / "again", lambda name: True) == {}
    assert not (tmp_path / "again" / "step_12").exists()


def test_one_lease_per_run_named_in_the_refusal_and_taken_over_only_when_stale(area):
    now = [1000.0]
    store = area(lease_s=60, retry_s=5)
    first = Lease(store, "pre-training x", clock=lambda: now[0])
    first.acquire()
    second = Lease(store, "pre-training x", clock=lambda: now[0])
    with pytest.raises(LeaseHeld) as refused:
        second.acquire()
    line = str(refused.value)
    assert f"host {socket.gethostname()}, pid {os.getpid()}, since {first.since}" in line and "\n" not in line
    now[0] += 30
    first.renew()  # a quarter of the lifetime passed: written again
    now[0] += 70  # 70 s after the renewal: expired
    second.acquire()
    with pytest.raises(DurableStoreError, match="lost its lease"):
        first.renew(force=True)
    first.release()  # not its lease any more: left as it is
    assert json.loads(store.fs.cat_file(second.path))["token"] == second.token
    second.release()
    assert not store.fs.exists(second.path)


def test_a_lease_of_a_dead_process_on_this_machine_is_taken_over_at_once(area):
    store = area(lease_s=600, retry_s=5)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    store.fs.makedirs(store.path, exist_ok=True)
    store.fs.pipe_file(f"{store.path}/lease.json", json.dumps({
        "host": socket.gethostname(), "pid": int(dead.stdout), "since": "then", "renewed": 9e12, "lease_s": 600,
        "token": "old"}).encode())
    lease = Lease(store, "pre-training x")
    lease.acquire()
    assert json.loads(store.fs.cat_file(lease.path))["token"] == lease.token


@pytest.mark.parametrize("root, says", [
    ("bucket/prefix", "is not a URL"),
    ("nope://bucket/prefix", "Protocol not known"),
    ("file:///no/such/folder/electra", "does not exist"),
])
def test_a_bad_durable_root_is_refused_with_the_key_and_the_fix(root, says):
    with pytest.raises(DurableStoreError, match=says) as refused:
        durable.check(Settings(root))
    assert f"paths.durable_root={root}" in str(refused.value)


@pytest.mark.slow
def test_a_bucket_that_does_not_exist_is_refused_by_an_s3_server(moto, monkeypatch):
    client_of(moto, monkeypatch)
    durable.check(Settings("s3://runs/electra"))  # the bucket the server has
    with pytest.raises(DurableStoreError, match="the bucket or folder does not exist") as refused:
        durable.check(Settings("s3://no-such-bucket/electra"))
    assert "paths.durable_root=s3://no-such-bucket/electra" in str(refused.value) and "\n" not in str(refused.value)


def test_the_durable_root_stays_out_of_the_run_identity(tmp_path, pretrain_cfg, monkeypatch):
    plain = pretrain_cfg(tmp_path)
    durable_cfg = pretrain_cfg(tmp_path, "paths.durable_root=s3://bucket/prefix", "paths.durable_keep=5")
    assert plain.paths.durable_root is None and Settings.of(plain.paths) is None
    assert runs.identity_hashes(plain) == runs.identity_hashes(durable_cfg)
    monkeypatch.setenv("ELECTRA_ABLATE_DURABLE_ROOT", "s3://team/electra")  # every job of a sweep, on any launcher
    assert Settings.of(pretrain_cfg(tmp_path).paths) == Settings("s3://team/electra")


COMMON = ["objective=electra", "trainer.max_steps=24", "trainer.checkpoint_every_n_steps=8",
          "logger.log_every_n_steps=4", "trainer.export_fractions=[0.5]"]


def losses(tmp: Path, run_id: str) -> dict[int, float]:
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    return {m.step: m.value for m in client.get_metric_history(run_id, "train/loss")}


def straight_and_crashed(tmp_path: Path, pretrain_cfg, stop_at, root: str):
    """The losses of a straight run, and a run with `root` as its durable root crashed after step 17 (checkpoints
    at 8 and 16 uploaded, the export at 12): (losses, the crashed run's folder, its config)."""
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    expected = losses(straight, pretrain.train(pretrain_cfg(straight, *COMMON)))
    (tmp_path / "bucket").mkdir()
    cfg = pretrain_cfg(crashed, *COMMON, f"paths.durable_root={root}")
    with pytest.raises(RuntimeError, match="simulated crash"):
        pretrain.train(cfg, callbacks=[stop_at(17)])
    return expected, crashed, cfg


def test_a_run_whose_local_folder_is_lost_resumes_from_the_store_to_the_same_losses(tmp_path, pretrain_cfg, stop_at):
    expected, crashed, cfg = straight_and_crashed(tmp_path, pretrain_cfg, stop_at, f"file://{tmp_path}/bucket/runs")
    shutil.rmtree(crashed / "outputs")  # the machine is gone; the MLflow store (a server's) and the bucket remain
    run_id = pretrain.train(cfg)
    got = losses(crashed, run_id)
    assert sorted(got) == sorted(expected)
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=1e-5, abs=1e-6), (step, got, expected)
    run = MlflowClient(f"sqlite:///{crashed}/mlflow.db").get_run(run_id)
    assert "resumed from" in json.loads(run.data.tags[runs.TAG_RESTARTS])[-1]["how"]
    area = Path(run.data.tags["durable_area"].removeprefix("file://"))
    assert json.loads((area / "checkpoints" / "latest.json").read_text())["step"] == 24
    assert {p.name for p in (area / "pretrained").glob("*.json")} == {"step_12.json", "final.json"}
    assert not (area / "lease.json").exists()  # released at the end

    shutil.rmtree(crashed / "outputs")  # finished, and lost again: its exports come back, nothing is trained
    assert pretrain.train(cfg) == run_id
    store = Path(run.data.tags["store"])
    listing = json.loads((store / "checkpoints.json").read_text())
    assert listing == {"12": "pretrained/step_12", "24": "pretrained/final"}
    assert not (store / "checkpoints").exists()


def test_a_run_whose_mlflow_store_is_lost_too_resumes_from_the_store_in_a_new_run(tmp_path, pretrain_cfg, stop_at):
    expected, crashed, cfg = straight_and_crashed(tmp_path, pretrain_cfg, stop_at, f"file://{tmp_path}/bucket")
    client = MlflowClient(f"sqlite:///{crashed}/mlflow.db")
    (lost,) = client.search_runs([client.get_experiment_by_name("electra-ablate").experiment_id])
    # The local disk is gone, and the embedded MLflow store with it: the next job has an empty store of its own (a
    # new file: this process's MLflow keeps the old one open).
    shutil.rmtree(crashed / "outputs")
    fresh = tmp_path / "fresh"
    run_id = pretrain.train(pretrain_cfg(crashed, *COMMON, f"paths.durable_root=file://{tmp_path}/bucket",
                                         f"logger.tracking_uri=sqlite:///{fresh}/mlflow.db"))
    assert run_id != lost.info.run_id
    got = losses(fresh, run_id)
    assert sorted(got) == [s for s in sorted(expected) if s > 16]  # the steps after the bucket's checkpoint of 16
    for step in got:
        assert got[step] == pytest.approx(expected[step], rel=1e-5, abs=1e-6), (step, got, expected)


def test_every_process_of_a_multi_process_run_fetches_the_checkpoint_it_resumes_from(tmp_path, pretrain_cfg):
    from electra_ablate.training import durable_run

    cfg = pretrain_cfg(tmp_path, f"paths.durable_root=file://{tmp_path}/bucket")
    (tmp_path / "bucket").mkdir()
    store = Path(cfg.paths.output_root) / "pretrain" / "electra-ablate" / "abc123"
    assert durable_run.area_path(cfg, store) == "pretrain/electra-ablate/abc123"
    area = RunArea(Settings.of(cfg.paths), durable_run.area_path(cfg, store))
    area.upload_checkpoint(checkpoint(tmp_path, 8), 8, None)
    durable_run.fetch_checkpoint(cfg, store)  # a DDP process on a machine without the run's folder
    assert (store / "checkpoints" / "last.ckpt").read_bytes() == checkpoint(tmp_path, 8).read_bytes()


def test_a_lease_that_stays_unreadable_stops_the_job_with_one_line(area, monkeypatch):
    from electra_ablate.tracking import lease as lease_mod

    monkeypatch.setattr(lease_mod, "SETTLE_S", 0.0)
    store = area(lease_s=600, retry_s=5)
    store.fs.makedirs(store.path, exist_ok=True)
    store.fs.pipe_file(f"{store.path}/lease.json", b"{not json")
    with pytest.raises(DurableStoreError, match="is not a lease record") as stopped:
        Lease(store, "pre-training x").acquire()
    assert "\n" not in str(stopped.value) and "delete it" in str(stopped.value)
