"""Shared fixtures: the real data folder beside the checkout, tiny configs, a temporary MLflow store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
CONF_DIR = REPO / "conf"
DATA_DIR = Path(os.environ.get("ELECTRA_ABLATE_DATA", REPO.parent / "shared" / "data")).resolve()

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA_DIR / "corpus").is_dir():
        pytest.fail(f"real data not found at {DATA_DIR}; set ELECTRA_ABLATE_DATA to the shared data folder")
    return DATA_DIR


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
