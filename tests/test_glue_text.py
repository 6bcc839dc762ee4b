"""data=glue_text: GLUE tasks' training text as a pre-training corpus, never their dev text."""

from __future__ import annotations

import pytest

from electra_ablate import pretrain
from electra_ablate.data.errors import DataError
from electra_ablate.glue.pretrain_text import glue_text_corpus
from electra_ablate.glue.readers import read_tsv
from electra_ablate.glue.tasks import get_task


def test_corpus_holds_training_sentences_only(tmp_path, data_dir):
    path = glue_text_corpus(["sst2", "mrpc"], data_dir / "glue", tmp_path, sentences_per_document=5)
    docs = [d.splitlines() for d in path.read_text().strip().split("\n\n")]
    lines = [line for d in docs for line in d]
    train = [t for name in ("sst2", "mrpc") for ex in read_tsv(get_task(name), data_dir / "glue", "train")
             for t in (ex.text_a, ex.text_b) if t]
    assert lines == [" ".join(t.split()) for t in train]  # every training sentence, in order, labels dropped, no dev row
    assert all(len(d) <= 5 for d in docs) and len(docs) == -(-len(lines) // 5)
    # Written once: a second call finds the same file and leaves it alone.
    mtime = path.stat().st_mtime_ns
    assert glue_text_corpus(["sst2", "mrpc"], data_dir / "glue", tmp_path, 5) == path
    assert path.stat().st_mtime_ns == mtime


def test_bad_settings_are_refused(tmp_path, data_dir):
    with pytest.raises(DataError, match="data.tasks is empty"):
        glue_text_corpus([], data_dir / "glue", tmp_path, 5)
    with pytest.raises(DataError, match="sentences_per_document=0"):
        glue_text_corpus(["sst2"], data_dir / "glue", tmp_path, 0)


def test_pretrains_on_glue_text_with_a_trained_vocabulary(tmp_path, pretrain_cfg):
    cfg = pretrain_cfg(tmp_path, "data=glue_text", "data.tasks=[sst2]", "data.train_vocab_size=200",
                       "data.max_seq_length=32", "data.batch_size=8", "objective=bert", "trainer.max_steps=3",
                       "optim.warmup_steps=0")
    from mlflow.tracking import MlflowClient

    run = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(pretrain.train(cfg))
    assert run.info.status == "FINISHED"
    assert run.data.params["data.tasks"] == "['sst2']"
