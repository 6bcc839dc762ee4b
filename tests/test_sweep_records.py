"""A sweep's own MLflow record (kind=sweep): a record left RUNNING by a process that has ended is told from a
live one, retired by the next sweep and named so in the report; sweeps sharing one experiment list only their
own invocations, re-runs that launched nothing are counted, not listed; a resumed run's compute time leaves out
the time it lay dead."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from types import SimpleNamespace

import pandas as pd
import pytest

from electra_ablate.report.build import write_report
from electra_ablate.report.provenance import _idle_seconds
from electra_ablate.sweep import provenance
from electra_ablate.sweep.compose import make_context
from electra_ablate.sweep.run import retire_dead_sweeps, run_sweep
from electra_ablate.tracking import runs as tracking


def ended_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def record(client, experiment: str, sweep: str, scale: str, **process) -> str:
    tags = {tracking.TAG_KIND: "sweep", tracking.TAG_SWEEP: sweep, "scale": scale, "command": f"sweep={sweep} {process}",
            **provenance.process(), **process}
    return tracking.RunLogger.start(client, experiment, f"sweep-{scale}", tags).run_id


def test_only_a_process_known_to_have_ended_is_gone():
    me = provenance.process()
    assert provenance.process_gone(me) is False
    assert provenance.process_gone({**me, "pid": str(ended_pid())}) is True
    assert provenance.process_gone({**me, "pid": str(ended_pid()), "boot_id": "another-boot"}) is False
    assert provenance.process_gone({**me, "pid": str(ended_pid()), "host": "another-host"}) is False
    assert provenance.process_gone({"host": me["host"], "boot_id": me["boot_id"]}) is False  # no pid recorded


def test_the_next_sweep_retires_its_dead_records_and_the_report_says_which_ended(tmp_path, data_dir):
    paths = {"root_dir": str(tmp_path), "data_dir": str(data_dir), "output_root": str(tmp_path / "outputs"),
             "cache_dir": str(tmp_path / "cache")}
    ctx = make_context("weight_sharing", "cpu", paths, f"sqlite:///{tmp_path}/mlflow.db")
    client = tracking.setup(ctx.tracking_uri, ctx.experiment)
    dead = record(client, ctx.experiment, "weight_sharing", "cpu", pid=str(ended_pid()))
    alive = record(client, ctx.experiment, "weight_sharing", "cpu")
    elsewhere = record(client, ctx.experiment, "weight_sharing", "cpu", pid=str(ended_pid()), boot_id="another-boot")
    other_sweep = record(client, ctx.experiment, "table5_efficiency", "cpu", pid=str(ended_pid()))

    text = write_report(ctx, client, tmp_path / "reports").read_text()
    produced = text.split("## How this was produced")[1]
    assert produced.count("status RUNNING in MLflow, but its process has ended") == 1, produced
    assert "sweep=table5_efficiency" not in produced, "another sweep of the shared experiment is listed"

    assert retire_dead_sweeps(client, ctx) == [dead]
    status = {r: client.get_run(r).info.status for r in (dead, alive, elsewhere, other_sweep)}
    assert status == {dead: "KILLED", alive: "RUNNING", elsewhere: "RUNNING", other_sweep: "RUNNING"}
    assert "process that died" in client.get_run(dead).data.tags[tracking.TAG_END_REASON]
    text = write_report(ctx, client, tmp_path / "reports").read_text()
    assert "its process has ended" not in text and "status KILLED" in text


def test_a_sweep_stopped_by_ctrl_c_is_killed_and_one_that_breaks_failed_with_the_reason(tmp_path, data_dir):
    paths = {"root_dir": str(tmp_path), "data_dir": str(data_dir), "output_root": str(tmp_path / "outputs"),
             "cache_dir": str(tmp_path / "cache")}
    ctx = make_context("weight_sharing", "cpu", paths, f"sqlite:///{tmp_path}/mlflow.db")

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    def broken(*args, **kwargs):
        raise OSError("disk full")

    for writer, error in ((stopped, KeyboardInterrupt), (broken, OSError)):
        with pytest.raises(error):
            run_sweep(ctx, [], ["report"], tmp_path / "reports", False, "python -m electra_ablate.sweep", writer)
    client = tracking.setup(ctx.tracking_uri, ctx.experiment)
    exp = client.get_experiment_by_name(ctx.experiment)
    runs = client.search_runs([exp.experiment_id], f"tags.{tracking.TAG_KIND} = 'sweep'",
                              order_by=["attributes.start_time ASC"])
    assert [(r.info.status, r.data.tags[tracking.TAG_END_REASON]) for r in runs] == [
        ("KILLED", "stopped by KeyboardInterrupt (SIGINT/SIGTERM)"), ("FAILED", "OSError: disk full")]


def test_re_runs_that_launched_nothing_are_counted_not_listed(tmp_path, data_dir):
    paths = {"root_dir": str(tmp_path), "data_dir": str(data_dir), "output_root": str(tmp_path / "outputs"),
             "cache_dir": str(tmp_path / "cache")}
    ctx = make_context("weight_sharing", "cpu", paths, f"sqlite:///{tmp_path}/mlflow.db")
    client = tracking.setup(ctx.tracking_uri, ctx.experiment)

    def finished(name: str, jobs: int) -> None:
        run_id = record(client, ctx.experiment, "weight_sharing", "cpu", pid=name)
        for phase in ("pretrain", "finetune"):
            client.set_tag(run_id, f"phase.{phase}", json.dumps({"jobs": jobs, "returncode": 0, "seconds": 1.0,
                                                                   "command": f"{name}-{phase}" if jobs else ""}))
        client.set_terminated(run_id, "FINISHED")

    finished("first", 4)
    finished("second", 0)
    finished("third", 0)
    produced = write_report(ctx, client, tmp_path / "reports").read_text().split("## How this was produced")[1]
    assert "first-pretrain" in produced and "'second'" not in produced and "'third'" not in produced, produced
    assert "2 other finished invocations found every job done and launched nothing" in produced


def test_a_resumed_runs_compute_time_leaves_out_the_time_it_lay_dead():
    t0 = time.mktime(time.strptime("2026-11-26 10:00:00", "%Y-%m-%d %H:%M:%S"))
    logged = [t0 + s for s in (10, 60, 100, 1010, 1500, 2000, 3010)]  # attempts from t0, t0 + 1000, t0 + 3000
    client = SimpleNamespace(get_metric_history=lambda run_id, key: [SimpleNamespace(timestamp=t * 1000) for t in logged])
    restarts = [{"attempt": 2, "at": "2026-11-26 10:16:40"}, {"attempt": 3, "at": "2026-11-26 10:50:00"}]
    run = pd.Series({"run_id": "r", f"tags.{tracking.TAG_RESTARTS}": json.dumps(restarts)})
    assert _idle_seconds(client, run) == (1000 - 100) + (3000 - 2000)
    assert _idle_seconds(client, pd.Series({"run_id": "r"})) == 0.0  # never resumed
    assert _idle_seconds(None, run) == 0.0  # no client: durations as recorded
