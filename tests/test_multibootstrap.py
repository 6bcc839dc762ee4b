"""The multi-bootstrap on synthetic predictions whose answer is known: its resampled metrics equal the project's
metric code on the expanded resample, identical arms give an interval around 0, a known gap is found and
covered, a single pre-training seed is flagged, and pre-training variance widens the interval as it should."""

from __future__ import annotations

import numpy as np
import pytest

from electra_ablate.finetuning import run as finetuning
from electra_ablate.glue import features as glue_features
from electra_ablate.glue import metrics as glue_metrics
from electra_ablate.glue import tasks as glue
from electra_ablate.report import multibootstrap as mb


def synthetic_arm(rng, accuracy: float, groups: int, seeds: int, n: int = 400, labels=None, group_sd: float = 0.0,
                  run_sd: float = 0.01, pretrained: bool = True, task: str = "rte"):
    """{task: runs}: each run predicts each example correctly with probability accuracy + its group's offset
    (sd group_sd) + its own offset (sd run_sd); labels binary, shared by the arms when given."""
    labels = rng.integers(0, 2, n) if labels is None else labels
    runs = []
    for g in range(groups):
        offset = rng.normal(0, group_sd)
        for s in range(seeds):
            p = np.clip(accuracy + offset + rng.normal(0, run_sd), 0, 1)
            correct = rng.random(n) < p
            preds = np.where(correct, labels, 1 - labels)
            runs.append(mb.RunPredictions(f"g{g}" if pretrained else None, s, np.arange(n), labels, preds))
    return {task: runs}, labels


@pytest.mark.parametrize("task", ["cola", "sst2", "stsb", "mnli", "rte"])
def test_resampled_metric_equals_the_project_metric_on_the_expanded_resample(task):
    rng = np.random.default_rng(1)
    spec = glue.get_task(task)
    n = 60
    if spec.is_regression:  # STS-B: scores on a 0.2 grid, so labels and predictions both have ties
        labels = np.round(rng.uniform(0, 5, n) * 5) / 5
        preds = np.stack([np.round((labels + rng.normal(0, 1, n)) * 2) / 2 for _ in range(3)])
    else:
        labels = rng.integers(0, spec.num_labels, n)
        preds = np.stack([np.where(rng.random(n) < 0.7, labels, rng.integers(0, spec.num_labels, n)) for _ in range(3)])
    idx = rng.integers(0, n, size=(5, n))
    w = np.stack([np.bincount(i, minlength=n) for i in idx])
    got = mb.resampled_metric(spec, labels, preds, w)
    for b in range(5):
        for r in range(3):
            expected = 100 * glue_metrics.METRICS[spec.paper_metric](preds[r][idx[b]], labels[idx[b]])
            assert got[b, r] == pytest.approx(expected, abs=1e-9)


def test_identical_arms_give_an_interval_around_zero():
    rng = np.random.default_rng(0)
    a, labels = synthetic_arm(rng, 0.7, groups=4, seeds=3, group_sd=0.02)
    same = mb.compare(a, a)
    assert same.difference.estimate == 0 and same.difference.low < 0 < same.difference.high
    assert same.difference.sign_probability == 0.5
    # Two arms drawn from the same distribution: no sign is established.
    b, _ = synthetic_arm(rng, 0.7, groups=4, seeds=3, group_sd=0.02, labels=labels)
    other = mb.compare(a, b).difference
    assert other.low < 0 < other.high
    assert 0.5 <= other.sign_probability < 0.975


def test_a_known_gap_is_found_and_covered():
    rng = np.random.default_rng(2)
    a, labels = synthetic_arm(rng, 0.80, groups=3, seeds=4, group_sd=0.01)
    b, _ = synthetic_arm(rng, 0.60, groups=3, seeds=4, group_sd=0.01, labels=labels)
    result = mb.compare(a, b, names=("electra", "bert"))
    d = result.difference
    assert 0 < d.low <= 20.0 <= d.high and d.sign_probability == 1.0
    assert d.estimate == pytest.approx(20.0, abs=3.0)
    assert result.tasks["rte"] == d  # one task: the mean over tasks is that task
    assert result.pretrain_variance and result.groups == (3, 3) and result.runs == (12, 12)
    assert result.examples == {"rte": 400} and result.notes == ()
    reverse = mb.compare(b, a).difference
    assert reverse.estimate == pytest.approx(-d.estimate) and reverse.high < 0


def test_a_single_pretraining_seed_is_flagged():
    rng = np.random.default_rng(3)
    a, labels = synthetic_arm(rng, 0.75, groups=1, seeds=5)
    b, _ = synthetic_arm(rng, 0.65, groups=3, seeds=5, labels=labels)
    result = mb.compare(a, b, names=("electra", "bert"))
    assert not result.pretrain_variance
    assert result.notes == ("arm electra has one pre-training seed: pre-training variance is not covered",)
    assert result.difference.low > 0


def test_pretraining_variance_widens_the_interval_as_the_group_spread_says():
    rng = np.random.default_rng(4)
    n, sd, groups = 2000, 0.05, 8
    a, labels = synthetic_arm(rng, 0.7, groups=groups, seeds=2, n=n, group_sd=sd, run_sd=0.0)
    b, _ = synthetic_arm(rng, 0.7, groups=groups, seeds=2, n=n, group_sd=sd, run_sd=0.0, labels=labels)
    d = mb.compare(a, b, samples=2000).difference
    # Groups: each arm's mean of 8 group offsets has sd 100 * 0.05 / sqrt(8); the bootstrap of the observed
    # offsets estimates it (the observed spread, divided by n rather than n - 1), within sampling error.
    observed = [np.std([np.mean(r.predictions == r.labels) * 100 for r in arm["rte"][::2]]) for arm in (a, b)]
    expected = np.sqrt(sum(s**2 / groups for s in observed))
    assert d.sd_seeds == pytest.approx(expected, rel=0.15)
    assert d.sd > d.sd_seeds > d.sd_examples  # example noise (N = 2000) is the smaller part here
    # A single group per arm cannot see that spread (what is left is the two runs' own binomial noise).
    one = mb.compare({"rte": a["rte"][:2]}, {"rte": b["rte"][:2]}, samples=2000).difference
    assert one.sd_seeds < d.sd_seeds / 2


def test_runs_without_pretraining_are_their_own_groups():
    rng = np.random.default_rng(5)
    a, labels = synthetic_arm(rng, 0.75, groups=2, seeds=3)
    none, _ = synthetic_arm(rng, 0.55, groups=1, seeds=6, labels=labels, pretrained=False)
    result = mb.compare(a, none)
    assert result.groups == (2, 6) and result.pretrain_variance and result.difference.low > 0


def test_arms_are_compared_on_their_common_examples_and_tasks():
    rng = np.random.default_rng(6)
    a, labels = synthetic_arm(rng, 0.8, groups=2, seeds=2, n=100)
    b, _ = synthetic_arm(rng, 0.6, groups=2, seeds=2, n=100, labels=labels)
    cut = b["rte"][0]
    b["rte"][0] = cut._replace(index=cut.index[:80], labels=cut.labels[:80], predictions=cut.predictions[:80])
    cola, _ = synthetic_arm(rng, 0.8, groups=2, seeds=2, n=50, task="cola")
    result = mb.compare({**a, **cola}, b)
    assert set(result.tasks) == {"rte"} and result.examples == {"rte": 80}
    bad = b["rte"][1]
    b["rte"][1] = bad._replace(labels=1 - bad.labels)
    with pytest.raises(mb.MultiBootstrapError, match="disagree on the gold labels"):
        mb.compare(a, b)
    with pytest.raises(mb.MultiBootstrapError, match="no task has runs in every arm"):
        mb.compare(a, cola)


def test_glue_difference_is_the_mean_of_the_task_differences():
    rng = np.random.default_rng(7)
    a, labels = synthetic_arm(rng, 0.8, groups=3, seeds=2)
    b, _ = synthetic_arm(rng, 0.7, groups=3, seeds=2, labels=labels)
    a2, labels2 = synthetic_arm(rng, 0.6, groups=3, seeds=2, task="sst2")
    b2, _ = synthetic_arm(rng, 0.6, groups=3, seeds=2, labels=labels2, task="sst2")
    result = mb.compare({**a, **a2}, {**b, **b2})
    tasks = result.tasks
    assert list(tasks) == ["sst2", "rte"]  # GLUE order
    assert result.difference.estimate == pytest.approx((tasks["rte"].estimate + tasks["sst2"].estimate) / 2)
    assert result.difference.low < tasks["rte"].estimate < result.difference.high + 10


def test_seed_level_fallback_without_predictions():
    rng = np.random.default_rng(8)
    a = {"rte": [mb.RunScore(f"g{g}", s, 70 + g + rng.normal(0, 1)) for g in range(3) for s in range(5)]}
    b = {"rte": [mb.RunScore(f"g{g}", s, 60 + g + rng.normal(0, 1)) for g in range(3) for s in range(5)]}
    result = mb.compare(a, b)
    d = result.difference
    assert d.estimate == pytest.approx(np.mean([r.score for r in a["rte"]]) - np.mean([r.score for r in b["rte"]]))
    assert 0 < d.low < 10 < d.high and d.sd_examples == 0
    assert any("dev-example variance is not covered" in n for n in result.notes)
    same = mb.compare(a, a).difference
    assert same.low < 0 < same.high


def test_seeds_to_resolve_scales_with_the_seed_variance():
    d = mb.Difference(0.5, -0.5, 1.5, 0.8, 0.5, 0.45, 0.1, 80.5, 80.0)
    k = mb.seeds_to_resolve(d)
    z = 1.959963984540054
    assert k == pytest.approx(0.45**2 / ((0.5 / z) ** 2 - 0.1**2))
    # At k times the seeds the interval's half-width would equal the estimate.
    assert z * np.sqrt(d.sd_seeds**2 / k + d.sd_examples**2) == pytest.approx(0.5)
    assert mb.seeds_to_resolve(d._replace(sd_examples=0.3)) is None  # dev-set noise alone covers 0
    assert mb.seeds_to_resolve(d._replace(estimate=0.0)) is None


def test_predictions_artifact_round_trips(tmp_path):
    task = glue.get_task("mnli")
    rng = np.random.default_rng(9)
    feats = {}
    preds = {}
    for split, n in (("dev_matched", 7), ("dev_mismatched", 5)):
        labels = rng.integers(0, 3, n)
        feats[split] = glue_features.Features(np.zeros(0, np.int32), np.zeros(0, np.int8), np.zeros(n + 1, np.int64), labels,
                                     np.arange(n) + 100)
        preds[split] = rng.integers(0, 3, n)
    path = finetuning.write_predictions(tmp_path / "dev_predictions.tsv", task, feats, preds)
    index, labels, got = mb.read_predictions(path, task)
    assert list(index) == list(range(100, 107))
    assert list(labels) == list(feats["dev_matched"].labels) and list(got) == list(preds["dev_matched"])
    _, _, mismatched = mb.read_predictions(path, task, "dev_mismatched")
    assert list(mismatched) == list(preds["dev_mismatched"])
    stsb = glue.get_task("stsb")
    f = glue_features.Features(np.zeros(0, np.int32), np.zeros(0, np.int8), np.zeros(3, np.int64), np.array([0.2, 4.8], np.float32),
                      np.arange(2))
    path = finetuning.write_predictions(tmp_path / "stsb.tsv", stsb, {"dev": f}, {"dev": np.array([1.25, 3.5])})
    assert list(mb.read_predictions(path, stsb)[2]) == [1.25, 3.5]


def test_a_thousand_samples_over_thirty_runs_are_scored_in_one_vectorised_call(monkeypatch):
    """No Python loop over the resamples (what keeps 1000 samples at about a second): one metric call per task
    scores every run on every sample, and the project's metric code runs once per run, on all the data."""
    rng = np.random.default_rng(10)
    a, labels = synthetic_arm(rng, 0.8, groups=5, seeds=3, n=1000)
    b, _ = synthetic_arm(rng, 0.7, groups=5, seeds=3, n=1000, labels=labels)
    resampled, accuracy = mb.resampled_metric, mb.METRICS["accuracy"]
    shapes, scored = [], []

    def counted_resample(task, labels, preds, w):
        shapes.append((preds.shape, w.shape))
        return resampled(task, labels, preds, w)

    def counted_accuracy(preds, labels):
        scored.append(len(preds))
        return accuracy(preds, labels)

    monkeypatch.setattr(mb, "resampled_metric", counted_resample)
    monkeypatch.setitem(mb.METRICS, "accuracy", counted_accuracy)
    result = mb.compare(a, b, samples=1000)
    assert shapes == [((30, 1000), (1000, 1000))]  # (runs, examples), (samples, examples): one call for rte
    assert scored == [1000] * 30
    assert result.difference.estimate == pytest.approx(10, abs=2) and result.difference.low > 0


def test_several_arms_share_the_example_draw_and_best_of_takes_the_best():
    rng = np.random.default_rng(11)
    a, labels = synthetic_arm(rng, 0.70, groups=2, seeds=2)
    b, _ = synthetic_arm(rng, 0.80, groups=2, seeds=2, labels=labels)
    c, _ = synthetic_arm(rng, 0.60, groups=2, seeds=2, labels=labels)
    boot = mb.bootstrap({"a": a, "b": b, "c": c})
    assert boot.groups == {"a": 2, "b": 2, "c": 2} and boot.examples == {"rte": 400}
    best = mb.best_of([boot.glue["a"], boot.glue["b"]])
    assert best.estimate == boot.glue["b"].estimate
    assert np.all(best.drawn >= boot.glue["a"].drawn) and np.all(best.drawn >= boot.glue["b"].drawn)
    d = mb.difference(best, boot.glue["c"])
    assert d.low > 0 and d.estimate == pytest.approx(boot.glue["b"].estimate - boot.glue["c"].estimate)
    # Pairwise from the joint draw equals compare() with the same arms only in the estimate (draws differ).
    assert mb.difference(boot.glue["b"], boot.glue["a"]).estimate == pytest.approx(
        mb.compare(b, a).difference.estimate)
