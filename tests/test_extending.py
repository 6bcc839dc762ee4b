"""Adding an objective or a sharing mode takes one module and one config file, nothing in the package:
a toy of each (tests/toy_variants.py, tests/toy_conf/) is found through Hydra's search path, checked,
counted and pre-trained like the paper's own."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from electra_ablate.common.cli import CONF_DIR
from electra_ablate.common.variants import option_class, options
from electra_ablate.models import flops
from electra_ablate.training import checks
from electra_ablate.training.pretraining import train

TOY_CONF = Path(__file__).resolve().parent / "toy_conf"
SEARCHPATH = f"hydra.searchpath=[file://{TOY_CONF}]"


def history(tmp: Path, run_id: str) -> tuple:
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    run = client.get_run(run_id)
    return run, {k: {m.step: m.value for m in client.get_metric_history(run_id, k)} for k in run.data.metrics}


def test_a_toy_objective_from_outside_the_package_pretrains(tmp_path, pretrain_cfg):
    cfg = pretrain_cfg(tmp_path, SEARCHPATH, "objective=shuffled", "trainer.max_steps=6", "optim.warmup_steps=2",
                       "logger.log_every_n_steps=3")
    run, hist = history(tmp_path, train(cfg))
    assert run.info.status == "FINISHED" and run.data.tags["objective"] == "shuffled"
    assert set(hist["train/disc_loss"]) == {3, 6} and 0 < hist["train/replaced_fraction"][6] < 0.2
    # FLOPs come from the class's own heads: one discriminator, no generator.
    per_step = hist["flops/total"][6] / 6
    assert per_step == pytest.approx(flops.pretrain_flops_per_step(
        run_config(cfg), None, flops.Heads("disc", 1.0, generator=False), cfg.data.batch_size, cfg.data.max_seq_length))


def test_a_toy_sharing_mode_ties_what_it_says_and_pretrains(tmp_path, pretrain_cfg):
    from toy_variants import PositionSharing

    cfg = pretrain_cfg(tmp_path, SEARCHPATH, "sharing=positions", "trainer.max_steps=4", "optim.warmup_steps=2",
                       "logger.log_every_n_steps=2")
    seen = {}

    class Look(__import__("pytorch_lightning").Callback):
        def on_train_start(self, trainer, pl_module):
            g, m = pl_module.generator.electra.embeddings, pl_module.model.electra.embeddings
            seen["positions"] = g.position_embeddings.weight is m.position_embeddings.weight
            seen["words"] = g.word_embeddings.weight is m.word_embeddings.weight

    run, _ = history(tmp_path, train(cfg, callbacks=[Look()]))
    assert run.info.status == "FINISHED" and run.data.tags["sharing"] == "positions"
    assert seen == {"positions": True, "words": False}
    assert PositionSharing.shares_weights  # so two-stage training refuses it, with no code naming it
    bad = pretrain_cfg(tmp_path, SEARCHPATH, "sharing=positions", "algorithm=two_stage", "generator.hidden_size=1.0")
    with pytest.raises(checks.ConfigError, match="sharing=positions would undo"):
        checks.validate(bad)


# Every option of every variant group, found in conf/ (a new variant is checked here without editing this file).
GROUPS = ("objective", "sharing", "generator", "algorithm", "weighting")
OPTIONS = [(group, option) for group in GROUPS for option in options(CONF_DIR, group)]


@pytest.mark.parametrize("group, option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_variant_describes_itself(tmp_path, pretrain_cfg, group, option):
    """Its class says how the report shows it, and its name is its file's (no YAML repeats it)."""
    cls = option_class(CONF_DIR, group, option)
    assert cls is not None and cls.display_name and cls.paper, f"{group}={option}: display_name and paper"
    assert "name:" not in (CONF_DIR / group / f"{option}.yaml").read_text().replace("display_name:", "")
    cfg = pretrain_cfg(tmp_path, f"{group}={option}")
    if "name" in cfg[group]:
        assert cfg[group].name == option
    try:
        checks.validate(cfg)
    except checks.ConfigError as e:  # a combination the defaults rule out must say which key to change
        assert "=" in str(e)


def test_a_toy_variant_is_named_after_its_file_and_labelled_by_its_class(tmp_path, pretrain_cfg):
    from electra_ablate.report.markdown import _variant_name
    from electra_ablate.sweep.spec import Variant

    cfg = pretrain_cfg(tmp_path, SEARCHPATH, "objective=shuffled", "sharing=positions")
    assert (cfg.objective.name, cfg.sharing.name) == ("shuffled", "positions")
    assert cfg.run_name.startswith("shuffled-positions-")
    electra = Variant("electra", {"objective": "electra", "sharing": "embeddings"}, {})
    assert _variant_name(electra, None) == "electra (ELECTRA, shared embeddings)"


def run_config(cfg):
    from electra_ablate.training.build import discriminator_config

    return discriminator_config(cfg, cfg.data.train_vocab_size, 0)
