"""What the report says of each arm: its pre-training scale, its vocabulary when the run predates the recorded
digest, and a warning when compared arms differ in encoder shape."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace as NS

from electra_ablate.report import arms
from electra_ablate.report import multibootstrap as mb
from electra_ablate.tracking import runs as tracking
from electra_ablate.sweep.jobs import PretrainJob
from electra_ablate.sweep.plan import PretrainState
from electra_ablate.sweep.spec import Variant
from electra_ablate.report.verdicts import Claim, Verdict

SHAPE = {"model.embedding_size": "64", "model.hidden_size": "128", "model.num_hidden_layers": "4",
         "model.num_attention_heads": "2", "model.intermediate_size": "512"}


def run(run_id: str, params: dict, metrics: dict | None = None, tags: dict | None = None):
    return NS(info=NS(run_id=run_id), data=NS(params=params, metrics=metrics or {}, tags=tags or {}))


def state(variant: str, r) -> PretrainState:
    return PretrainState(PretrainJob(variant, 0), "hash", r, None, 600)


def spec(*variants: Variant):
    return NS(variants=variants)


ELECTRA = Variant("electra", {}, {})
BERT = Variant("bert", {}, {})
NONE = Variant("none", {}, {}, random_init_of="electra")


def test_scale_counts_tokens_from_steps_batch_and_sequence_and_names_the_floor():
    e = run("e", {**SHAPE, "trainer.max_steps": "600", "data.batch_size": "128", "data.max_seq_length": "64",
                  "trainer.accumulate_grad_batches": "2"}, {"flops/total": 2.5e13})
    said = arms.describe(spec(ELECTRA, BERT, NONE), [state("electra", e)])
    assert said["electra"] == "600 steps x 256 x 64 = 9.8M tokens, 2.5e+13 FLOPs per pre-training run"
    assert said["none"] == "no pre-training (random weights shaped like electra)"
    assert "bert" not in said  # no finished run: nothing is claimed about it


def test_vocabulary_of_an_older_run_is_read_from_its_saved_network(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\nthe\n")
    older = run("o", {}, tags={tracking.TAG_CHECKPOINT: str(tmp_path)})
    assert arms.run_vocab_sha256(older) == hashlib.sha256(b"[PAD]\n[UNK]\nthe\n").hexdigest()
    recorded = run("r", {tracking.PARAM_VOCAB_SHA256: "abc"}, tags={tracking.TAG_CHECKPOINT: str(tmp_path)})
    assert arms.run_vocab_sha256(recorded) == "abc"
    assert arms.run_vocab_sha256(run("g", {}, tags={tracking.TAG_CHECKPOINT: str(tmp_path / "gone")})) is None


def test_a_shape_difference_between_arms_is_flagged_and_random_arms_inherit_their_shape():
    e, b = run("e", SHAPE), run("b", SHAPE)
    assert arms.shape_warning(spec(ELECTRA, BERT, NONE), [state("electra", e), state("bert", b)]) is None
    wider = run("w", {**SHAPE, "model.hidden_size": "256"})
    warning = arms.shape_warning(spec(ELECTRA, BERT, NONE), [state("electra", e), state("bert", wider)])
    assert warning is not None and "differ in encoder shape" in warning
    assert "bert 64x256x4x2x512" in warning and "none 64x128x4x2x512" in warning


def test_each_verdict_reads_as_a_sentence_with_its_scale():
    claim = Claim("ELECTRA beats BERT", "Table 5", ("electra",), ("bert",), "")
    d = mb.Difference(estimate=-6.3, low=-12.2, high=0.5, sign_probability=0.97, sd=3.0, sd_seeds=2.5, sd_examples=1.0,
                      mean_a=55.7, mean_b=62.0)
    done = Verdict(claim, d, ("sst2",), {"electra": 3, "bert": 3}, 5.0, True, "unresolved at this scale", "")
    missing = Verdict(claim, None, (), {}, 0.0, False, "not run", "")
    lines = arms.scale_sentences([done, missing], {"electra": "E scale", "bert": "B scale"})
    assert lines == ["- ELECTRA beats BERT: **unresolved at this scale** (-6.3 points, 95% interval [-12.2, +0.5]; "
                     "electra: E scale; bert: B scale).", "- ELECTRA beats BERT: not run."]
