"""Shared fixtures: a tiny hermetic data folder (the real one only for `realdata` tests), tiny configs, a
temporary MLflow store."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import hermetic
import pytest
import pytorch_lightning as pl
import torch

REPO = Path(__file__).resolve().parent.parent
CONF_DIR = REPO / "conf"
# The shared real data, as conf/paths/default.yaml finds it; only `realdata` tests read it.
REAL_DATA_DIR = Path(os.environ.get("ELECTRA_ABLATE_DATA", REPO.parent / "shared" / "data")).resolve()

# Two torch threads at most; one per test worker when pytest-xdist runs several side by side (on 2 shared cores,
# two threads per process were 3x slower than one).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, torch.get_num_threads() // _WORKERS)))


def pytest_configure(config):
    """Write the tiny data folder (tests/hermetic.py, ~1 s) and point ELECTRA_ABLATE_DATA at it, before any test
    module is imported: test modules, the configs they compose (paths.data_dir) and the entry points they start
    in subprocesses then all read it, so the default run needs no real data and gives the same results
    wherever it runs."""
    config._hermetic_data = hermetic.make_data_dir()
    config._real_data_env = os.environ.get("ELECTRA_ABLATE_DATA")
    os.environ["ELECTRA_ABLATE_DATA"] = str(config._hermetic_data)


def pytest_unconfigure(config):
    if getattr(config, "_hermetic_data", None) is None:
        return
    hermetic.remove_data_dir(config._hermetic_data)
    if config._real_data_env is None:
        os.environ.pop("ELECTRA_ABLATE_DATA", None)
    else:
        os.environ["ELECTRA_ABLATE_DATA"] = config._real_data_env


@pytest.fixture(scope="session")
def data_dir(pytestconfig) -> Path:
    """The tiny hermetic data folder, laid out like the real one (corpus/, vocab/, glue/)."""
    return pytestconfig._hermetic_data


@pytest.fixture(scope="session")
def real_data_dir() -> Path:
    """The shared real data, for tests of real corpus and GLUE statistics (marker `realdata`, run by
    `pytest -m realdata`); they skip, naming the fix, where it is absent."""
    if not (REAL_DATA_DIR / "corpus").is_dir():
        pytest.skip(f"real data not found at {REAL_DATA_DIR}; set ELECTRA_ABLATE_DATA to the shared data folder "
                    "(../shared/data/README.md) to run the realdata tests")
    return REAL_DATA_DIR


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    # Tests pick their own folders: a user's ELECTRA_ABLATE_HOME / ELECTRA_ABLATE_ROOT must not redirect them.
    monkeypatch.delenv("ELECTRA_ABLATE_HOME", raising=False)
    monkeypatch.delenv("ELECTRA_ABLATE_ROOT", raising=False)
    monkeypatch.delenv("ELECTRA_ABLATE_DURABLE_ROOT", raising=False)  # a user's durable store: never written by tests


# A pre-training config small enough for hundreds of CPU steps: 2 layers, hidden 64, sequences of 64, and a
# 2000-token WordPiece vocabulary trained on the sample (small output layers).
TINY_PRETRAIN = {
    "model": "tiny",
    "model.hidden_size": "64",
    "model.embedding_size": "32",
    "model.num_hidden_layers": "2",
    "model.num_attention_heads": "2",
    "model.intermediate_size": "128",
    "model.generator_fraction": "0.5",
    "data.max_seq_length": "64",
    "data.batch_size": "16",
    "data.max_docs": "400",
    "data.train_vocab_size": "2000",
    "runtime.num_workers": "0",
    "trainer.enable_progress_bar": "false",
    "optim.lr": "2e-3",
    "optim.warmup_steps": "10",
}


@pytest.fixture(scope="session")
def token_cache(tmp_path_factory) -> Path:
    """One tokenized sample corpus for the whole session (the data cache is keyed by its inputs)."""
    return tmp_path_factory.mktemp("token_cache")


@pytest.fixture
def pretrain_cfg(data_dir, token_cache):
    """compose the real `pretrain` config with TINY_PRETRAIN, a store under `tmp`, and `overrides` (which win)."""
    from hydra import compose, initialize_config_dir

    def make(tmp: Path, *overrides: str):
        settings = dict(TINY_PRETRAIN)
        settings.update(
            {
                "paths.root_dir": str(tmp),
                "paths.data_dir": str(data_dir),
                "paths.output_dir": f"{tmp}/run",
                "paths.cache_dir": str(token_cache),
                "logger.tracking_uri": f"sqlite:///{tmp}/mlflow.db",
            }
        )
        settings.update(o.split("=", 1) for o in overrides)
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose("pretrain", overrides=[f"{k}={v}" for k, v in settings.items()])

    return make



class StopAt(pl.Callback):
    """Simulates a crash right after a given step (resume tests)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError("simulated crash")


@pytest.fixture
def stop_at():
    return StopAt


def read_only_rows(db: Path, sql: str) -> list[tuple]:
    """Rows of `sql` on the SQLite store `db`, opened read-only: a poller must never create or migrate the store the
    process under test is creating. [] while the store or its tables do not exist yet."""
    if not db.is_file():
        return []
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return con.execute(sql).fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return []
