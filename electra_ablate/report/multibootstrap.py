"""Multi-bootstrap: is arm A better than arm B, counting pre-training seeds, fine-tuning seeds and dev examples?

The paper's gaps are small (Table 5: Replace MLM 82.4 vs BERT 82.2), and an interval over the fine-tuning
seeds of one pre-trained model says nothing about another pre-training run of the same recipe. MultiBERTs
(Sellam et al. 2022, "The MultiBERTs: BERT Reproductions for Robustness Analysis", section 3; reference
language/multiberts/multibootstrap.py in google-research/language) resamples pre-training seeds and test
examples together. Here, per bootstrap sample and per arm:

1. draw the arm's pre-training groups with replacement (the same draw for every task: a pre-trained model
   is one draw whatever it is fine-tuned on);
2. within each drawn group, draw its fine-tuning runs of the task with replacement (two-stage bootstrap);
3. draw the task's dev examples with replacement, the same draw for both arms (paired over examples);
4. score every run on the drawn examples with the task's GLUE metric (x 100), average the drawn runs of each
   group, then the groups (a macro-average as in the reference: every pre-training seed counts equally).

The GLUE statistic of an arm is the mean of its task statistics; the difference A - B gives the estimate (the
same macro-average on all the data), a percentile interval and the probability that the sign of the
estimate is right (the share of samples with that sign). Pre-training seeds are never paired across arms:
seed 0 of ELECTRA and seed 0 of BERT are unrelated models.

Special cases, reported in `Comparison.notes`:
- one pre-training group in an arm: step 1 cannot vary it, so pre-training variance is not covered;
- an arm with no pre-training (fine-tuned from random init, `pretrained=none`): each run's seed draws both
  the random encoder and the fine-tuning order, so every run is its own group (pass `group=None`);
- no per-example predictions (old runs): pass `RunScore`s (each run's final score) instead; groups and runs
  are resampled, example variance is then not covered.

Use:
    a = {"rte": [RunPredictions("pre-run-1", 0, idx, labels, preds), ...], "cola": [...]}
    result = compare(a, b)            # -> Comparison: estimate, low, high, sign_probability, tasks, notes
    result.tasks["rte"].estimate      # per-task differences, same fields
    boot = bootstrap({"electra": a, "bert": b, "none": c})   # several arms, jointly: ArmSamples per arm
    difference(best_of([boot.glue["g1_4"], boot.glue["g1_2"]]), boot.glue["g1"])   # any contrast of arms
Every resample is vectorised: metrics come from example counts (B, N) and matrix products, so 1000
samples over 1000 examples x 30 runs take about a second.
"""

from __future__ import annotations

import csv
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from electra_ablate.glue import tasks as glue
from electra_ablate.glue.metrics import METRICS

SAMPLES = 1000
SEED = 0
LEVEL = 0.95


class MultiBootstrapError(ValueError):
    """Runs that cannot be compared (no runs, disagreeing labels, no common examples)."""


class RunPredictions(NamedTuple):
    """One fine-tuning run's dev predictions (the task's paper split: MNLI matched)."""

    group: str | None  # pre-training run (or seed); None = no pre-training: the run is its own group
    seed: int  # fine-tuning seed
    index: np.ndarray  # (N,) example ids (the GLUE file's row numbers)
    labels: np.ndarray  # (N,) gold labels: class ids, or STS-B scores
    predictions: np.ndarray  # (N,) predicted class ids, or scores


class RunScore(NamedTuple):
    """A run's final task score (x 100), for the fallback without predictions."""

    group: str | None
    seed: int
    score: float


class Difference(NamedTuple):
    estimate: float  # A - B on all the data (macro-average over groups of the mean over runs)
    low: float
    high: float
    sign_probability: float  # share of bootstrap samples whose difference has the estimate's sign
    sd: float  # bootstrap standard deviation of the difference
    sd_seeds: float  # ... resampling groups and runs only (examples fixed)
    sd_examples: float  # ... resampling examples only (every run once)
    mean_a: float
    mean_b: float


class Comparison(NamedTuple):
    difference: Difference  # the mean over tasks (the GLUE-style score)
    tasks: dict[str, Difference]
    groups: tuple[int, int]  # pre-training groups of A and B
    runs: tuple[int, int]  # fine-tuning runs of A and B (all tasks)
    examples: dict[str, int]  # task -> dev examples compared (0 for the score fallback)
    pretrain_variance: bool  # False when an arm has a single pre-training group
    notes: tuple[str, ...]


# --- reading the fine-tuning artifact --------------------------------------------------------------------


def read_predictions(path: str | Path, task: glue.TaskSpec, split: str | None = None):
    """(index, labels, predictions) of one split (default: the task's paper split) from the dev-predictions
    TSV that every fine-tuning run logs (finetune.write_predictions: split, index, label, prediction)."""
    split = split or task.dev_splits[0].name
    rows = []
    with open(path, newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\")
        header = next(reader, None)
        if header != ["split", "index", "label", "prediction"]:
            raise MultiBootstrapError(f"{path}: not a dev-predictions file (header {header})")
        rows = [r for r in reader if r[0] == split]
    if not rows:
        raise MultiBootstrapError(f"{path}: no rows of split {split!r} for task {task.name}")
    if task.is_regression:
        decode = float
    else:
        ids = {label: i for i, label in enumerate(task.tsv_labels)}
        decode = ids.__getitem__
    index = np.array([int(r[1]) for r in rows], dtype=np.int64)
    labels = np.array([decode(r[2]) for r in rows])
    preds = np.array([decode(r[3]) for r in rows])
    return index, labels, preds


# --- vectorised metrics on example counts -----------------------------------------------------------------


def _weighted_ranks(values: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Average ranks (ties share their mean rank, as scipy's rankdata) of the multiset in which example i
    appears w[b, i] times: (N,) values, (B, N) counts -> (B, N) rank of each example."""
    order = np.argsort(values, kind="stable")
    _, starts, inverse = np.unique(values[order], return_index=True, return_inverse=True)
    weight = np.add.reduceat(w[:, order], starts, axis=1)  # (B, G) copies per distinct value
    rank = np.cumsum(weight, axis=1) - weight + (weight + 1) / 2  # (B, G)
    out = np.empty_like(w, dtype=float)
    out[:, order] = rank[:, inverse]
    return out


def _weighted_pearson(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Pearson correlation per row of (B, N) x and y, example i counted w[b, i] times -> (B,); 0 where either
    side is constant (undefined: no ranking information, as a one-class MCC is 0; report/collect.py scores
    such a run 0 too)."""
    n = w.sum(axis=1, keepdims=True)
    mx, my = (w * x).sum(1, keepdims=True) / n, (w * y).sum(1, keepdims=True) / n
    dx, dy = x - mx, y - my
    cov = (w * dx * dy).sum(1)
    var = (w * dx * dx).sum(1) * (w * dy * dy).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(var > 0, cov / np.sqrt(var), 0.0)


def resampled_metric(task: glue.TaskSpec, labels: np.ndarray, preds: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The task's paper metric x 100 (glue.metrics.task_score) of every run on every resample: (N,) labels, (R, N)
    predictions, (B, N) example counts -> (B, R). Equal to glue.metrics.METRICS on the expanded resample (tested),
    but 0 where that is NaN (a constant prediction's correlation)."""
    metric = task.paper_metric
    w = w.astype(float)
    n = w.sum(axis=1, keepdims=True)  # (B, 1)
    if metric == "accuracy":
        return 100 * (w @ (preds == labels).T.astype(float)) / n
    if metric == "mcc":  # binary (CoLA): confusion counts from matrix products
        p, y = (preds == 1).astype(float), (labels == 1).astype(float)
        tp, fp = w @ (p * y).T, w @ (p * (1 - y)).T
        fn = (w * y).sum(1, keepdims=True) - tp
        tn = n - tp - fp - fn
        den = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
        with np.errstate(invalid="ignore", divide="ignore"):
            return 100 * np.where(den > 0, (tp * tn - fp * fn) / den, 0.0)  # sklearn: 0 when a margin is empty
    if metric == "spearman":  # Pearson correlation of the average ranks of the resample
        y = _weighted_ranks(labels, w)
        return 100 * np.stack([_weighted_pearson(_weighted_ranks(p, w), y, w) for p in preds], axis=1)
    raise MultiBootstrapError(f"task {task.name}: no resampled form of metric {metric!r}")


# --- the bootstrap --------------------------------------------------------------------------------------


def _groups(runs: Sequence) -> list[str]:
    """Each run's group key; a run without pre-training (group None) is its own group."""
    return [str(r.group) if r.group is not None else f"\0run{i}" for i, r in enumerate(runs)]


class _Arm:
    """An arm's group draws, shared by its tasks: counts[b, g] = times group g was drawn in sample b."""

    def __init__(self, arm: Mapping[str, Sequence], rng: np.random.Generator, samples: int):
        self.keys = {t: _groups(runs) for t, runs in arm.items()}
        self.names = sorted({g for keys in self.keys.values() for g in keys})
        self.counts = rng.multinomial(len(self.names), np.full(len(self.names), 1 / len(self.names)), size=samples)
        self.rng = rng

    def weights(self, task: str) -> tuple[np.ndarray, np.ndarray]:
        """Run weights of the macro-average (each group equal, runs equal within it): on all the data (R,),
        and per bootstrap sample with groups and runs drawn (B, R)."""
        keys = self.keys[task]
        present = sorted(set(keys))
        col = {g: self.names.index(g) for g in present}
        full = np.zeros(len(keys))
        drawn = np.zeros((self.counts.shape[0], len(keys)))
        for g in present:
            members = [i for i, k in enumerate(keys) if k == g]
            full[members] = 1 / (len(present) * len(members))
            c = self.counts[:, col[g]]  # (B,) times the group was drawn
            # Each of the c draws picks len(members) runs with replacement; pooled, that is one multinomial.
            picks = self.rng.multinomial(c * len(members), np.full(len(members), 1 / len(members)))
            drawn[:, members] = picks / len(members)
        total = self.counts[:, [col[g] for g in present]].sum(axis=1, keepdims=True)  # groups of this task drawn
        with np.errstate(invalid="ignore", divide="ignore"):
            drawn = drawn / total  # a sample that drew none of this task's groups gives NaN (dropped later)
        return full, drawn


class ArmSamples(NamedTuple):
    """An arm's statistic (x 100): per bootstrap sample in three flavours, and on all the data."""

    drawn: np.ndarray  # (B,) groups, runs and examples resampled
    seeds: np.ndarray  # (B,) groups and runs resampled, every example once
    examples: np.ndarray | None  # (B,) examples resampled, every run once; None without predictions
    estimate: float  # macro-average over groups of the mean over runs, on all the data


def best_of(arms: Sequence[ArmSamples]) -> ArmSamples:
    """The best of several arms in every sample ("the best generator size lies among these")."""
    ex = None if any(a.examples is None for a in arms) else np.max([a.examples for a in arms], axis=0)
    return ArmSamples(np.max([a.drawn for a in arms], axis=0), np.max([a.seeds for a in arms], axis=0), ex,
                      max(a.estimate for a in arms))


class Bootstrap(NamedTuple):
    glue: dict[str, ArmSamples]  # arm -> mean of its task statistics
    tasks: dict[str, dict[str, ArmSamples]]  # task -> arm -> samples
    groups: dict[str, int]  # arm -> pre-training groups
    runs: dict[str, int]  # arm -> fine-tuning runs (all tasks)
    examples: dict[str, int]  # task -> dev examples compared (0: final scores only)


def bootstrap(arms: Mapping[str, Mapping[str, Sequence[RunPredictions] | Sequence[RunScore]]],
              tasks: Sequence[str] | None = None, samples: int = SAMPLES, seed: int | None = None) -> Bootstrap:
    """Joint multi-bootstrap of any number of arms ({arm: {task: runs}}) on the tasks they all ran (GLUE
    order; or `tasks`): one draw of examples per task shared by every arm, one draw of groups per arm shared
    by its tasks. A task whose runs are RunScore (no predictions) is resampled over groups and runs only."""
    tasks = [t for t in (tasks or glue.TASKS) if all(arm.get(t) for arm in arms.values())]
    if not tasks:
        raise MultiBootstrapError("no task has runs in every arm: " + "; ".join(
            f"{name}: {sorted(t for t, runs in arm.items() if runs)}" for name, arm in arms.items()))
    rng = np.random.default_rng(SEED if seed is None else seed)  # SEED: the report's bootstrap_seed setting
    draws = {name: _Arm({t: arm[t] for t in tasks}, rng, samples) for name, arm in arms.items()}
    per_task: dict[str, dict[str, ArmSamples]] = {}
    examples = {}
    for t in tasks:
        task = glue.get_task(t)
        runs = [r for arm in arms.values() for r in arm[t]]
        if all(isinstance(r, RunPredictions) for r in runs):
            labels, preds, n = _common_examples(task, runs)
            w = rng.multinomial(n, np.full(n, 1 / n), size=samples)  # (B, N), the same for every arm
            scores = resampled_metric(task, labels, preds, w)  # (B, R)
            observed = _observed(task, preds, labels)  # (R,) on all the data
        elif all(isinstance(r, RunScore) for r in runs):
            n, scores, observed = 0, None, np.array([r.score for r in runs], dtype=float)
        else:
            raise MultiBootstrapError(f"task {t}: mixes runs with and without predictions; pass RunScore for all")
        examples[t] = n
        per_task[t], start = {}, 0
        for name, arm in arms.items():
            cols = slice(start, start + len(arm[t]))
            start = cols.stop
            full, drawn = draws[name].weights(t)
            per_task[t][name] = ArmSamples(
                drawn @ observed[cols] if scores is None else (drawn * scores[:, cols]).sum(1),
                drawn @ observed[cols], None if scores is None else scores[:, cols] @ full, float(full @ observed[cols]))
    mean = {}
    for name in arms:
        parts = [per_task[t][name] for t in tasks]
        ex = None if any(p.examples is None for p in parts) else np.mean([p.examples for p in parts], axis=0)
        mean[name] = ArmSamples(np.mean([p.drawn for p in parts], axis=0), np.mean([p.seeds for p in parts], axis=0),
                                ex, float(np.mean([p.estimate for p in parts])))
    return Bootstrap(mean, per_task, {name: len(d.names) for name, d in draws.items()},
                     {name: sum(len(arm[t]) for t in tasks) for name, arm in arms.items()}, examples)


def difference(a: ArmSamples, b: ArmSamples, level: float = LEVEL) -> Difference:
    """A - B: the estimate, its percentile interval, the share of samples with the estimate's sign."""
    d = a.drawn - b.drawn
    d = d[np.isfinite(d)]  # a sample that drew none of a task's groups
    est = a.estimate - b.estimate
    alpha = (1 - level) / 2
    low, high = np.quantile(d, [alpha, 1 - alpha]) if len(d) else (math.nan, math.nan)
    sign = 0.5 if est == 0 or not len(d) else float(np.mean(np.sign(d) == np.sign(est)))
    sd_examples = 0.0 if a.examples is None or b.examples is None else np.nanstd(a.examples - b.examples, ddof=1)
    return Difference(float(est), float(low), float(high), sign, float(np.std(d, ddof=1)),
                      float(np.nanstd(a.seeds - b.seeds, ddof=1)), float(sd_examples), a.estimate, b.estimate)


def _common_examples(task: glue.TaskSpec, runs: Sequence[RunPredictions]):
    """Labels (N,) and predictions (R, N) on the examples every run predicted, in index order."""
    common = runs[0].index
    for r in runs[1:]:
        common = np.intersect1d(common, r.index)
    if not len(common):
        raise MultiBootstrapError(f"task {task.name}: the runs share no dev example (check glue_data.max_eval_examples)")
    labels, preds = None, []
    for r in runs:
        pos = {int(i): j for j, i in enumerate(r.index)}
        take = np.array([pos[int(i)] for i in common])
        y = np.asarray(r.labels)[take]
        if labels is None:
            labels = y
        elif not np.allclose(labels, y):
            raise MultiBootstrapError(f"task {task.name}: runs disagree on the gold labels of the same examples")
        preds.append(np.asarray(r.predictions)[take])
    return labels, np.stack(preds), len(common)


def _observed(task: glue.TaskSpec, preds: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each run's paper metric x 100 on all the examples, with the project's metric code (glue.metrics.METRICS);
    an undefined correlation (constant predictions) is 0, as in the resamples."""
    with warnings.catch_warnings():  # scipy's ConstantInputWarning: the NaN it warns of becomes 0 here
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nan_to_num(np.array([100 * METRICS[task.paper_metric](p, labels) for p in preds]), nan=0.0)


def notes(boot: Bootstrap, arms: Sequence[str]) -> tuple[str, ...]:
    """What the comparison of these arms does not cover."""
    out = [f"arm {a} has one pre-training seed: pre-training variance is not covered"
           for a in arms if boot.groups[a] == 1]
    if not all(boot.examples.values()):
        out.append("no per-example predictions: resampled over seeds only, dev-example variance is not covered")
    return tuple(out)


def compare(a: Mapping[str, Sequence[RunPredictions] | Sequence[RunScore]],
            b: Mapping[str, Sequence[RunPredictions] | Sequence[RunScore]], tasks: Sequence[str] | None = None,
            samples: int = SAMPLES, seed: int | None = None, level: float = LEVEL,
            names: tuple[str, str] = ("A", "B")) -> Comparison:
    """Multi-bootstrap of arm A - arm B ({task: runs} each; RunScore runs for the fallback without
    predictions) on the tasks both ran (GLUE order), or `tasks`."""
    boot = bootstrap({names[0]: a, names[1]: b}, tasks, samples, seed)
    per_task = {t: difference(s[names[0]], s[names[1]], level) for t, s in boot.tasks.items()}
    groups = (boot.groups[names[0]], boot.groups[names[1]])
    return Comparison(difference(boot.glue[names[0]], boot.glue[names[1]], level), per_task, groups,
                      (boot.runs[names[0]], boot.runs[names[1]]), boot.examples, min(groups) > 1,
                      notes(boot, names))


def seeds_to_resolve(d: Difference, level: float = LEVEL) -> float | None:
    """How many times the current seeds (pre-training and fine-tuning, scaled together) the interval needs
    to exclude 0, if the estimate held: the seed part of the variance shrinks as 1/k, the dev-example part
    does not. None when no number of seeds can (the estimate is 0, or example noise alone covers it)."""
    z = z_score(level)
    room = (d.estimate / z) ** 2 - d.sd_examples ** 2
    if d.estimate == 0 or room <= 0:
        return None
    return max(1.0, d.sd_seeds ** 2 / room)


def z_score(level: float = LEVEL) -> float:
    """The normal quantile of a two-sided interval at `level` (1.96 for 95%)."""
    from scipy.stats import norm

    return float(norm.ppf(1 - (1 - level) / 2))
