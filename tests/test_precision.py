"""`runtime.precision`: what `auto` resolves to on CPUs with and without native bf16 (the capability is mocked,
so both branches run on any machine), that explicit values pass through, that pre-training and fine-tuning
runs record the resolved value as a parameter, and that precision never enters a run's identity."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from mlflow.tracking import MlflowClient

from electra_ablate import pretrain
from electra_ablate.finetuning import run as finetuning
from electra_ablate.finetuning import source as finetune_source
from electra_ablate.common import precision
from electra_ablate.tracking import runs as tracking
from electra_ablate.models.checkpoint import save_pretrained
from electra_ablate.models.encoder import ElectraForPretraining, EncoderConfig
from electra_ablate.training import build

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ["ELECTRA_ABLATE_DATA"])  # conftest: the tiny hermetic data folder

# /proc/cpuinfo flag sets: AMD Zen 4 (avx512_bf16), Intel Sapphire Rapids (AMX), and an AVX2-only CPU.
ZEN4 = frozenset({"sse4_2", "avx2", "avx512f", "avx512_bf16"})
SAPPHIRE_RAPIDS = frozenset({"avx2", "avx512f", "amx_tile", "amx_bf16"})
AVX2_ONLY = frozenset({"sse4_2", "avx2", "fma"})


@pytest.fixture
def cpu_with(monkeypatch):
    """Pretend this machine's CPU has the given /proc/cpuinfo flags (what every caller of the resolver reads)."""

    def set_flags(flags: frozenset[str]) -> None:
        monkeypatch.setattr(precision, "cpu_flags", lambda: flags)

    return set_flags


@pytest.mark.parametrize("flags, expected", [(ZEN4, "bf16-mixed"), (SAPPHIRE_RAPIDS, "bf16-mixed"),
                                             (AVX2_ONLY, "32-true"), (frozenset(), "32-true")])
def test_auto_on_cpu_follows_native_bf16(cpu_with, flags, expected):
    cpu_with(flags)
    assert precision.resolve("auto", "cpu") == expected
    assert precision.resolve("auto", "cpu", flags) == expected  # the same answer from flags passed in
    assert ("no bf16 instructions" in precision.describe_cpu()) == (expected == "32-true")


@pytest.mark.parametrize("flags", [AVX2_ONLY, ZEN4])
def test_auto_on_cuda_is_bf16_whatever_the_cpu(cpu_with, flags):
    cpu_with(flags)
    assert precision.resolve("auto", "cuda") == "bf16-mixed"


@pytest.mark.parametrize("requested", ["32-true", "bf16-mixed", "16-mixed", "64-true"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_explicit_precision_passes_through(cpu_with, requested, device):
    cpu_with(ZEN4)
    assert precision.resolve(requested, device) == requested
    cpu_with(AVX2_ONLY)
    assert precision.resolve(requested, device) == requested


def test_cpu_flags_are_read_from_cpuinfo_and_name_the_cpu():
    if not Path("/proc/cpuinfo").is_file():
        pytest.skip("no /proc/cpuinfo on this OS")
    text = Path("/proc/cpuinfo").read_text()
    flags = precision.cpu_flags()
    assert flags and all(f in text for f in list(flags)[:20])
    assert precision.describe_cpu().startswith(precision.cpu_name())


def test_training_device_is_cpu_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert precision.training_device("auto") == "cpu" and precision.training_device("gpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert precision.training_device("auto") == "cuda" and precision.training_device("cpu") == "cpu"


# --- recorded per run, never part of its identity ---------------------------------------------------------


def test_pretraining_records_the_resolved_precision_and_keeps_it_out_of_identity(tmp_path, pretrain_cfg, cpu_with):
    cpu_with(ZEN4)
    auto = pretrain_cfg(tmp_path, "objective=bert", "trainer.max_steps=2", "optim.warmup_steps=1", "runtime.precision=auto")
    run_id = pretrain.train(auto)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    params = client.get_run(run_id).data.params
    assert params["runtime.resolved_precision"] == "bf16-mixed" and params["runtime.precision"] == "auto"

    fp32 = pretrain_cfg(tmp_path, "objective=bert", "trainer.max_steps=2", "optim.warmup_steps=1", "runtime.precision=32-true")
    bf16 = pretrain_cfg(tmp_path, "objective=bert", "trainer.max_steps=2", "optim.warmup_steps=1", "runtime.precision=bf16-mixed")
    assert tracking.config_hash(fp32) == tracking.config_hash(bf16) == tracking.config_hash(auto)
    assert client.get_run(run_id).data.tags[tracking.TAG_CONFIG_HASH] == tracking.config_hash(fp32)
    assert pretrain.train(fp32) == run_id  # the same run: found finished, not trained again in fp32
    cpu_with(AVX2_ONLY)
    assert build.resolve_precision(auto) == "32-true"


def _finetune_cfg(tmp_path: Path, uri: str, *overrides: str):
    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        return compose("finetune", overrides=[
            f"paths.root_dir={REPO}", f"paths.data_dir={DATA}", f"paths.output_root={tmp_path}/outputs",
            f"paths.output_dir={tmp_path}/run", f"logger.tracking_uri={uri}", "runtime.num_workers=0",
            "trainer.enable_progress_bar=false", "glue_data.max_seq_length=64", "task=rte", "task.epochs=1",
            "glue_data.max_train_examples=16", "glue_data.max_eval_examples=8", "glue_data.batch_size=8", *overrides])


def test_finetuning_records_the_resolved_precision_and_keeps_it_out_of_identity(tmp_path, monkeypatch, cpu_with):
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is ./mlruns
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    torch.manual_seed(0)
    vocab = DATA / "vocab" / "bert-base-uncased-vocab.txt"
    config = EncoderConfig(vocab_size=len(vocab.read_text(encoding="utf-8").splitlines()), embedding_size=32,
                           hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                           max_position_embeddings=128)
    ckpt = save_pretrained(tmp_path / "pre", ElectraForPretraining(config, disc_head=True), vocab,
                           {"model_name": "tiny"})

    cpu_with(AVX2_ONLY)
    auto = _finetune_cfg(tmp_path, uri, f"pretrained={ckpt}", "runtime.precision=auto")
    finetuning.run(auto)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(auto.logger.experiment)
    (run,) = client.search_runs([exp.experiment_id])
    assert run.data.params["runtime.resolved_precision"] == "32-true"
    cpu_with(ZEN4)
    assert finetuning.precision(auto) == "bf16-mixed"

    hashes = {p: tracking.config_hash(finetuning.run_identity(cfg, cfg.task, finetune_source.normalise_spec(str(ckpt))))
              for p in ("auto", "32-true", "bf16-mixed")
              for cfg in [_finetune_cfg(tmp_path, uri, f"pretrained={ckpt}", f"runtime.precision={p}")]}
    assert len(set(hashes.values())) == 1 and run.data.tags[tracking.TAG_CONFIG_HASH] == hashes["auto"]
    monkeypatch.setattr(finetuning, "train_task", lambda *a, **k: pytest.fail("fine-tuned a finished run again"))
    finetuning.run(_finetune_cfg(tmp_path, uri, f"pretrained={ckpt}", "runtime.precision=bf16-mixed"))
    assert len(client.search_runs([exp.experiment_id])) == 1
