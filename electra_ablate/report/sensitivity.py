"""Which tasks see pre-training: per task of a sweep with a random-init arm, what each arm scored, how far each
pre-trained arm lies above random init with its multi-bootstrap interval, how much the dev set alone moves that
difference, and what a fine-tuning run of the task costs.

At CPU scale a task can be too small (dev-set noise larger than any gap pre-training opens) or too hard (every
arm near the majority class) to show pre-training at all; a GLUE mean over such tasks dilutes the ones that do.
The differences are those of the sanity claims' verdicts (report/verdicts.py: `Verdict.per_task`, the same
bootstrap samples), so a number here is the number in the verdict section; the durations are read from MLflow as
the report's compute line reads them (report/provenance.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

import pandas as pd

from electra_ablate.glue import tasks as glue
from electra_ablate.report import multibootstrap as mb
from electra_ablate.report import verdicts as vd
from electra_ablate.report.provenance import duration, run_seconds
from electra_ablate.report.tables import table

METRIC_NAMES = {"mcc": "Matthews corr.", "spearman": "Spearman", "accuracy": "accuracy"}


def floor_verdicts(spec, results: Sequence[vd.Verdict]) -> list[vd.Verdict]:
    """The sanity claims with per-task numbers: one pre-trained arm against one arm without pre-training."""
    return [v for v in results if v.per_task and len(v.claim.better) == 1 and len(v.claim.worse) == 1
            and vd.pretrained(spec.variant(v.claim.better[0])) and not vd.pretrained(spec.variant(v.claim.worse[0]))]


def task_seconds(scores: pd.DataFrame, frame: pd.DataFrame, client=None) -> dict[str, float]:
    """Task -> median duration in seconds of its fine-tuning runs in `scores` (report score rows, any arm)."""
    if not len(scores) or not len(frame):
        return {}
    jobs = frame[frame["run_id"].isin(set(scores["run_id"]))]
    if not len(jobs):
        return {}
    seconds = dict(zip(jobs["run_id"], run_seconds(jobs, client)))
    out = {}
    for task, g in scores.groupby("task"):
        values = [seconds[r] for r in g["run_id"] if r in seconds and pd.notna(seconds[r])]
        if values:
            out[task] = float(statistics.median(values))
    return out


def _pair(v: vd.Verdict) -> str:
    return f"{v.claim.better[0]} - {v.claim.worse[0]}"


def _difference(tv: vd.TaskVerdict | None) -> str:
    if tv is None:
        return "–"
    if tv.difference is None:
        return "– (degenerate)"
    d = tv.difference
    resolved = f" **{tv.verdict}**" if tv.verdict in vd.RESOLVED else ""
    return f"{d.estimate:+.1f} [{d.low:+.1f}, {d.high:+.1f}]{resolved}"


def _noise(tv: vd.TaskVerdict | None) -> str:
    if tv is None or tv.difference is None or not tv.examples:
        return "–"
    return f"±{mb.z_score() * tv.difference.sd_examples:.1f}"


def section(spec, tasks: Sequence[str], medians: pd.DataFrame, results: Sequence[vd.Verdict],
            seconds: Mapping[str, float]) -> list[str]:
    """The report's "Which tasks see pre-training" section (`medians`: variant x task, Summary.medians); [] for a
    sweep of one task or without a random-init arm."""
    floors = floor_verdicts(spec, results)
    if len(tasks) < 2 or not floors:
        return []
    labels = [v.label for v in spec.variants if v.label in medians.index]
    pairs = [_pair(v) for v in floors]
    header = ["task", "metric", "dev examples", *[f"{a} median" for a in labels],
              *[f"{p}: Δ [95% CI]" for p in pairs], f"dev-set noise ({' / '.join(pairs)})" if len(pairs) > 1 else
              "dev-set noise", "fine-tuning run (median)"]
    rows = []
    for t in tasks:
        spec_t = glue.get_task(t)
        per = [v.per_task.get(t) for v in floors]
        examples = next((tv.examples for tv in per if tv is not None and tv.examples), 0)
        rows.append([spec_t.dir_name, METRIC_NAMES.get(spec_t.paper_metric, spec_t.paper_metric),
                     str(examples) if examples else "–",
                     *[_median(medians, a, t) for a in labels], *[_difference(tv) for tv in per],
                     " / ".join(_noise(tv) for tv in per), duration(seconds[t]) if t in seconds else "–"])
    return ["## Which tasks see pre-training", "",
            "Per task, the median over fine-tuning runs of each arm (the GLUE table's numbers) and each pre-trained "
            "arm minus random init: the multi-bootstrap estimate (the mean over pre-training seeds of the mean over "
            "fine-tuning runs, so it may differ from the difference of medians) and its 95% interval, from the "
            "sanity checks' verdicts (bold where resolved). *Dev-set noise* is ±1.96 x the standard deviation of "
            "that difference over bootstrap samples that resample only the task's dev examples (every fine-tuning "
            "run of both arms counted once, the same examples for both): the half-width of the interval the "
            "difference would have if the seeds were fixed and only the dev set were drawn again. More seeds do "
            "not shrink it, so a task on which pre-training's gain is smaller than its noise cannot show "
            "pre-training at this size whatever the number of seeds. *Fine-tuning run*: the median wall-clock "
            "duration in MLflow of the task's final-checkpoint fine-tuning runs (all arms; start to end, less the "
            "time a resumed run lay dead), what one more seed of one arm costs on that task.", "",
            table(header, rows), ""]


def _median(medians: pd.DataFrame, label: str, task: str) -> str:
    value = medians.loc[label, task] if task in medians.columns else None
    return "–" if value is None or pd.isna(value) else f"{value:.1f}"
