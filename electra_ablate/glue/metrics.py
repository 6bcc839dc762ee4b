"""GLUE metrics and the GLUE score: the paper's (Clark et al. 2020, section 3.1: CoLA Matthews correlation,
STS-B Spearman, accuracy elsewhere) plus GLUE's secondary ones (MRPC/QQP F1, STS-B Pearson, MNLI mismatched
accuracy), computed with scikit-learn and scipy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np
from scipy import stats
from sklearn import metrics as skm

from electra_ablate.glue.tasks import TASKS, GlueDataError, TaskSpec


def _accuracy(preds, labels) -> float:
    return float(skm.accuracy_score(labels, preds))


def _f1(preds, labels) -> float:
    return float(skm.f1_score(labels, preds, pos_label=1, zero_division=0.0))


def _mcc(preds, labels) -> float:
    return float(skm.matthews_corrcoef(labels, preds))


def _spearman(preds, labels) -> float:
    return float(stats.spearmanr(preds, labels).statistic)


def _pearson(preds, labels) -> float:
    return float(stats.pearsonr(preds, labels).statistic)


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": _accuracy,
    "f1": _f1,
    "mcc": _mcc,
    "spearman": _spearman,
    "pearson": _pearson,
}


def compute_metrics(task: TaskSpec, predictions: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, float]:
    """{dev split: (predictions, labels)} -> {metric name: value}; MNLI mismatched gets a name prefix.

    Predictions are class ids, or scores for STS-B.
    """
    out = {}
    for split in task.dev_splits:
        preds, labels = (np.asarray(x) for x in predictions[split.name])
        for m in task.metrics:
            out[split.metric_prefix + m] = METRICS[m](preds, labels)
    return out


def task_score(task: TaskSpec, metrics: Mapping[str, float]) -> float:
    """The paper's number for a task (CoLA MCC, STS-B Spearman, else accuracy; MNLI matched) x 100."""
    return 100.0 * metrics[task.paper_metric]


class GlueScore(NamedTuple):
    score: float
    tasks: tuple[str, ...]


def glue_score(per_task: Mapping[str, float], include_wnli: bool = False) -> GlueScore:
    """Mean of per-task scores over the tasks present, with the tasks it covers (GLUE order).

    The paper's GLUE score averages the eight tasks without WNLI (Clark et al. 2020, section 3.1), so WNLI
    is left out unless `include_wnli`.
    """
    unknown = sorted(set(per_task) - set(TASKS))
    if unknown:
        raise GlueDataError(f"glue_score: unknown task(s) {unknown}; valid: {', '.join(TASKS)}")
    tasks = tuple(t for t in TASKS if t in per_task and (include_wnli or t != "wnli"))
    if not tasks:
        raise GlueDataError(f"glue_score: no task to average in {sorted(per_task)} (WNLI alone is not a GLUE score)")
    return GlueScore(float(np.mean([per_task[t] for t in tasks])), tasks)
