"""How a report's numbers were produced: the sweep invocations and their phases, machine and packages, git
commits and compute time of the runs counted, the vocabulary of each arm (with a warning when arms differ),
and where to find the runs in the MLflow dashboard.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping

import numpy as np
import pandas as pd

from electra_ablate.report import arms
from electra_ablate.report.collect import SweepData, is_missing
from electra_ablate.sweep.provenance import environment, process_gone
from electra_ablate.tracking import runs as tracking


VOCAB_SHA_PREFIX = 12  # hex digits of a vocabulary's sha256 shown in the report
UNRECORDED = "unrecorded"  # runs logged before the vocabulary digest was recorded


def vocabularies(data: SweepData) -> dict[str, set[str]]:
    """The vocabulary digests (sha256 of vocab.txt) of each arm's runs in the tables, by variant label: its
    pre-training runs and the fine-tuning runs counted (the latter also cover imported `pretrained` arms)."""
    out: dict[str, set[str]] = {v.label: set() for v in data.ctx.spec.variants}
    column = f"params.{tracking.PARAM_VOCAB_SHA256}"
    by_pretrain_run: dict[str, str] = {}
    for s in data.pretrain:
        if s.run is not None:
            # Runs from before the digest was recorded: the vocab.txt saved with the network.
            digest = arms.run_vocab_sha256(s.run) or UNRECORDED
            by_pretrain_run[s.run.info.run_id] = digest
            out.setdefault(s.job.variant, set()).add(digest)
    if len(data.scores) and len(data.frame):
        digests = data.frame.set_index("run_id")[column] if column in data.frame else pd.Series(dtype=str)
        for variant, run_id, pre in zip(data.scores["variant"], data.scores["run_id"], data.scores["pretrain_run"]):
            digest = digests.get(run_id)
            if not isinstance(digest, str):
                digest = by_pretrain_run.get(pre, UNRECORDED)  # its tokenizer is its checkpoint's
            out.setdefault(variant, set()).add(digest)
    return out


def vocabulary_warning(vocabs: Mapping[str, set[str]]) -> str | None:
    """A warning when the arms compared (or the runs of one arm) did not all use the same vocabulary."""
    known = {d for ds in vocabs.values() for d in ds if d != UNRECORDED}
    if len(known) <= 1:
        return None
    mixed = [label for label, ds in vocabs.items() if len(ds - {UNRECORDED}) > 1]
    return ("**Warning: the runs compared here used different vocabularies** (" + _vocab_list(vocabs)
            + "): their token ids differ, so a difference between arms mixes the variant with the vocabulary"
            + (f", and within {', '.join(mixed)} runs of one arm differ too" if mixed else "")
            + ". Rebuild with one vocabulary (same data config and corpus; see README, Reproducibility).")


def _vocab_list(vocabs: Mapping[str, set[str]]) -> str:
    return "; ".join(f"{label} " + (", ".join(f"`{d[:VOCAB_SHA_PREFIX]}`" if d != UNRECORDED else d
                                              for d in sorted(ds)) or "no runs")
                     for label, ds in vocabs.items())


def _status(r: pd.Series, running_sweep_run: str | None) -> str:
    """A sweep record's status; a RUNNING one whose process has ended (killed or cut off) says so."""
    if r["run_id"] == running_sweep_run:
        return "RUNNING (this report)"
    tags = {k.removeprefix("tags."): v for k, v in r.items() if k.startswith("tags.") and isinstance(v, str)}
    if r["status"] == "RUNNING" and process_gone(tags):
        return "RUNNING in MLflow, but its process has ended (killed or cut off; the next sweep marks it KILLED)"
    return str(r["status"])


def _phases(r: pd.Series) -> dict[str, dict]:
    """What each phase a sweep record ran launched (run.run_sweep's `phase.<name>` tags), by phase name."""
    return {n: json.loads(r[f"tags.phase.{n}"]) for n in ("pretrain", "finetune") if isinstance(r.get(f"tags.phase.{n}"), str)}


def _launched_nothing(r: pd.Series) -> bool:
    """A finished sweep record whose every phase found all of its jobs done: a re-run that only re-made the report."""
    phases = _phases(r)
    return r["status"] == "FINISHED" and bool(phases) and not any(p["jobs"] for p in phases.values())


def _invocations(sweeps: pd.DataFrame, running_sweep_run: str | None, running_wall_time: float | None) -> list[str]:
    """One line per sweep invocation with what each phase launched; finished re-runs that launched nothing are
    counted, not listed (every re-made report would otherwise add one), unless it is the one making this report."""
    idle = [r["run_id"] for _, r in sweeps.iterrows() if r["run_id"] != running_sweep_run and _launched_nothing(r)]
    lines = ["Sweep invocations (oldest first; each phase launches only what was not already finished):", ""]
    for _, r in sweeps[~sweeps["run_id"].isin(idle)].iterrows():
        wall = running_wall_time if r["run_id"] == running_sweep_run else r.get("metrics.wall_time_s")
        if is_missing(wall) and r["status"] != "RUNNING":  # a stopped sweep logs no wall time, but has a start and end
            wall = (_times(pd.Series([r["end_time"]])) - _times(pd.Series([r["start_time"]]))).dt.total_seconds().iloc[0]
        lines.append(f"- {_when(r['start_time'])}: `{r.get('tags.command', '?')}` with `{r.get('tags.launcher', '?')}`, "
                     f"status {_status(r, running_sweep_run)}, "
                     f"wall time {duration(wall)}, git {r.get('tags.git_commit', '?')}")
        for name, phase in _phases(r).items():
            what = f"{phase['jobs']} job(s), {phase['seconds']:.0f} s, exit code {phase['returncode']}" if phase["jobs"] else "nothing to launch"
            lines.append(f"  - {name}: {what}" + (f": `{phase['command']}`" if phase["command"] else ""))
    if idle:
        lines.append(f"- {len(idle)} other finished invocation{'s' if len(idle) > 1 else ''} found every job done and "
                     "launched nothing (left out)")
    return lines


def provenance(data: SweepData, running_sweep_run: str | None, running_wall_time: float | None, client=None) -> str:
    frame = data.frame
    lines = []
    sweeps = frame[frame.get("tags.kind", pd.Series(dtype=str)) == "sweep"] if len(frame) else frame
    if len(sweeps):  # this sweep at this scale: sweeps naming one experiment share it
        sweeps = sweeps[(sweeps.get("tags.scale", pd.Series(dtype=str)) == data.ctx.spec.scale_name)
                        & (sweeps.get("tags.sweep", pd.Series(dtype=str)) == data.ctx.spec.name)]
        sweeps = sweeps.sort_values("start_time")
    if len(sweeps):
        lines += _invocations(sweeps, running_sweep_run, running_wall_time)
        last = sweeps.iloc[-1]
        lines += ["", f"- Machine of the last sweep: {last.get('tags.hardware', '?')}; {last.get('tags.platform', '?')}; "
                  f"Python {last.get('tags.python', '?')}", f"- Packages: {last.get('tags.packages', '?')}"]
    else:
        env = environment()
        lines += ["No sweep run is recorded (the runs were launched by hand); the report's own machine:", "",
                  f"- {env['hardware']}; {env['platform']}; Python {env['python']}", f"- Packages: {env['packages']}"]
    jobs = frame[frame.get("tags.kind", pd.Series(dtype=str)).isin(["pretrain", "finetune"])] if len(frame) else frame
    # The finished pre-training runs, the fine-tuning runs reported, and the unfinished pre-training runs whose
    # saved checkpoints those fine-tuned.
    grid = ({s.run.info.run_id for s in data.pretrain if s.run is not None} | set(data.scores["run_id"])
            | set(data.scores["pretrain_run"].dropna()) if len(data.scores) or data.pretrain else set())
    jobs = jobs[jobs["run_id"].isin(grid)] if len(jobs) else jobs
    if len(jobs):
        commits = sorted(set(jobs.get("tags.git_commit", pd.Series(dtype=str)).dropna()))
        seconds = run_seconds(jobs, client)
        hours = {k: seconds[g.index].sum() for k, g in jobs.groupby("tags.kind")}
        unfinished = jobs[jobs["status"] != "FINISHED"].groupby("tags.kind").size().to_dict()

        def over(kind: str) -> str:
            n = int((jobs["tags.kind"] == kind).sum())
            left = f", {unfinished[kind]} of them not finished (their time so far)" if unfinished.get(kind) else ""
            return f"over {n} runs{left}"
        lines += _unrecorded(jobs, sweeps)
        lines += [f"- Git commit(s) of the runs in the tables: {', '.join(commits) or 'unknown'}",
                  "- Compute time of the runs in the tables (sum of run durations, less the time a resumed run lay "
                  "dead between attempts): " + ", ".join(f"{k} {duration(v)} {over(k)}" for k, v in hours.items())]
    lines += _mfu_line(data, client)
    vocabs = vocabularies(data)
    lines.append(f"- Vocabulary per arm (sha256 of vocab.txt, first {VOCAB_SHA_PREFIX} hex digits): {_vocab_list(vocabs)}")
    warning = vocabulary_warning(vocabs)
    if warning:
        lines.append(f"- {warning}")
    lines += [f"- Sweep file: `sweeps/{data.ctx.spec.path.name}`; generated job configs: `{data.ctx.conf_dir}`",
              f"- Dashboard: `mlflow ui --backend-store-uri {data.ctx.tracking_uri} --host 127.0.0.1`, then "
              f"{_dashboard_link(data)} (experiment `{data.ctx.experiment}`; fine-tuning runs are nested under their "
              "pre-training run)."]
    return "\n".join(lines)


def _unrecorded(jobs: pd.DataFrame, sweeps: pd.DataFrame) -> list[str]:
    """A line naming the runs of the tables that no sweep record launched: those that started while no sweep
    invocation of this sweep was running (runs carry no link to the invocation that launched them, so the test is by
    time); none when the runs were all launched by hand (no sweep record at all)."""
    if not len(sweeps) or not len(jobs):
        return []
    starts, ends = _times(sweeps["start_time"]), _times(sweeps["end_time"]).fillna(pd.Timestamp.now(tz="UTC"))
    began = _times(jobs["start_time"])
    inside = pd.Series(False, index=jobs.index)
    for s, e in zip(starts, ends):
        inside |= (began >= s) & (began <= e)
    out = jobs[~inside]
    if not len(out):
        return []
    groups = out.groupby([out.get("tags.kind"), out.get("tags.variant")]).size()
    what = ", ".join(f"{n} {kind} run(s) of {variant}" for (kind, variant), n in groups.items())
    first, last = _when(began[~inside].min()), _when(began[~inside].max())
    return [f"- Launched outside every recorded sweep invocation (started while none was running, {first} to {last}): "
            f"{what}. They carry this sweep's identities and tags, but no sweep record lists their launch."]


def _mfu_line(data: SweepData, client) -> list[str]:
    """What the pre-training runs' `train/mfu` is a share of: the peak each process timed at its start
    (`runtime/peak_flops`, common/peaks.py), over every attempt; none when no run logged one."""
    if client is None:
        return []
    peaks = [m.value for s in data.pretrain if s.run is not None
             for m in client.get_metric_history(s.run.info.run_id, "runtime/peak_flops")]
    if not peaks:
        return []
    spread = f"{min(peaks):.2g} to {max(peaks):.2g}" if max(peaks) > 1.05 * min(peaks) else f"{peaks[0]:.2g}"
    return [f"- `train/mfu` (MLflow) is the share of a peak that each pre-training process timed at its start, a "
            f"square matmul in the run's dtype at its thread count on the machine as loaded then ({spread} FLOP/s "
            f"over {len(peaks)} starts): a practical peak, not the device's; no table here uses it."]


def run_seconds(jobs: pd.DataFrame, client=None) -> pd.Series:
    """Each run's duration in seconds (rows of tracking.runs_frame): end less start, a running one's so far, less
    the time a resumed run lay dead between attempts."""
    running = jobs["status"] == "RUNNING"
    ends = _times(jobs["end_time"]).where(~running, pd.Timestamp.now(tz="UTC"))
    seconds = (ends - _times(jobs["start_time"])).dt.total_seconds()
    return seconds - [_idle_seconds(client, r) for _, r in jobs.iterrows()]


def _dashboard_link(data: SweepData) -> str:
    ids = data.frame["experiment_id"].dropna().unique() if "experiment_id" in data.frame else []
    if len(ids) != 1:
        return "the experiment's page with the Model training view"
    return f"<{tracking.dashboard_url('http://127.0.0.1:5000', str(ids[0]))}>"


def _idle_seconds(client, run: pd.Series) -> float:
    """How long a resumed run lay dead: for each later attempt (tracking.TAG_RESTARTS), the time from the last
    training loss its previous attempt logged to the attempt's start. A run resumed in a later session spans
    the gap between sessions; counting it as compute would overstate a sweep's cost by hours."""
    restarts = run.get(f"tags.{tracking.TAG_RESTARTS}")
    if client is None or not isinstance(restarts, str):
        return 0.0
    logged = sorted(m.timestamp / 1000 for m in client.get_metric_history(run["run_id"], "train/loss"))
    idle, previous = 0.0, float("-inf")
    for restart in json.loads(restarts):
        # runs.RunLogger.adopt writes "at" in the local time of the machine that resumed the run
        at = time.mktime(time.strptime(restart["at"], "%Y-%m-%d %H:%M:%S"))
        last = max([t for t in logged if t < at], default=None)
        if last is not None:
            idle += at - max(last, previous)
        previous = at
    return idle


def _times(column: pd.Series) -> pd.Series:
    """MLflow's start/end times as UTC timestamps (mlflow.search_runs gives epoch milliseconds or datetimes)."""
    if pd.api.types.is_numeric_dtype(column):
        return pd.to_datetime(column, unit="ms", utc=True)
    return pd.to_datetime(column, utc=True)


def _when(ts) -> str:
    if is_missing(ts) or ts is pd.NaT:
        return "?"
    stamp = pd.to_datetime(ts, unit="ms", utc=True) if isinstance(ts, (int, float, np.integer)) else pd.Timestamp(ts)
    return stamp.strftime("%Y-%m-%d %H:%M UTC")


def duration(seconds) -> str:
    if is_missing(seconds):
        return "?"
    seconds = float(seconds)
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"
