"""Freed memory kept in the process (common/allocator.py): set at the start of an entry point and handed to the
processes it starts, switched off by ELECTRA_ABLATE_KEEP_FREED_MEMORY=0 or a job's runtime.keep_freed_memory=false,
and the same numbers either way: a pre-training run with glibc's defaults and one with freed memory kept, each in
its own process, end with bit-identical losses and weights."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_PRETRAIN
from omegaconf import OmegaConf

from electra_ablate.common import allocator

REPO = Path(__file__).resolve().parent.parent
glibc = pytest.mark.skipif(allocator._mallopt() is None, reason="freed memory is kept with glibc's mallopt only")


@pytest.fixture
def clean_env(monkeypatch):
    """No malloc variables and no switch in this process's environment; what the test sets is undone after it,
    and freed memory is given back as glibc's static settings give it back."""
    for name in [k for k in os.environ if k.startswith("MALLOC_")] + [allocator.ENV_SWITCH]:
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    allocator.keep_freed_memory(False)


@glibc
def test_kept_in_the_process_and_exported_to_the_ones_it_starts_then_given_back(clean_env):
    assert allocator.keep_freed_memory() == "kept"
    assert os.environ["MALLOC_MMAP_MAX_"] == "0" and os.environ["MALLOC_TRIM_THRESHOLD_"] == str(2**64 - 1)
    assert allocator.for_job(OmegaConf.create({"runtime": {"keep_freed_memory": False}})) == "given back"
    assert not any(k.startswith("MALLOC_") for k in os.environ)
    assert allocator.for_job(OmegaConf.create({"seed": 0})) == "kept"  # a config without the key: kept


@glibc
def test_a_users_own_malloc_variable_is_left_as_it_is(clean_env):
    clean_env.setenv("MALLOC_TRIM_THRESHOLD_", "1048576")
    allocator.keep_freed_memory()
    assert os.environ["MALLOC_TRIM_THRESHOLD_"] == "1048576" and os.environ["MALLOC_MMAP_MAX_"] == "0"
    allocator.keep_freed_memory(False)
    assert os.environ["MALLOC_TRIM_THRESHOLD_"] == "1048576" and "MALLOC_MMAP_MAX_" not in os.environ


def test_the_switch_leaves_glibc_as_it_is(clean_env):
    clean_env.setenv(allocator.ENV_SWITCH, "0")
    assert allocator.keep_freed_memory() == "off" == allocator.state()
    assert not any(k.startswith("MALLOC_") for k in os.environ)


def _pretrain(root: Path, data_dir: Path, keep: bool) -> tuple[dict, list[float], str]:
    """Pre-train the tiny config in a fresh `python -m electra_ablate.pretrain`; its final weights, its logged
    losses in order, and its log."""
    from mlflow.tracking import MlflowClient

    from electra_ablate.models.checkpoint import MODEL_NAME
    from electra_ablate.tracking import runs as tracking

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update({allocator.ENV_SWITCH: "1" if keep else "0", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    uri = f"sqlite:///{root}/mlflow.db"
    overrides = {**TINY_PRETRAIN, "paths.root_dir": str(root), "paths.data_dir": str(data_dir),
                 "logger.tracking_uri": uri, "hydra.run.dir": f"{root}/hydra", "trainer.max_steps": "6",
                 "logger.log_every_n_steps": "1", "optim.warmup_steps": "2", "data.max_docs": "100"}
    command = [sys.executable, "-m", "electra_ablate.pretrain", *(f"{k}={v}" for k, v in overrides.items())]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(uri)
    (run,) = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    losses = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "train/loss"), key=lambda m: m.step)]
    weights = torch.load(Path(run.data.tags[tracking.TAG_CHECKPOINT]) / MODEL_NAME, map_location="cpu")
    return weights, losses, (root / "hydra" / "pretrain.log").read_text()


@glibc
def test_the_same_losses_and_weights_with_freed_memory_kept_or_given_back(tmp_path, data_dir):
    default_weights, default_losses, default_log = _pretrain(tmp_path / "default", data_dir, keep=False)
    kept_weights, kept_losses, kept_log = _pretrain(tmp_path / "kept", data_dir, keep=True)
    assert "freed memory: glibc's defaults" in default_log and "freed memory: kept in the process" in kept_log
    assert len(default_losses) == 6 and kept_losses == default_losses  # bit for bit: floats compared with ==
    assert kept_weights.keys() == default_weights.keys()
    for key in default_weights:
        assert torch.equal(kept_weights[key], default_weights[key]), key
