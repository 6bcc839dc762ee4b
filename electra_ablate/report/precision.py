"""Which precision and which CPU the numbers of a report come from: each arm's runs by precision and by CPU model,
and every table cell, curve point and verdict whose runs mix them, with how many runs of each.

A run's precision is that of each of its attempts (`attempt.<n>.precision`, tracking/attempts.py), "a then b" for
a run resumed in another precision; a run recorded before attempts were has only its `runtime.resolved_precision`
param, which names its first attempt's. Its CPU is `attempt.<n>.cpu`, else `hardware.cpu`, else unrecorded (no
run recorded it before). Unrecorded values are counted but never make a mix on their own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import pandas as pd

from electra_ablate.report.collect import SweepData
from electra_ablate.report.tables import TASK_NAMES, table
from electra_ablate.tracking import attempts

UNRECORDED = "unrecorded"
MARK = "‡"  # after a GLUE table cell whose runs mix precisions
THEN = " then "  # joins the values of a run's attempts where they differ


def _attempt_label(tags: Mapping[str, str], field: str, first: str | None) -> str:
    """The values of a run's attempts in order, each once ("a then b"); `first`: attempt 1's where no tag says."""
    per = attempts.attempt_values(tags, field)
    if first and 1 not in per:
        per[1] = first
    return THEN.join(dict.fromkeys(per[n] for n in sorted(per))) if per else UNRECORDED


def run_precision(tags: Mapping[str, str], params: Mapping[str, str]) -> str:
    return _attempt_label(tags, "precision", params.get(attempts.PARAM_RESOLVED_PRECISION))


def run_cpu(tags: Mapping[str, str]) -> str:
    return _attempt_label(tags, "cpu", tags.get(attempts.TAG_CPU))


class Labels(NamedTuple):
    """Each run's precision and CPU, by run id."""

    precision: dict[str, str]
    cpu: dict[str, str]

    @classmethod
    def of(cls, frame: pd.DataFrame) -> Labels:
        precision, cpu = {}, {}
        for _, row in frame.iterrows() if len(frame) else ():
            tags = {c[5:]: v for c, v in row.items() if c.startswith("tags.") and isinstance(v, str)}
            params = {c[7:]: v for c, v in row.items() if c.startswith("params.") and isinstance(v, str)}
            precision[row["run_id"]], cpu[row["run_id"]] = run_precision(tags, params), run_cpu(tags)
        return cls(precision, cpu)


def mixed(counts: Mapping[str, int]) -> bool:
    """Whether runs of more than one precision (or CPU) are counted, or one run changed it between attempts."""
    known = [k for k in counts if k != UNRECORDED]
    return len(known) > 1 or any(THEN in k for k in known)


def counted(labels: Mapping[str, str], run_ids: Iterable) -> Counter:
    return Counter(labels.get(r, UNRECORDED) for r in dict.fromkeys(r for r in run_ids if isinstance(r, str)))


def describe(counts: Mapping[str, int]) -> str:
    """"2 bf16-mixed, 1 32-true", most runs first; "mixed:" in bold before a mix."""
    text = ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"**mixed**: {text}" if mixed(counts) else text or "–"


class Unit(NamedTuple):
    """A number of the report (an arm, a table cell, a curve point, a verdict) and the runs it comes from."""

    what: str
    pretrain: list[str]
    finetune: list[str]


def units(data: SweepData, results: Sequence = ()) -> dict[str, list[Unit]]:
    """The report's numbers by kind, each with its pre-training and fine-tuning runs."""
    s = data.scores
    finished = {v.label: [st.run.info.run_id for st in data.pretrain
                          if st.job.variant == v.label and st.run is not None] for v in data.ctx.spec.variants}

    def unit(what: str, rows: pd.DataFrame, extra: Sequence[str] = ()) -> Unit:
        return Unit(what, [*extra, *rows["pretrain_run"].dropna()], list(rows["run_id"]))

    out: dict[str, list[Unit]] = {"arm": [], "comparison": [], "table cell": [], "curve point": [], "verdict": []}
    for v in data.ctx.spec.variants:
        out["arm"].append(unit(v.label, s[s["variant"] == v.label] if len(s) else s, finished[v.label]))
    if not len(s):
        return out
    final = s[s["final"].astype(bool)]
    out["comparison"].append(unit("of the arms in the GLUE table", final))
    for (variant, task), rows in final.groupby(["variant", "task"], sort=False):
        out["table cell"].append(unit(f"{variant} {TASK_NAMES.get(task, task)}", rows))
    for (variant, step), rows in s[~s["final"].astype(bool)].groupby(["variant", "step"], sort=False):
        out["curve point"].append(unit(f"{variant} at step {int(step)}", rows))
    for r in results:
        labels = [*r.claim.better, *r.claim.worse]
        rows = final[final["variant"].isin(labels) & final["task"].isin(r.tasks)]
        out["verdict"].append(unit(f"\"{r.claim.text}\"", rows))
    return out


def cell_marks(data: SweepData) -> dict[tuple[str, str], str]:
    """(variant, task) -> MARK for each GLUE table cell whose runs mix precisions."""
    s, by = data.scores, Labels.of(data.frame).precision
    if not len(s):
        return {}
    final = s[s["final"].astype(bool)]
    return {key: MARK for key, rows in final.groupby(["variant", "task"], sort=False)
            if _mixes(Unit("", [*rows["pretrain_run"].dropna()], list(rows["run_id"])), by)}


def _mixes(unit: Unit, labels: Mapping[str, str]) -> str | None:
    """What mixes in `unit`'s runs ("pre-training: ...; fine-tuning: ..."), or None."""
    parts = [f"{phase} {describe(c)[len('**mixed**: '):]}" for phase, ids in (("pre-training", unit.pretrain),
                                                                              ("fine-tuning", unit.finetune))
             for c in [counted(labels, ids)] if mixed(c)]
    return "; ".join(parts) or None


def section(data: SweepData, results: Sequence = ()) -> list[str]:
    """The report's "Precision and hardware" section."""
    found, by = units(data, results), Labels.of(data.frame)
    out = ["## Precision and hardware", "",
           "Each run's precision and CPU model, per attempt where recorded (MLflow tags `attempt.<n>.precision`, "
           "`attempt.<n>.cpu`); a run recorded before those tags counts its `runtime.resolved_precision` param, "
           f"which names its first attempt's only, and an unrecorded CPU. \"a{THEN}b\": a run resumed in another "
           "precision or on another CPU.", ""]
    sweep = _sweep_precision(data.frame, data.ctx.spec)
    if sweep:
        out += [sweep, ""]
    rows = [[u.what, describe(counted(by.precision, u.pretrain)), describe(counted(by.precision, u.finetune)),
             describe(counted(by.cpu, u.pretrain)), describe(counted(by.cpu, u.finetune))] for u in found["arm"]]
    out += [table(["arm", "pre-training precision", "fine-tuning precision", "pre-training CPU", "fine-tuning CPU"],
                  rows), ""]
    for name, labels in (("precisions", by.precision), ("CPU models", by.cpu)):
        lines = [f"- {kind} {u.what}: {text}" for kind, us in found.items() if kind != "arm" for u in us
                 for text in [_mixes(u, labels)] if text]
        out += ([f"Numbers whose runs mix {name}, with how many runs of each:", "", *lines, ""] if lines
                else [f"No table cell, curve point or verdict mixes {name}.", ""])
    return out


def warning(data: SweepData, results: Sequence = ()) -> str | None:
    """A line for the top of the report when any number mixes runs of different precisions."""
    by, found = Labels.of(data.frame), units(data, results)
    n = {kind: sum(_mixes(u, by.precision) is not None for u in us) for kind, us in found.items() if kind != "arm"}
    if not any(n.values()):
        return None
    what = ", ".join(f"{k} {kind}{'s' if k > 1 else ''}" for kind, k in n.items() if k)
    return (f"**Warning: runs of different precisions are pooled or compared here** ({what}): bf16-mixed and 32-true "
            "runs differ in their numbers, so a difference may be the precision's. See Precision and hardware.")


def _sweep_precision(frame: pd.DataFrame, spec) -> str | None:
    """The precision the sweep's newest record gave its jobs (sweep/precision.py), where one is recorded."""
    column = f"tags.{attempts.TAG_PRECISION}"
    if not len(frame) or column not in frame or "tags.kind" not in frame:
        return None
    records = frame[(frame["tags.kind"] == "sweep") & (frame.get("tags.sweep") == spec.name)
                    & (frame.get("tags.scale") == spec.scale_name) & frame[column].notna()]
    if not len(records):
        return None
    last = records.sort_values("start_time").iloc[-1]
    how = last.get(f"tags.{attempts.TAG_PRECISION_HOW}")
    return (f"The sweep runs its jobs in {last[column]}" + (f" ({how})" if isinstance(how, str) else "")
            + f", on {last.get(f'tags.{attempts.TAG_CPU}', 'an unrecorded CPU')} at its last launch.")
