"""What carries a verdict: each claim's GLUE-k difference with each task left out in turn.

A GLUE mean can rest on one task: a difference of 30 points on STS-B moves a mean over five tasks by 6, whatever the
other four say. For every claim measured on two tasks or more, the difference without task t is read off the same
bootstrap samples as the headline (multibootstrap.Bootstrap.tasks: the mean of the other tasks' statistics in each
sample), so that a leave-one-task-out interval is exactly as wide as the headline's would be on those tasks. A task
*decides* a resolved verdict when leaving it out alone changes it (holds or reversed becomes another verdict): the
report says so beside the verdict, in its words line, on the console and in the README's tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from electra_ablate.glue import tasks as glue
from electra_ablate.report import multibootstrap as mb
from electra_ablate.report.tables import table


def _mean_without(samples: Mapping[str, mb.ArmSamples], left_out: str) -> mb.ArmSamples:
    """An arm's GLUE statistic over every task of `samples` (task -> its samples) but `left_out`."""
    parts = [s for t, s in samples.items() if t != left_out]
    ex = None if any(p.examples is None for p in parts) else np.mean([p.examples for p in parts], axis=0)
    return mb.ArmSamples(np.mean([p.drawn for p in parts], axis=0), np.mean([p.seeds for p in parts], axis=0), ex,
                         float(np.mean([p.estimate for p in parts])))


def leave_one_out(better: Sequence[str], worse: Sequence[str], boot: mb.Bootstrap) -> dict[str, mb.Difference]:
    """{task: the claim's difference (best of `better` - best of `worse`) on the GLUE mean without that task}, in
    GLUE order; empty for fewer than two tasks."""
    tasks = [t for t in glue.TASKS if t in boot.tasks]
    if len(tasks) < 2:
        return {}
    out = {}
    for t in tasks:
        arm = {a: _mean_without({u: boot.tasks[u][a] for u in tasks}, t) for a in (*better, *worse)}
        out[t] = mb.difference(mb.best_of([arm[a] for a in better]), mb.best_of([arm[a] for a in worse]))
    return out


def verdict_of(d: mb.Difference) -> str:
    if d.low > 0:
        return "holds"
    if d.high < 0:
        return "reversed"
    return "unresolved at this scale"


def deciding(verdict: str, without: Mapping[str, mb.Difference]) -> dict[str, mb.Difference]:
    """The tasks whose leaving out alone changes a resolved `verdict` (holds or reversed), with the difference without
    each. An unresolved verdict has nothing to rest on: its per-task verdicts say where the tasks pull apart."""
    if verdict not in ("holds", "reversed"):
        return {}
    return {t: d for t, d in without.items() if verdict_of(d) != verdict}


def recorded_deciding(claim: Mapping) -> dict[str, Mapping]:
    """`deciding` for a claim as a report's verdicts.json records it (its `verdict` and `without`)."""
    if claim.get("verdict") not in ("holds", "reversed"):
        return {}
    return {t: w for t, w in (claim.get("without") or {}).items() if w["verdict"] != claim["verdict"]}


def _name(task: str) -> str:
    return glue.get_task(task).dir_name


def interval(d: mb.Difference) -> str:
    return f"{d.estimate:+.1f} [{d.low:+.1f}, {d.high:+.1f}]"


def phrase(verdict: str, without: Mapping[str, mb.Difference]) -> str:
    """'rests on STS-B (without it: reversed, -1.4 [-3.0, +0.2])'; '' when no single task decides the verdict."""
    decide = deciding(verdict, without)
    if not decide:
        return ""
    parts = [f"without {_name(t)}: {verdict_of(d).replace(' at this scale', '')}, {interval(d)}" for t, d in decide.items()]
    return f"rests on {', '.join(_name(t) for t in decide)} ({'; '.join(parts)})"


def section(results: Sequence) -> list[str]:
    """The report's 'Without each task' section: each claim's GLUE difference with each task left out in turn."""
    several = [v for v in results if getattr(v, "without", None)]
    if not several:
        return []
    out = ["### Without each task", "",
           "Each claim's difference on the GLUE mean with one task left out in turn, from the same bootstrap samples "
           "as its headline verdict: a row whose verdict differs from the headline's (in bold) is a task that alone "
           "decides the headline; the verdict then rests on that task, not on the mean.", ""]
    rows = []
    for v in several:
        for t, d in v.without.items():
            changed = verdict_of(d) != v.verdict
            cell = verdict_of(d)
            rows.append([v.claim.text, _name(t), f"{d.estimate:+.2f} [{d.low:+.2f}, {d.high:+.2f}]",
                         f"{d.sign_probability:.2f}", f"**{cell}**" if changed else cell, v.verdict])
    return out + [table(["claim", "left out", "Δ without it [95% CI]", "P(sign)", "verdict without it",
                         "headline verdict"], rows), ""]
