"""A stop is never a success, and a refusal touches nothing (docs/reliability.md, "Exit codes").

Stops: Ctrl-C (SIGINT) or SIGTERM (a scheduler's time limit or preemption, `kill`) ends every entry point with one
`stopped by <signal>: ...` line on stderr and exit status 130 or 143; what was running is recorded KILLED and the
same command resumes it. Pre-training stops after the current step and saves that step's checkpoint first, also
when the signal comes while a checkpoint is being written. Refusals: every documented refusal (tests/
test_bad_input.py's tables, `finetune task=qnli` without QNLI data) leaves the outputs folder (ELECTRA_ABLATE_HOME)
exactly as it was, an absent one absent.

The default run signals this process itself (in-process entry points, fast); the slow ones (`-m slow`) stop the
real commands in subprocesses, multiruns (basic, joblib and submitit_local launchers) included, and re-run them.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import pytorch_lightning as pl
from mlflow.tracking import MlflowClient

from conftest import read_only_rows

from electra_ablate.common import cli, stops
from electra_ablate.tracking import runs as tracking

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _fresh_stop_state():
    # An xdist worker starts with SIGINT ignored, which stops.handled() rightly keeps: the tests start from
    # Python's own Ctrl-C handler, as a command run from a terminal does.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    stops.reset()
    yield
    stops.reset()
    signal.signal(signal.SIGINT, previous)


# --- the handler -----------------------------------------------------------------------------------------------


def test_the_first_sigterm_raises_a_later_one_does_not_and_a_deferred_one_waits_for_its_block():
    with stops.handled():
        with pytest.raises(stops.Stopped) as stopped:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises at the next bytecode
        assert stopped.value.signum == signal.SIGTERM and stops.received() == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)  # the process is stopping already: nothing more happens
        time.sleep(0.01)
    stops.reset()
    with stops.handled():
        written = []
        with pytest.raises(stops.Stopped):
            with stops.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.01)
                written.append("whole")  # the block is not cut short
        assert written == ["whole"]
    stops.reset()
    with stops.handled():
        with stops.deferred(raise_after=False):  # the work it finished stands
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
        assert stops.received() == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is not stops._handle  # the previous handler is back


def test_a_signal_ignored_at_start_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a script's background job
    try:
        with stops.handled():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is stops._handle
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_an_entry_point_ends_a_stop_with_one_line_and_the_signals_status(capsys, monkeypatch, sig, status):
    monkeypatch.setattr(sys, "argv", ["work"])

    @cli.one_line_errors
    def work():
        stops.report("the work X at step 3 (MLflow run abc) is recorded KILLED; the same command resumes it")
        os.kill(os.getpid(), sig)
        time.sleep(5)

    with pytest.raises(SystemExit) as ended:
        work()
    assert ended.value.code == status
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"stopped by {sig.name}: the work X at step 3 (MLflow run abc) is recorded KILLED; the same "
                   "command resumes it"]


@pytest.mark.parametrize("signalled", [True, False], ids=["multirun stopped", "jobs stopped alone"])
def test_jobs_stopped_in_other_processes_end_their_multirun_with_one_line(tmp_path, capsys, monkeypatch, signalled):
    # What a launcher's workers (joblib, submitit) and the multirun's own process do, in one process: each stopped
    # job records what it stopped in the multirun's folder and returns; the multirun, once its launcher is done,
    # says them in one line with the signal's status and removes the records. The multirun's process was sent the
    # SIGTERM itself (and handed it on), or the jobs were stopped alone (a scheduler's time limit).
    from hydra.core.hydra_config import HydraConfig
    from hydra.conf import HydraConf
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from electra_ablate.common import job_stops

    cfg = OmegaConf.create({"hydra": OmegaConf.structured(HydraConf)})
    cfg.hydra.sweep.dir, cfg.hydra.mode = str(tmp_path / "multirun"), RunMode.MULTIRUN
    (tmp_path / "multirun" / job_stops.FOLDER).mkdir(parents=True)
    (tmp_path / "multirun" / job_stops.FOLDER / "7.json").write_text("{}")  # an earlier multirun's, run again
    job_stops.MultirunStops().on_multirun_start(cfg)
    assert not (tmp_path / "multirun" / job_stops.FOLDER).exists()
    monkeypatch.setattr(sys, "argv", ["pretrain", "-m", "seed=0,1,2"])
    monkeypatch.setattr(stops, "in_entry_process", lambda: False)  # the jobs run in a launcher's worker
    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)
    jobs = {0: "pre-training s0 at step 38 is recorded KILLED", 1: "pre-training s1 at step 6 is recorded KILLED",
            2: None, 3: None}

    @cli.one_line_errors
    def job(task_cfg):
        if jobs[task_cfg.hydra.job.num] is None:
            raise stops.Stopped(signal.SIGTERM)  # what a stopped worker does to the next job: starts nothing
        stops.report(jobs[task_cfg.hydra.job.num])
        raise stops.Stopped(signal.SIGTERM, step=3)

    for num in jobs:
        stops.forget_reports()
        task_cfg = cfg.copy()
        task_cfg.hydra.job.num = num
        HydraConfig.instance().set_config(task_cfg)
        if jobs[num] is None:
            stops.report("this job was not started; the same command runs it")
        assert job(task_cfg) == job_stops.StoppedJob(signal.SIGTERM, stops.what())
    stops.forget_reports()
    assert capsys.readouterr().err == ""  # nothing from the jobs themselves

    def launcher() -> None:  # the multirun's own process, SIGTERM'd while its launcher ran (stops._handle)
        if signalled:
            monkeypatch.setattr(stops._state, "received", signal.SIGTERM)

    with pytest.raises(SystemExit) as ended:
        cli.one_line_errors(launcher)()
    assert ended.value.code == 143
    assert capsys.readouterr().err.splitlines() == [
        "stopped by SIGTERM: pre-training s0 at step 38 is recorded KILLED; pre-training s1 at step 6 is recorded "
        "KILLED; this job was not started; the same command runs it (2 jobs)"]
    assert not (tmp_path / "multirun" / job_stops.FOLDER).exists()


def test_an_error_after_a_stop_is_the_stops_one_line_not_a_traceback(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["work"])

    # A SIGTERM to the whole process group ends a DataLoader worker first; the main process then fails on it.
    @cli.one_line_errors
    def work():
        with stops.handled():
            with stops._graceful(stops.SIGNALS):  # inside training: only recorded
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.01)
            raise RuntimeError("DataLoader worker (pid(s) 1234) exited unexpectedly")

    with pytest.raises(SystemExit) as ended:
        work()
    assert ended.value.code == 143
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("stopped by SIGTERM: ")
    status, reason = tracking.end_status(RuntimeError("DataLoader worker (pid 1234) is killed by signal: Terminated."))
    assert status == "KILLED" and reason.startswith("stopped by SIGTERM (then RuntimeError: DataLoader worker")


# --- pre-training: stopped after a step, its checkpoint saved, resumed ---------------------------------------


class SignalAt(pl.Callback):
    """Sends `sig` to this process at `step`: after the step, or, with `in_checkpoint`, while the checkpoint of
    that step is being written."""

    def __init__(self, step: int, sig: int = signal.SIGTERM, in_checkpoint: bool = False):
        self.step, self.sig, self.in_checkpoint = step, sig, in_checkpoint

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step and not self.in_checkpoint:
            os.kill(os.getpid(), self.sig)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if trainer.global_step == self.step and self.in_checkpoint:
            os.kill(os.getpid(), self.sig)
            time.sleep(0.05)  # the handler has run: the write goes on


@pytest.mark.parametrize("sig, in_checkpoint", [(signal.SIGTERM, True), (signal.SIGINT, False)],
                         ids=["SIGTERM-while-writing-a-checkpoint", "SIGINT-after-a-step"])
def test_pretraining_stops_after_the_step_saves_it_and_the_same_config_resumes(tmp_path, pretrain_cfg, sig,
                                                                              in_checkpoint):
    from electra_ablate.training.pretraining import train
    from electra_ablate.training.run_folder import checkpoint_step

    cfg = pretrain_cfg(tmp_path, "objective=bert", "trainer.max_steps=12", "trainer.checkpoint_every_n_steps=4",
                       "logger.log_every_n_steps=2", "optim.warmup_steps=2")
    with stops.handled(), pytest.raises(stops.Stopped) as stopped:
        train(cfg, callbacks=[SignalAt(4 if in_checkpoint else 5, sig, in_checkpoint)])
    step = 4 if in_checkpoint else 5
    assert stopped.value.step == step
    client = tracking.setup(cfg.logger.tracking_uri, cfg.logger.experiment)
    (run,) = client.search_runs([client.get_experiment_by_name(cfg.logger.experiment).experiment_id])
    assert run.info.status == "KILLED" and run.data.tags[tracking.TAG_END_REASON] == f"stopped by {sig.name}"
    (ckpt,) = Path(cfg.paths.output_root).glob("pretrain/*/*/checkpoints/last.ckpt")
    assert checkpoint_step(ckpt) == step  # whole, and of the step it stopped after
    assert not list(ckpt.parent.glob(".*tmp*"))
    assert f"at step {step} of 12" in stops.line(sig) and f"checkpoint at step {step} is saved" in stops.line(sig)

    stops.reset()
    assert train(cfg) == run.info.run_id
    again = client.get_run(run.info.run_id)
    assert again.info.status == "FINISHED" and again.data.tags[tracking.TAG_ATTEMPTS] == "2"
    assert json.loads(again.data.tags[tracking.TAG_RESTARTS])[-1]["how"].startswith("resumed from")
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == list(range(2, 13, 2))


class StartedAt(pl.Callback):
    """Notes the step training starts from (a resume's checkpoint's)."""

    step: int | None = None

    def on_train_start(self, trainer, pl_module):
        self.step = trainer.global_step


def test_a_folder_written_before_resumes_from_its_newest_checkpoint(tmp_path):
    """last.ckpt of a stop at step 45 and last-v1.ckpt of the periodic save at step 200 that followed it: the resume
    reads step 200's; a file that is not a whole checkpoint, or another name, is passed over."""
    import torch

    from electra_ablate.training.run_folder import newest_checkpoint

    assert newest_checkpoint(tmp_path / "none") is None and newest_checkpoint(tmp_path) is None
    torch.save({"global_step": 45}, tmp_path / "last.ckpt")
    assert newest_checkpoint(tmp_path) == tmp_path / "last.ckpt"
    torch.save({"global_step": 200}, tmp_path / "last-v1.ckpt")
    torch.save({"global_step": 100}, tmp_path / "last-v2.ckpt")
    torch.save({"global_step": 900}, tmp_path / "epoch=0-step=900.ckpt")
    (tmp_path / "last-v3.ckpt").write_bytes(b"PK\x03\x04 cut short")
    assert newest_checkpoint(tmp_path) == tmp_path / "last-v1.ckpt"
    torch.save({"global_step": 200}, tmp_path / "last.ckpt")  # a tie: last.ckpt, where every save goes now
    assert newest_checkpoint(tmp_path) == tmp_path / "last.ckpt"


@pytest.mark.parametrize("folder_of", ["today", "before"])
def test_a_resume_reads_the_newest_checkpoint(tmp_path, pretrain_cfg, stop_at, folder_of):
    """Stopped before its first periodic checkpoint, resumed, killed after two more: the next resume starts from
    the newest. Lightning's version counter used to put the resumed process's checkpoints beside the stop's
    last.ckpt (last-v1.ckpt, ...), and a resume read last.ckpt; a folder written so still resumes from the newest."""
    from electra_ablate.training.pretraining import train
    from electra_ablate.training.run_folder import checkpoint_step

    cfg = pretrain_cfg(tmp_path, "objective=bert", "trainer.max_steps=12", "trainer.checkpoint_every_n_steps=4",
                       "logger.log_every_n_steps=2", "optim.warmup_steps=2")
    with stops.handled(), pytest.raises(stops.Stopped):
        train(cfg, callbacks=[SignalAt(2)])
    (folder,) = Path(cfg.paths.output_root).glob("pretrain/*/*/checkpoints")
    stopped = (folder / "last.ckpt").read_bytes()
    assert checkpoint_step(folder / "last.ckpt") == 2
    stops.reset()
    with pytest.raises(RuntimeError, match="simulated crash"):  # writes nothing more to the folder, as SIGKILL
        train(cfg, callbacks=[stop_at(9)])  # resumed at step 2; periodic checkpoints at steps 4 and 8
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"] and checkpoint_step(folder / "last.ckpt") == 8
    if folder_of == "before":
        (folder / "last.ckpt").rename(folder / "last-v1.ckpt")
        (folder / "last.ckpt").write_bytes(stopped)

    started = StartedAt()
    run_id = train(cfg, callbacks=[started])
    assert started.step == 8
    client = tracking.setup(cfg.logger.tracking_uri, cfg.logger.experiment)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags[tracking.TAG_ATTEMPTS] == "3"
    newest = "last-v1.ckpt" if folder_of == "before" else "last.ckpt"
    assert json.loads(run.data.tags[tracking.TAG_RESTARTS])[-1]["how"] == f"resumed from {folder / newest}"
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == list(range(2, 13, 2))


def test_the_process_tree_a_stop_ends_is_read_on_any_system():
    """A multirun's process tree (which a stopped sweep or multirun ends) comes from psutil, not /proc, which only
    Linux has: parent, process group and command line of each process, a child found under its parent, and a
    marker per process. On Linux the table says what /proc says."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "a job's argument"],
                             start_new_session=True)
    try:
        table = stops.processes()
        me = os.getpid()
        assert table[me][:2] == (os.getppid(), os.getpgid(0))
        assert table[child.pid] == (me, child.pid, f"{sys.executable}\0-c\0import time; time.sleep(60)\0a job's argument")
        assert stops.descendants(me)[child.pid] == (me, table[child.pid][2])
        assert child.pid in stops.job_hosts(stops.descendants(me))
        assert stops._marker(child.pid) == stops._marker(child.pid) != stops._marker(me)
        if Path("/proc/self/stat").is_file():
            for pid in (me, child.pid):
                stat = Path(f"/proc/{pid}/stat").read_text()
                fields = stat[stat.rindex(")") + 2:].split()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").rstrip("\0")
                assert table[pid] == (int(fields[1]), int(fields[2]), cmdline)
    finally:
        child.kill()
        child.wait()
    assert child.pid not in stops.processes()


# --- refusals touch nothing -----------------------------------------------------------------------------------


def listing(root: Path) -> list[str] | None:
    """Every path under `root` (folders end in /), or None when `root` does not exist."""
    if not root.exists():
        return None
    return sorted(f"{p.relative_to(root)}{'/' if p.is_dir() else ''}" for p in root.rglob("*"))


@pytest.fixture(scope="module")
def used_home(tmp_path_factory) -> Path:
    """An outputs folder that has been used: a store with a finished run, a run folder, a cache entry."""
    home = tmp_path_factory.mktemp("used") / "home"
    client = tracking.setup(f"sqlite:///{home}/mlflow.db", "electra-ablate")
    tracking.RunLogger.start(client, "electra-ablate", "old", {tracking.TAG_CONFIG_HASH: "0" * 16}).finish()
    (home / "runs" / "2020-01-01_00-00-00_old" / ".hydra").mkdir(parents=True)
    (home / "cache" / "hashes").mkdir(parents=True)
    (home / "cache" / "hashes" / "0123").write_text("digest")
    return home


def home_in(state: str, tmp: Path, used_home: Path) -> Path:
    home = tmp / "home"
    if state == "empty":
        home.mkdir()
    elif state == "used":
        shutil.copytree(used_home, home)
    return home


FINETUNE_BASE = ["runtime.num_workers=0", "trainer.enable_progress_bar=false", "glue_data.max_seq_length=32",
                 "model.hidden_size=32", "model.embedding_size=32", "model.num_hidden_layers=2",
                 "model.num_attention_heads=2", "model.intermediate_size=64"]


def refusals() -> dict[str, tuple[str, object, str]]:
    """id -> (entry point, argv or a function of the test's tmp folder giving it, the refusal's message), for
    every refusal tests/test_bad_input.py documents, as the command lines that meet it."""
    import test_bad_input as bad

    cases: dict[str, tuple[str, object, str]] = {}
    for name, (overrides, message) in bad.PRETRAIN_VALUES.items():
        cases[f"pretrain {name}"] = ("pretrain", overrides, message)
    for make in bad.CORPORA:
        cases[f"pretrain {make.__name__}"] = ("pretrain", lambda tmp, make=make: [f"data.corpus={make(tmp)[0]}"],
                                              "Corpus .*")
    cases["pretrain missing vocabulary"] = (
        "pretrain", lambda tmp: ["data.train_vocab_size=0", f"data.vocab_file={tmp}/vocab.txt"],
        "Vocabulary file .*vocab.txt does not exist")
    for name, (config, args, message) in {**bad.UNKNOWN_KEYS, **bad.BAD_COMMAND_LINES}.items():
        cases[name if name.startswith(config) else f"{config} {name}"] = (config, args, message)
    for name, (overrides, message) in bad.FINETUNE_VALUES.items():
        cases[f"finetune {name}"] = ("finetune", [*FINETUNE_BASE, "task=rte", *overrides], message)
    for make in bad.GLUE_FILES:
        cases[f"finetune {make.__name__}"] = (
            "finetune", lambda tmp, make=make: [*FINETUNE_BASE, "task=rte", f"glue_data.dir={make(tmp)[0]}"],
            "RTE|GLUE")
    cases["finetune task=qnli without QNLI data"] = (
        "finetune", [*FINETUNE_BASE, "task=qnli"], r"GLUE task directory .*QNLI not found")
    cases["finetune missing checkpoint directory"] = (
        "finetune", lambda tmp: [*FINETUNE_BASE, "task=rte", f"pretrained={tmp}/gone"],
        "is neither a directory, an MLflow run id")
    cases["finetune run id with no store"] = (
        "finetune", [*FINETUNE_BASE, "task=rte", "pretrained=" + "0" * 32], "no MLflow store at|no MLflow run")
    for name, (body, message) in bad.SWEEP_FILES.items():
        cases[f"sweep {name}"] = ("sweep", lambda tmp, body=body: [f"sweep={_sweep_file(tmp, bad.SWEEP_BASE + body)}"],
                                  message)
    for name, (sweep, scale, message) in bad.REPORT_INPUTS.items():
        cases[f"report {name}"] = ("report", [f"sweep={sweep}", *([f"scale={scale}"] if scale else [])], message)
    for name, (args, message) in bad.EXPORTS.items():
        cases[f"export {name}"] = ("export", lambda tmp, args=args: _export_args(tmp, args), message)
    return cases


def _sweep_file(inputs: Path, text: str) -> Path:
    path = inputs / "mine.yaml"
    path.write_text(text + "\n")
    return path


def _export_args(inputs: Path, args: list[str]) -> list[str]:
    # A store of a new name each time: the process keeps SQLite stores it has opened, so one made again at a
    # path removed since would not be created again.
    store = inputs / f"store-{next(_STORES)}.db"
    tracking.setup(f"sqlite:///{store}", "electra-ablate")
    return [a.format(tmp=inputs, out=inputs / "out", store=store) for a in args]


_STORES = itertools.count()


ENTRIES = {"pretrain": "electra_ablate.pretrain", "finetune": "electra_ablate.finetune",
           "sweep": "electra_ablate.sweep.run", "report": "electra_ablate.report.build", "export": "electra_ablate.export"}


def run_entry(entry: str, argv: list[str], monkeypatch) -> int:
    """Run an entry point's console `cli_main` in this process, as `python -m electra_ablate.<entry> ...` would."""
    import importlib

    from hydra.core.global_hydra import GlobalHydra

    module = importlib.import_module(ENTRIES[entry])
    monkeypatch.setattr(sys, "argv", [entry, *argv])
    GlobalHydra.instance().clear()
    try:
        module.cli_main()
    except SystemExit as ended:
        return ended.code
    finally:
        GlobalHydra.instance().clear()
    return 0


def check_refusal(case: str, state: str, tmp: Path, used_home: Path, monkeypatch, capsys) -> None:
    import re

    entry, argv, message = REFUSALS[case]
    (tmp / "inputs").mkdir()
    argv = argv(tmp / "inputs") if callable(argv) else argv
    home = home_in(state, tmp, used_home)
    monkeypatch.setenv("ELECTRA_ABLATE_HOME", str(home))
    before = listing(home)
    status = run_entry(entry, list(argv), monkeypatch)
    err = capsys.readouterr().err
    assert status not in (0, None), err
    assert re.search(message, str(status) + err), (message, status, err)
    assert listing(home) == before, f"{case}: the outputs folder changed"


REFUSALS = refusals()
# One of each kind of refusal for the default run (the whole table is `-m slow`), three also with an outputs folder
# that is empty or has been used.
SOME = ["finetune task=qnli without QNLI data", "pretrain corpus_binary_part_way", "sweep invalid variant value",
        "pretrain lr negative", "pretrain misspelt", "finetune epochs zero", "finetune run id with no store",
        "report unknown sweep", "export no store"]
SOME_STATES = [(c, "absent") for c in SOME] + [(c, s) for c in SOME[:3] for s in ("empty", "used")]


@pytest.mark.parametrize("case, state", SOME_STATES, ids=[f"{c}-{s}" for c, s in SOME_STATES])
def test_a_refused_command_leaves_the_outputs_folder_as_it_was(tmp_path, used_home, monkeypatch, capsys, case,
                                                               state):
    check_refusal(case, state, tmp_path, used_home, monkeypatch, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in REFUSALS if c not in SOME])
def test_every_documented_refusal_leaves_the_outputs_folder_as_it_was(tmp_path, used_home, monkeypatch, capsys,
                                                                     case):
    check_refusal(case, "absent", tmp_path, used_home, monkeypatch, capsys)
    shutil.rmtree(tmp_path / "inputs")
    check_refusal(case, "used", tmp_path, used_home, monkeypatch, capsys)


# --- slow: the real commands stopped by SIGTERM, then run again ------------------------------------------------


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **extra}


def statuses(home: Path) -> list[tuple[str, str]]:
    """(kind, status) of every run in the outputs folder's store, read-only (a poller must not create it)."""
    return read_only_rows(home / "mlflow.db", "select (select value from tags t where t.run_uuid = r.run_uuid and "
                                              "t.key = 'kind'), status from runs r")


def stop_when(cmd: list[str], ready, job_env: dict[str, str], sig: int = signal.SIGTERM, target=None,
              timeout: float = 900) -> tuple[int, str, str]:
    """Start `cmd`, send `sig` (to `target(pid)`, else to it) once `ready()`; (exit status, stdout, stderr)."""
    proc = subprocess.Popen(cmd, env=job_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tic = time.perf_counter()
    try:
        while not ready():
            assert proc.poll() is None, f"ended before the stop: {proc.communicate()[1][-3000:]}"
            assert time.perf_counter() - tic < timeout, "the stop point was never reached"
            time.sleep(0.1)
        os.kill(target(proc.pid) if target else proc.pid, sig)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


def one_stop_line(err: str, sig: str = "SIGTERM") -> str:
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert lines and lines[-1].startswith(f"stopped by {sig}: "), err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    return lines[-1]


def pretrain_cmd(tmp: Path, data_dir: Path, cache: Path, *extra: str) -> list[str]:
    from conftest import TINY_PRETRAIN

    settings = {**TINY_PRETRAIN, "runtime.num_workers": "2", "paths.data_dir": str(data_dir),
                "paths.cache_dir": str(cache)}
    return [sys.executable, "-m", "electra_ablate.pretrain", "objective=electra", "trainer.max_steps=200",
            "trainer.checkpoint_every_n_steps=10", "logger.log_every_n_steps=5",
            *(f"{k}={v}" for k, v in settings.items()), *extra]


def checkpointed(home: Path):
    return lambda: any(home.glob("pretrain/*/*/checkpoints/last.ckpt"))


def finished_once_each_step(home: Path, n: int) -> None:
    client = MlflowClient(f"sqlite:///{home}/mlflow.db")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])
            if r.data.tags.get("kind") == "pretrain"]
    assert len(runs) == n and {r.info.status for r in runs} == {"FINISHED"}, [(r.info.run_id, r.info.status) for r in runs]
    for r in runs:
        assert r.data.tags[tracking.TAG_ATTEMPTS] == "2"
        assert [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")] == list(range(5, 201, 5))


@pytest.mark.slow
def test_sigterm_stops_pretraining_with_one_line_and_the_same_command_resumes_it(tmp_path, data_dir, token_cache):
    home = tmp_path / "home"
    cmd = pretrain_cmd(tmp_path, data_dir, token_cache)
    job_env = env(ELECTRA_ABLATE_HOME=str(home))
    status, out, err = stop_when(cmd, checkpointed(home), job_env)
    assert status == 143, err[-3000:]
    line = one_stop_line(err)
    assert "is recorded KILLED" in line and "the same command resumes from it" in line and "MLflow run" in line
    assert statuses(home) == [("pretrain", "KILLED")]
    again = subprocess.run(cmd, env=job_env, capture_output=True, text=True, timeout=1200)
    assert again.returncode == 0, again.stderr[-3000:]
    finished_once_each_step(home, 1)


@pytest.mark.slow
def test_a_run_killed_after_its_resume_continues_from_its_newest_checkpoint(tmp_path, pretrain_cfg, data_dir,
                                                                            token_cache):
    """Stopped by SIGTERM before its first periodic checkpoint, resumed by the real command, which SIGKILL ends
    after two periodic checkpoints: the next resume starts from the newest of them, not from the stop."""
    from conftest import TINY_PRETRAIN
    from electra_ablate.training.pretraining import train
    from electra_ablate.training.run_folder import checkpoint_step, newest_checkpoint

    common = ["objective=bert", "trainer.max_steps=200", "trainer.checkpoint_every_n_steps=10",
              "logger.log_every_n_steps=2", "optim.warmup_steps=2"]
    cfg = pretrain_cfg(tmp_path, *common)
    with stops.handled(), pytest.raises(stops.Stopped):
        train(cfg, callbacks=[SignalAt(3)])
    (folder,) = Path(cfg.paths.output_root).glob("pretrain/*/*/checkpoints")
    stops.reset()

    settings = {**TINY_PRETRAIN, "paths.root_dir": str(tmp_path), "paths.data_dir": str(data_dir),
                "paths.cache_dir": str(token_cache), "logger.tracking_uri": f"sqlite:///{tmp_path}/mlflow.db",
                **dict(o.split("=", 1) for o in common)}  # the same settings as `cfg`: the same identity
    cmd = [sys.executable, "-m", "electra_ablate.pretrain", *(f"{k}={v}" for k, v in settings.items())]
    def two_periodic_checkpoints():
        newest = newest_checkpoint(folder)
        return newest is not None and checkpoint_step(newest) >= 20

    status, _, err = stop_when(cmd, two_periodic_checkpoints, env(), sig=signal.SIGKILL)
    assert status == -signal.SIGKILL, err[-3000:]
    newest = checkpoint_step(folder / "last.ckpt")
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == ["last.ckpt"]
    assert 20 <= newest < 200

    started = StartedAt()
    run_id = train(cfg, callbacks=[started])
    assert started.step == newest
    client = tracking.setup(cfg.logger.tracking_uri, cfg.logger.experiment)
    assert client.get_run(run_id).info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == list(range(2, 201, 2))


@pytest.mark.slow
def test_sigterm_stops_finetuning_with_one_line_and_the_same_command_runs_it_again(tmp_path, data_dir):
    home = tmp_path / "home"
    cmd = [sys.executable, "-m", "electra_ablate.finetune", "pretrained=none", "task=rte", "task.epochs=20",
           *FINETUNE_BASE, "glue_data.batch_size=8", "logger.log_every_n_steps=2", f"paths.data_dir={data_dir}"]
    job_env = env(ELECTRA_ABLATE_HOME=str(home))

    def logging_metrics():
        return bool(read_only_rows(home / "mlflow.db", "select 1 from metrics limit 1"))

    status, out, err = stop_when(cmd, logging_metrics, job_env)
    assert status == 143, err[-3000:]
    line = one_stop_line(err)
    assert "fine-tuning rte seed=0" in line and "is recorded KILLED" in line
    assert statuses(home) == [("finetune", "KILLED")]
    again = subprocess.run(cmd, env=job_env, capture_output=True, text=True, timeout=1200)
    assert again.returncode == 0, again.stderr[-3000:]
    assert statuses(home) == [("finetune", "FINISHED")]


EXPORT_STOPPED = textwrap.dedent(
    """
    import os, signal, sys
    from electra_ablate.hf import exporting
    real = exporting.to_transformers_model

    def stopping(*args, **kwargs):  # SIGTERM while the first network is being written
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    exporting.to_transformers_model = stopping
    from electra_ablate.export import cli_main
    sys.argv = ["export", *sys.argv[1:]]
    cli_main()
    """
)


@pytest.mark.slow
def test_sigterm_stops_an_export_with_one_line_and_nothing_half_written(tmp_path):
    import torch

    from electra_ablate.models.checkpoint import save_pretrained
    from electra_ablate.models.encoder import ElectraForPretraining, EncoderConfig

    pytest.importorskip("transformers")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"w{i}" for i in range(59)]]) + "\n")
    config = EncoderConfig(vocab_size=64, embedding_size=32, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    source = save_pretrained(tmp_path / "pretrained", ElectraForPretraining(config, disc_head=True), vocab,
                             {"objective": "electra", "do_lower_case": True})
    out = tmp_path / "exported"
    stopped = subprocess.run([sys.executable, "-c", EXPORT_STOPPED, str(source), str(out)], env=env(),
                             capture_output=True, text=True, timeout=600)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "wrote nothing" in one_stop_line(stopped.stderr)
    assert not out.exists() and not list(tmp_path.glob(".exported*"))
    again = subprocess.run([sys.executable, "-m", "electra_ablate.export", str(source), str(out)], env=env(),
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and (out / "discriminator" / "config.json").is_file(), again.stderr[-3000:]


@pytest.mark.slow
def test_sigterm_stops_the_benchmark_with_one_line(tmp_path, data_dir):
    pytest.importorskip("transformers")
    out = tmp_path / "bench.md"
    cmd = [sys.executable, "-m", "electra_ablate.bench", "--quick", "--models", "tiny", "--batch-size", "8",
           "--seq-len", "64", "--threads", "1", "--data-dir", str(data_dir), "--cache-dir", str(tmp_path / "cache"),
           "--out", str(out), "--sections", "pretrain,pieces", "--override", "data.max_docs=300"]
    def measuring():  # the benchmark has begun: its cache is built
        return any((tmp_path / "cache").glob("pretrain/*/meta.json"))

    status, _, err = stop_when(cmd, measuring, env())
    assert status == 143, err[-3000:]
    assert "wrote no report" in one_stop_line(err) and not out.exists()


def job_processes(root: int, needle: str) -> list[int]:
    """The descendants of `root` running `needle`, less their own copies (a job's forked data-loader workers)."""
    found = stops.descendants(root)
    return [pid for pid, (ppid, cmdline) in found.items()
            if needle in cmdline and needle not in found.get(ppid, (0, ""))[1]]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_sigterm_stops_a_multirun_whose_jobs_end_killed_and_resume(tmp_path, data_dir, token_cache, launcher):
    home = tmp_path / "home"
    extra = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"] if launcher == "joblib" else []
    cmd = pretrain_cmd(tmp_path, data_dir, token_cache, "seed=0,1", *extra)
    cmd.insert(3, "-m")
    job_env = env(ELECTRA_ABLATE_HOME=str(home))
    tic = time.perf_counter()
    status, _, err = stop_when(cmd, checkpointed(home), job_env)
    assert status == 143, err[-3000:]
    assert "Error executing job" not in err and "HYDRA_FULL_ERROR" not in err, err[-3000:]
    assert "pre-training" in one_stop_line(err)
    found = statuses(home)
    assert "RUNNING" not in {s for _, s in found} and ("pretrain", "KILLED") in found, found
    if launcher == "basic":  # one job at a time: the second never started
        assert found == [("pretrain", "KILLED")]
    again = subprocess.run(cmd, env=job_env, capture_output=True, text=True, timeout=1800)
    assert again.returncode == 0, again.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{home}/mlflow.db")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert sorted(r.data.tags["seed"] for r in runs) == ["0", "1"] and {r.info.status for r in runs} == {"FINISHED"}
    print(f"multirun ({launcher}) stopped by SIGTERM and resumed in {time.perf_counter() - tic:.0f} s")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR2], ids=["SIGTERM", "SIGUSR2"])
def test_a_submitit_job_stopped_mid_run_is_killed_and_resumes(tmp_path, data_dir, token_cache, sig):
    # What a SLURM time limit or preemption does to a job's process (docs/scaling.md), with submitit's local
    # executor. SIGTERM: the run ends KILLED at a checkpoint of its step, the multirun runs the rest and ends with
    # the job's line and 143; the same command resumes it. SIGUSR2 (submitit's preemption signal): the same stop, then submitit requeues the job, which
    # resumes the run; the multirun succeeds. Either way the run ends FINISHED with each step logged once.
    home = tmp_path / "home"
    cmd = pretrain_cmd(tmp_path, data_dir, token_cache, "hydra/launcher=submitit_local",
                       "hydra.launcher.timeout_min=60", f"hydra.sweep.dir={tmp_path}/multirun")
    cmd.insert(3, "-m")
    job_env = env(ELECTRA_ABLATE_HOME=str(home))

    def the_job(pid: int) -> int:
        (job,) = job_processes(pid, "submitit.core._submit")
        return job

    status, _, err = stop_when(cmd, checkpointed(home), job_env, sig=sig, target=the_job)
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "multirun").rglob("*.log"))
    assert f"stopped by {sig.name}: pre-training" in logs and "the same command resumes from it" in logs
    if sig == signal.SIGTERM:
        assert status == 143, err[-3000:]  # the multirun's other jobs ran; a stopped job is not a success
        assert "Error executing job" not in err and "HYDRA_FULL_ERROR" not in err, err[-3000:]
        assert one_stop_line(err).startswith("stopped by SIGTERM: pre-training")
        assert statuses(home) == [("pretrain", "KILLED")]
        again = subprocess.run(cmd, env=job_env, capture_output=True, text=True, timeout=1800)
        assert again.returncode == 0, again.stderr[-3000:]
    else:
        assert status == 0, err[-3000:]  # requeued by submitit, resumed and finished in the same multirun
    finished_once_each_step(home, 1)
