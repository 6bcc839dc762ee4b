"""A run keeps its precision: a run started in bf16-mixed and resumed on a machine where `auto` means fp32 goes on
in bf16-mixed (one warning line says it is slow there), an explicit runtime.precision switches it, and every
attempt records what it ran in and on (tracking/attempts.py). The CPU's bf16 flags are mocked."""

from __future__ import annotations

import logging

import pytest
import pytorch_lightning as pl

from electra_ablate.common import precision
from electra_ablate.tracking import attempts
from electra_ablate.tracking import runs as tracking

ZEN4 = frozenset({"avx2", "avx512f", "avx512_bf16"})
AVX2_ONLY = frozenset({"avx2", "fma"})


class _Run:
    """The parts of an mlflow Run that `attempts.choose` reads."""

    def __init__(self, tags=None, params=None):
        self.data = type("Data", (), {"tags": dict(tags or {}), "params": dict(params or {})})()


@pytest.mark.parametrize("requested, previous, flags, expected", [
    ("auto", None, ZEN4, "bf16-mixed"),
    ("auto", None, AVX2_ONLY, "32-true"),
    ("auto", _Run(params={"runtime.resolved_precision": "bf16-mixed"}), AVX2_ONLY, "bf16-mixed"),  # before attempts
    ("auto", _Run({"attempt.1.precision": "bf16-mixed", "attempt.2.precision": "32-true"},
                  {"runtime.resolved_precision": "bf16-mixed"}), ZEN4, "32-true"),  # its newest attempt's
    ("32-true", _Run(params={"runtime.resolved_precision": "bf16-mixed"}), ZEN4, "32-true"),
    ("bf16-mixed", _Run(params={"runtime.resolved_precision": "32-true"}), AVX2_ONLY, "bf16-mixed"),
])
def test_auto_keeps_the_runs_precision_and_an_explicit_value_switches_it(requested, previous, flags, expected):
    choice = attempts.choose(requested, "cpu", previous, flags)
    assert choice.precision == expected
    assert (choice.warning is not None) == (expected == "bf16-mixed" and flags == AVX2_ONLY)
    if requested != "auto" and previous is not None:
        assert "switched from" in choice.how


class Precisions(pl.Callback):
    """Records the precision each fit trained in."""

    def __init__(self):
        self.seen: list[str] = []

    def on_train_start(self, trainer, pl_module):
        self.seen.append(str(trainer.precision))


@pytest.fixture
def cpu_with(monkeypatch):
    return lambda flags: monkeypatch.setattr(precision, "cpu_flags", lambda: flags)


def _stopped_bf16_run(tmp_path, pretrain_cfg, stop_at, cpu_with, seen):
    """A run started where `auto` means bf16-mixed, crashed after its checkpoint at step 4."""
    from electra_ablate.training.pretraining import train

    cpu_with(ZEN4)
    cfg = pretrain_cfg(tmp_path, "objective=bert", "trainer.max_steps=8", "trainer.checkpoint_every_n_steps=4",
                       "optim.warmup_steps=2", "runtime.precision=auto")
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg, callbacks=[stop_at(5), seen])
    return cfg


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "emulated" in r.getMessage()]


def test_a_resumed_run_keeps_bf16_where_auto_means_fp32_says_so_once_and_records_both_attempts(
        tmp_path, pretrain_cfg, stop_at, cpu_with, caplog):
    from electra_ablate.training.pretraining import train

    seen = Precisions()
    cfg = _stopped_bf16_run(tmp_path, pretrain_cfg, stop_at, cpu_with, seen)
    cpu_with(AVX2_ONLY)  # another machine: `auto` would be fp32 here
    caplog.set_level(logging.INFO)
    run_id = train(cfg, callbacks=[seen])
    assert seen.seen == ["bf16-mixed", "bf16-mixed"]
    (line,) = _warnings(caplog)
    assert "6x slower" in line and "bf16-mixed" in line
    run = tracking.setup(cfg.logger.tracking_uri, cfg.logger.experiment).get_run(run_id)
    tags = run.data.tags
    assert run.info.status == "FINISHED" and tags[tracking.TAG_ATTEMPTS] == "2"
    assert run.data.params["runtime.resolved_precision"] == "bf16-mixed"
    assert tags["attempt.1.precision"] == tags["attempt.2.precision"] == tags["precision"] == "bf16-mixed"
    assert tags["attempt.1.cpu_bf16"] == "avx512_bf16" and tags["attempt.2.cpu_bf16"] == "none"
    assert tags["attempt.2.cpu"] == precision.cpu_name() and tags["hardware.cpu_cores"].isdigit()
    assert "hardware.gpu" in tags and "kept from" in tags["precision.how"]


def test_an_explicit_precision_switches_a_resumed_run_and_records_the_switch(tmp_path, pretrain_cfg, stop_at,
                                                                            cpu_with, caplog):
    from electra_ablate.training.pretraining import train

    seen = Precisions()
    cfg = _stopped_bf16_run(tmp_path, pretrain_cfg, stop_at, cpu_with, seen)
    cpu_with(AVX2_ONLY)
    caplog.set_level(logging.INFO)
    fp32 = pretrain_cfg(tmp_path, "objective=bert", "trainer.max_steps=8", "trainer.checkpoint_every_n_steps=4",
                        "optim.warmup_steps=2", "runtime.precision=32-true")
    run_id = train(fp32, callbacks=[seen])
    assert seen.seen == ["bf16-mixed", "32-true"] and not _warnings(caplog)
    tags = tracking.setup(cfg.logger.tracking_uri, cfg.logger.experiment).get_run(run_id).data.tags
    assert (tags["attempt.1.precision"], tags["attempt.2.precision"], tags["precision"]) == \
        ("bf16-mixed", "32-true", "32-true")
    assert "switched from bf16-mixed" in tags["precision.how"]
