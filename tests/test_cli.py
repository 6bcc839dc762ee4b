"""The command line as users meet it, through the real entry points in subprocesses: corpora whose config has a
required key pre-train end to end, a refused input ends in one `error:` line with no stack (the stack only
with HYDRA_FULL_ERROR=1, and a multirun's failure left to Hydra's launcher), every command's --help, and a
sweep given by path runs in one folder named after its file."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parents[1]
# A pre-training small enough to take two steps in seconds on a CPU.
TINY = ["model=tiny", "model.hidden_size=32", "model.embedding_size=32", "model.num_hidden_layers=1",
        "model.num_attention_heads=2", "model.intermediate_size=64", "data.max_seq_length=32", "data.batch_size=4",
        "trainer.max_steps=2", "optim.warmup_steps=0", "runtime.num_workers=0", "trainer.enable_progress_bar=false"]


def cli(tmp: Path, module: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "HYDRA_FULL_ERROR")}
    environ.update(PYTHONPATH=str(REPO), ELECTRA_ABLATE_HOME=str(tmp / "home"), **env)
    return subprocess.run([sys.executable, "-m", f"electra_ablate.{module}", *args], cwd=tmp, env=environ,
                          capture_output=True, text=True, timeout=600)


# --- a required key (`???`) set on the command line --------------------------------------------------------


def text_folder(tmp: Path, data_dir: Path) -> list[str]:
    corpus = (data_dir / "corpus" / "enwiki_sample_5mb.txt").read_text().split("\n\n")
    (tmp / "corpus").mkdir()
    for i in range(3):
        (tmp / "corpus" / f"{i}.txt").write_text("\n\n".join(corpus[i * 40:(i + 1) * 40]))
    return ["data=text_files", f"data.paths=[{tmp / 'corpus'}]"]


def saved_dataset(tmp: Path, data_dir: Path) -> list[str]:
    datasets = pytest.importorskip("datasets")
    corpus = (data_dir / "corpus" / "enwiki_sample_5mb.txt").read_text().split("\n\n")[:120]
    datasets.Dataset.from_dict({"text": corpus}).save_to_disk(str(tmp / "saved"))
    return ["data=hf_dataset", f"data.name={tmp / 'saved'}"]


@pytest.mark.parametrize("corpus", [text_folder, saved_dataset], ids=["text_files", "hf_dataset"])
def test_a_corpus_with_a_required_key_pre_trains_from_the_command_line(tmp_path, data_dir, corpus):
    done = cli(tmp_path, "pretrain", *corpus(tmp_path, data_dir), *TINY)
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/home/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("electra-ablate").experiment_id])
    assert run.info.status == "FINISHED" and Path(run.data.tags["checkpoint_path"], "config.json").is_file()
    assert "litlogger" not in done.stdout + done.stderr  # Lightning's advert is dropped (training/__init__.py)
    # The corpus's budget line goes to the run's log file (the console shows the outcome): it names a real size.
    logs = "".join(f.read_text() for f in tmp_path.rglob("*.log"))
    assert "the run sees" in logs and "0.00B" not in logs + done.stdout + done.stderr


# --- refusals ------------------------------------------------------------------------------------------------

REFUSALS = {  # one per entry point: each wires its errors through common/cli.py's one_line_errors
    "pretrain": ("pretrain", ["optim.lr=-1"], r"optim.lr=-1 must be a positive number"),
    "finetune": ("finetune", ["task=sst2", "pretrained=/nonexistent/dir"],
                 r"pretrained='/nonexistent/dir' is neither a directory, an MLflow run id"),
    "sweep": ("sweep", ["sweep=/nowhere/mine.yaml"], r"sweep file /nowhere/mine.yaml not found"),
    "report": ("report", ["sweep=no_such_sweep"], r"no sweep named 'no_such_sweep'"),
    "export": ("export", ["not-a-run", "out"], r"'not-a-run' is neither an existing pre-trained"),
    "bench": ("bench", ["--sections", "speed"], r"unknown --sections \['speed'\]"),
    "submit": ("submit", ["--experiment", "nothing", "--variant", "v", "--out", "x.zip"],
               r"--experiment 'nothing': no such experiment"),
}


@pytest.mark.parametrize("module, args, message", REFUSALS.values(), ids=REFUSALS.keys())
def test_a_refusal_ends_in_one_error_line(tmp_path, module, args, message):
    import re

    done = cli(tmp_path, module, *args)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and last.startswith("error: ") and re.search(message, last), done.stderr[-3000:]
    assert "Traceback" not in done.stderr + done.stdout and "Error executing job" not in done.stderr


def test_what_counts_as_a_refusal():
    from hydra.errors import ConfigCompositionException, InstantiationException
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue

    from electra_ablate.common.cli import refusal_message
    from electra_ablate.data.errors import DataError
    from electra_ablate.training.checks import ConfigError

    message = "optim.lr=-1 must be a positive number"
    assert refusal_message(ConfigError(message)) == message
    assert refusal_message(ValueError("a bug")) is None and refusal_message(KeyError("x")) is None  # stack kept
    wrapped = InstantiationException("Error in call to target 'x':\nDataError('Corpus missing')")
    wrapped.__cause__ = DataError("Corpus missing")
    assert refusal_message(wrapped) == "Corpus missing"
    wrapped.__cause__ = TypeError("__init__() got an unexpected keyword argument")
    assert refusal_message(wrapped) is None
    with pytest.raises(MissingMandatoryValue) as missing:
        OmegaConf.create({"data": {"paths": "???"}}).data.paths
    assert refusal_message(missing.value).startswith("data.paths has no value")
    composition = ConfigCompositionException("In 'sweep_variant/a': Could not find 'objective/bertt'\n\n"
                                             "Available options in 'objective':\n\tbert\n\telectra")
    assert refusal_message(composition) == ("In 'sweep_variant/a': Could not find 'objective/bertt'; "
                                            "Available options in 'objective': bert, electra")


@pytest.mark.slow
def test_the_stack_is_kept_with_hydra_full_error(tmp_path):
    done = cli(tmp_path, "finetune", "task=sst2", "pretrained=/nonexistent/dir", HYDRA_FULL_ERROR="1")
    assert done.returncode == 1 and "Traceback" in done.stderr and "FinetuneError: pretrained=" in done.stderr


@pytest.mark.slow
def test_a_multirun_leaves_a_failed_job_to_hydra(tmp_path):
    # A multirun's jobs fail as Hydra's launchers expect (the sweep's keep_going and FAILED records rely on
    # it): the launcher runs the batch, then reports the first failure with its overrides.
    done = cli(tmp_path, "pretrain", "-m", "optim.lr=-1", "seed=0,1")
    assert done.returncode == 1 and "Error executing job with overrides" in done.stderr
    assert "ConfigError: optim.lr=-1 must be a positive number" in done.stderr


# --- help ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["pretrain", *(pytest.param(m, marks=pytest.mark.slow)
                                                   for m in ("finetune", "sweep", "report"))])
def test_help_says_what_the_command_does(tmp_path, module):
    done = cli(tmp_path, module, "--help")
    assert done.returncode == 0, done.stderr[-3000:]
    text = done.stdout
    assert text.startswith(f"python -m electra_ablate.{module} "), text[:300]
    assert "Main options:" in text and f"  python -m electra_ablate.{module} " in text.split("Examples:")[1]
    assert "objective: all_tokens_mlm, bert, electra" in text  # the config groups, as Hydra lists them
    assert "--cfg job" in text and "powered by Hydra" not in text


@pytest.mark.parametrize("module", ["export", "bench", "submit"])
def test_argparse_help_has_an_example(module, capsys):
    import importlib

    main = importlib.import_module({"export": "electra_ablate.export", "bench": "electra_ablate.bench.cli",
                                    "submit": "electra_ablate.glue.submit"}[module]).main
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    text = capsys.readouterr().out
    assert done.value.code == 0 and f"  python -m electra_ablate.{module} " in text.split("example")[1]


# --- small things ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_sweep_given_by_path_runs_in_one_folder_named_after_its_file(tmp_path):
    (tmp_path / "sweeps").mkdir()
    path = tmp_path / "sweeps" / "mine.yaml"
    path.write_text("tasks: [rte]\nseeds: [0]\npretrain: {model: tiny, trainer.max_steps: 2, optim.warmup_steps: 0}\n"
                    "variants:\n  electra: {objective: electra}\n")
    # Extra overrides for every job, quoted as README.md writes them.
    done = cli(tmp_path, "sweep", f"sweep={path}", "dry_run=true", f"report_dir={tmp_path}/reports",
               'pretrain_overrides=["trainer=ddp","runtime.precision=32-true"]')
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (tmp_path / "home" / "runs").iterdir()
    assert run_dir.name.endswith("_sweep-mine") and (run_dir / ".hydra" / "config.yaml").is_file()
    pretrain = f"{sys.executable} -m electra_ablate.pretrain -m"
    (command,) = [line for line in done.stdout.splitlines() if line.startswith(pretrain)]
    assert " +sweep_variant=electra " in command and " trainer=ddp runtime.precision=32-true " in command


def test_lightning_keeps_its_messages_but_not_its_litlogger_advert():
    import pytorch_lightning as pl

    import electra_ablate.training  # noqa: F401 - installs the filter

    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    loggers = [logging.getLogger(f"{package}.utilities.rank_zero") for package in ("pytorch_lightning", "lightning_fabric")]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        pl.Trainer(logger=False, accelerator="cpu", enable_progress_bar=False, enable_checkpointing=False)
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
    assert any("GPU available" in m for m in seen), seen  # Lightning's own messages still pass
    assert not any("litlogger" in m for m in seen), seen
