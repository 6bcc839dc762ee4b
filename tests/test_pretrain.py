"""Pre-training end to end on the real Wikipedia sample: every objective learns, runs resume exactly,
finished runs are found again, and bad configs fail before compute with one clear message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from mlflow.tracking import MlflowClient

from electra_ablate import pretrain
from electra_ablate.checkpoint import load_pretrained
from electra_ablate.system import TrainingError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"

# A model small enough for hundreds of CPU steps: 2 layers, hidden 64, sequences of 64.
TINY = [
    "model=tiny",
    "model.hidden_size=64",
    "model.embedding_size=32",
    "model.num_hidden_layers=2",
    "model.num_attention_heads=2",
    "model.intermediate_size=128",
    "model.generator_fraction=0.5",
    "data.max_seq_length=64",
    "data.batch_size=16",
    "data.max_docs=400",
    "data.train_vocab_size=2000",  # a small WordPiece vocabulary trained on the sample: fast output layers
    "runtime.num_workers=0",
    "trainer.enable_progress_bar=false",
    "optim.lr=2e-3",
    "optim.warmup_steps=10",
]


def compose_cfg(tmp: Path, data_dir: Path, *overrides: str, cache: Path | None = None):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(
            "pretrain",
            overrides=[
                *TINY,
                f"paths.root_dir={tmp}",
                f"paths.data_dir={data_dir}",
                f"paths.output_dir={tmp}/run",
                f"paths.cache_dir={cache or tmp / 'cache'}",
                f"logger.tracking_uri=sqlite:///{tmp}/mlflow.db",
                *overrides,
            ],
        )


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("token_cache")  # one tokenized corpus for the whole module


def losses(tmp: Path, run_id: str) -> dict[int, float]:
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    return {m.step: m.value for m in client.get_metric_history(run_id, "train/loss")}


@pytest.mark.parametrize("objective", ["bert", "electra", "electra_15", "replace_mlm", "all_tokens_mlm"])
def test_every_objective_lowers_its_loss_on_real_text(tmp_path, data_dir, cache_dir, objective):
    cfg = compose_cfg(tmp_path, data_dir, f"objective={objective}", "trainer.max_steps=100",
                      "logger.log_every_n_steps=25", cache=cache_dir)
    run_id = pretrain.train(cfg)
    hist = losses(tmp_path, run_id)
    assert sorted(hist) == [25, 50, 75, 100]
    assert hist[100] < 0.92 * hist[25], f"{objective}: loss did not fall: {hist}"

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["objective"] == objective and run.data.tags["kind"] == "pretrain"
    expected = {"train/loss", "train/mlm_loss", "train/masked_lm_accuracy", "train/tokens_per_s", "train/lr",
                "train/flops", "flops/total"}
    if objective in ("electra", "electra_15"):
        expected |= {"train/disc_loss", "train/disc_accuracy", "train/disc_precision", "train/disc_recall",
                     "train/disc_auc", "train/replaced_fraction", "train/sampled_masked_lm_accuracy"}
    assert expected <= set(run.data.metrics), expected - set(run.data.metrics)
    assert run.data.params["objective.name"] == objective

    # The fine-tunable network is saved where the tag says, with its heads and vocabulary.
    net, info = load_pretrained(run.data.tags["checkpoint_path"])
    assert info["objective"] == objective and info["step"] == 100
    assert net.has_disc_head == (objective in ("electra", "electra_15", "all_tokens_mlm"))
    assert (Path(run.data.tags["checkpoint_path"]) / "vocab.txt").is_file()


class StopAt(pl.Callback):
    """Simulates a crash right after a given step."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError("simulated crash")


def test_interrupted_run_resumes_with_identical_losses(tmp_path, data_dir, cache_dir):
    common = ["objective=electra", "trainer.max_steps=24", "trainer.checkpoint_every_n_steps=8",
              "logger.log_every_n_steps=4", "trainer.export_fractions=[0.5]"]
    straight = tmp_path / "straight"
    cfg = compose_cfg(straight, data_dir, *common, cache=cache_dir)
    run_id = pretrain.train(cfg)
    expected = losses(straight, run_id)

    crashed = tmp_path / "crashed"
    cfg = compose_cfg(crashed, data_dir, *common, cache=cache_dir)
    with pytest.raises(RuntimeError, match="simulated crash"):
        pretrain.train(cfg, callbacks=[StopAt(13)])
    client = MlflowClient(f"sqlite:///{crashed}/mlflow.db")
    (failed,) = client.search_runs([client.get_experiment_by_name("electra-ablate").experiment_id])
    assert failed.info.status == "FAILED"

    resumed_id = pretrain.train(cfg)  # same config: picks up the interrupted run from step 8
    assert resumed_id == failed.info.run_id
    got = losses(crashed, resumed_id)
    assert sorted(got) == sorted(expected)
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=1e-5, abs=1e-6), (step, got, expected)
    tags = client.get_run(resumed_id).data.tags
    assert set(json.loads(tags["checkpoints"])) == {"12", "24"}


def test_a_finished_run_is_found_and_not_recomputed(tmp_path, data_dir, cache_dir):
    cfg = compose_cfg(tmp_path, data_dir, "objective=bert", "trainer.max_steps=3", cache=cache_dir)
    first = pretrain.train(cfg)
    again = compose_cfg(tmp_path, data_dir, "objective=bert", "trainer.max_steps=3", "runtime.num_workers=1",
                        cache=cache_dir)  # a speed-only setting does not change the run's identity
    assert pretrain.train(again) == first
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    assert len(client.search_runs([client.get_experiment_by_name("electra-ablate").experiment_id])) == 1


def test_sharing_all_with_unequal_sizes_fails_before_any_data_is_built(tmp_path, data_dir):
    cfg = compose_cfg(tmp_path, data_dir, "sharing=all", "generator.hidden_size=0.25")
    with pytest.raises(pretrain.ConfigError, match="generator.hidden_size=1.0"):
        pretrain.train(cfg)
    assert not (tmp_path / "cache").exists()


def test_sequence_longer_than_positions_is_rejected(tmp_path, data_dir):
    cfg = compose_cfg(tmp_path, data_dir, "data.max_seq_length=256")
    with pytest.raises(pretrain.ConfigError, match="max_position_embeddings"):
        pretrain.train(cfg)


def test_unknown_option_names_the_valid_ones(tmp_path, data_dir):
    with pytest.raises(ConfigCompositionException, match="electra_15"):
        compose_cfg(tmp_path, data_dir, "objective=electra_10")


def test_diverging_loss_stops_with_a_clear_message(tmp_path, data_dir, cache_dir):
    cfg = compose_cfg(tmp_path, data_dir, "objective=bert", "trainer.max_steps=50", "optim.lr=1e12",
                      "optim.warmup_steps=0", "optim.max_grad_norm=1e30", cache=cache_dir)
    with pytest.raises(TrainingError, match="training diverged. Lower optim.lr"):
        pretrain.train(cfg)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("electra-ablate").experiment_id])
    assert run.info.status == "FAILED"


def test_pretrained_networks_keep_their_generator(tmp_path, data_dir, cache_dir):
    cfg = compose_cfg(tmp_path, data_dir, "objective=electra", "sharing=embeddings", "trainer.max_steps=2",
                      cache=cache_dir)
    run_id = pretrain.train(cfg)
    path = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(run_id).data.tags["checkpoint_path"]
    disc, info = load_pretrained(path)
    gen, _ = load_pretrained(path, which="generator")
    assert info["generator"]["config"]["hidden_size"] == 32  # 0.5 x 64
    # sharing=embeddings: the saved generator carries the same embedding values as the discriminator.
    assert torch.equal(gen.electra.embeddings.word_embeddings.weight, disc.electra.embeddings.word_embeddings.weight)
