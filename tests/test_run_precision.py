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


# --- a sweep keeps one precision -----------------------------------------------------------------------------


def _tiny_checkpoint(tmp_path, data_dir):
    import torch

    from electra_ablate.models.checkpoint import save_pretrained
    from electra_ablate.models.encoder import ElectraForPretraining, EncoderConfig

    torch.manual_seed(0)
    vocab = data_dir / "vocab" / "bert-base-uncased-vocab.txt"
    config = EncoderConfig(vocab_size=len(vocab.read_text(encoding="utf-8").splitlines()), embedding_size=32,
                           hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                           max_position_embeddings=128)
    return save_pretrained(tmp_path / "pre", ElectraForPretraining(config, disc_head=True), vocab,
                           {"model_name": "tiny"})


def _sweep_context(tmp_path, data_dir):
    from electra_ablate.sweep import compose

    path = tmp_path / "onep.yaml"
    path.write_text(f"name: onep\nscript: electra_ablate.finetune\ntasks: [rte]\nseeds: [0, 1]\n"
                    f"variants:\n  tiny: {{pretrained: '{_tiny_checkpoint(tmp_path, data_dir)}'}}\n")
    paths = {"root_dir": str(tmp_path), "data_dir": str(data_dir), "output_root": str(tmp_path / "outputs"),
             "cache_dir": str(tmp_path / "outputs" / "cache")}
    tiny = ["runtime.num_workers=0", "trainer.enable_progress_bar=false", "glue_data.max_seq_length=64",
            "task.epochs=1", "glue_data.max_train_examples=16", "glue_data.max_eval_examples=8",
            "glue_data.batch_size=8"]
    return compose.make_context(path, None, paths, f"sqlite:///{tmp_path}/mlflow.db", finetune_overrides=tiny)


def _launch_on(ctx, requested: str, seed: int):
    """Launch the sweep as its runner does (its record, its precision), then run its fine-tuning job of `seed` in
    this process, composed from the generated config as the multirun composes it; returns the job's run."""
    from electra_ablate.sweep.jobs import Checkpoint
    from electra_ablate.sweep.run import run_sweep
    from electra_ablate.finetuning import run as finetuning

    launched = {}

    def writer(job_ctx, client, report_dir, **_):
        ckpt = Checkpoint("tiny", None, None, None, True, None)
        job_ctx.write_finetune_config(ckpt)
        cfg = job_ctx.compose_finetune([job_ctx.searchpath, f"+sweep_checkpoint={ckpt.config_name}", "task=rte",
                                        f"seed={seed}"])
        finetuning.run(cfg)
        launched["cfg"] = cfg
        return report_dir / "onep.md"

    run_sweep(ctx, [], ["report"], ctx.workdir / "reports", False, "python -m electra_ablate.sweep", writer, requested)
    client = tracking.setup(ctx.tracking_uri, ctx.experiment)
    exp = client.get_experiment_by_name(ctx.experiment)
    (run,) = client.search_runs([exp.experiment_id], f"tags.kind = 'finetune' and tags.seed = '{seed}'")
    (record,) = client.search_runs([exp.experiment_id], "tags.kind = 'sweep'", max_results=1,
                                   order_by=["attributes.start_time DESC"])
    return launched["cfg"], run, record


def test_a_sweeps_jobs_launched_on_two_machines_run_in_the_precision_of_its_first_launch(tmp_path, data_dir, cpu_with,
                                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    ctx = _sweep_context(tmp_path, data_dir)
    cpu_with(ZEN4)  # the first launch, where `auto` is bf16-mixed
    cfg, first, record = _launch_on(ctx, "auto", seed=0)
    assert cfg.runtime.precision == "bf16-mixed" and record.data.tags["precision"] == "bf16-mixed"
    assert record.data.tags["hardware.cpu_bf16"] == "avx512_bf16" and "hardware.gpu" in record.data.tags
    cpu_with(AVX2_ONLY)  # launched again elsewhere: `auto` would be fp32 here
    cfg, second, record = _launch_on(ctx, "auto", seed=1)
    assert cfg.runtime.precision == "bf16-mixed" and record.data.tags["precision"] == "bf16-mixed"
    assert "kept from the sweep's record" in record.data.tags["precision.how"]
    for run in (first, second):
        assert run.data.tags["attempt.1.precision"] == run.data.params["runtime.resolved_precision"] == "bf16-mixed"
    assert (first.data.tags["attempt.1.cpu_bf16"], second.data.tags["attempt.1.cpu_bf16"]) == ("avx512_bf16", "none")


def test_an_explicit_sweep_precision_switches_its_jobs_and_its_record_says_so(tmp_path, data_dir, cpu_with):
    from electra_ablate.sweep import precision as sweep_precision

    ctx = _sweep_context(tmp_path, data_dir)
    client = tracking.setup(ctx.tracking_uri, ctx.experiment)
    cpu_with(ZEN4)
    assert sweep_precision.choose(client, ctx, "auto").precision == "bf16-mixed"
    record = {"kind": "sweep", "sweep": "onep", "scale": ctx.spec.scale_name, "precision": "bf16-mixed"}
    tracking.RunLogger.start(client, ctx.experiment, "sweep", record).finish()
    cpu_with(AVX2_ONLY)
    kept = sweep_precision.choose(client, ctx, "auto")
    assert kept.precision == "bf16-mixed" and "6x slower" in kept.warning
    switched = sweep_precision.choose(client, ctx, "32-true")
    assert switched.precision == "32-true" and "switched from bf16-mixed" in switched.how and switched.warning is None


def test_a_runtime_precision_of_the_users_own_overrides_wins_for_its_phase_and_is_recorded(tmp_path, data_dir):
    import dataclasses

    from electra_ablate.sweep import precision as sweep_precision

    ctx = dataclasses.replace(_sweep_context(tmp_path, data_dir), pretrain_overrides=["runtime.precision=32-true"])
    applied, choice = sweep_precision.applied(ctx, attempts.Choice("bf16-mixed", "resolved"))
    assert applied.pretrain_overrides == ["runtime.precision=bf16-mixed", "runtime.precision=32-true"]
    assert applied.finetune_overrides[0] == "runtime.precision=bf16-mixed"
    assert applied.compose_finetune(["task=rte"]).runtime.precision == "bf16-mixed"
    assert "pretrain_overrides set runtime.precision=32-true" in choice.how


def test_a_finetuning_run_restarted_where_auto_means_fp32_keeps_bf16(tmp_path, data_dir, cpu_with, monkeypatch, caplog):
    from hydra import compose, initialize_config_dir

    from electra_ablate.sweep.spec import CONF_DIR
    from electra_ablate.finetuning import run as finetuning

    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is ./mlruns
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("finetune", overrides=[
            f"paths.root_dir={tmp_path}", f"paths.data_dir={data_dir}", f"paths.output_root={tmp_path}/outputs",
            f"paths.output_dir={tmp_path}/run", f"logger.tracking_uri={uri}", "runtime.num_workers=0",
            "trainer.enable_progress_bar=false", "glue_data.max_seq_length=64", "task=rte", "task.epochs=1",
            "glue_data.max_train_examples=16", "glue_data.max_eval_examples=8", "glue_data.batch_size=8",
            f"pretrained={_tiny_checkpoint(tmp_path, data_dir)}", "runtime.precision=auto"])
    fit, trained_in = finetuning._fit, []

    def crash(*args):
        trained_in.append(args[-1])
        raise RuntimeError("simulated crash")

    cpu_with(ZEN4)
    monkeypatch.setattr(finetuning, "_fit", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        finetuning.run(cfg)
    monkeypatch.setattr(finetuning, "_fit", lambda *args: trained_in.append(args[-1]) or fit(*args))
    cpu_with(AVX2_ONLY)
    caplog.set_level(logging.INFO)
    finetuning.run(cfg)
    assert trained_in == ["bf16-mixed", "bf16-mixed"] and len(_warnings(caplog)) == 1
    client = tracking.setup(uri, cfg.logger.experiment)
    (run,) = client.search_runs([client.get_experiment_by_name(cfg.logger.experiment).experiment_id])
    tags = run.data.tags
    assert run.info.status == "FINISHED" and tags[tracking.TAG_ATTEMPTS] == "2"
    assert (tags["attempt.1.precision"], tags["attempt.2.precision"]) == ("bf16-mixed", "bf16-mixed")
    assert (tags["attempt.1.cpu_bf16"], tags["attempt.2.cpu_bf16"]) == ("avx512_bf16", "none")
