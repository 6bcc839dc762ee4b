"""Same config, same numbers: vocabulary, pre-training examples, weights and fine-tuning scores reproduce
from empty caches in fresh processes (README, "Reproducibility")."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# The pinned digest is of the real sample, and the chain is checked on the real data.
pytestmark = pytest.mark.realdata

# A 1000-piece vocabulary learned from the first 300 documents of the sample, as written by this code. Any
# machine must produce exactly this file; a deliberate change to the learner bumps VOCAB_LEARNER_VERSION in
# data/cache.py and updates this digest.
VOCAB_300_1000_SHA256 = "5e99e3f7f1de74136f0a2ca725c52bef98933a02c60e4df656d681b74225ad66"


def fresh_env(hash_seed: int) -> dict[str, str]:
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed), "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def vocab_in_new_process(corpus: Path, cache_dir: Path, hash_seed: int) -> str:
    code = ("import sys; from electra_ablate.data.cache import train_vocab; "
            "print(train_vocab(sys.argv[1], sys.argv[2], 1000, max_docs=300))")
    out = subprocess.run([sys.executable, "-c", code, str(corpus), str(cache_dir)], env=fresh_env(hash_seed),
                         capture_output=True, text=True, check=True, timeout=300)
    return hashlib.sha256(Path(out.stdout.strip().splitlines()[-1]).read_bytes()).hexdigest()


def test_vocabulary_is_the_same_file_in_every_process(real_data_dir, tmp_path):
    corpus = real_data_dir / "corpus" / "enwiki_sample_5mb.txt"
    first = vocab_in_new_process(corpus, tmp_path / "a", hash_seed=1)
    second = vocab_in_new_process(corpus, tmp_path / "b", hash_seed=2)
    assert first == second == VOCAB_300_1000_SHA256


# --- the whole chain: vocabulary, examples, pre-trained weights, fine-tuning score ----------------------------

# A small pre-training config (2 layers, hidden 64, a 1000-piece vocabulary learned from 300 documents).
PRETRAIN = ["model=tiny", "model.hidden_size=64", "model.embedding_size=32", "model.num_hidden_layers=2",
            "model.num_attention_heads=2", "model.intermediate_size=128", "model.generator_fraction=0.5",
            "data.max_docs=300", "data.train_vocab_size=1000", "data.max_seq_length=64", "data.batch_size=8",
            "trainer.max_steps=6", "optim.warmup_steps=2", "logger.log_every_n_steps=2", "runtime.num_workers=0", "trainer.accelerator=cpu",
            "trainer.enable_progress_bar=false"]
FINETUNE = ["task=rte", "seed=3", "glue_data.max_train_examples=64", "glue_data.max_eval_examples=32",
            "glue_data.max_seq_length=64", "trainer.max_steps=4", "runtime.num_workers=0", "trainer.accelerator=cpu",
            "trainer.enable_progress_bar=false"]


def run_entry_point(module: str, root: Path, data_dir: Path, hash_seed: int, *overrides: str) -> dict:
    """Run `python -m module` in a fresh process with its own empty output root, cache and MLflow store;
    returns the params, tags and metrics of the one run it records."""
    from mlflow.tracking import MlflowClient

    root.mkdir(parents=True)
    uri = f"sqlite:///{root}/mlflow.db"
    args = [f"paths.root_dir={root}", f"paths.data_dir={data_dir}", f"logger.tracking_uri={uri}",
            f"hydra.run.dir={root}/hydra", *overrides]
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=root, env=fresh_env(hash_seed),
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(uri)
    (run,) = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert run.info.status == "FINISHED"
    return {"params": run.data.params, "tags": run.data.tags, "metrics": run.data.metrics}


@pytest.mark.slow
def test_same_config_gives_the_same_vocabulary_examples_weights_and_score(real_data_dir, tmp_path):
    import torch

    from electra_ablate.tracking import runs as tracking
    from electra_ablate.models.checkpoint import MODEL_NAME, VOCAB_NAME

    runs = [run_entry_point("electra_ablate.pretrain", tmp_path / f"pretrain{i}", real_data_dir, seed, *PRETRAIN)
            for i, seed in enumerate((11, 22))]
    first, second = runs
    for name in (tracking.PARAM_VOCAB_SHA256, tracking.PARAM_EXAMPLES_SHA256):
        assert len(first["params"][name]) == 64 and first["params"][name] == second["params"][name], name
    assert first["tags"][tracking.TAG_CONFIG_HASH] == second["tags"][tracking.TAG_CONFIG_HASH]
    final = [Path(r["tags"][tracking.TAG_CHECKPOINT]) for r in runs]
    assert final[0] != final[1]  # two stores, nothing shared
    assert hashlib.sha256((final[0] / VOCAB_NAME).read_bytes()).hexdigest() == first["params"][tracking.PARAM_VOCAB_SHA256]
    weights = [torch.load(f / MODEL_NAME, map_location="cpu") for f in final]
    assert weights[0].keys() == weights[1].keys()
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key]), key
    assert first["metrics"]["train/loss"] == second["metrics"]["train/loss"]

    # The same checkpoint fine-tuned twice with one seed, each time from an empty feature cache.
    scores = [run_entry_point("electra_ablate.finetune", tmp_path / f"finetune{i}", real_data_dir, seed,
                              f"pretrained={final[0]}", *FINETUNE) for i, seed in enumerate((33, 44))]
    assert scores[0]["metrics"]["final/score"] == scores[1]["metrics"]["final/score"]
    assert scores[0]["params"][tracking.PARAM_VOCAB_SHA256] == first["params"][tracking.PARAM_VOCAB_SHA256]
