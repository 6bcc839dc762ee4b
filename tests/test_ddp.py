"""Lightning DDP on CPU (gloo), two processes started the way a user starts them: one MLflow run and one set
of outputs written by the first process, each process on its own shard of every global batch, metrics
reduced over both before they are logged, FLOPs counted over the global batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from electra_ablate.models import flops
from electra_ablate.models.checkpoint import load_pretrained
from electra_ablate.objectives.electra import Electra

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_two_cpu_processes_make_one_run_with_reduced_metrics(tmp_path, data_dir, token_cache):
    from conftest import TINY_PRETRAIN

    settings = {**TINY_PRETRAIN, "paths.root_dir": str(tmp_path), "paths.data_dir": str(data_dir),
                "paths.cache_dir": str(token_cache), "hydra.run.dir": str(tmp_path / "run"),
                "runtime.num_workers": "0"}
    cmd = [sys.executable, "-m", "electra_ablate.pretrain", "trainer.accelerator=cpu", "trainer.devices=2",
           "trainer.strategy=ddp", "trainer.max_steps=12", "trainer.checkpoint_every_n_steps=4",
           "logger.log_every_n_steps=4", "trainer.export_fractions=[0.5]", "optim.warmup_steps=2",
           *(f"{k}={v}" for k, v in settings.items())]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stderr[-4000:]

    client = MlflowClient(f"sqlite:///{tmp_path}/outputs/mlflow.db")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert len(runs) == 1, [(r.info.run_id, r.info.status) for r in runs]  # the second process records nothing
    (run,) = runs
    assert run.info.status == "FINISHED"
    history = {k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)] for k in run.data.metrics}
    assert [s for s, _ in history["train/loss"]] == [4, 8, 12]  # each window logged once, by one process
    # The global batch is both processes' batches: the FLOPs of a step count 2 x data.batch_size sequences.
    batch, seq = int(TINY_PRETRAIN["data.batch_size"]), int(TINY_PRETRAIN["data.max_seq_length"])
    ckpt_root = Path(run.data.tags["store"])
    info = (ckpt_root / "pretrained" / "final" / "config.json").read_text()
    assert '"step": 12' in info and (ckpt_root / "pretrained" / "step_6").is_dir()
    per_step = dict(history["flops/total"])[12] / 12
    model, _ = load_pretrained(ckpt_root / "pretrained" / "final")
    generator, _ = load_pretrained(ckpt_root / "pretrained" / "final", which="generator")
    assert per_step == pytest.approx(flops.pretrain_flops_per_step(model.config, generator.config, Electra.flops,
                                                                   2 * batch, seq))
    # The corpus budget counts the global batch too: tokens the run will see over both processes.
    assert float(run.data.params["corpus/tokens_to_see"]) == 12 * 2 * batch * seq
