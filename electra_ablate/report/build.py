"""The markdown report of one sweep: `python -m electra_ablate.report sweep=<name> [scale=...]`.

Reads the sweep's MLflow experiment into pandas (tracking.runs_frame) and writes `reports/<name>.md` with
PNG figures in `reports/<name>/`: the median GLUE dev table per variant beside the paper's number
(electra_ablate/paper_results.yaml, the one place published numbers live), the spread over fine-tuning seeds
(mean, std, min, max, best-of-N: the paper reports the median of 10 runs, section 3.1), bootstrap confidence
intervals for each variant's difference from the baseline, generator-size curves (paper Figure 3 left),
learning curves against pre-training FLOPs counted as the paper does (electra_ablate.flops), failed and
missing runs, and how the numbers were produced. The runs counted are exactly the sweep's grid: pre-training
runs found by config hash, fine-tuning runs by (pre-training run, step, task, seed), newest finished first.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import hydra
import numpy as np
import pandas as pd
import yaml
from omegaconf import DictConfig

from electra_ablate.report import arms
from electra_ablate.common import cli
from electra_ablate.report import expected_max
from electra_ablate.glue import tasks as glue
from electra_ablate.tracking import runs as tracking
from electra_ablate.report import verdicts
from electra_ablate.sweep.compose import SweepContext, context_from_cfg
from electra_ablate.sweep.jobs import Checkpoint, FinetuneKey
from electra_ablate.sweep.plan import PretrainState, checkpoints_of, finetune_key, key_of, pretrain_states, random_init_checkpoints
from electra_ablate.sweep.provenance import environment

PAPER_RESULTS = Path(__file__).with_name("paper_results.yaml")
TASK_NAMES = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP", "mnli": "MNLI",
              "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0


# --- the paper's numbers --------------------------------------------------------------------------------------


@cache
def _paper_results(path: str) -> dict:
    return yaml.safe_load(Path(path).read_text())


def load_paper_results(path: str | Path | None = None) -> dict:
    """electra_ablate/paper_results.yaml: {section: {source, rows: {row: {label, glue | <task>: score}}}}."""
    return _paper_results(str(path or PAPER_RESULTS))


def paper_row(spec, label: str, paper: Mapping | None = None) -> tuple[dict | None, str | None]:
    """(row, source) a variant is compared with: its `expected_row`, else its label in the sweep's section."""
    paper = paper or load_paper_results()
    variant = spec.variant(label)
    if variant.expected_row:
        section, _, row = variant.expected_row.partition(".")
    elif spec.paper:
        section, row = spec.paper, label
    else:
        return None, None
    if section not in paper:
        raise KeyError(f"{spec.path}: paper section {section!r} is not in {PAPER_RESULTS.name}; it has {sorted(paper)}")
    return (paper[section].get("rows") or {}).get(row), paper[section]["source"]


def paper_glue(row: Mapping | None, tasks: Sequence[str]) -> tuple[float | None, bool]:
    """The paper's GLUE number for a row, or the mean of its per-task numbers over `tasks` (derived=True)."""
    if not row:
        return None, False
    if "glue" in row:
        return float(row["glue"]), False
    per_task = [row[t] for t in tasks if t in row]
    if per_task and len(per_task) == len(tasks):
        return float(np.mean(per_task)), True
    return None, False


# --- collecting the runs ---------------------------------------------------------------------------------------


@dataclass
class SweepData:
    ctx: SweepContext
    pretrain: list[PretrainState]
    checkpoints: list[Checkpoint]  # every checkpoint the sweep fine-tunes (of finished pre-training runs)
    scores: pd.DataFrame  # one row per finished fine-tuning job of the grid
    problems: list[str]  # failed and missing jobs, one line each
    frame: pd.DataFrame  # every run of the experiment (tracking.runs_frame)
    flops: dict[tuple[str, int], float] = field(default_factory=dict)  # (pretrain run, step) -> FLOPs


def _tags(row: pd.Series) -> dict[str, str]:
    return {c[len("tags."):]: str(v) for c, v in row.items() if c.startswith("tags.") and isinstance(v, str)}


def collect(ctx: SweepContext, client) -> SweepData:
    spec = ctx.spec
    frame = tracking.runs_frame(client, ctx.experiment)
    states = pretrain_states(ctx, client)
    problems: list[str] = []
    checkpoints: list[Checkpoint] = [Checkpoint(v.label, None, None, None, True, None)
                                     for v in spec.variants if v.pretrained is not None]
    for s in states:
        what = f"pre-training {s.job.variant} seed {s.job.seed} (config {s.config_hash})"
        if s.run is not None:
            found, missing = checkpoints_of(s, spec.checkpoints)
            checkpoints += found
            problems += [f"{m}: its fine-tuning jobs were not run" for m in missing]
        elif s.failed is not None:
            problems.append(f"{what}: {s.failed.info.status} (MLflow run {s.failed.info.run_id}); not fine-tuned")
        else:
            problems.append(f"{what}: missing (no MLflow run); not fine-tuned")
    checkpoints += random_init_checkpoints(spec, checkpoints)

    ft = frame[frame.get("tags.kind", pd.Series(dtype=str)) == "finetune"] if len(frame) else frame
    ft = ft.sort_values("start_time", ascending=False) if len(ft) else ft
    done: dict[FinetuneKey, pd.Series] = {}
    failed: dict[FinetuneKey, pd.Series] = {}
    for _, row in ft.iterrows():
        key = finetune_key(_tags(row))
        if key is None:
            continue
        if key.source.startswith("variant:"):
            key = key._replace(step="")  # an imported model's step is whatever the import reports
        target = done if row["status"] == "FINISHED" and not _missing(row.get("metrics.final/score")) else failed
        target.setdefault(key, row)

    records = []
    for c in checkpoints:
        for task in spec.tasks:
            absent = []
            for seed in spec.seeds:
                key = key_of(c, task, seed)
                row = done.get(key)
                if row is None:
                    bad = failed.get(key)
                    if bad is None:
                        absent.append(seed)
                    else:
                        problems.append(f"fine-tuning {c.config_name} {task} seed {seed}: {bad['status']} "
                                        f"(MLflow run {bad['run_id']})")
                    continue
                records.append({
                    "variant": c.variant, "pretrain_seed": c.pretrain_seed, "pretrain_run": c.run_id,
                    "step": c.step, "fraction": c.fraction, "final": c.final, "task": task, "seed": seed,
                    "score": float(row["metrics.final/score"]), "run_id": row["run_id"],
                })
            if absent:
                problems.append(f"fine-tuning {c.config_name} {task} seed{'s' if len(absent) > 1 else ''} "
                                f"{', '.join(map(str, absent))}: missing (no MLflow run)")
    scores = pd.DataFrame.from_records(records, columns=[
        "variant", "pretrain_seed", "pretrain_run", "step", "fraction", "final", "task", "seed", "score", "run_id"])
    data = SweepData(ctx, states, checkpoints, scores, problems, frame)
    if "learning_curves" in spec.figures:
        data.flops = checkpoint_flops(client, states, checkpoints)
    return data


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def checkpoint_flops(client, states: Sequence[PretrainState], checkpoints: Sequence[Checkpoint]) -> dict:
    """Pre-training FLOPs at each checkpoint: the run's train/flops at that step (interpolated between logged
    steps), else flops/total scaled by step / max_steps."""
    out = {}
    runs = {s.run.info.run_id: s for s in states if s.run is not None}
    for c in checkpoints:
        if c.run_id is None or c.run_id not in runs:
            continue
        history = sorted((m.step, m.value) for m in client.get_metric_history(c.run_id, "train/flops"))
        if history and history[0][0] <= c.step <= history[-1][0]:
            steps, values = zip(*history)
            out[(c.run_id, c.step)] = float(np.interp(c.step, steps, values))
        elif "flops/total" in runs[c.run_id].run.data.metrics:
            state = runs[c.run_id]
            out[(c.run_id, c.step)] = state.run.data.metrics["flops/total"] * c.step / max(c.step, state.max_steps)
    return out


# --- statistics --------------------------------------------------------------------------------------------


def task_stats(scores: pd.DataFrame) -> pd.DataFrame:
    """Per (variant, task): n, median, mean, std, min, max, best-of-N over the fine-tuning runs."""
    g = scores.groupby(["variant", "task"])["score"]
    return pd.DataFrame({
        "n": g.size(), "median": g.median(), "mean": g.mean(), "std": g.std(ddof=1), "min": g.min(),
        "max": g.max(),
    }).assign(best=lambda d: d["max"])


def per_seed_glue(scores: pd.DataFrame, tasks: Sequence[str]) -> pd.DataFrame:
    """GLUE score of each (variant, pre-training seed, fine-tuning seed) that ran every task in `tasks`."""
    wide = scores.pivot_table(index=["variant", "pretrain_seed", "seed"], columns="task", values="score", dropna=False)
    wide = wide.reindex(columns=list(tasks)).dropna()
    if wide.empty:
        return pd.DataFrame(columns=["variant", "glue"])
    glue_scores = [glue.glue_score(dict(zip(tasks, row))).score for row in wide.to_numpy()]
    return pd.DataFrame({"variant": wide.index.get_level_values("variant"), "glue": glue_scores})


def glue_of(medians: Mapping[str, float]) -> float | None:
    """The GLUE score (paper: mean over tasks, WNLI left out) of per-task medians; None when empty."""
    per_task = {t: v for t, v in medians.items() if not _missing(v)}
    if not per_task or set(per_task) == {"wnli"}:
        return None
    return glue.glue_score(per_task).score


def bootstrap_difference(
    variant: Mapping[str, np.ndarray], baseline: Mapping[str, np.ndarray], samples: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED, level: float = 0.95,
) -> tuple[float, float, float]:
    """(observed, low, high): the GLUE-of-medians difference variant - baseline and its percentile bootstrap
    interval, resampling each task's fine-tuning runs of each side independently (fixed seed)."""
    tasks = [t for t in variant if t in baseline and len(variant[t]) and len(baseline[t])]
    if not tasks:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)

    def glue_samples(runs: Mapping[str, np.ndarray]) -> np.ndarray:
        medians = []
        for t in tasks:  # (samples, n) resamples -> (samples,) medians
            x = np.asarray(runs[t], dtype=float)
            medians.append(np.median(x[rng.integers(0, len(x), size=(samples, len(x)))], axis=1))
        return np.mean(medians, axis=0)

    observed = glue_of({t: float(np.median(variant[t])) for t in tasks}) - glue_of({t: float(np.median(baseline[t])) for t in tasks})
    diffs = glue_samples(variant) - glue_samples(baseline)
    alpha = (1 - level) / 2
    low, high = np.quantile(diffs, [alpha, 1 - alpha])
    return float(observed), float(low), float(high)


# --- the markdown --------------------------------------------------------------------------------------------


def fmt(x, digits: int = 1) -> str:
    return "–" if _missing(x) else f"{x:.{digits}f}"


def signed(x, digits: int = 1) -> str:
    return "–" if _missing(x) else f"{x:+.{digits}f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


@dataclass
class Summary:
    """The numbers of the main table (also what tests compare against the stored runs)."""

    tasks: list[str]  # tasks with at least one finished final-checkpoint run, GLUE order
    medians: pd.DataFrame  # variant x task medians (final checkpoints)
    glue: dict[str, float | None]  # variant -> GLUE of its task medians
    stats: pd.DataFrame  # task_stats of the final checkpoints
    seed_glue: pd.DataFrame  # per_seed_glue of the final checkpoints
    differences: dict[str, tuple[float, float, float]]  # variant -> bootstrap_difference vs the baseline


def summarize(data: SweepData) -> Summary:
    spec = data.ctx.spec
    final = data.scores[data.scores["final"].astype(bool)] if len(data.scores) else data.scores
    present = set(final["task"]) if len(final) else set()
    tasks = [t for t in glue.TASKS if t in present and t in spec.tasks]
    stats = task_stats(final) if len(final) else pd.DataFrame()
    medians = (stats["median"].unstack("task").reindex(columns=tasks) if len(stats) else pd.DataFrame(columns=tasks))
    labels = [v.label for v in spec.variants]
    medians = medians.reindex(index=labels)
    glue_scores = {v: glue_of(medians.loc[v].to_dict()) for v in labels}
    differences = {}
    if spec.baseline and len(final):
        runs = {v: {t: g["score"].to_numpy() for t, g in final[final["variant"] == v].groupby("task")} for v in labels}
        for v in labels:
            if v != spec.baseline and runs[v] and runs[spec.baseline]:
                differences[v] = bootstrap_difference(runs[v], runs[spec.baseline])
    return Summary(tasks, medians, glue_scores, stats, per_seed_glue(final, tasks) if tasks else pd.DataFrame(columns=["variant", "glue"]), differences)


def render(data: SweepData, summary: Summary, figures: Mapping[str, str], provenance: str,
           verdict_lines: Sequence[str] = ()) -> str:
    spec = data.ctx.spec
    paper = load_paper_results()
    out = [f"# {spec.description}", ""]
    out.append(f"Sweep `{spec.name}` (sweeps/{spec.path.name}), scale `{spec.scale_name}`; MLflow experiment "
               f"`{data.ctx.experiment}` at `{data.ctx.tracking_uri}`. Generated by `python -m electra_ablate.report "
               f"sweep={spec.name}{'' if spec.scale is None else f' scale={spec.scale}'}` on "
               f"{time.strftime('%Y-%m-%d %H:%M %Z')}; do not edit by hand.")
    out.append("")
    if spec.notes:
        out += [spec.notes, ""]
    sections = {spec.paper} if spec.paper else set()
    sections |= {v.expected_row.partition(".")[0] for v in spec.variants if v.expected_row}
    for s in sorted(x for x in sections if x in paper):
        out.append(f"Published numbers: {paper[s]['source']}." + (f" {paper[s]['note']}" if paper[s].get("note") else ""))
        for claim in paper[s].get("claims") or []:
            out.append(f"- Paper: {claim}")
        out.append("")

    for warning in (vocabulary_warning(vocabularies(data)), arms.shape_warning(spec, data.pretrain)):
        if warning:
            out += [warning, ""]

    tasks = summary.tasks
    out += ["## GLUE dev, median over fine-tuning seeds", ""]
    if not tasks:
        out += ["No fine-tuning run of a final checkpoint has finished yet.", ""]
    else:
        out.append(
            f"Each cell is the median over fine-tuning runs (the paper reports the median of 10, section 3.1) of "
            f"the task's paper metric x 100 after the last epoch (CoLA Matthews corr., STS-B Spearman, accuracy "
            f"otherwise). {short_glue(tasks)} = mean of the task medians over the tasks run here: {', '.join(TASK_NAMES[t] for t in tasks)}"
            + (" (the paper's GLUE score averages eight tasks, so compare the differences between variants more than "
               "the absolute numbers)." if len(tasks) < 8 else ".") + " A paper number in parentheses is that "
            "task's published number; * marks a paper GLUE derived as the mean of its per-task numbers.")
        out.append("")
        header = ["variant", *[TASK_NAMES[t] for t in tasks], short_glue(tasks), "paper", "Δ paper"]
        if spec.baseline:
            header.append(f"Δ vs {spec.baseline} [95% CI]")
        header.append("runs")
        rows = []
        for v in spec.variants:
            row_paper, _ = paper_row(spec, v.label, paper)
            cells = [_variant_name(v.label, row_paper)]
            for t in tasks:
                m = summary.medians.loc[v.label, t]
                cells.append(fmt(m) + (f" ({row_paper[t]:.1f})" if row_paper and t in row_paper else ""))
            ours = summary.glue[v.label]
            theirs, derived = paper_glue(row_paper, tasks)
            cells += [f"**{fmt(ours)}**", (fmt(theirs) + ("*" if derived else "")) if theirs is not None else "–",
                      signed(ours - theirs) if ours is not None and theirs is not None else "–"]
            if spec.baseline:
                if v.label == spec.baseline:
                    cells.append("baseline")
                elif v.label in summary.differences:
                    d, lo, hi = summary.differences[v.label]
                    cells.append(f"{signed(d)} [{signed(lo)}, {signed(hi)}]")
                else:
                    cells.append("–")
            n = summary.stats.loc[v.label, "n"] if len(summary.stats) and v.label in summary.stats.index.get_level_values(0) else None
            cells.append("–" if n is None else f"{int(n.min())}–{int(n.max())}" if n.min() != n.max() else str(int(n.min())))
            rows.append(cells)
        out += [table(header, rows), ""]
        if spec.baseline:
            out += [f"The interval is a percentile bootstrap ({BOOTSTRAP_SAMPLES} resamples, seed {BOOTSTRAP_SEED}) of the "
                    f"difference in GLUE-of-medians, resampling each task's fine-tuning runs of both variants; an interval "
                    f"that contains 0 means these runs cannot tell the variant from {spec.baseline}.", ""]
        if "glue" in figures:
            out += [f"![GLUE per fine-tuning seed]({figures['glue']})", ""]
        out += _spread_section(spec, summary)
        out += _expected_max_section(summary, figures)
    if "generator_size" in figures:
        out += ["## Generator size (paper Figure 3, left)", "",
                "GLUE (median over fine-tuning seeds, band = interquartile range of the per-seed GLUE scores) against the "
                "generator's hidden size, one line per discriminator size; the unigram generator is drawn at the left.", "",
                f"![generator size]({figures['generator_size']})", ""]
    if "learning_curves" in spec.figures:
        out += _learning_section(data, figures, paper)
    out += list(verdict_lines)
    out += ["## Failed and missing runs", ""]
    out += [f"- {p}" for p in data.problems] if data.problems else ["None: every job of the grid finished."]
    out += ["", "## How this was produced", "", provenance, ""]
    return "\n".join(out)


def short_glue(tasks: Sequence[str]) -> str:
    """'GLUE' for the paper's eight tasks, else 'GLUE-<n>' (the text names the tasks): a score over a subset is
    never labelled plain GLUE."""
    return verdicts.glue_label(tasks).split(":")[0]


def _variant_name(label: str, row: Mapping | None) -> str:
    return f"{label} ({row['label']})" if row and row.get("label") and row["label"] != label else label


def _spread_section(spec, summary: Summary) -> list[str]:
    out = ["## Spread over fine-tuning seeds", "",
           "Best-of-N is the largest of the N runs (the GLUE row: mean of the task maxima): reporting it instead of "
           "the median is what \"best seed\" results do. The GLUE row's std, min and max are over per-seed GLUE "
           "scores (runs with the same pre-training and fine-tuning seed, every task present).", ""]
    rows = []
    for v in spec.variants:
        if not len(summary.stats) or v.label not in summary.stats.index.get_level_values(0):
            continue
        s = summary.stats.loc[v.label]
        for t in summary.tasks:
            if t in s.index:
                r = s.loc[t]
                rows.append([v.label, TASK_NAMES[t], int(r["n"]), fmt(r["median"]), fmt(r["mean"]), fmt(r["std"], 2),
                             fmt(r["min"]), fmt(r["max"]), fmt(r["best"])])
        seeds = summary.seed_glue[summary.seed_glue["variant"] == v.label]["glue"]
        present = [t for t in summary.tasks if t in s.index]
        rows.append([v.label, f"**{short_glue(summary.tasks)}**", len(seeds), fmt(summary.glue[v.label]), fmt(glue_of(s["mean"].to_dict())),
                     fmt(seeds.std(ddof=1) if len(seeds) > 1 else math.nan, 2), fmt(seeds.min() if len(seeds) else math.nan),
                     fmt(seeds.max() if len(seeds) else math.nan), fmt(glue_of(s["best"].reindex(present).to_dict()))])
    out += [table(["variant", "task", "n", "median", "mean", "std", "min", "max", "best-of-N"], rows), ""]
    ranked = [v.label for v in spec.variants if summary.glue.get(v.label) is not None]
    by_median = sorted(ranked, key=lambda v: -summary.glue[v])
    best = {v: glue_of(summary.stats.loc[v]["best"].to_dict()) for v in ranked}
    by_best = sorted(ranked, key=lambda v: -best[v])
    if len(ranked) > 1:
        out += [f"Ranking by median GLUE: {' > '.join(by_median)}. Ranking by best-of-N GLUE: {' > '.join(by_best)}"
                + (" (the same order)." if by_median == by_best else " (a different order: the best-seed numbers would "
                   "change the conclusion)."), ""]
    return out


def _expected_max_section(summary: Summary, figures: Mapping[str, str]) -> list[str]:
    out = ["## Expected best dev score of n runs", "",
           "Expected validation performance (Dodge et al. 2019): the expected maximum of n fine-tuning runs drawn "
           "from the runs made, band = +-1 standard deviation of that maximum (electra_ablate.expected_max). n = 1 "
           "is the mean; a best-of-N number rises along the curve with N, so a best-seed result is only comparable "
           "at the same N. The last panel is the mean over tasks of each seed's scores.", ""]
    if "expected_max" in figures:
        out += [f"![expected max]({figures['expected_max']})", ""]
    rows = []
    for v in summary.medians.index:  # the sweep's variant order
        seeds = summary.seed_glue[summary.seed_glue["variant"] == v]["glue"].to_numpy()
        if len(seeds):
            mean, sd = expected_max.expected_max(seeds)
            rows.append([v, len(mean), fmt(mean[0]), fmt(float(np.median(seeds))), f"{fmt(mean[-1])} ± {fmt(sd[-1], 2)}"])
    if rows:
        out += [f"Per-seed {verdicts.glue_label(summary.tasks)} scores (runs with every task):", "",
                table(["variant", "runs N", "E[max of 1] (mean)", "median", "E[max of N] ± sd"], rows), ""]
    return out


def _learning_section(data: SweepData, figures: Mapping[str, str], paper: Mapping) -> list[str]:
    spec = data.ctx.spec
    out = ["## Learning curves: GLUE against pre-training FLOPs", "",
           "Fine-tuning runs of intermediate checkpoints of the same pre-training runs; FLOPs as the paper counts "
           "them (electra_ablate.flops: forward + backward of generator and discriminator).", ""]
    if "learning_curves" in figures:
        out += [f"![learning curves]({figures['learning_curves']})", ""]
    curve = learning_curve(data)
    if curve.empty:
        return out + ["No fine-tuning run of an intermediate checkpoint has finished yet.", ""]
    rows = []
    for _, r in curve.iterrows():
        row_paper, _ = paper_row(spec, r["variant"], paper)
        by_fraction = (row_paper or {}).get("by_fraction") or {}
        theirs = next((v for f, v in by_fraction.items() if math.isclose(float(f), r["fraction"])), None)
        rows.append([r["variant"], f"{r['fraction']:g}", int(r["step"]), f"{r['flops']:.3g}" if not _missing(r["flops"]) else "–",
                     fmt(r["glue"]), fmt(theirs), int(r["n"])])
    out += [table(["variant", "fraction of steps", "step", "pre-train FLOPs", "GLUE (median)", "paper", "seeds"], rows), ""]
    return out


def learning_curve(data: SweepData) -> pd.DataFrame:
    """Per (variant, fraction): GLUE of task medians, the IQR of per-seed GLUE, FLOPs, step, seed count."""
    s = data.scores[data.scores["pretrain_run"].notna()] if len(data.scores) else data.scores
    rows = []
    tasks = [t for t in glue.TASKS if t in set(s["task"])] if len(s) else []
    for (variant, fraction), g in s.groupby(["variant", "fraction"]) if len(s) else []:
        medians = g.groupby("task")["score"].median().to_dict()
        seeds = per_seed_glue(g, [t for t in tasks if t in medians])["glue"]
        flops = [data.flops.get((run, step)) for run, step in {(r, st) for r, st in zip(g["pretrain_run"], g["step"])}]
        flops = [f for f in flops if f is not None]
        rows.append({"variant": variant, "fraction": float(fraction), "step": int(g["step"].iloc[0]),
                     "flops": float(np.mean(flops)) if flops else math.nan, "glue": glue_of(medians),
                     "q25": seeds.quantile(0.25) if len(seeds) else math.nan,
                     "q75": seeds.quantile(0.75) if len(seeds) else math.nan, "n": int(g["seed"].nunique())})
    order = {v.label: i for i, v in enumerate(data.ctx.spec.variants)}
    df = pd.DataFrame(rows, columns=["variant", "fraction", "step", "flops", "glue", "q25", "q75", "n"])
    return df.sort_values(["variant", "fraction"], key=lambda c: c.map(order) if c.name == "variant" else c).reset_index(drop=True)


# --- figures ---------------------------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def glue_figure(data: SweepData, summary: Summary, path: Path) -> None:
    plt = _pyplot()
    spec = data.ctx.spec
    labels = [v.label for v in spec.variants]
    fig, ax = plt.subplots(figsize=(max(4, 1.1 * len(labels) + 1.5), 3.6))
    paper = load_paper_results()
    for i, v in enumerate(labels):
        seeds = summary.seed_glue[summary.seed_glue["variant"] == v]["glue"].to_numpy()
        ax.scatter(np.full(len(seeds), i) + np.linspace(-0.12, 0.12, len(seeds)), seeds, s=14, alpha=0.6, color="C0")
        if summary.glue[v] is not None:
            ax.hlines(summary.glue[v], i - 0.3, i + 0.3, color="C0", lw=2, label="median (ours)" if i == 0 else None)
        theirs, _ = paper_glue(paper_row(spec, v, paper)[0], summary.tasks)
        if theirs is not None:
            ax.scatter([i], [theirs], marker="x", color="C3", s=40, label="paper" if i == 0 else None)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    ax.set_ylabel(f"{short_glue(summary.tasks)} dev")
    ax.set_title(f"{spec.name}: GLUE per fine-tuning seed")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def generator_size_points(data: SweepData) -> pd.DataFrame:
    """Per variant: discriminator hidden size, generator hidden size (None for unigram/uniform), generator
    kind, and the per-seed GLUE scores, from the pre-training runs' tags."""
    final = data.scores[data.scores["final"].astype(bool)] if len(data.scores) else data.scores
    tasks = [t for t in glue.TASKS if t in set(final["task"])] if len(final) else []
    seed_glue = per_seed_glue(final, tasks) if tasks else pd.DataFrame(columns=["variant", "glue"])
    rows = []
    for s in data.pretrain:
        if s.run is None:
            continue
        tags = s.run.data.tags
        disc = int(tags.get("disc_hidden_size") or s.run.data.params.get("model.hidden_size"))
        kind = tags.get("generator", "neural")
        gen = int(round(disc * float(tags["generator_hidden_size"]))) if kind == "neural" else None
        rows.append({"variant": s.job.variant, "disc": disc, "gen": gen, "kind": kind})
    points = pd.DataFrame(rows, columns=["variant", "disc", "gen", "kind"]).drop_duplicates("variant")
    out = []
    for _, p in points.iterrows():
        values = seed_glue[seed_glue["variant"] == p["variant"]]["glue"]
        if len(values):
            out.append({**p.to_dict(), "median": glue_of(summary_medians(final, p["variant"])),
                        "q25": values.quantile(0.25), "q75": values.quantile(0.75)})
    return pd.DataFrame(out, columns=["variant", "disc", "gen", "kind", "median", "q25", "q75"])


def summary_medians(final: pd.DataFrame, variant: str) -> dict:
    return final[final["variant"] == variant].groupby("task")["score"].median().to_dict()


def generator_size_figure(data: SweepData, path: Path) -> bool:
    pts = generator_size_points(data)
    if pts.empty:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    neural = pts[pts["gen"].notna()]
    left = np.log2(neural["gen"].min()) - 1 if len(neural) else 0.0  # x position of the fixed-table generators
    for i, (disc, g) in enumerate(pts.groupby("disc")):
        color = f"C{i}"
        n = g[g["gen"].notna()].sort_values("gen")
        x = np.log2(n["gen"].astype(float))
        ax.plot(x, n["median"], marker="o", color=color, label=f"discriminator {disc}")
        ax.fill_between(x, n["q25"], n["q75"], color=color, alpha=0.2)
        for j, (_, u) in enumerate(g[g["gen"].isna()].iterrows()):
            ax.errorbar([left - 0.3 * j], [u["median"]], yerr=[[u["median"] - u["q25"]], [u["q75"] - u["median"]]],
                        fmt="s", color=color, capsize=3)
    ticks = sorted(set(np.log2(neural["gen"].astype(float)))) if len(neural) else []
    labels = [str(int(2 ** t)) for t in ticks]
    kinds = sorted(set(pts[pts["gen"].isna()]["kind"]))
    if kinds:
        ticks, labels = [left, *ticks], ["/".join(kinds), *labels]
    ax.set_xticks(ticks, labels)
    ax.set_xlabel("generator hidden size")
    ax.set_ylabel("GLUE dev (median)")
    ax.set_title("GLUE vs generator size")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def learning_curves_figure(data: SweepData, path: Path) -> bool:
    curve = learning_curve(data)
    if curve.empty:
        return False
    plt = _pyplot()
    paper = load_paper_results()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, (variant, g) in enumerate(curve.groupby("variant", sort=False)):
        color = f"C{i}"
        for axis, x in ((ax, g["flops"]), (bx, g["fraction"])):
            axis.plot(x, g["glue"], marker="o", color=color, label=variant)
            axis.fill_between(x, g["q25"], g["q75"], color=color, alpha=0.2)
        by_fraction = ((paper_row(data.ctx.spec, variant, paper)[0] or {}).get("by_fraction")) or {}
        if by_fraction:
            bx.plot([float(f) for f in by_fraction], list(by_fraction.values()), ls="--", marker="x", color=color,
                    label=f"{variant} (paper)")
    ax.set_xscale("log")
    ax.set_xlabel("pre-training FLOPs (paper accounting)")
    ax.set_ylabel("GLUE dev (median)")
    ax.set_title("GLUE vs pre-training compute")
    bx.set_xscale("log", base=2)
    bx.set_xlabel("fraction of pre-training steps")
    bx.set_title("vs fraction of training (paper: dashed)")
    for a in (ax, bx):
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# --- provenance ----------------------------------------------------------------------------------------------


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


def provenance(data: SweepData, running_sweep_run: str | None, running_wall_time: float | None) -> str:
    frame = data.frame
    lines = []
    sweeps = frame[frame.get("tags.kind", pd.Series(dtype=str)) == "sweep"] if len(frame) else frame
    if len(sweeps):
        sweeps = sweeps[sweeps.get("tags.scale", pd.Series(dtype=str)) == data.ctx.spec.scale_name]
        sweeps = sweeps.sort_values("start_time")
    if len(sweeps):
        lines.append("Sweep invocations (oldest first; each phase launches only what was not already finished):")
        lines.append("")
        for _, r in sweeps.iterrows():
            wall = running_wall_time if r["run_id"] == running_sweep_run else r.get("metrics.wall_time_s")
            lines.append(f"- {_when(r['start_time'])}: `{r.get('tags.command', '?')}` with `{r.get('tags.launcher', '?')}`, "
                         f"status {'RUNNING (this report)' if r['run_id'] == running_sweep_run else r['status']}, "
                         f"wall time {_duration(wall)}, git {r.get('tags.git_commit', '?')}")
            for name in ("pretrain", "finetune"):
                col = f"tags.phase.{name}"
                if not isinstance(r.get(col), str):
                    continue
                phase = json.loads(r[col])
                what = f"{phase['jobs']} job(s), {phase['seconds']:.0f} s, exit code {phase['returncode']}" if phase["jobs"] else "nothing to launch"
                lines.append(f"  - {name}: {what}" + (f": `{phase['command']}`" if phase["command"] else ""))
        last = sweeps.iloc[-1]
        lines += ["", f"- Machine of the last sweep: {last.get('tags.hardware', '?')}; {last.get('tags.platform', '?')}; "
                  f"Python {last.get('tags.python', '?')}", f"- Packages: {last.get('tags.packages', '?')}"]
    else:
        env = environment()
        lines += ["No sweep run is recorded (the runs were launched by hand); the report's own machine:", "",
                  f"- {env['hardware']}; {env['platform']}; Python {env['python']}", f"- Packages: {env['packages']}"]
    jobs = frame[frame.get("tags.kind", pd.Series(dtype=str)).isin(["pretrain", "finetune"])] if len(frame) else frame
    grid = {s.run.info.run_id for s in data.pretrain if s.run is not None} | set(data.scores["run_id"]) if len(data.scores) or data.pretrain else set()
    jobs = jobs[jobs["run_id"].isin(grid)] if len(jobs) else jobs
    if len(jobs):
        commits = sorted(set(jobs.get("tags.git_commit", pd.Series(dtype=str)).dropna()))
        seconds = (_times(jobs["end_time"]) - _times(jobs["start_time"])).dt.total_seconds()
        hours = {k: seconds[g.index].sum() for k, g in jobs.groupby("tags.kind")}
        lines += [f"- Git commit(s) of the runs in the tables: {', '.join(commits) or 'unknown'}",
                  "- Compute time of the runs in the tables (sum of run durations): "
                  + ", ".join(f"{k} {_duration(v)} over {int((jobs['tags.kind'] == k).sum())} runs" for k, v in hours.items())]
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


def _dashboard_link(data: SweepData) -> str:
    ids = data.frame["experiment_id"].dropna().unique() if "experiment_id" in data.frame else []
    if len(ids) != 1:
        return "the experiment's page with the Model training view"
    return f"<{tracking.dashboard_url('http://127.0.0.1:5000', str(ids[0]))}>"


def _times(column: pd.Series) -> pd.Series:
    """MLflow's start/end times as UTC timestamps (mlflow.search_runs gives epoch milliseconds or datetimes)."""
    if pd.api.types.is_numeric_dtype(column):
        return pd.to_datetime(column, unit="ms", utc=True)
    return pd.to_datetime(column, utc=True)


def _when(ts) -> str:
    if _missing(ts) or ts is pd.NaT:
        return "?"
    stamp = pd.to_datetime(ts, unit="ms", utc=True) if isinstance(ts, (int, float, np.integer)) else pd.Timestamp(ts)
    return stamp.strftime("%Y-%m-%d %H:%M UTC")


def _duration(seconds) -> str:
    if _missing(seconds):
        return "?"
    seconds = float(seconds)
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


# --- writing ---------------------------------------------------------------------------------------------------


def write_report(ctx: SweepContext, client, report_dir: str | Path, running_sweep_run: str | None = None,
                 running_wall_time: float | None = None) -> Path:
    """Write <report_dir>/<name>.md and <report_dir>/<name>/*.png atomically; returns the markdown's path."""
    report_dir = Path(report_dir)
    name = ctx.spec.name
    data = collect(ctx, client)
    summary = summarize(data)
    report_dir.mkdir(parents=True, exist_ok=True)
    staging = report_dir / f".{name}.{os.getpid()}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    figures: dict[str, str] = {}
    if summary.tasks:
        glue_figure(data, summary, staging / "glue.png")
        figures["glue"] = f"{name}/glue.png"
    if "generator_size" in ctx.spec.figures and generator_size_figure(data, staging / "generator_size.png"):
        figures["generator_size"] = f"{name}/generator_size.png"
    if "learning_curves" in ctx.spec.figures and learning_curves_figure(data, staging / "learning_curves.png"):
        figures["learning_curves"] = f"{name}/learning_curves.png"
    final = data.scores[data.scores["final"].astype(bool)] if len(data.scores) else data.scores
    if summary.tasks:
        panels = expected_max.curves(final, summary.seed_glue, summary.tasks)
        titles = {**{t: TASK_NAMES[t] for t in summary.tasks}, "glue": verdicts.glue_label(summary.tasks)}
        if expected_max.figure(panels, titles, [v.label for v in ctx.spec.variants], staging / "expected_max.png"):
            figures["expected_max"] = f"{name}/expected_max.png"
    results = verdicts.verdicts(ctx.spec, final, client, load_paper_results())
    closing = verdicts.render(results)
    if results:
        closing += ["In words, with the scale each verdict was reached at:", "",
                    *arms.scale_sentences(results, arms.describe(ctx.spec, data.pretrain)), ""]
    text = render(data, summary, figures, provenance(data, running_sweep_run, running_wall_time), closing)
    md_tmp = report_dir / f".{name}.md.{os.getpid()}.tmp"
    md_tmp.write_text(text)
    # Swap the figure folder in, then the markdown that points at it.
    target = report_dir / name
    old = report_dir / f".{name}.{os.getpid()}.old"
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    md_tmp.replace(report_dir / f"{name}.md")
    return report_dir / f"{name}.md"


@hydra.main(config_path=str(cli.CONF_DIR), config_name="sweep", version_base="1.3")
def main(cfg: DictConfig) -> str:
    ctx = context_from_cfg(cfg)
    client = tracking.setup(ctx.tracking_uri, ctx.experiment)
    path = write_report(ctx, client, cfg.report_dir)
    print(f"report: {path}")
    return str(path)


def cli_main() -> None:
    """Console entry: a misspelt key stops here with the keys it may mean, before Hydra starts (cli.py)."""
    cli.check_args("sweep")
    main()


if __name__ == "__main__":
    cli_main()
