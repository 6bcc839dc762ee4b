"""Each fine-tuning run's dev predictions, read from the MLflow artifact fine-tuning logs
(`predictions/dev_predictions.tsv`, finetuning.run.write_predictions), and whether the run learned
anything at all.

A run is *degenerate* when its dev predictions are a single class (classification) or one value (regression:
STS-B predictions whose spread is below REGRESSION_SPREAD of the gold scores', or not finite). Such a run
scores what the majority class scores (accuracy = the majority share, MCC = 0) or has no defined correlation,
whatever it was fine-tuned from, so comparing it with another arm measures nothing about pre-training. A
finished run whose score is undefined (NaN: Spearman of a constant) is degenerate even without its artifact;
any other run without the artifact (logged before predictions were kept) is *unknown*.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote, urlparse

import numpy as np
import pandas as pd

from electra_ablate.glue import tasks as glue
from electra_ablate.report import multibootstrap as mb

PREDICTIONS_ARTIFACT = "predictions/dev_predictions.tsv"  # written by finetuning.run.train_task
# Regression predictions whose standard deviation is below this share of the gold scores' are one value:
# the TSV keeps 6 significant digits, so a collapsed head's round-off lies far below it.
REGRESSION_SPREAD = 1e-4


def load_run_predictions(client, run_id: str, task: str) -> mb.RunPredictions | None:
    """(index, labels, predictions) of a fine-tuning run from its artifact; None when it has none. A local
    artifact store is read in place (no copy, no progress bar per run)."""
    uri = urlparse(client.get_run(run_id).info.artifact_uri)
    if uri.scheme in ("", "file"):
        path = Path(unquote(uri.path)) / PREDICTIONS_ARTIFACT
        return _read(path, task) if path.is_file() else None
    with tempfile.TemporaryDirectory(prefix="electra_ablate_preds_") as tmp:
        try:
            path = client.download_artifacts(run_id, PREDICTIONS_ARTIFACT, tmp)
        except Exception:  # MlflowException / OSError: a run logged before predictions were kept
            return None
        return _read(path, task)


def _read(path, task: str) -> mb.RunPredictions:
    index, labels, preds = mb.read_predictions(path, glue.get_task(task))
    return mb.RunPredictions(None, 0, index, labels, preds)


def is_constant(task: glue.TaskSpec, labels: np.ndarray, predictions: np.ndarray) -> bool:
    """True when the predictions are one class (classification) or one value (regression, or not finite)."""
    preds = np.asarray(predictions)
    if not task.is_regression:
        return len(np.unique(preds)) <= 1
    preds = preds.astype(float)
    if not np.isfinite(preds).all():
        return True
    spread = float(np.std(np.asarray(labels, dtype=float)))
    return float(np.std(preds)) <= REGRESSION_SPREAD * (spread if spread > 0 else 1.0)


def is_degenerate(task: str, predictions: mb.RunPredictions | None, score_undefined: bool = False) -> bool | None:
    """A run's verdict: True / False, or None (unknown) when it has no predictions and a defined score."""
    if score_undefined:
        return True
    if predictions is None:
        return None
    return is_constant(glue.get_task(task), predictions.labels, predictions.predictions)


# --- counting ---------------------------------------------------------------------------------------------


class Count(NamedTuple):
    """Degenerate runs among `runs`; `known` of them had predictions (or an undefined score)."""

    degenerate: int
    known: int
    runs: int

    @property
    def unknown(self) -> int:
        return self.runs - self.known

    @property
    def all(self) -> bool:
        """Every run learned nothing (and every run is known)."""
        return self.runs > 0 and self.degenerate == self.runs

    @property
    def any(self) -> bool:
        return self.degenerate > 0


def count(flags: Iterable[bool | None]) -> Count:
    """Count a frame column's flags (a missing one, None or NaN, is unknown)."""
    flags = list(flags)
    known = [bool(f) for f in flags if not pd.isna(f)]
    return Count(sum(known), len(known), len(flags))


def counts(scores: pd.DataFrame, variant: str, tasks: Sequence[str] | None = None) -> dict[str, Count]:
    """{task: Count} of a variant's rows of a report score frame (its `degenerate` column), in `tasks` order."""
    rows = scores[scores["variant"] == variant] if len(scores) else scores
    tasks = list(tasks) if tasks is not None else list(dict.fromkeys(rows["task"])) if len(rows) else []
    return {t: count(rows[rows["task"] == t]["degenerate"]) if len(rows) else Count(0, 0, 0) for t in tasks}


def total(per_task: dict[str, Count]) -> Count:
    return Count(*(sum(c[i] for c in per_task.values()) for i in range(3)))


def what(tasks: Iterable[str]) -> str:
    """'predict one class', 'predict a constant' or both, for the tasks named."""
    kinds = {glue.get_task(t).is_regression for t in tasks}
    return {frozenset({False}): "predict one class", frozenset({True}): "predict a constant"}.get(
        frozenset(kinds), "predict one class (a constant for regression)")


def cell(per_task: dict[str, Count]) -> str:
    """A table cell: '3 of 3', '0 of 3', '4 of 6 (CoLA 3 of 3, RTE 1 of 3)', '... , 2 unknown'."""
    c = total(per_task)
    if c.runs == 0:
        return "–"
    if c.known == 0:
        return f"unknown ({c.runs} run{'s' if c.runs > 1 else ''} without predictions)"
    out = f"{c.degenerate} of {c.runs}"
    parts = [(t, x) for t, x in per_task.items() if x.any]
    if len(per_task) > 1 and c.any and not c.all:
        out += " (" + ", ".join(f"{_name(t)} {x.degenerate} of {x.runs}" for t, x in parts) + ")"
    return out + (f", {c.unknown} unknown" if c.unknown else "")


def phrase(variant: str, per_task: dict[str, Count]) -> str:
    """'electra: 3 of 3 SST-2 runs predict one class' (with the unknown runs, if any)."""
    c = total(per_task)
    on = "/".join(_name(t) for t, x in per_task.items() if x.runs)
    out = f"{variant}: {c.degenerate} of {c.runs} {on} run{'s' if c.runs > 1 else ''} {what(per_task)}"
    if c.any and len([x for x in per_task.values() if x.any]) < len(per_task):
        out += " (" + ", ".join(f"{_name(t)} {x.degenerate} of {x.runs}" for t, x in per_task.items() if x.any) + ")"
    return out + (f", {c.unknown} without predictions (unknown)" if c.unknown else "")


def _name(task: str) -> str:
    return glue.get_task(task).dir_name
