"""The console a user reads (common/console.py, sweep/progress.py, training/heartbeat.py): library chatter in the
log file only, warnings on the console, progress lines for a phase's jobs (their ends, and at most once a minute
every running job's step, total and time left), and a 2-step pre-training run that ends with its outcome and no
banner."""

from __future__ import annotations

import contextvars
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from electra_ablate.common import console
from electra_ablate.sweep.progress import PhaseConsole, duration, job_progress

REPO = Path(__file__).resolve().parent.parent


def _record(name: str, level: int, message: str, **extra) -> logging.LogRecord:
    record = logging.LogRecord(name, level, __file__, 1, "%s", (message,), None)
    record.__dict__.update(extra)
    return record


def test_the_console_shows_warnings_and_marked_info_but_not_library_chatter():
    keep = console.ConsoleFilter().filter
    assert not keep(_record("pytorch_lightning.utilities.rank_zero", logging.INFO, "GPU available: False, used: False"))
    assert not keep(_record("mlflow.store.db.utils", logging.INFO, "Creating initial MLflow database tables..."))
    assert not keep(_record("electra_ablate.training.pretraining", logging.INFO, "corpus: 38.8k word pieces"))
    assert keep(_record("electra_ablate.sweep.run", logging.INFO, "pretrain: all 2 job(s) finished", console=True))
    assert keep(_record("electra_ablate.data.budget", logging.WARNING, "the run goes over its corpus 80 times"))
    assert keep(_record("mlflow.tracking", logging.ERROR, "the server did not answer"))
    library = "/venv/site-packages/pytorch_lightning/utilities/_pytree.py:21: FutureWarning: LeafSpec is deprecated"
    ours = f"{console.PACKAGE_DIR}/data/module.py:9: UserWarning: falling back to the slow tokenizer"
    assert not keep(_record("py.warnings", logging.WARNING, library))
    assert keep(_record("py.warnings", logging.WARNING, ours))


def test_console_lines_say_what_kind_they_are():
    fmt = console.ConsoleFormatter("%(message)s").format
    assert fmt(_record("x", logging.INFO, "done")) == "done"
    assert fmt(_record("x", logging.WARNING, "no corpus")) == "warning: no corpus"
    assert fmt(_record("x", logging.ERROR, "failed")) == "error: failed"


def test_the_verbose_flag_leaves_hydra_its_arguments_and_reaches_the_jobs(monkeypatch):
    monkeypatch.delenv(console.VERBOSE_ENV, raising=False)
    argv = ["pretrain", "model=tiny", "--verbose", "seed=1"]
    assert console.take_verbose_flag(argv) is True
    assert argv == ["pretrain", "model=tiny", "seed=1"]
    assert os.environ[console.VERBOSE_ENV] == "1"
    monkeypatch.delenv(console.VERBOSE_ENV)
    assert console.take_verbose_flag(["pretrain", "model=tiny"]) is False


def test_a_phase_shows_progress_and_warnings_and_keeps_the_rest_in_its_log(tmp_path, capsys, monkeypatch):
    """A stand-in multirun: three jobs that end through console.job (done, failed, stopped), one library line and one
    warning."""
    monkeypatch.delenv(console.VERBOSE_ENV, raising=False)
    script = textwrap.dedent("""
        from electra_ablate.common import console, stops
        print("GPU available: False, used: False", flush=True)
        with console.job("electra-s0"):
            print("warning: the run goes over its corpus 80 times", flush=True)
        try:
            with console.job("bert-s0"):
                raise RuntimeError("boom")
        except RuntimeError:
            print("Traceback: boom", flush=True)
        try:
            with console.job("electra-s1"):
                raise stops.Stopped(15)
        except stops.Stopped:
            pass
        raise SystemExit(1)
    """)
    watch = PhaseConsole("pretrain", 3, tmp_path / "multirun" / "console.log", verbose=False)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", script], **watch.popen_kwargs(env))
    watch.start(proc)
    watch.finish(proc.wait())
    out = capsys.readouterr().out
    shown = "\n".join(line for line in out.splitlines() if not line.startswith("  | "))  # less the log's end
    assert "GPU available" not in shown
    assert "warning: the run goes over its corpus 80 times" in out
    assert "  pretrain 1/3: electra-s0," in out and "  pretrain 2/3: bert-s0 (failed)," in out
    assert "  pretrain 3/3: electra-s1 (stopped)," in out  # its run is KILLED and resumes: not a failure
    assert "pretrain: 1/3 job(s) done, 1 failed, 1 stopped in " in out
    assert "  | Traceback: boom" in out  # the log's end, shown because the multirun failed
    log = (tmp_path / "multirun" / "console.log").read_text()
    assert "GPU available: False" in log and "Traceback: boom" in log


class StandInJob:
    """A job of a stand-in multirun, in a context of its own as in a process of its own: its heartbeats and its end
    go to the progress file through console.job and console.heartbeat, as the training loops' do."""

    def __init__(self, name: str):
        self.context, self.around = contextvars.Context(), console.job(name)
        self.context.run(self.around.__enter__)

    def beat(self, step: int, total: int, seconds_per_step: float | None) -> None:
        self.context.run(console.heartbeat, step, total, seconds_per_step)

    def end(self) -> None:
        self.context.run(self.around.__exit__, None, None, None)


def test_a_running_phase_shows_each_jobs_step_total_and_time_left_at_most_once_a_minute(tmp_path, capsys,
                                                                                       monkeypatch):
    """Twelve minutes on a fake clock, the console polled every 2 s as its watch thread does, at the default interval:
    bert-s0 resumed at step 1,200 of 9,000 (2 s a step), electra-s0 starting at 40 s (1.5 s a step), each reporting
    every 30 s; bert-s0 ends at 10 min 10 s, electra-s0 at 12 min."""
    monkeypatch.delenv(console.VERBOSE_ENV, raising=False)
    monkeypatch.delenv(console.PROGRESS_EVERY_ENV, raising=False)
    now = [0.0]
    log_path = tmp_path / "multirun" / "console.log"
    watch = PhaseConsole("pretrain", 2, log_path, verbose=False, clock=lambda: now[0])
    assert watch.every_s == 60.0
    monkeypatch.setenv(console.PROGRESS_ENV, watch.popen_kwargs(dict(os.environ))["env"][console.PROGRESS_ENV])
    watch.open()
    bert, electra = StandInJob("bert-s0"), None
    for t in range(0, 721, 2):
        now[0] = float(t)
        if t <= 600 and t % 30 == 0:
            bert.beat(1200 + t // 2, 9000, 2.0)
        if t == 610:
            bert.end()
        if t == 40:
            electra = StandInJob("electra-s0")
            electra.beat(10, 1832, None)  # its first report: no rate yet
        elif t > 40 and t % 30 == 10:
            electra.beat(10 + round((t - 40) / 1.5), 1832, 1.5)
        if t == 720:
            electra.end()
        watch.poll()
    watch.finish(0)
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if x.startswith("  pretrain running: ")]
    # One line a minute, from the first minute to the eleventh (at 12 min both jobs have ended).
    assert len(lines) == 11, lines
    # A resumed job at its true step of its total; a job without a rate yet.
    assert lines[0] == ("  pretrain running: bert-s0 1,230/9,000 (14%), 4 h 19 min left; "
                        "electra-s0 10/1,832 (1%), time left not known yet")
    # Read 20 s after its report at 100 s: the time left counts down from that report.
    assert lines[1].endswith("; electra-s0 50/1,832 (3%), 44 min 13 s left"), lines[1]
    assert lines[10] == "  pretrain running: electra-s0 410/1,832 (22%), 35 min 13 s left"
    assert "  pretrain 1/2: bert-s0, 10 min 10 s elapsed" in out and "  pretrain 2/2: electra-s0, 12 min 00 s elapsed" in out
    assert "pretrain: 2/2 job(s) done in 12 min 00 s" in out
    # The log keeps what the console showed: it grows by one progress line a minute, no more.
    logged = [x for x in log_path.read_text().splitlines() if x.startswith("  pretrain running: ")]
    assert logged == lines


def test_a_resumed_job_reports_its_true_step_and_the_rate_of_the_steps_it_ran_since(tmp_path, monkeypatch):
    """The Heartbeat callback in a real Lightning loop, stopped at step 30 and resumed from its checkpoint to 60 on a
    clock that makes every step 2 s and puts a day between the two processes (here, two trainers)."""
    import itertools

    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from electra_ablate.training.heartbeat import Heartbeat

    class Toy(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.w(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    progress = tmp_path / "progress.jsonl"
    monkeypatch.setenv(console.PROGRESS_ENV, str(progress))
    data = DataLoader(TensorDataset(torch.randn(120, 2)), batch_size=4)  # 30 steps an epoch: step 30 ends one

    def fit(max_steps: int, start: float, ckpt: str | None) -> list[dict]:
        progress.unlink(missing_ok=True)
        trainer = pl.Trainer(max_steps=max_steps, accelerator="cpu", logger=False, enable_progress_bar=False,
                             enable_model_summary=False, enable_checkpointing=False,
                             callbacks=[Heartbeat(every_s=10.0, clock=itertools.count(start, 2.0).__next__)])
        with console.job("toy-s0"):
            trainer.fit(Toy(), data, ckpt_path=ckpt)
        trainer.save_checkpoint(tmp_path / "last.ckpt")
        return [json.loads(line) for line in progress.read_text().splitlines()]

    first = fit(30, 0.0, None)
    beats = [r for r in first if "step" in r]
    assert [r["step"] for r in beats] == [1, 6, 11, 16, 21, 26] and {r["total"] for r in beats} == {30}
    assert beats[0]["seconds_per_step"] is None and {r["seconds_per_step"] for r in beats[1:]} == {2.0}
    assert first[-1]["job"] == "toy-s0" and first[-1]["status"] == "done"
    resumed = [r for r in fit(60, 86_400.0, str(tmp_path / "last.ckpt")) if "step" in r]
    assert [r["step"] for r in resumed] == [31, 36, 41, 46, 51, 56] and {r["total"] for r in resumed} == {60}
    assert resumed[0]["seconds_per_step"] is None and {r["seconds_per_step"] for r in resumed[1:]} == {2.0}


def test_a_paused_job_s_time_left_ignores_the_pause_and_follows_a_lasting_slow_down(tmp_path, monkeypatch):
    """The Heartbeat callback on a clock that makes every step 2 s, stops the process for 21 minutes after step 30
    (SIGSTOP, as fine-tuning on both cores does to a long run) and from step 100 makes every step 4 s (a job beside)."""
    from types import SimpleNamespace

    from electra_ablate.training.heartbeat import Heartbeat

    progress = tmp_path / "progress.jsonl"
    monkeypatch.setenv(console.PROGRESS_ENV, str(progress))
    now, trainer = 0.0, SimpleNamespace(is_global_zero=True, global_step=0, estimated_stepping_batches=200)
    beat = Heartbeat(every_s=10.0, clock=lambda: now)
    with console.job("bert-s0"):
        for step in range(1, 201):
            now += (2.0 if step <= 100 else 4.0) + (1260.0 if step == 31 else 0.0)
            trainer.global_step = step
            beat.on_train_batch_end(trainer, None, None, None, step - 1)
    records = [json.loads(line) for line in progress.read_text().splitlines()]
    rates = {r["step"]: r["seconds_per_step"] for r in records if "step" in r}
    # The interval with the pause in it is one of ten: the median leaves it out (their mean gave 27-44 s a step).
    assert {rates[s] for s in rates if 1 < s <= 100} == {2.0}
    # A lasting slow-down shows once it fills most of the window's intervals (here within 30 steps of it).
    assert rates[max(rates)] == 4.0 and min(s for s in rates if rates[s] == 4.0) <= 130


def test_outside_a_sweep_the_heartbeat_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(console.PROGRESS_ENV, raising=False)
    assert not console.reporting()
    with console.job("x"):
        assert not console.reporting()
        console.heartbeat(1, 2, 0.5)  # no progress file: nothing to write, no error
    monkeypatch.setenv(console.PROGRESS_ENV, str(tmp_path / "p.jsonl"))
    console.heartbeat(1, 2, 0.5)  # outside a job
    assert not (tmp_path / "p.jsonl").exists()


def test_a_job_s_progress_counts_its_time_left_down_from_its_last_report():
    record = {"job": "bert-s0", "step": 1200, "total": 9000, "seconds_per_step": 2.0}
    assert job_progress(record, 0.0, 90.0) == "bert-s0 1,200/9,000 (13%), 4 h 20 min left"
    assert job_progress(record, 600.0, 900.0) == "bert-s0 1,200/9,000 (13%), 4 h 10 min left"
    assert job_progress(record, 15600.0 + 5, 90.0).endswith(", 0 s left (no report for 4 h 20 min)")
    assert job_progress({**record, "seconds_per_step": None}, 0.0, 90.0).endswith(", time left not known yet")


def test_the_progress_interval_is_checked_with_the_fix(monkeypatch):
    monkeypatch.setenv(console.PROGRESS_EVERY_ENV, "0")
    with pytest.raises(console.ConsoleError, match="ELECTRA_ABLATE_PROGRESS_EVERY_S='0' must be a positive number"):
        console.progress_every()
    monkeypatch.setenv(console.PROGRESS_EVERY_ENV, "2.5")
    assert console.progress_every() == 2.5


@pytest.mark.parametrize("seconds, text", [(42, "42 s"), (185, "3 min 05 s"), (3720, "1 h 02 min")])
def test_durations_read_as_a_person_says_them(seconds, text):
    assert duration(seconds) == text


def test_a_two_step_pre_training_run_ends_with_its_outcome_and_no_banner(tmp_path):
    """Run as a sweep's job would be (a progress file in its environment), it also reports its step of its total."""
    env = {k: v for k, v in os.environ.items() if k != console.VERBOSE_ENV}
    progress = tmp_path / "console.progress.jsonl"
    env.update(ELECTRA_ABLATE_HOME=str(tmp_path), OMP_NUM_THREADS="1", PYTHONPATH=str(REPO),
               **{console.PROGRESS_ENV: str(progress), console.PROGRESS_EVERY_ENV: "60"})
    cmd = [sys.executable, "-m", "electra_ablate.pretrain", "model=tiny", "model.hidden_size=64",
           "model.embedding_size=32", "model.num_hidden_layers=2", "model.num_attention_heads=2",
           "model.intermediate_size=128", "trainer.max_steps=2", "optim.warmup_steps=1", "data.max_docs=200",
           "data.batch_size=4", "data.max_seq_length=64", "runtime.num_workers=0", "trainer.enable_progress_bar=false",
           "logger.log_every_n_steps=1"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for chatter in ("GPU available", "TPU available", "Seed set to", "Automatic Mixed Precision", "LeafSpec",
                    "deprecated", "Creating initial MLflow database", "[INFO]"):
        assert chatter not in out, f"{chatter!r} reached the console:\n{out}"
    assert "pre-trained electra-embeddings-tiny-s0 (FINISHED)" in out, out
    assert "at its end: masked-LM accuracy" in out and "discriminator ROC AUC" in out, out
    logs = list((tmp_path / "runs").glob("*/*.log"))
    assert logs and "GPU available" in logs[0].read_text(), "the banner belongs in the run's log file"
    records = [json.loads(line) for line in progress.read_text().splitlines()]
    # The first report comes after the first step, without a rate; the next is due 30 s later.
    assert records[0] == {"job": "electra-embeddings-tiny-s0", "step": 1, "total": 2, "seconds_per_step": None}
    assert records[-1]["job"] == "electra-embeddings-tiny-s0" and records[-1]["status"] == "done", records
