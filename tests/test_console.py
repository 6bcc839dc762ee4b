"""The console a user reads (common/console.py, sweep/progress.py): library chatter in the log file only,
warnings on the console, progress lines for a phase's jobs, and a 2-step pre-training run that ends with its
outcome and no banner."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from electra_ablate.common import console
from electra_ablate.sweep.progress import PhaseConsole, duration

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
    """A stand-in multirun: two jobs that end through console.job, one library line and one warning."""
    monkeypatch.delenv(console.VERBOSE_ENV, raising=False)
    script = textwrap.dedent("""
        from electra_ablate.common import console
        print("GPU available: False, used: False", flush=True)
        with console.job("electra-s0"):
            print("warning: the run goes over its corpus 80 times", flush=True)
        try:
            with console.job("bert-s0"):
                raise RuntimeError("boom")
        except RuntimeError:
            print("Traceback: boom", flush=True)
        raise SystemExit(1)
    """)
    watch = PhaseConsole("pretrain", 2, tmp_path / "multirun" / "console.log", verbose=False)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", script], **watch.popen_kwargs(env))
    watch.start(proc)
    watch.finish(proc.wait())
    out = capsys.readouterr().out
    shown = "\n".join(line for line in out.splitlines() if not line.startswith("  | "))  # less the log's end
    assert "GPU available" not in shown
    assert "warning: the run goes over its corpus 80 times" in out
    assert "  pretrain 1/2: electra-s0," in out and "  pretrain 2/2: bert-s0 (failed)," in out
    assert "pretrain: 1/2 job(s) done, 1 failed in " in out
    assert "  | Traceback: boom" in out  # the log's end, shown because the multirun failed
    log = (tmp_path / "multirun" / "console.log").read_text()
    assert "GPU available: False" in log and "Traceback: boom" in log


@pytest.mark.parametrize("seconds, text", [(42, "42 s"), (185, "3 min 05 s"), (3720, "1 h 02 min")])
def test_durations_read_as_a_person_says_them(seconds, text):
    assert duration(seconds) == text


def test_a_two_step_pre_training_run_ends_with_its_outcome_and_no_banner(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != console.VERBOSE_ENV}
    env.update(ELECTRA_ABLATE_HOME=str(tmp_path), OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
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
