"""Verdicts and expected-max curves on a store whose runs carry dev-prediction artifacts the way fine-tuning
logs them: a known gap holds, no pre-training is its own arm (each run its own group), runs without
predictions fall back to their final scores, claims are data, and the expected max matches its definition."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import numpy as np
import pytest

from electra_ablate.finetuning import run as finetuning
from electra_ablate.glue import features as glue_features
from electra_ablate.glue import metrics as glue_metrics
from electra_ablate.glue import tasks as glue
from electra_ablate.report import expected_max
from electra_ablate.report import verdicts
from electra_ablate.report.build import write_report
from electra_ablate.report.collect import collect
from electra_ablate.report.paper import load_paper_results
from electra_ablate.report.stats import summarize
from electra_ablate.sweep import compose
from electra_ablate.sweep.jobs import PretrainJob
from electra_ablate.sweep.spec import load_sweep
from electra_ablate.tracking import runs as tracking
from tests.hermetic import finetune_hash_of

SWEEP_FILE = """
name: claims_mini
description: "Verdicts on a miniature Table 5 with a random-init floor"
paper: table5_efficiency
baseline: electra
tasks: [cola, rte]
seeds: [0, 1, 2]
pretrain_seeds: [0, 1]
pretrain: {model: tiny, trainer.max_steps: 100}
variants:
  electra: {objective: electra}
  bert: {objective: bert}
  scratch: {pretrained: none}
"""
ACCURACY = {"electra": 0.85, "bert": 0.70, "scratch": 0.52}
N = 300


def make_context(tmp_path: Path, data_dir: Path, text: str = SWEEP_FILE) -> compose.SweepContext:
    path = tmp_path / "claims_mini.yaml"
    path.write_text(text)
    paths = {"root_dir": str(tmp_path), "data_dir": str(data_dir), "output_root": str(tmp_path / "outputs"),
             "cache_dir": str(tmp_path / "outputs" / "cache")}
    return compose.make_context(path, None, paths, f"sqlite:///{tmp_path}/mlflow.db")


def log_finetune(client, tmp: Path, pretrain_id: str | None, variant: str, task: str, seed: int, rng,
                 hashes: dict, with_predictions: bool = True) -> None:
    spec = glue.get_task(task)
    labels = np.random.default_rng(123).integers(0, 2, N)  # the same dev set for every run
    correct = rng.random(N) < ACCURACY[variant] + rng.normal(0, 0.02)
    preds = np.where(correct, labels, 1 - labels)
    score = 100 * glue_metrics.METRICS[spec.paper_metric](preds, labels)
    tags = {"kind": "finetune", "task": task, "seed": seed, "pretrain_run_id": pretrain_id or "none",
            "pretrained_step": 100 if pretrain_id else 0, "variant": variant, "sweep": "claims_mini",
            "config_hash": hashes[(pretrain_id, 100, task, seed) if pretrain_id else (variant, None, task, seed)]}
    time.sleep(0.002)
    run = tracking.RunLogger.start(client, "claims_mini", f"{task}-s{seed}", tags, parent_run_id=pretrain_id)
    run.log_metrics({"final/score": score}, 3)
    if with_predictions:
        features = glue_features.Features(np.zeros(0, np.int32), np.zeros(0, np.int8), np.zeros(N + 1, np.int64), labels,
                                 np.arange(N))
        out = tmp / run.run_id / "dev_predictions.tsv"
        run.log_artifact(finetuning.write_predictions(out, spec, {"dev": features}, {"dev": preds}), "predictions")
    run.finish("FINISHED")


def build_store(tmp: Path, data_dir: Path, with_predictions=lambda variant: True):
    ctx = make_context(tmp, data_dir)
    client = tracking.setup(ctx.tracking_uri, "claims_mini")
    rng = np.random.default_rng(0)
    pretrained = {}
    for variant, pseed in itertools.product(("electra", "bert"), (0, 1)):
        cfg_hash = tracking.config_hash(ctx.compose_pretrain(PretrainJob(variant, pseed)))
        tags = {"kind": "pretrain", "config_hash": cfg_hash, "variant": variant, "sweep": "claims_mini",
                "seed": pseed, "checkpoints": json.dumps({"100": "/ckpt/final"})}
        run = tracking.RunLogger.start(client, "claims_mini", f"{variant}-s{pseed}", tags, {"trainer.max_steps": "100"})
        run.finish("FINISHED")
        pretrained[(variant, pseed)] = run.run_id
    hashes = finetune_hash_of(ctx, client)  # the report counts only runs of the grid's current fine-tuning config
    for (variant, pseed), run_id in pretrained.items():
        for task, seed in itertools.product(("cola", "rte"), (0, 1, 2)):
            log_finetune(client, tmp, run_id, variant, task, seed, rng, hashes, with_predictions(variant))
    for task, seed in itertools.product(("cola", "rte"), (0, 1, 2)):
        log_finetune(client, tmp, None, "scratch", task, seed, rng, hashes, with_predictions("scratch"))
    return ctx, client


@pytest.fixture(scope="module")
def store(tmp_path_factory, data_dir):
    return build_store(tmp_path_factory.mktemp("verdicts"), data_dir)


def test_claims_hold_and_no_pretraining_is_an_arm_of_single_runs(store, tmp_path):
    ctx, client = store
    data = collect(ctx, client)
    final = data.scores[data.scores["final"].astype(bool)]
    assert set(final["variant"]) == {"electra", "bert", "scratch"} and len(final) == 2 * 3 * 2 * 2 + 6
    results = {v.claim.text: v for v in verdicts.verdicts(ctx.spec, final, client, load_paper_results())}
    assert set(results) == {"ELECTRA beats BERT", "Pre-training beats no pre-training (sanity check): electra > scratch",
                            "Pre-training beats no pre-training (sanity check): bert > scratch"}
    v = results["ELECTRA beats BERT"]
    assert v.verdict == "holds" and v.examples and v.groups == {"electra": 2, "bert": 2}
    assert v.tasks == ("cola", "rte") and v.claim.paper == "85.0 vs 82.2 (+2.8)"
    assert v.difference.low > 0 and v.runs_per_group == 3
    floor = results["Pre-training beats no pre-training (sanity check): bert > scratch"]
    assert floor.verdict == "holds" and floor.groups == {"bert": 2, "scratch": 3}  # each scratch run its own group

    text = write_report(ctx, client, tmp_path / "reports").read_text()
    section = text.split("## Verdicts on the paper's claims")[1].split("## Failed and missing runs")[0]
    row = next(line for line in section.splitlines() if line.startswith("| ELECTRA beats BERT |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:4] == ["Table 5", "85.0 vs 82.2 (+2.8)", "GLUE-2: CoLA, RTE"] and cells[6] == "holds"
    assert "## Expected best dev score of n runs" in text and (tmp_path / "reports/claims_mini/expected_max.png").is_file()
    # The existing sections count the random-init arm too.
    summary = summarize(data)
    assert summary.glue["scratch"] is not None and len(summary.seed_glue[summary.seed_glue["variant"] == "scratch"]) == 3
    assert "scratch" in summary.differences


def test_runs_without_predictions_fall_back_to_their_scores(tmp_path, data_dir):
    ctx, client = build_store(tmp_path, data_dir, with_predictions=lambda variant: variant != "bert")
    data = collect(ctx, client)
    final = data.scores[data.scores["final"].astype(bool)]
    results = {v.claim.text: v for v in verdicts.verdicts(ctx.spec, final, client, load_paper_results())}
    assert not results["ELECTRA beats BERT"].examples and results["ELECTRA beats BERT"].verdict == "holds"
    assert results["Pre-training beats no pre-training (sanity check): electra > scratch"].examples
    lines = verdicts.render(list(results.values()))
    assert any("no predictions: examples not resampled" in line for line in lines)


def test_unresolved_claims_say_what_would_resolve_them():
    d = verdicts.mb.Difference(0.5, -0.4, 1.4, 0.85, 0.46, 0.4, 0.1, 80.5, 80.0)
    assert verdicts.verdict_of(d) == "unresolved at this scale"
    text = verdicts.what_it_takes(d, verdicts.verdict_of(d), {"a": 3, "b": 3}, 10)
    k = verdicts.mb.seeds_to_resolve(d)
    assert text.startswith(f"≈{int(np.ceil(k * 3))} pre-training seeds per arm x 10 fine-tuning seeds")
    single = verdicts.what_it_takes(d, "unresolved at this scale", {"a": 1, "b": 1}, 10)
    assert f"≈{int(np.ceil(k * 10))} fine-tuning seeds per arm" in single and "≥2 pre-training seeds" in single
    noisy = verdicts.what_it_takes(d._replace(sd_examples=0.5), "unresolved at this scale", {"a": 3, "b": 3}, 10)
    assert noisy.startswith("no number of seeds")
    assert verdicts.verdict_of(d._replace(low=-2.0, high=-0.1)) == "reversed"


def test_claims_cover_the_paper_sweeps():
    paper = load_paper_results()
    claims = verdicts.load_claims()
    table5 = verdicts.sweep_claims(load_sweep("table5_efficiency"), paper)
    paper_claims = [c for c in table5 if c.worse != ("none",)]
    assert len(paper_claims) == len(claims["table5_efficiency"]) == 5
    # ...and the random-init floor under every pre-trained arm
    assert sorted(c.better for c in table5 if c.worse == ("none",)) == [
        ("all_tokens_mlm",), ("bert",), ("electra",), ("electra_15",), ("replace_mlm",)]
    sizes = verdicts.sweep_claims(load_sweep("generator_size", "tiny"), paper)
    best = [c for c in sizes if c.text.startswith("Generators 1/4-1/2")]
    assert sorted(c.text for c in best) == [f"Generators 1/4-1/2 the discriminator's size work best (discriminator={d})"
                                            for d in ("d128", "d64")]
    assert {c.better for c in best} == {("d64-g1_4", "d64-g1_2"), ("d128-g1_4", "d128-g1_2")}
    assert {c.worse for c in best} == {("d64-g1_8", "d64-g3_4", "d64-g1"), ("d128-g1_8", "d128-g3_4", "d128-g1")}
    for name in ("weight_sharing", "training_algorithms", "table1_small", "quick"):
        assert verdicts.sweep_claims(load_sweep(name), paper), name
    assert verdicts.sweep_claims(load_sweep("released_models"), paper) == []


def test_a_claim_entry_missing_its_arms_is_refused(tmp_path):
    path = tmp_path / "claims.yaml"
    path.write_text("table5_efficiency:\n  - {claim: x, figure: y, better: [electra]}\n")
    with pytest.raises(verdicts.ClaimsError, match=r"table5_efficiency\[0\]: needs `better` and `worse`"):
        verdicts.load_claims(path)
    path.write_text("table5_efficiency:\n  - {claim: x, figure: y, better: [a], worse: [b], beter: [c]}\n")
    with pytest.raises(verdicts.ClaimsError, match=r"unknown key\(s\) \['beter'\]"):
        verdicts.load_claims(path)


def test_glue_subsets_are_labelled_with_their_tasks():
    assert verdicts.glue_label(["rte", "cola", "sst2", "mrpc", "stsb"]) == "GLUE-5: CoLA, SST-2, MRPC, STS-B, RTE"
    assert verdicts.glue_label(["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte"]) == "GLUE"


def test_expected_max_matches_its_definition():
    scores = [70.0, 72.0, 72.0, 75.0, 80.0]
    mean, sd = expected_max.expected_max(scores)
    assert mean[0] == pytest.approx(np.mean(scores)) and sd[0] == pytest.approx(np.std(scores))
    # n = 2 by enumeration of all ordered pairs drawn with replacement.
    maxima = [max(a, b) for a, b in itertools.product(scores, repeat=2)]
    assert mean[1] == pytest.approx(np.mean(maxima)) and sd[1] == pytest.approx(np.std(maxima))
    assert np.all(np.diff(mean) > 0) and mean[-1] < max(scores)
    far, _ = expected_max.expected_max(scores, n_max=500)
    assert far[-1] == pytest.approx(80.0, abs=1e-6)
