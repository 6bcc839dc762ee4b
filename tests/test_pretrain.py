"""Pre-training end to end on the tiny hermetic corpus (conftest): every objective learns, runs resume exactly,
finished runs are found again, and bad configs fail before compute with one clear message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException
from mlflow.tracking import MlflowClient

from electra_ablate import pretrain
from electra_ablate.common.variants import option_class, options
from electra_ablate.models.checkpoint import MODEL_NAME, load_pretrained
from electra_ablate.training.system import TrainingError
from electra_ablate.training import checks
from electra_ablate.common.cli import CONF_DIR








def losses(tmp: Path, run_id: str) -> dict[int, float]:
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    return {m.step: m.value for m in client.get_metric_history(run_id, "train/loss")}


@pytest.mark.parametrize("objective", options(CONF_DIR, "objective"))  # every option: a new one is tested here
def test_every_objective_lowers_its_loss_on_text(tmp_path, pretrain_cfg, objective):
    cls = option_class(CONF_DIR, "objective", objective)
    cfg = pretrain_cfg(tmp_path, f"objective={objective}", "trainer.max_steps=100",
                      "logger.log_every_n_steps=25")
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
    if cls.detects_replacements:
        expected |= {"train/disc_loss", "train/disc_accuracy", "train/disc_precision", "train/disc_recall",
                     "train/disc_auc", "train/replaced_fraction", "train/sampled_masked_lm_accuracy"}
    assert expected <= set(run.data.metrics), expected - set(run.data.metrics)
    # The network that sees [MASK] (BERT's encoder, or the generator) has its accuracy split by input.
    assert {f"masked_lm_accuracy_at_{part}" for part in ("mask", "kept")} <= {
        k.split("/")[1].removeprefix("gen_") for k in run.data.metrics}
    assert run.data.params["objective.name"] == objective

    # The fine-tunable network is saved where the tag says, with its heads and vocabulary.
    net, info = load_pretrained(run.data.tags["checkpoint_path"])
    assert info["objective"] == objective and info["step"] == 100
    assert net.has_disc_head == cls.model_heads.get("disc_head", False)
    assert (Path(run.data.tags["checkpoint_path"]) / "vocab.txt").is_file()


def test_interrupted_run_resumes_with_identical_losses(tmp_path, pretrain_cfg, stop_at):
    common = ["objective=electra", "trainer.max_steps=24", "trainer.checkpoint_every_n_steps=8",
              "logger.log_every_n_steps=4", "trainer.export_fractions=[0.5]"]
    straight = tmp_path / "straight"
    cfg = pretrain_cfg(straight, *common)
    run_id = pretrain.train(cfg)
    expected = losses(straight, run_id)

    crashed = tmp_path / "crashed"
    cfg = pretrain_cfg(crashed, *common)
    with pytest.raises(RuntimeError, match="simulated crash"):
        pretrain.train(cfg, callbacks=[stop_at(13)])
    client = MlflowClient(f"sqlite:///{crashed}/mlflow.db")
    (failed,) = client.search_runs([client.get_experiment_by_name("electra-ablate").experiment_id])
    assert failed.info.status == "FAILED"
    exported = Path(json.loads(failed.data.tags["checkpoints"])["12"])  # saved at step 12, before the crash at 13
    before = (exported / MODEL_NAME).stat().st_mtime_ns

    resumed_id = pretrain.train(cfg)  # same config: picks up the interrupted run from step 8
    assert resumed_id == failed.info.run_id
    got = losses(crashed, resumed_id)
    assert sorted(got) == sorted(expected)
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=1e-5, abs=1e-6), (step, got, expected)
    tags = client.get_run(resumed_id).data.tags
    assert set(json.loads(tags["checkpoints"])) == {"12", "24"}
    # Passing step 12 again, the resumed run kept the export it had made (it may be fine-tuned meanwhile); the
    # steps it recomputed give the same weights.
    assert json.loads(tags["checkpoints"])["12"] == str(exported)
    assert (exported / MODEL_NAME).stat().st_mtime_ns == before
    straight_12 = json.loads(MlflowClient(f"sqlite:///{straight}/mlflow.db").get_run(run_id).data.tags["checkpoints"])["12"]
    kept, reference = load_pretrained(exported)[0].state_dict(), load_pretrained(straight_12)[0].state_dict()
    assert all(torch.allclose(kept[k], reference[k], rtol=1e-5, atol=1e-6) for k in reference)


def test_a_listed_export_is_found_where_its_folder_is_now(tmp_path):
    from electra_ablate.training.run_folder import located, read_exports, write_exports

    old, now = tmp_path / "old" / "run", tmp_path / "new" / "run"
    (old / "pretrained" / "step_2").mkdir(parents=True)
    (now / "pretrained" / "step_4").mkdir(parents=True)
    assert located(now, "pretrained/step_4") == now / "pretrained" / "step_4"
    assert located(now, str(old / "pretrained" / "step_2")) == old / "pretrained" / "step_2"  # still there: as it is
    assert located(now, str(tmp_path / "gone" / "run" / "pretrained" / "step_4")) == now / "pretrained" / "step_4"
    assert located(now, "/gone/pretrained/step_8") == Path("/gone/pretrained/step_8")  # nowhere: as recorded
    write_exports(now, {"4": now / "pretrained" / "step_4", "2": old / "pretrained" / "step_2"})
    assert json.loads((now / "checkpoints.json").read_text()) == {"2": str(old / "pretrained" / "step_2"),
                                                                  "4": "pretrained/step_4"}
    assert read_exports(now) == {"2": old / "pretrained" / "step_2", "4": now / "pretrained" / "step_4"}


@pytest.mark.parametrize("listing", ["relative", "absolute"])
def test_a_moved_store_finds_its_exports(tmp_path, pretrain_cfg, stop_at, listing):
    """checkpoints.json names the exports relative to the run's folder: a store moved to another folder (outputs
    and MLflow database) resumes keeping the export it had made, and once finished is found finished there, its tags
    naming where the exports are now. A listing written before, of absolute paths, is read by their tails."""
    common = ["objective=bert", "trainer.max_steps=8", "trainer.checkpoint_every_n_steps=4", "optim.warmup_steps=1",
              "logger.log_every_n_steps=2", "trainer.export_fractions=[0.5]"]
    first = tmp_path / "first"
    with pytest.raises(RuntimeError, match="simulated crash"):
        pretrain.train(pretrain_cfg(first, *common), callbacks=[stop_at(5)])  # exported and checkpointed at step 4
    (listed,) = (first / "outputs").glob("pretrain/*/*/checkpoints.json")
    assert json.loads(listed.read_text()) == {"4": "pretrained/step_4"}
    if listing == "absolute":
        listed.write_text(json.dumps({"4": str(listed.parent / "pretrained" / "step_4")}))
    moved = tmp_path / "moved"
    first.rename(moved)
    (store,) = (moved / "outputs").glob("pretrain/*/*")
    exported = store / "pretrained" / "step_4" / MODEL_NAME
    before = exported.stat().st_mtime_ns

    run_id = pretrain.train(pretrain_cfg(moved, *common))
    assert exported.stat().st_mtime_ns == before  # found where it is now, and kept
    assert json.loads((store / "checkpoints.json").read_text()) == {"4": "pretrained/step_4", "8": "pretrained/final"}
    tags = MlflowClient(f"sqlite:///{moved}/mlflow.db").get_run(run_id).data.tags
    assert json.loads(tags["checkpoints"]) == {"4": str(store / "pretrained" / "step_4"),
                                               "8": str(store / "pretrained" / "final")}

    again = tmp_path / "again"
    moved.rename(again)
    store = again / store.relative_to(moved)
    final = (store / "pretrained" / "final" / MODEL_NAME).stat().st_mtime_ns
    assert pretrain.train(pretrain_cfg(again, *common)) == run_id
    assert (store / "pretrained" / "final" / MODEL_NAME).stat().st_mtime_ns == final  # found finished: not trained again
    run = MlflowClient(f"sqlite:///{again}/mlflow.db").get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["store"] == str(store)
    assert run.data.tags["checkpoint_path"] == str(store / "pretrained" / "final")
    assert json.loads(run.data.tags["checkpoints"])["4"] == str(store / "pretrained" / "step_4")


def test_a_finished_run_is_found_and_not_recomputed(tmp_path, pretrain_cfg):
    cfg = pretrain_cfg(tmp_path, "objective=bert", "trainer.max_steps=3", "optim.warmup_steps=1")
    first = pretrain.train(cfg)
    again = pretrain_cfg(tmp_path, "objective=bert", "trainer.max_steps=3", "optim.warmup_steps=1", "runtime.num_workers=1")  # a speed-only setting does not change the run's identity
    assert pretrain.train(again) == first
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    assert len(client.search_runs([client.get_experiment_by_name("electra-ablate").experiment_id])) == 1


def test_sharing_all_with_unequal_sizes_fails_before_any_data_is_built(tmp_path, pretrain_cfg):
    cfg = pretrain_cfg(tmp_path, "sharing=all", "generator.hidden_size=0.25", f"paths.cache_dir={tmp_path}/cache")
    with pytest.raises(checks.ConfigError, match="generator.hidden_size=1.0"):
        pretrain.train(cfg)
    assert not (tmp_path / "cache").exists()


def test_sequence_longer_than_positions_is_rejected(tmp_path, pretrain_cfg):
    cfg = pretrain_cfg(tmp_path, "data.max_seq_length=256")
    with pytest.raises(checks.ConfigError, match="max_position_embeddings"):
        pretrain.train(cfg)


def test_unknown_option_names_the_valid_ones(tmp_path, pretrain_cfg):
    with pytest.raises(ConfigCompositionException, match="electra_15"):
        pretrain_cfg(tmp_path, "objective=electra_10")


def test_diverging_loss_stops_with_a_clear_message(tmp_path, pretrain_cfg):
    cfg = pretrain_cfg(tmp_path, "objective=bert", "trainer.max_steps=50", "optim.lr=1e12",
                      "optim.warmup_steps=0", "optim.max_grad_norm=1e30")
    with pytest.raises(TrainingError, match=r"loss is nan at step 2: training diverged. Recent train/loss values: step 1: .*optim.lr=1000000000000.0"):
        pretrain.train(cfg)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("electra-ablate").experiment_id])
    assert run.info.status == "FAILED"


def test_pretrained_networks_keep_their_generator(tmp_path, pretrain_cfg):
    cfg = pretrain_cfg(tmp_path, "objective=electra", "sharing=embeddings", "trainer.max_steps=2", "optim.warmup_steps=1")
    run_id = pretrain.train(cfg)
    path = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(run_id).data.tags["checkpoint_path"]
    disc, info = load_pretrained(path)
    gen, _ = load_pretrained(path, which="generator")
    assert info["generator"]["config"]["hidden_size"] == 32  # 0.5 x 64
    # sharing=embeddings: the saved generator carries the same embedding values as the discriminator.
    assert torch.equal(gen.electra.embeddings.word_embeddings.weight, disc.electra.embeddings.word_embeddings.weight)


def test_a_seed_the_sweep_did_not_plan_for_the_variant_ends_with_no_run(tmp_path, pretrain_cfg):
    cfg = pretrain_cfg(tmp_path, "objective=bert", "trainer.max_steps=2", "optim.warmup_steps=0", "sweep.variant=long", "sweep.seeds=[0]",
                       "seed=1")
    assert pretrain.train(cfg) is None
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    assert not [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert not (tmp_path / "outputs" / "pretrain").exists()
    cfg = pretrain_cfg(tmp_path, "objective=bert", "trainer.max_steps=2", "optim.warmup_steps=0", "sweep.variant=long", "sweep.seeds=[0]",
                       "seed=0")
    assert pretrain.train(cfg) is not None  # the planned seed trains
