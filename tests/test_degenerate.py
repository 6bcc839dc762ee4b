"""A report never dresses noise as a result: arms whose fine-tuning runs all predict one class are called
degenerate (in the tables, the ranking and the verdicts), equal medians tie, a healthy comparison keeps its
verdict, and every fine-tuned checkpoint appears. The stores are written the way fine-tuning logs its runs
(final score plus the dev-predictions artifact) and the report is built as the CLI builds it (write_report)."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from electra_ablate.glue import features as glue_features
from electra_ablate.glue import metrics as glue_metrics
from electra_ablate.glue import tasks as glue
from electra_ablate.report import predictions as pr
from electra_ablate.report import verdicts
from electra_ablate.report.build import write_report
from electra_ablate.report.collect import collect
from electra_ablate.report.markdown import ranking
from electra_ablate.report.paper import load_paper_results
from electra_ablate.sweep import compose
from electra_ablate.sweep.jobs import PretrainJob
from electra_ablate.finetuning import run as finetuning
from electra_ablate.tracking import runs as tracking
from tests.hermetic import finetune_hash_of

# The README's main job in miniature: ELECTRA and BERT at one pre-training seed, random init shaped like ELECTRA.
SWEEP = """
name: honest
description: "ELECTRA vs BERT vs no pre-training"
paper: table5_efficiency
baseline: bert
tasks: [{task}]
seeds: [0, 1, 2]
pretrain_seeds: [0]
checkpoints: {checkpoints}
pretrain: {{model: tiny, trainer.max_steps: 100}}
variants:
  electra: {{objective: electra}}
  bert: {{objective: bert}}
  none: {{random_init_of: electra}}
"""
N = 300
LABELS = {"sst2": (np.arange(N) < 153).astype(int),  # 51% positive: one class scores 51.0
          "stsb": np.random.default_rng(7).uniform(0, 5, N)}


def one_class(task: str, seed: int) -> np.ndarray:
    return np.full(N, 2.5) if glue.get_task(task).is_regression else np.ones(N, int)


def learner(accuracy: float):
    """Predictions right on about `accuracy` of the examples (regression: the gold scores plus noise)."""
    def preds(task: str, seed: int) -> np.ndarray:
        rng = np.random.default_rng(1000 * seed + int(accuracy * 100))
        labels = LABELS[task]
        if glue.get_task(task).is_regression:
            return labels + rng.normal(0, 3 * (1 - accuracy), N)
        return np.where(rng.random(N) < accuracy, labels, 1 - labels)
    return preds


def build(tmp: Path, data_dir: Path, arms: dict, task: str = "sst2", checkpoints=(1.0,)):
    """A store with one pre-training run per pre-trained arm and, per checkpoint and seed, a fine-tuning run
    whose predictions come from arms[variant](task, seed) (a list: one function per seed)."""
    path = tmp / "honest.yaml"
    path.write_text(SWEEP.format(task=task, checkpoints=list(checkpoints)))
    paths = {"root_dir": str(tmp), "data_dir": str(data_dir), "output_root": str(tmp / "outputs"),
             "cache_dir": str(tmp / "outputs" / "cache")}
    ctx = compose.make_context(path, None, paths, f"sqlite:///{tmp}/mlflow.db")
    client = tracking.setup(ctx.tracking_uri, "honest")
    steps = [int(100 * f) for f in checkpoints]
    runs = {}
    for variant in ("electra", "bert"):
        tags = {"kind": "pretrain", "variant": variant, "sweep": "honest", "seed": 0,
                "config_hash": tracking.config_hash(ctx.compose_pretrain(PretrainJob(variant, 0))),
                "checkpoints": json.dumps({str(s): f"/ckpt/step_{s}" for s in steps})}
        run = tracking.RunLogger.start(client, "honest", variant, tags, {"trainer.max_steps": "100"})
        for s in range(10, 101, 10):
            run.log_metrics({"train/flops": 1e9 * s}, s)
        run.finish("FINISHED")
        runs[variant] = run.run_id
    spec = glue.get_task(task)
    hashes = finetune_hash_of(ctx, client)
    for variant, make in arms.items():
        source = runs["electra" if variant == "none" else variant]
        for step in steps if variant != "none" else [100]:
            for seed in range(3):
                preds = (make[seed] if isinstance(make, list) else make)(task, seed)
                labels = LABELS[task]
                tags = {"kind": "finetune", "task": task, "seed": seed, "pretrain_run_id": source, "variant": variant,
                        "pretrained_step": step, "sweep": "honest", "config_hash": hashes[(variant, step, task, seed)],
                        **({tracking.TAG_RANDOM_INIT: "true"} if variant == "none" else {})}
                time.sleep(0.002)
                run = tracking.RunLogger.start(client, "honest", f"{variant}-{task}-s{seed}", tags, parent_run_id=source)
                with warnings.catch_warnings():  # scipy warns of the NaN Spearman of a constant, as fine-tuning logs it
                    warnings.simplefilter("ignore", RuntimeWarning)
                    score = 100 * glue_metrics.METRICS[spec.paper_metric](preds, labels)
                run.log_metrics({"final/score": score}, 3)
                features = glue_features.Features(np.zeros(0, np.int32), np.zeros(0, np.int8),
                                                  np.zeros(N + 1, np.int64), labels, np.arange(N))
                out = tmp / "preds" / run.run_id / "dev_predictions.tsv"
                out.parent.mkdir(parents=True)
                run.log_artifact(finetuning.write_predictions(out, spec, {"dev": features}, {"dev": preds}), "predictions")
                run.finish("FINISHED")
    return ctx, client


def section(text: str, heading: str) -> str:
    return text.split(heading)[1].split("\n## ")[0]


def cells(text: str, start: str) -> list[str]:
    row = next(line for line in text.splitlines() if line.startswith(start))
    return [c.strip() for c in row.strip("|").split("|")]


def test_arms_that_predict_one_class_are_degenerate_and_never_ranked(tmp_path, data_dir):
    ctx, client = build(tmp_path, data_dir, {"electra": one_class, "bert": one_class, "none": one_class})
    text = write_report(ctx, client, tmp_path / "reports").read_text()

    assert "**Warning: no fine-tuning run learned anything**" in text
    assert text.index("Warning: no fine-tuning run learned anything") < text.index("## GLUE dev")
    main = cells(text, "| electra (ELECTRA) |")
    assert main[1] == "51.0" and main[-2:] == ["3", "3 of 3"] and main[-3] == "– (degenerate)"
    assert cells(text, "| none |")[-1] == "3 of 3"
    assert "Ranking by median" not in text and "Ranking by best-of-N" not in text
    assert "No ranking: no arm has runs that learn (electra: 3 of 3 SST-2 runs predict one class; " in text

    verdict_rows = [line for line in section(text, "## Verdicts on the paper's claims").splitlines()
                    if line.startswith("| ") and not line.startswith("| claim")]
    assert len(verdict_rows) == 3
    for row in verdict_rows:
        c = [x.strip() for x in row.strip("|").split("|")]
        assert c[4] == "–" and c[6].startswith("**degenerate**: ") and "3 of 3 SST-2 runs predict one class" in c[6]
        assert not any(word in row for word in ("holds", "reversed", "unresolved"))
    assert "- ELECTRA beats BERT: **degenerate**, no comparison (electra: 3 of 3 SST-2 runs predict one class; " \
           "bert: 3 of 3 SST-2 runs predict one class;" in text
    final = collect(ctx, client).scores
    results = verdicts.verdicts(ctx.spec, final, client, load_paper_results())
    assert {v.verdict for v in results} == {"degenerate"} and all(v.difference is None for v in results)


def test_healthy_arms_keep_their_verdict_and_partly_degenerate_ones_are_named(tmp_path, data_dir):
    ctx, client = build(tmp_path, data_dir, {"electra": learner(0.9), "bert": learner(0.7),
                                             "none": [learner(0.6), one_class, learner(0.6)]})
    text = write_report(ctx, client, tmp_path / "reports").read_text()
    assert "Warning" not in text
    assert cells(text, "| electra (ELECTRA) |")[-1] == "0 of 3" and cells(text, "| none |")[-1] == "1 of 3"
    assert "Ranking by median GLUE: electra > bert > none." in text
    verdict = section(text, "## Verdicts on the paper's claims")
    row = cells(verdict, "| ELECTRA beats BERT |")
    assert row[6] == "holds (one pre-training seed)" and float(row[4].split()[0]) > 0
    floor = cells(verdict, "| Pre-training beats no pre-training (sanity check): bert > none |")
    assert floor[6] == "holds (one pre-training seed); partly degenerate: none: 1 of 3 SST-2 runs predict one class"


def test_equal_medians_are_a_tie(tmp_path, data_dir):
    same = learner(0.8)
    ctx, client = build(tmp_path, data_dir, {"electra": same, "bert": same, "none": learner(0.6)})
    text = write_report(ctx, client, tmp_path / "reports").read_text()
    assert "Ranking by median GLUE: electra = bert > none." in text
    assert cells(text, "| electra (ELECTRA) |")[1] == cells(text, "| bert (BERT) |")[1]
    # Ties are by the displayed precision; the order within a tie is the given one, not the hidden decimals.
    assert ranking({"a": 69.96, "b": 70.04, "c": 71.0}) == "c > a = b"
    assert ranking({"a": 70.0, "b": 70.0, "c": 70.0}) == "a = b = c"
    assert ranking({"a": 60.0, "b": 70.0}) == "b > a"


def test_intermediate_checkpoints_appear_without_asking_for_figures(tmp_path, data_dir):
    ctx, client = build(tmp_path, data_dir, {"electra": learner(0.9), "bert": learner(0.7), "none": learner(0.6)},
                        checkpoints=(0.5, 1.0))
    assert ctx.spec.figures == ()
    out = tmp_path / "reports"
    text = write_report(ctx, client, out).read_text()
    curves = section(text, "## Learning curves")
    assert (out / "honest" / "learning_curves.png").is_file() and "![learning curves]" in curves
    rows = {(c[0], c[1]): c for c in (cells(line, "|") for line in curves.splitlines() if line.startswith("| electra")
                                      or line.startswith("| bert"))}
    assert set(rows) == {("electra", "0.5"), ("electra", "1"), ("bert", "0.5"), ("bert", "1")}
    assert "| none |" not in curves  # random weights: no pre-training to draw a curve over
    data = collect(ctx, client)
    half = data.scores[(data.scores["variant"] == "electra") & (data.scores["step"] == 50)]["score"]
    assert rows[("electra", "0.5")][2] == "50" and rows[("electra", "0.5")][4] == f"{half.median():.1f}"
    assert rows[("electra", "0.5")][3] == "5e+10" and rows[("electra", "0.5")][-1] == "0 of 3"


def test_a_sweep_of_final_checkpoints_only_has_no_learning_curves(tmp_path, data_dir):
    ctx, client = build(tmp_path, data_dir, {"electra": learner(0.9), "bert": learner(0.7)})
    assert "## Learning curves" not in write_report(ctx, client, tmp_path / "reports").read_text()


def test_constant_regression_predictions_are_degenerate_not_failed(tmp_path, data_dir):
    ctx, client = build(tmp_path, data_dir, {"electra": one_class, "bert": [learner(0.8), one_class, learner(0.8)]},
                        task="stsb")
    data = collect(ctx, client)
    electra = data.scores[data.scores["variant"] == "electra"]
    assert len(electra) == 3 and list(electra["score"]) == [0.0] * 3 and electra["degenerate"].all()
    assert not any("stsb" in p for p in data.problems if "electra" in p)  # finished, not failed
    text = write_report(ctx, client, tmp_path / "reports").read_text()
    assert cells(text, "| electra (ELECTRA) |")[-1] == "3 of 3" and cells(text, "| bert (BERT) |")[-1] == "1 of 3"
    row = cells(section(text, "## Verdicts on the paper's claims"), "| ELECTRA beats BERT |")
    assert row[6] == "**degenerate**: electra: 3 of 3 STS-B runs predict a constant"


def test_a_partly_constant_regression_arm_keeps_a_finite_verdict(tmp_path, data_dir):
    ctx, client = build(tmp_path, data_dir, {"electra": learner(0.9), "bert": [learner(0.6), one_class, learner(0.6)]},
                        task="stsb")
    final = collect(ctx, client).scores
    v = next(v for v in verdicts.verdicts(ctx.spec, final, client, load_paper_results())
             if v.claim.text == "ELECTRA beats BERT")
    assert v.verdict == "holds" and np.isfinite([v.difference.estimate, v.difference.low, v.difference.high]).all()
    assert v.note == "partly degenerate: bert: 1 of 3 STS-B runs predict a constant"


@pytest.mark.parametrize("preds, constant", [
    (np.full(10, 3.0), True), (3.0 + 1e-7 * np.arange(10), True), (np.array([1.0, np.nan] * 5), True),
    (np.linspace(0, 5, 10), False), (3.0 + 0.01 * np.arange(10), False)])
def test_a_regression_head_is_constant_below_a_tiny_spread(preds, constant):
    assert pr.is_constant(glue.get_task("stsb"), np.linspace(0, 5, 10), preds) is constant


def test_runs_without_predictions_are_counted_as_unknown():
    assert pr.count([True, None, False]) == pr.Count(1, 2, 3)
    assert pr.cell({"sst2": pr.Count(1, 2, 3)}) == "1 of 3, 1 unknown"
    assert pr.cell({"sst2": pr.Count(0, 0, 3)}) == "unknown (3 runs without predictions)"
    assert not pr.Count(2, 2, 3).all  # an unknown run may have learned
    assert pr.cell({"cola": pr.Count(3, 3, 3), "rte": pr.Count(1, 3, 3)}) == "4 of 6 (CoLA 3 of 3, RTE 1 of 3)"
