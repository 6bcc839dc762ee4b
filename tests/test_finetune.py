"""Fine-tuning: the real Hydra config with tiny overrides, end to end into a temporary MLflow store (tags,
per-epoch and final metrics, predictions), skip-if-done, layer-wise learning rates by hand, the protocol's
size defaults, the checkpoint sources, and bad input that must fail before anything is recorded."""

from __future__ import annotations

import ast
import csv
import json
import os
import re
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException

from electra_ablate.finetuning import run as finetuning
from electra_ablate.finetuning import source as finetune_source
from electra_ablate.glue import readers as glue_readers
from electra_ablate.glue import tasks as glue
from electra_ablate.tracking import identity
from electra_ablate.tracking import runs as tracking
from electra_ablate.models.checkpoint import save_pretrained
from electra_ablate.finetuning.system import FinetuneSystem, OptimSettings, layerwise_param_groups, pool
from electra_ablate.models.encoder import ElectraForPretraining, ElectraModel, EncoderConfig

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "glue"
DATA = Path(os.environ["ELECTRA_ABLATE_DATA"])  # conftest: the tiny hermetic data folder
VOCAB = DATA / "vocab" / "bert-base-uncased-vocab.txt"

# A 2-layer, 32-wide encoder over the tiny data's BERT-layout vocabulary (the real tokenizer, few rows).
VOCAB_SIZE = len(VOCAB.read_text(encoding="utf-8").splitlines())
TINY = EncoderConfig(vocab_size=VOCAB_SIZE, embedding_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
TINY_MODEL = ["model.embedding_size=32", "model.hidden_size=32", "model.num_hidden_layers=2",
              "model.num_attention_heads=2", "model.intermediate_size=64"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One SQLite store for the module (creating one costs seconds); each test uses its own experiment."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root}/mlflow.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)  # MLflow's default artifact root is ./mlruns: keep it out of the checkout
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        client = tracking.setup(uri, "warmup")
    return client, uri


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the config's store, not the environment's
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is ./mlruns


def config(tmp_path: Path, uri: str, experiment: str, *overrides: str):
    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        return compose("finetune", overrides=[
            f"paths.root_dir={REPO}", f"paths.data_dir={DATA}", f"paths.output_root={tmp_path}/outputs",
            f"paths.output_dir={tmp_path}/run", f"logger.tracking_uri={uri}", f"logger.experiment={experiment}",
            "runtime.num_workers=0", "trainer.enable_progress_bar=false", "glue_data.max_seq_length=64", *overrides,
        ])


def save_tiny(directory: Path, config: EncoderConfig = TINY, vocab: Path = VOCAB, **meta) -> Path:
    torch.manual_seed(0)
    return save_pretrained(directory, ElectraForPretraining(config, disc_head=True), vocab, meta)


def runs_of(client, experiment: str):
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id])


def glue_dir_with(tmp_path: Path, *dir_names: str) -> Path:
    root = tmp_path / "glue"
    for name in dir_names:
        shutil.copytree(FIXTURES / name, root / name)
    return root


# --- end to end -----------------------------------------------------------------------------------------


def test_finetune_from_a_pretraining_run_records_everything_and_is_not_repeated(store, tmp_path, monkeypatch, capsys):
    client, uri = store
    exp = "e2e"
    tracking.setup(uri, exp)
    pre = tracking.RunLogger.start(client, exp, "electra-tiny", {"kind": "pretrain", "sweep": "table5", "variant": "electra"})
    final = save_tiny(tmp_path / "pre" / "final", run_id=pre.run_id, step=200, model_name="tiny")
    step100 = save_tiny(tmp_path / "pre" / "step_100", run_id=pre.run_id, step=100, model_name="tiny")
    pre.set_tags({"checkpoint_path": str(final), "checkpoints": json.dumps({"100": str(step100), "200": str(final)})})
    pre.finish()

    cfg = config(tmp_path, uri, exp, f"pretrained={pre.run_id}", "task=sst2", "seed=3", "task.epochs=2",
                 "glue_data.max_train_examples=64", "glue_data.max_eval_examples=48", "glue_data.batch_size=16")
    score = finetuning.run(cfg)

    (run,) = [r for r in runs_of(client, exp) if r.data.tags["kind"] == "finetune"]
    tags, metrics, params = run.data.tags, run.data.metrics, run.data.params
    assert run.info.status == "FINISHED"
    assert {k: tags[k] for k in ("kind", "task", "seed", "pretrain_run_id", "mlflow.parentRunId", "pretrained_step",
                                 "sweep", "variant", "model")} == {
        "kind": "finetune", "task": "sst2", "seed": "3", "pretrain_run_id": pre.run_id,
        "mlflow.parentRunId": pre.run_id, "pretrained_step": "200", "sweep": "table5", "variant": "electra",
        "model": "tiny"}
    assert tags["config_hash"] == tracking.config_hash(finetuning.run_identity(cfg, cfg.task, pre.run_id))
    # Protocol defaults for a small model (paper Table 7), and the first 64 training rows.
    assert (params["resolved.size"], params["resolved.lr"], params["resolved.layerwise_lr_decay"],
            params["resolved.train_examples"]) == ("small", "0.0003", "0.8", "64")
    # The reference's update and loss (model/optimization.py, run_finetuning.py), recorded with every run.
    assert (params["finetune_optim.bias_correction"], params["finetune_optim.loss_reduction"]) == ("False", "sum")

    history = client.get_metric_history(run.info.run_id, "dev/accuracy")
    assert [m.step for m in history] == [1, 2]
    values = [m.value for m in history]
    assert metrics["final/accuracy"] == values[-1]
    assert metrics["best/accuracy"] == max(values) and metrics["best_epoch"] == int(np.argmax(values)) + 1
    assert metrics["final/score"] == pytest.approx(100 * values[-1]) and score == metrics["final/score"]
    assert client.get_metric_history(run.info.run_id, "train/loss")

    # The predictions artifact, checked against the dev labels: it must reproduce the logged accuracy.
    local = client.download_artifacts(run.info.run_id, "predictions/dev_predictions.tsv", str(tmp_path))
    with open(local, newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert rows[0] == ["split", "index", "label", "prediction"] and len(rows) == 49
    gold = glue_readers.read_tsv(glue.TASKS["sst2"], DATA / "glue", "dev")[:48]
    assert [int(r[2]) for r in rows[1:]] == [e.label for e in gold] and [int(r[1]) for r in rows[1:]] == list(range(48))
    assert np.mean([r[2] == r[3] for r in rows[1:]]) == pytest.approx(metrics["final/accuracy"])

    # Skip-if-done: the same config again trains nothing and returns the stored result ...
    monkeypatch.setattr(finetuning, "train_task", lambda *a, **k: pytest.fail("trained a finished run again"))
    assert finetuning.run(cfg) == score
    assert "already done in FINISHED run " + run.info.run_id in capsys.readouterr().out
    # ... and so does task=glue for its SST-2 member (a member hashes like task=sst2).
    only_sst2 = tmp_path / "glue_sst2"
    (only_sst2 / "SST-2").mkdir(parents=True)
    for split in ("train", "dev"):
        (only_sst2 / "SST-2" / f"{split}.tsv").symlink_to(DATA / "glue" / "SST-2" / f"{split}.tsv")
    glue_cfg = config(tmp_path, uri, exp, f"pretrained={pre.run_id}", "task=glue", "seed=3", "task.members.sst2.epochs=2",
                      "glue_data.max_train_examples=64", "glue_data.max_eval_examples=48", "glue_data.batch_size=16",
                      f"glue_data.dir={only_sst2}")
    assert finetuning.run(glue_cfg) == pytest.approx(score)
    assert len(runs_of(client, exp)) == 2  # the pre-training run and one fine-tuning run

    # The intermediate checkpoints of the same run are reachable by step.
    assert finetune_source.checkpoint_of_run(client, pre.run_id, 100) == step100
    with pytest.raises(finetune_source.FinetuneError, match=r"pretrained_step=50: run .* has no checkpoint at that step; it has steps \[100, 200\]"):
        finetune_source.checkpoint_of_run(client, pre.run_id, 50)


def test_glue_from_random_init_runs_each_available_task(store, tmp_path):
    client, uri = store
    exp = "glue-none"
    glue_dir = glue_dir_with(tmp_path, "MNLI", "STS-B")
    # STS-B: 6 doubled rows in batches of 4 = 2 steps an epoch; max_steps=3 stops it inside epoch 2.
    cfg = config(tmp_path, uri, exp, "pretrained=none", "task=glue", f"glue_data.dir={glue_dir}", "glue_data.batch_size=4",
                 "task.members.mnli.epochs=1", "task.members.stsb.epochs=5", "trainer.max_steps=3",
                 "logger.log_every_n_steps=1", *TINY_MODEL)
    score = finetuning.run(cfg)

    runs = {r.data.tags["task"]: r for r in runs_of(client, exp)}
    assert set(runs) == {"mnli", "stsb"} and all(r.info.status == "FINISHED" for r in runs.values())
    mnli, stsb = runs["mnli"].data, runs["stsb"].data
    assert {"dev/accuracy", "dev/mismatched_accuracy", "final/mismatched_accuracy", "final/score"} <= set(mnli.metrics)
    assert {"dev/spearman", "dev/pearson", "final/spearman", "final/score"} <= set(stsb.metrics)
    assert stsb.metrics["final/score"] == pytest.approx(100 * stsb.metrics["final/spearman"])
    assert stsb.params["resolved.train_examples"] == "6"  # 3 rows, doubled by swapping the pair
    assert mnli.params["resolved.train_examples"] == "4"
    assert (mnli.tags["pretrain_run_id"], mnli.tags["pretrained_step"], "mlflow.parentRunId" in mnli.tags) == ("none", "0", False)
    assert score == pytest.approx(np.mean([mnli.metrics["final/score"], stsb.metrics["final/score"]]))
    steps = {t: [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")] for t, r in runs.items()}
    assert steps == {"mnli": [1], "stsb": [1, 2, 3]}
    assert [m.step for m in client.get_metric_history(runs["stsb"].info.run_id, "dev/spearman")] == [1, 2]  # epoch 1, then the stop
    local = client.download_artifacts(runs["mnli"].info.run_id, "predictions/dev_predictions.tsv", str(tmp_path))
    splits = [line.split("\t")[0] for line in Path(local).read_text().splitlines()[1:]]
    assert splits == ["dev_matched"] * 3 + ["dev_mismatched"] * 4


def test_random_init_takes_shape_and_vocabulary_from_the_checkpoint_and_fresh_weights(store, tmp_path, monkeypatch):
    client, uri = store
    exp = "random-init"
    tracking.setup(uri, exp)
    pre = {}
    for seed in (0, 1):
        run = tracking.RunLogger.start(client, exp, f"electra-s{seed}", {"kind": "pretrain", "seed": str(seed)})
        final = save_tiny(tmp_path / f"pre{seed}" / "final", run_id=run.run_id, step=10, model_name="tiny")
        run.set_tags({"checkpoint_path": str(final)})
        run.finish()
        pre[seed] = run.run_id
    saved, _ = finetune_source.load_pretrained(tmp_path / "pre0" / "final")

    def encoder(seed: int, run_id: str, random_init: bool):
        cfg = config(tmp_path, uri, exp, f"pretrained={run_id}", f"random_init={random_init}", f"seed={seed}")
        pretrained = finetune_source.resolve_pretrained(cfg, client)
        assert pretrained.config.vocab_size == TINY.vocab_size and pretrained.vocab_file.parent.name == "final"
        return pretrained.make_encoder().state_dict()

    same = encoder(0, pre[0], False)
    assert all(torch.equal(same[k], v) for k, v in saved.electra.state_dict().items())
    fresh = encoder(0, pre[0], True)
    assert set(fresh) == set(same) and not torch.equal(fresh["embeddings.word_embeddings.weight"],
                                                        same["embeddings.word_embeddings.weight"])
    std = fresh["encoder.layer.0.attention.self.query.weight"].std().item()
    assert 0.018 < std < 0.022  # the pre-training init, N(0, 0.02)
    # Reproducible from (seed, pre-training seed); a different fine-tuning seed or pre-training run draws anew.
    assert torch.equal(encoder(0, pre[0], True)["embeddings.word_embeddings.weight"], fresh["embeddings.word_embeddings.weight"])
    for seed, run_id in ((1, pre[0]), (0, pre[1])):
        assert not torch.equal(encoder(seed, run_id, True)["embeddings.word_embeddings.weight"],
                               fresh["embeddings.word_embeddings.weight"])

    # A run: its own identity, tagged, not nested under the pre-training run whose weights it does not use.
    overrides = ["task=rte", "glue_data.max_train_examples=16", "glue_data.max_eval_examples=16", "task.epochs=1"]
    finetuning.run(config(tmp_path, uri, exp, f"pretrained={pre[0]}", "random_init=true", *overrides))
    finetuning.run(config(tmp_path, uri, exp, f"pretrained={pre[0]}", *overrides))
    ft = {r.data.tags["random_init"]: r for r in runs_of(client, exp) if r.data.tags["kind"] == "finetune"}
    assert set(ft) == {"true", "false"} and ft["true"].data.tags["config_hash"] != ft["false"].data.tags["config_hash"]
    assert "mlflow.parentRunId" not in ft["true"].data.tags and ft["false"].data.tags["mlflow.parentRunId"] == pre[0]
    assert ft["true"].data.tags["pretrain_run_id"] == pre[0]
    with pytest.raises(finetune_source.FinetuneError, match="random_init=true takes its architecture"):
        finetuning.run(config(tmp_path, uri, exp, "pretrained=none", "random_init=true", *overrides))


def test_a_random_init_run_is_the_same_run_whichever_checkpoint_of_its_run_lends_the_shape(store, tmp_path,
                                                                                          monkeypatch, capsys):
    """A long run's random-init arm is fine-tuned from its first saved checkpoint while the run goes on; once the
    run has finished, the same job from its final checkpoint is that run, not a new one."""
    client, uri = store
    exp = "random-init-step"
    tracking.setup(uri, exp)
    run = tracking.RunLogger.start(client, exp, "bert-s0", {"kind": "pretrain", "seed": "0"})
    torch.manual_seed(1)  # the two checkpoints hold different weights
    early = save_pretrained(tmp_path / "pre" / "step_5", ElectraForPretraining(TINY, disc_head=True), VOCAB,
                            {"run_id": run.run_id, "step": 5, "model_name": "tiny"})
    final = save_tiny(tmp_path / "pre" / "final", run_id=run.run_id, step=10, model_name="tiny")
    run.set_tags({"checkpoint_path": str(final), "checkpoints": json.dumps({"5": str(early), "10": str(final)})})
    run.finish()
    overrides = [f"pretrained={run.run_id}", "random_init=true", "task=rte", "glue_data.max_train_examples=16",
                 "glue_data.max_eval_examples=16", "task.epochs=1"]
    from_early, from_final = (config(tmp_path, uri, exp, *overrides, *step) for step in (["pretrained_step=5"], []))

    def state(cfg):
        return finetune_source.resolve_pretrained(cfg, client).make_encoder().state_dict()

    early_state, final_state = state(from_early), state(from_final)
    assert all(torch.equal(early_state[k], v) for k, v in final_state.items())
    trained = [finetune_source.resolve_pretrained(c, client).make_encoder  # the checkpoints' own weights differ
               for c in (config(tmp_path, uri, exp, *overrides[:1], "pretrained_step=5"),
                         config(tmp_path, uri, exp, *overrides[:1]))]
    assert not torch.equal(*(m().state_dict()["embeddings.word_embeddings.weight"] for m in trained))

    def identity_of(cfg):
        return tracking.config_hash(finetuning.run_identity(cfg, cfg.task, run.run_id))

    assert identity_of(from_early) == identity_of(from_final)
    trained_ids = [identity_of(config(tmp_path, uri, exp, *overrides[:1], *s)) for s in (["pretrained_step=5"], [])]
    assert trained_ids[0] != trained_ids[1]  # a pre-trained checkpoint's step is part of its runs
    score = finetuning.run(from_early)
    monkeypatch.setattr(finetuning, "train_task", lambda *a, **k: pytest.fail("fine-tuned a finished run again"))
    assert finetuning.run(from_final) == score
    assert "already done in FINISHED run" in capsys.readouterr().out


# --- layer-wise learning rates and the protocol ---------------------------------------------------------

# lr 1e-3, decay 0.8, 4 layers, computed by hand: the reference's head depth is n_layers + 2 = 6.
BY_HAND = {
    True: {"embeddings": 2.62144e-4, 0: 3.2768e-4, 1: 4.096e-4, 2: 5.12e-4, 3: 6.4e-4, "head": 1e-3},
    False: {"embeddings": 3.2768e-4, 0: 4.096e-4, 1: 5.12e-4, 2: 6.4e-4, 3: 8e-4, "head": 1e-3},
}


@pytest.mark.parametrize("reference_off_by_one", [True, False])
def test_layerwise_decay_gives_every_layer_the_documented_lr(reference_off_by_one):
    config = EncoderConfig(vocab_size=50, embedding_size=16, hidden_size=32, num_hidden_layers=4,
                           num_attention_heads=2, intermediate_size=64)
    optim = OptimSettings(1e-3, 0.8, reference_off_by_one, (0.9, 0.999), 1e-6, 0.01, 0.1)
    system = FinetuneSystem(ElectraModel(config), glue.TASKS["rte"], optim, dev_labels={})
    system._trainer = types.SimpleNamespace(estimated_stepping_batches=20)  # what configure_optimizers reads
    conf = system.configure_optimizers()
    optimizer, schedule = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    names = {id(p): n for n, p in system.named_parameters()}
    lr_of = {names[id(p)]: g["initial_lr"] for g in optimizer.param_groups for p in g["params"]}
    assert sorted(lr_of) == sorted(names.values())  # every parameter exactly once
    expected = BY_HAND[reference_off_by_one]
    for name, lr in lr_of.items():
        if name.startswith("encoder.embeddings"):  # includes embeddings_project (16 -> 32)
            want = expected["embeddings"]
        elif name.startswith("head."):
            want = expected["head"]
        else:
            want = expected[int(name.split(".")[3])]  # encoder.encoder.layer.<i>.
        assert lr == pytest.approx(want, rel=1e-9), name
    assert any("embeddings_project" in n for n in lr_of)
    # Weight decay skips LayerNorm and bias (reference exclude_from_weight_decay).
    wd_of = {names[id(p)]: g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    assert wd_of["encoder.encoder.layer.0.output.LayerNorm.weight"] == 0.0 and wd_of["head.dense.bias"] == 0.0
    assert wd_of["head.dense.weight"] == 0.01
    # 10% warmup of 20 steps, reference shape min(1, t/2) * (1 - t/20): lr 0 at the start, 0.9x the
    # layer-wise lr after the 2 warmup steps.
    assert all(g["lr"] == 0.0 for g in optimizer.param_groups)
    for _ in range(2):
        optimizer.step()
        schedule.step()
    assert all(g["lr"] == pytest.approx(0.9 * g["initial_lr"]) for g in optimizer.param_groups)


def test_layerwise_groups_reject_unknown_parameters():
    with pytest.raises(ValueError, match="no layer-wise learning-rate depth for parameter 'pooler.weight'"):
        layerwise_param_groups([("pooler.weight", torch.nn.Parameter(torch.zeros(1)))], 1e-3, 0.8, 2, True, 0.0)


def test_protocol_defaults_follow_model_size(store, tmp_path):
    _, uri = store
    cfg = config(tmp_path, uri, "protocol")
    blank = finetune_source.Pretrained(*[None] * len(finetune_source.Pretrained._fields))
    for size, lr, decay in [("small", 3e-4, 0.8), ("base", 1e-4, 0.8), ("large", 5e-5, 0.9)]:
        p = finetuning.protocol(cfg, blank._replace(size=size))
        assert (p.lr, p.layerwise_lr_decay, p.eps, p.weight_decay, p.warmup_fraction, p.reference_off_by_one) == (
            lr, decay, 1e-6, 0.0, 0.1, True)
    cfg = config(tmp_path, uri, "protocol", "finetune_optim.lr=2e-5", "finetune_optim.layerwise_lr_decay=1.0")
    assert finetuning.protocol(cfg, blank._replace(size="large"))[:2] == (2e-5, 1.0)
    assert [finetune_source.size_name(n, h) for n, h in [("tiny", 128), (None, 256), (None, 768), (None, 1024), ("base", 256)]] == [
        "small", "small", "base", "large", "base"]
    epochs = {t: config(tmp_path, uri, "protocol", f"task={t}").task.epochs for t in glue.TASKS}
    assert epochs == {t: 10 if t in ("rte", "stsb") else 3 for t in glue.TASKS}
    assert (cfg.glue_data.batch_size, cfg.dropout.classifier, cfg.finetune_optim.max_grad_norm) == (32, 0.1, 1.0)
    assert config(tmp_path, uri, "protocol").glue_data.max_seq_length == 64  # the tests' override; default 128


# --- checkpoint sources ---------------------------------------------------------------------------------


def test_directory_checkpoint_loads_the_encoder_with_finetuning_dropout(store, tmp_path):
    client, uri = store
    directory = save_tiny(tmp_path / "ckpt", run_id="0" * 32, step=7)
    cfg = config(tmp_path, uri, "dir", f"pretrained={directory}", "dropout.hidden=0.2")
    p = finetune_source.resolve_pretrained(cfg, client)
    saved = torch.load(directory / "model.pt")
    encoder = p.make_encoder()
    for k, v in encoder.state_dict().items():
        torch.testing.assert_close(v, saved[f"electra.{k}"])
    assert encoder is not p.make_encoder()  # a fresh copy for every task
    assert (encoder.config.hidden_dropout_prob, encoder.config.attention_probs_dropout_prob) == (0.2, 0.1)
    assert (p.run_id, p.step, p.vocab_file, p.size) == ("0" * 32, 7, directory / "vocab.txt", "small")


def test_hf_checkpoints_go_through_the_interop_module_lazily(store, tmp_path, monkeypatch):
    client, uri = store
    for module in ("finetune.py", "finetuning/run.py", "finetuning/source.py"):
        tree = ast.parse((REPO / "electra_ablate" / module).read_text())
        top_level = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names} | {
            n.module for n in tree.body if isinstance(n, ast.ImportFrom)}
        assert not {"transformers", "electra_ablate.hf.importing"} & top_level, module  # works without transformers

    torch.manual_seed(1)
    net = ElectraForPretraining(TINY, disc_head=True)
    calls = []
    fake = types.ModuleType("electra_ablate.hf.importing")
    fake.import_pretrained = lambda spec, cache_dir=None: calls.append(spec) or (net, {"model_name": "base", "do_lower_case": False}, VOCAB)
    monkeypatch.setitem(sys.modules, "electra_ablate.hf.importing", fake)
    cfg = config(tmp_path, uri, "hf", "pretrained=hf:google/electra-small-discriminator")
    p = finetune_source.resolve_pretrained(cfg, client)
    assert calls == ["google/electra-small-discriminator"]
    assert (p.spec, p.run_id, p.size, p.vocab_file) == ("hf:google/electra-small-discriminator", None, "base", VOCAB)
    assert finetuning.lowercase(cfg, p) is False  # the checkpoint's tokenizer is cased
    assert finetuning.lowercase(config(tmp_path, uri, "hf", "glue_data.lowercase=true"), p) is True
    torch.testing.assert_close(p.make_encoder().state_dict(), net.electra.state_dict())


# --- bad input ------------------------------------------------------------------------------------------


def test_unknown_task_is_rejected_with_the_valid_options(store, tmp_path):
    _, uri = store
    with pytest.raises(MissingConfigException, match=r"(?s)Could not find 'task/sts'.*Available options in 'task'.*rte.*stsb"):
        config(tmp_path, uri, "bad", "task=sts")


@pytest.mark.parametrize("case", ["bad_label", "missing_split", "missing_dir"])
def test_bad_data_fails_before_any_run_is_recorded(store, tmp_path, case):
    client, uri = store
    glue_dir = glue_dir_with(tmp_path, "RTE")
    messages = {
        "bad_label": r"RTE/dev.tsv line 2: label 'maybe' in field 'label' is not one of the rte labels",
        "missing_split": r"RTE/dev.tsv not found: task rte needs train.tsv, dev.tsv",
        "missing_dir": r"GLUE task directory .*/glue/RTE not found",
    }
    if case == "bad_label":
        dev = glue_dir / "RTE" / "dev.tsv"
        dev.write_text(dev.read_text().replace("\tnot_entailment\n", "\tmaybe\n"))
    elif case == "missing_split":
        (glue_dir / "RTE" / "dev.tsv").unlink()
    else:
        shutil.rmtree(glue_dir / "RTE")
    exp = f"bad-{case}"
    cfg = config(tmp_path, uri, exp, "pretrained=none", "task=rte", f"glue_data.dir={glue_dir}", *TINY_MODEL)
    with pytest.raises(glue.GlueDataError, match=messages[case]):
        finetuning.run(cfg)
    assert runs_of(client, exp) == []


def test_task_glue_without_any_data_says_where_it_looked(store, tmp_path):
    client, uri = store
    cfg = config(tmp_path, uri, "bad-glue", "task=glue", f"glue_data.dir={tmp_path}/nowhere")
    with pytest.raises(glue.GlueDataError, match=r"task=glue: no GLUE task has its train and dev files under glue_data.dir=.*/nowhere"):
        finetuning.run(cfg)
    assert runs_of(client, "bad-glue") == []


@pytest.mark.parametrize("case", ["vocab", "positions", "not_a_checkpoint", "transformers_dir", "unknown_run", "step_with_dir"])
def test_bad_checkpoints_fail_before_any_run_is_recorded(store, tmp_path, case):
    client, uri = store
    glue_dir = glue_dir_with(tmp_path, "RTE")
    overrides = {
        "vocab": lambda: (f"pretrained={save_tiny(tmp_path / 'c', EncoderConfig(**{**TINY.to_dict(), 'vocab_size': 100}))}",),
        "positions": lambda: (f"pretrained={save_tiny(tmp_path / 'c', EncoderConfig(**{**TINY.to_dict(), 'max_position_embeddings': 32}))}",),
        "not_a_checkpoint": lambda: ("pretrained=no/such/dir",),
        "transformers_dir": lambda: (f"pretrained={hf_like_dir(tmp_path)}",),
        "unknown_run": lambda: ("pretrained=" + "a" * 32,),
        "step_with_dir": lambda: (f"pretrained={save_tiny(tmp_path / 'c')}", "pretrained_step=100"),
    }[case]()
    messages = {
        "vocab": r"word embeddings have vocab_size=100 but its vocabulary .*vocab.txt has " + str(VOCAB_SIZE) + " entries",
        "positions": r"glue_data.max_seq_length=64 exceeds the encoder's max_position_embeddings=32",
        "not_a_checkpoint": r"pretrained='no/such/dir' is neither a directory, an MLflow run id",
        "transformers_dir": r"config.json: unknown format None; expected 'electra-ablate/1'; for a transformers checkpoint directory use pretrained=hf:",
        "unknown_run": r"pretrained=a{32}: no MLflow run with this id in sqlite:///",
        "step_with_dir": r"pretrained_step=100 needs pretrained=<MLflow run id>",
    }
    exp = f"bad-{case}"
    cfg = config(tmp_path, uri, exp, "task=rte", f"glue_data.dir={glue_dir}", *overrides)
    with pytest.raises(finetune_source.FinetuneError, match=messages[case]):
        finetuning.run(cfg)
    assert runs_of(client, exp) == []


def hf_like_dir(tmp_path: Path) -> Path:
    """A directory as transformers' save_pretrained leaves it (a config.json of another format)."""
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "electra", "hidden_size": 32}))
    return tmp_path / "hf"


def test_a_failure_during_training_marks_the_run_failed(store, tmp_path, monkeypatch):
    client, uri = store
    exp = "fails"
    glue_dir = glue_dir_with(tmp_path, "RTE")

    def boom(self, batch, batch_idx):
        raise RuntimeError("boom in training_step")

    monkeypatch.setattr(FinetuneSystem, "training_step", boom)
    cfg = config(tmp_path, uri, exp, "pretrained=none", "task=rte", f"glue_data.dir={glue_dir}", *TINY_MODEL)
    with pytest.raises(RuntimeError, match="boom in training_step"):
        finetuning.run(cfg)
    (run,) = runs_of(client, exp)
    assert run.info.status == "FAILED" and "final/score" not in run.data.metrics
    # A sweep's keep_going records the failure the same way and lets the multirun go on.
    cfg = config(tmp_path, uri, exp + "-keep-going", "pretrained=none", "task=rte", f"glue_data.dir={glue_dir}",
                 "sweep.keep_going=true", *TINY_MODEL)
    assert np.isnan(finetuning.run(cfg))
    assert [r.info.status for r in runs_of(client, exp + "-keep-going")] == ["FAILED"]


@pytest.mark.parametrize("bias_correction", ["true", "false"], ids=["adamw", "reference"])
def test_bf16_mixed_with_fused_adamw_fine_tunes(store, tmp_path, bias_correction):
    """The GPU defaults (bf16-mixed + fused AdamW, clip 1.0): Lightning's plugin refuses to clip for a fused
    optimizer; FinetuneSystem clips by global norm itself (FusedClipping), so the run finishes. The reference's
    update (the default) runs on the same fused kernel."""
    client, uri = store
    exp = f"bf16-fused-{bias_correction}"
    ckpt = save_tiny(tmp_path / "pre", model_name="tiny")
    cfg = config(tmp_path, uri, exp, f"pretrained={ckpt}", "task=rte", "task.epochs=1", "runtime.precision=bf16-mixed",
                 "runtime.fused_adam=true", "glue_data.max_train_examples=16", "glue_data.max_eval_examples=8",
                 "glue_data.batch_size=8", f"finetune_optim.bias_correction={bias_correction}")
    finetuning.run(cfg)
    (run,) = runs_of(client, exp)
    assert run.info.status == "FINISHED" and np.isfinite(run.data.metrics["final/score"])


def test_mean_pooling_averages_the_real_tokens_and_cls_pooling_reads_the_first():
    hidden = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert torch.equal(pool(hidden, mask, "cls"), hidden[:, 0])
    expected = torch.stack([hidden[0, :2].mean(0), hidden[1].mean(0)])
    assert torch.allclose(pool(hidden, mask, "mean"), expected)


def test_mean_pooling_is_recorded_and_leaves_cls_runs_identities_alone(store, tmp_path):
    client, uri = store
    cfg = config(tmp_path, uri, "pooling", "pretrained=none", "task=rte", f"glue_data.dir={FIXTURES}",
                 "pooling=mean", *TINY_MODEL)
    finetuning.run(cfg)
    (run,) = runs_of(client, "pooling")
    assert run.data.params["pooling"] == "mean"
    plain = config(tmp_path, uri, "pooling", "pretrained=none", "task=rte", f"glue_data.dir={FIXTURES}", *TINY_MODEL)
    assert "pooling" not in identity.identity(plain)  # the default is left out: older runs keep their hashes
    assert identity.identity(cfg)["pooling"] == "mean"


def test_an_unknown_pooling_is_refused_before_any_run(store, tmp_path):
    client, uri = store
    cfg = config(tmp_path, uri, "bad-pooling", "pretrained=none", "task=rte", f"glue_data.dir={FIXTURES}",
                 "pooling=max", *TINY_MODEL)
    with pytest.raises(finetune_source.FinetuneError, match=r"pooling='max' must be cls .* or mean"):
        finetuning.run(cfg)
    assert runs_of(client, "bad-pooling") == []


def test_the_cpu_regime_recipe_is_recorded_and_its_settings_are_the_identity(store, tmp_path):
    client, uri = store
    cfg = config(tmp_path, uri, "recipe", "pretrained=none", "task=rte", f"glue_data.dir={FIXTURES}",
                 "recipe=cpu_regime", *TINY_MODEL)
    assert (cfg.pooling, cfg.dropout.hidden, cfg.dropout.attention, cfg.dropout.classifier) == ("mean", 0.0, 0.0, 0.1)
    assert (cfg.glue_data.max_train_examples, cfg.glue_data.max_seq_length, cfg.finetune_optim.lr) == (4000, 64, 5e-4)
    assert cfg.task.epochs == 10  # the task keeps its own epochs (paper Table 7: RTE 10)
    finetuning.run(cfg)
    (run,) = runs_of(client, "recipe")
    assert run.data.params["preset"] == "cpu_regime" and run.data.params["dropout.hidden"] == "0.0"
    spelt = config(tmp_path, uri, "recipe", "pretrained=none", "task=rte", f"glue_data.dir={FIXTURES}", "pooling=mean",
                   "dropout.hidden=0.0", "dropout.attention=0.0", "glue_data.max_train_examples=4000",
                   "finetune_optim.lr=5e-4", *TINY_MODEL)
    assert identity.identity(spelt) == identity.identity(cfg)  # the preset's name is a label, not a setting
    wins = config(tmp_path, uri, "recipe", "pretrained=none", "task=rte", "recipe=cpu_regime", "pooling=cls")
    assert wins.pooling == "cls"  # the command line overrides the recipe


def test_fixed_length_batches_fine_tune_to_the_same_result(store, tmp_path):
    """runtime.finetune_padding=max pads every batch to glue_data.max_seq_length (one shape, for graphs on a GPU):
    without dropout the padded positions change nothing but rounding, so the losses and the dev score agree."""
    client, uri = store
    ckpt = save_tiny(tmp_path / "pre", model_name="tiny")
    histories = {}
    for padding in ("dynamic", "max", "bucket"):
        exp = f"padding-{padding}"
        cfg = config(tmp_path / padding, uri, exp, f"pretrained={ckpt}", "task=rte", "task.epochs=2",
                     "glue_data.max_train_examples=32", "glue_data.max_eval_examples=16", "glue_data.batch_size=8",
                     "dropout.hidden=0", "dropout.attention=0", "dropout.classifier=0", "logger.log_every_n_steps=1",
                     "runtime.precision=32-true", f"runtime.finetune_padding={padding}")
        finetuning.run(cfg)
        (run,) = runs_of(client, exp)
        loss = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/loss")}
        histories[padding] = (loss, run.data.metrics["final/score"])
    loss, score = histories["dynamic"]
    assert len(loss) >= 8
    for padding in ("max", "bucket"):
        other, other_score = histories[padding]
        assert sorted(other) == sorted(loss)
        assert [other[k] for k in sorted(other)] == pytest.approx([loss[k] for k in sorted(loss)], rel=1e-4, abs=1e-6)
        assert other_score == pytest.approx(score, abs=1e-6)


def test_fine_tuning_batches_are_padded_as_the_runtime_says():
    from electra_ablate.finetuning.data import collate

    items = [(np.arange(5), np.zeros(5), 1, 0), (np.arange(37), np.zeros(37), 0, 1)]
    assert collate(items)["input_ids"].shape == (2, 37)
    assert collate(items, padding="bucket", max_len=128)["input_ids"].shape == (2, 64)
    assert collate(items, padding="bucket", max_len=50)["input_ids"].shape == (2, 50)
    padded = collate(items, padding="max", max_len=128)
    assert padded["input_ids"].shape == (2, 128) and padded["attention_mask"].sum().item() == 5 + 37


# --- re-initialising the top layers (Zhang et al. 2021) -----------------------------------------------------


def test_reinit_top_layers_redraws_only_the_top_blocks_with_the_pretraining_init():
    torch.manual_seed(0)
    trained = ElectraForPretraining(TINY, disc_head=True).electra
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(1.0)  # far from any init, so a redrawn tensor is told apart
    before = {k: v.clone() for k, v in trained.state_dict().items()}
    state = torch.random.get_rng_state()
    out = finetune_source.reinit_top_layers(trained, 1, seed=3).state_dict()
    assert torch.equal(torch.random.get_rng_state(), state)  # the run's own draws (head, dropout, order) unchanged
    top = "encoder.layer.1."
    for k, v in out.items():
        if not k.startswith(top):
            assert torch.equal(v, before[k]), k
    assert torch.equal(out[top + "output.LayerNorm.weight"], torch.ones(TINY.hidden_size))
    assert torch.equal(out[top + "attention.self.query.bias"], torch.zeros(TINY.hidden_size))
    assert abs(out[top + "intermediate.dense.weight"].std().item() - TINY.initializer_range) < 0.002
    again = finetune_source.reinit_top_layers(ElectraForPretraining(TINY, disc_head=True).electra, 1, seed=3)
    assert torch.equal(again.state_dict()[top + "intermediate.dense.weight"], out[top + "intermediate.dense.weight"])
    assert finetune_source.reinit_top_layers(trained, 0, seed=3) is trained


def test_a_pre_ln_encoder_redraws_its_final_layernorm_with_the_top_block():
    pre = ElectraForPretraining(EncoderConfig(**{**TINY.to_dict(), "layer_norm": "pre"}), disc_head=True).electra
    with torch.no_grad():
        pre.encoder.LayerNorm.weight.fill_(3.0)
    finetune_source.reinit_top_layers(pre, 1, seed=0)
    assert torch.equal(pre.encoder.LayerNorm.weight, torch.ones(TINY.hidden_size))


def test_reinit_top_layers_is_recorded_and_leaves_other_runs_identities_alone(store, tmp_path, monkeypatch):
    client, uri = store
    ckpt = save_tiny(tmp_path / "ckpt", model_name="tiny")
    seen = []
    real = finetune_source.reinit_top_layers
    monkeypatch.setattr(finetuning, "reinit_top_layers", lambda enc, n, seed: seen.append((n, seed)) or real(enc, n, seed))
    overrides = [f"pretrained={ckpt}", "task=rte", f"glue_data.dir={FIXTURES}", "task.epochs=1",
                 "glue_data.max_train_examples=16", "glue_data.max_eval_examples=8"]
    cfg = config(tmp_path, uri, "reinit", *overrides, "reinit_top_layers=1", "seed=2")
    finetuning.run(cfg)
    (run,) = runs_of(client, "reinit")
    assert run.info.status == "FINISHED" and run.data.params["reinit_top_layers"] == "1" and seen == [(1, 2)]
    plain = config(tmp_path, uri, "reinit", *overrides, "seed=2")
    assert "reinit_top_layers" not in identity.identity(plain)  # the default is left out: older runs keep their hashes
    assert identity.identity(cfg)["reinit_top_layers"] == 1


@pytest.mark.parametrize("value, message", [
    ("-1", r"reinit_top_layers=-1 must be a whole number"),
    ("0.5", r"reinit_top_layers=0.5 must be a whole number"),
    ("3", r"reinit_top_layers=3 exceeds the encoder's 2 layers"),
])
def test_a_bad_reinit_top_layers_is_refused_before_any_run(store, tmp_path, value, message):
    client, uri = store
    ckpt = save_tiny(tmp_path / "ckpt", model_name="tiny")
    cfg = config(tmp_path, uri, "bad-reinit", f"pretrained={ckpt}", "task=rte", f"glue_data.dir={FIXTURES}",
                 f"reinit_top_layers={value}")
    with pytest.raises(finetune_source.FinetuneError, match=message):
        finetuning.run(cfg)
    assert runs_of(client, "bad-reinit") == []


# --- per-task settings ---------------------------------------------------------------------------------------


def test_per_task_settings_apply_to_their_task_only_and_are_its_identity(store, tmp_path):
    client, uri = store
    exp = "per-task"
    glue_dir = glue_dir_with(tmp_path, "MNLI", "STS-B")
    table = ["+per_task.stsb.glue_data.max_train_examples=2", "+per_task.stsb.task.epochs=1",
             "+per_task.stsb.finetune_optim.lr=1e-3"]
    cfg = config(tmp_path, uri, exp, "pretrained=none", "task=glue", f"glue_data.dir={glue_dir}",
                 "glue_data.batch_size=4", "task.members.mnli.epochs=1", *table, *TINY_MODEL)
    finetuning.run(cfg)
    runs = {r.data.tags["task"]: r.data for r in runs_of(client, exp)}
    # STS-B: its first 2 rows doubled, 1 epoch at its own lr; MNLI as the run says (4 rows, lr by size).
    assert (runs["stsb"].params["resolved.train_examples"], runs["stsb"].params["task.epochs"]) == ("4", "1")
    assert runs["stsb"].params["resolved.lr"] == "0.001" and runs["mnli"].params["resolved.lr"] != "0.001"
    assert runs["mnli"].params["resolved.train_examples"] == "4" and "per_task" not in " ".join(runs["mnli"].params)

    # The table is not the identity: the same settings given directly are the same STS-B run, and a
    # per-task change for another task leaves this one's identity alone.
    def ident(*overrides):
        c = config(tmp_path, uri, exp, "pretrained=none", "task=stsb", *overrides, *TINY_MODEL)
        c, task_cfg = finetuning.for_task(c, "stsb", c.task)
        return finetuning.run_identity(c, task_cfg, "none")

    direct = ident("glue_data.max_train_examples=2", "task.epochs=1", "finetune_optim.lr=1e-3")
    assert ident(*table) == direct
    assert ident(*table, "+per_task.rte.glue_data.max_seq_length=128") == direct
    assert ident() == ident("+per_task.rte.task.epochs=2")
    assert ident(*table) != ident()


@pytest.mark.parametrize("override, message", [
    ("+per_task.stbs.task.epochs=1", "names ['stbs'], which are not GLUE tasks"),
    ("+per_task.stsb.glue_data.max_seq_lenght=128", "per_task.stsb.glue_data.max_seq_lenght is not a fine-tuning "
                                                    "setting"),
    ("+per_task.stsb.task.epoch=1", "per_task.stsb.task.epoch is not a fine-tuning setting"),
    ("+per_task.stsb.seed=3", "sets ['seed'], which one task cannot change"),
    ("+per_task.stsb.task.epochs=0", "task.epochs=0 must be a positive integer"),
])
def test_a_bad_per_task_entry_is_refused_before_any_run(store, tmp_path, override, message):
    client, uri = store
    cfg = config(tmp_path, uri, "per-task-bad", "pretrained=none", "task=stsb", f"glue_data.dir={FIXTURES}", override,
                 *TINY_MODEL)
    with pytest.raises(Exception, match=re.escape(message)):
        finetuning.run(cfg)
    assert runs_of(client, "per-task-bad") == []
