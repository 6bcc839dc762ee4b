"""The pre-training pilot (probes/pilot.py): its curve is pre-training's own, and a cache entry built with other
settings is refused before any network exists."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from electra_ablate import pretrain
from electra_ablate.probes import pilot
from electra_ablate.bench.settings import BenchError
from electra_ablate.data.module import PretrainDataModule
from electra_ablate.training import build
from tests.conftest import TINY_PRETRAIN


def _overrides(tmp: Path, data_dir: Path, cache_dir: Path, *extra: str) -> list[str]:
    settings = {**TINY_PRETRAIN, "paths.root_dir": str(tmp), "paths.data_dir": str(data_dir),
                "paths.cache_dir": str(cache_dir), "logger.tracking_uri": f"sqlite:///{tmp}/mlflow.db",
                "objective": "electra", "trainer.max_steps": "12", "logger.log_every_n_steps": "4"}
    settings.update(o.split("=", 1) for o in extra)
    return [f"{k}={v}" for k, v in settings.items()]


def test_a_pilot_draws_the_curve_pre_training_logs(tmp_path, data_dir, token_cache, pretrain_cfg):
    common = ["objective=electra", "trainer.max_steps=12", "logger.log_every_n_steps=4"]
    run_id = pretrain.train(pretrain_cfg(tmp_path / "run", *common))
    client = MlflowClient(f"sqlite:///{tmp_path}/run/mlflow.db")
    logged = {k: {m.step: m.value for m in client.get_metric_history(run_id, f"train/{k}")}
              for k in ("mlm_loss", "disc_loss", "disc_auc", "lr")}
    out = tmp_path / "pilot.csv"
    rows = pilot.main(["p", *_overrides(tmp_path / "pilot", data_dir, token_cache), "--out", str(out)])
    assert [r["step"] for r in rows] == [4, 8, 12]
    with open(out, newline="") as f:
        written = list(csv.DictReader(f))
    assert tuple(written[0]) == pilot.COLUMNS and [int(r["step"]) for r in written] == [4, 8, 12]
    assert int(written[-1]["tokens"]) == 12 * 16 * 64
    for row in rows:
        for key, values in logged.items():
            assert row[key] == pytest.approx(values[row["step"]], rel=1e-5), (key, row["step"])


def test_a_pilot_reads_a_built_cache_entry_and_refuses_one_built_otherwise(tmp_path, data_dir, token_cache,
                                                                            monkeypatch):
    cfg = pilot.compose_pretrain(_overrides(tmp_path, data_dir, token_cache, "paths.output_dir=" + str(tmp_path)))
    dm = build.data_module(cfg)
    entry = dm.prepare().directory
    with pytest.raises(BenchError, match=r"data.max_seq_length=32 but the cache entry was built with 64"):
        pilot.main(["p", *_overrides(tmp_path, data_dir, token_cache, "data.max_seq_length=32"), "--cache", str(entry)])

    def no_corpus(self):
        raise AssertionError("the corpus was built although --cache names an entry")

    monkeypatch.setattr(PretrainDataModule, "_build_cache", no_corpus)
    rows = pilot.main(["p", *_overrides(tmp_path, data_dir, token_cache, "trainer.max_steps=4", "optim.warmup_steps=2"),
                       "--cache", str(entry), "--out", str(tmp_path / "c.csv")])
    assert [r["step"] for r in rows] == [4] and 0.0 <= rows[0]["disc_auc"] <= 1.0
