"""The numbers of a report: per-task spread over fine-tuning seeds (the paper reports the median of 10 runs,
section 3.1), per-seed GLUE scores, the GLUE of task medians, percentile-bootstrap intervals for a variant's
difference from the baseline, learning curves and generator-size points.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from electra_ablate.glue import tasks as glue
from electra_ablate.glue.metrics import glue_score
from electra_ablate.report import multibootstrap as mb
from electra_ablate.report.collect import SweepData, final_rows, is_missing

BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0


@contextlib.contextmanager
def bootstrap_seed(seed: int | None):
    """Every bootstrap of a report (the percentile intervals here and the multi-bootstrap verdicts) drawn from
    `seed` instead of 0 while the block runs, and the report says which (the report's `bootstrap_seed=`)."""
    global BOOTSTRAP_SEED
    if seed is None:
        yield
        return
    before = BOOTSTRAP_SEED, mb.SEED
    BOOTSTRAP_SEED = mb.SEED = int(seed)
    try:
        yield
    finally:
        BOOTSTRAP_SEED, mb.SEED = before


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
    glue_scores = [glue_score(dict(zip(tasks, row))).score for row in wide.to_numpy()]
    return pd.DataFrame({"variant": wide.index.get_level_values("variant"), "glue": glue_scores})


def pretrain_seed_glue(final: pd.DataFrame, tasks: Sequence[str]) -> pd.DataFrame:
    """Per (variant, pre-training seed) of the variants pre-trained with more than one seed: each task's median over
    the fine-tuning runs of that seed's checkpoint, their GLUE score ("glue") and the number of runs ("n"), so that
    a reader sees how far one pre-trained encoder lies from another beside how far the arms lie apart."""
    columns = ["variant", "pretrain_seed", *tasks, "glue", "n"]
    if not len(final) or not tasks:
        return pd.DataFrame(columns=columns)
    several = final.groupby("variant")["pretrain_seed"].nunique()
    runs = final[final["variant"].isin(several[several > 1].index) & final["task"].isin(tasks)]
    if not len(runs):
        return pd.DataFrame(columns=columns)
    medians = runs.pivot_table(index=["variant", "pretrain_seed"], columns="task", values="score", aggfunc="median")
    medians = medians.reindex(columns=list(tasks))
    out = medians.reset_index()
    out["glue"] = [glue_of(row) for row in medians.to_dict("records")]
    out["n"] = runs.groupby(["variant", "pretrain_seed"]).size().reindex(medians.index).to_numpy()
    return out[columns]


def glue_of(medians: Mapping[str, float]) -> float | None:
    """The GLUE score (paper: mean over tasks, WNLI left out) of per-task medians; None when empty."""
    per_task = {t: v for t, v in medians.items() if not is_missing(v)}
    if not per_task or set(per_task) == {"wnli"}:
        return None
    return glue_score(per_task).score


def bootstrap_difference(
    variant: Mapping[str, np.ndarray], baseline: Mapping[str, np.ndarray], samples: int = BOOTSTRAP_SAMPLES,
    seed: int | None = None, level: float = 0.95,
) -> tuple[float, float, float]:
    """(observed, low, high): the GLUE-of-medians difference variant - baseline and its percentile bootstrap
    interval, resampling each task's fine-tuning runs of each side independently (fixed seed)."""
    tasks = [t for t in variant if t in baseline and len(variant[t]) and len(baseline[t])]
    if not tasks:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(BOOTSTRAP_SEED if seed is None else seed)

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


@dataclass
class Summary:
    """The numbers of the main table (also what tests compare against the stored runs)."""

    tasks: list[str]  # tasks with at least one finished final-checkpoint run, GLUE order
    medians: pd.DataFrame  # variant x task medians (final checkpoints)
    glue: dict[str, float | None]  # variant -> GLUE of its task medians
    stats: pd.DataFrame  # task_stats of the final checkpoints
    seed_glue: pd.DataFrame  # per_seed_glue of the final checkpoints
    differences: dict[str, tuple[float, float, float]]  # variant -> bootstrap_difference vs the baseline

    def as_record(self) -> dict[str, dict[str, float]]:
        """variant -> task -> median, with its GLUE under "glue": the main table as data."""
        rows = self.medians.to_dict(orient="index") if len(self.medians) else {}
        return {v: {**{t: float(x) for t, x in row.items() if pd.notna(x)},
                    **({"glue": float(self.glue[v])} if self.glue.get(v) is not None else {})} for v, row in rows.items()}


def summarize(data: SweepData) -> Summary:
    spec = data.ctx.spec
    final = final_rows(data.scores)
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


def curve_runs(data: SweepData) -> pd.DataFrame:
    """The score rows of pre-trained checkpoints: random-init arms (their pretrain_run is the run they are
    shaped like) and imported models have no pre-training to draw a curve over."""
    if not len(data.scores):
        return data.scores
    shaped = {v.label for v in data.ctx.spec.variants if v.random_init_of is not None}
    return data.scores[data.scores["pretrain_run"].notna() & ~data.scores["variant"].isin(shaped)]


def switch_steps(data: SweepData) -> dict[str, float]:
    """Pre-training run -> the step at which two-stage training switched (or, unfinished, will switch) from the
    generator to the discriminator (its train/switch_step metric); runs of the other algorithms have none."""
    out = {}
    for state in data.pretrain:
        run = state.latest
        if run is None:
            continue
        if "train/switch_step" in run.data.metrics:
            out[run.info.run_id] = run.data.metrics["train/switch_step"]
        elif "algorithm.switch_fraction" in run.data.params:
            # A run not finished yet that has not switched (or not logged it yet): where it switches
            # (algorithms/two_stage.py).
            out[run.info.run_id] = round(float(run.data.params["algorithm.switch_fraction"]) * state.max_steps)
    return out


def curve_tasks(data: SweepData) -> list[str]:
    """The instrument a learning curve is read on: every task any fine-tuning run of the sweep has (GLUE order), so
    that each point, and the random-init floor, averages over the same tasks (GLUE-k); a checkpoint not yet
    fine-tuned on one of them has no GLUE-k of its own."""
    present = set(data.scores["task"]) if len(data.scores) else set()
    return [t for t in glue.TASKS if t in present]


def learning_curve(data: SweepData) -> pd.DataFrame:
    """Per (variant, fraction): GLUE-k of task medians over `curve_tasks` (NaN where a task has no run yet at that
    checkpoint; `tasks` counts those that have), the IQR of per-seed GLUE-k, FLOPs, step, fine-tuning and
    pre-training seed counts (a run still pre-training adds its seed to the early fractions only), and the network
    fine-tuned: `generator` for two-stage checkpoints up to the switch (the discriminator is still untrained there,
    so the generator, an MLM model, is exported), `discriminator` otherwise."""
    s = curve_runs(data)
    switches = switch_steps(data)
    rows = []
    tasks = curve_tasks(data)
    for (variant, fraction), g in s.groupby(["variant", "fraction"]) if len(s) else []:
        medians = g.groupby("task")["score"].median().to_dict()
        complete = all(t in medians for t in tasks)
        seeds = per_seed_glue(g, tasks)["glue"] if complete else pd.Series(dtype=float)
        flops = [data.flops.get((run, step)) for run, step in {(r, st) for r, st in zip(g["pretrain_run"], g["step"])}]
        flops = [f for f in flops if f is not None]
        before_switch = all(st <= switches.get(r, -1) for r, st in zip(g["pretrain_run"], g["step"]))
        rows.append({"variant": variant, "fraction": float(fraction), "step": int(g["step"].iloc[0]),
                     "flops": float(np.mean(flops)) if flops else math.nan,
                     "glue": glue_of(medians) if complete else math.nan, "tasks": len(medians),
                     "q25": seeds.quantile(0.25) if len(seeds) else math.nan,
                     "q75": seeds.quantile(0.75) if len(seeds) else math.nan, "n": int(g["seed"].nunique()),
                     "pretrain_seeds": int(g["pretrain_seed"].nunique()),
                     "network": "generator" if before_switch else "discriminator"})
    order = {v.label: i for i, v in enumerate(data.ctx.spec.variants)}
    df = pd.DataFrame(rows, columns=["variant", "fraction", "step", "flops", "glue", "tasks", "q25", "q75", "n",
                                     "pretrain_seeds", "network"])
    return df.sort_values(["variant", "fraction"], key=lambda c: c.map(order) if c.name == "variant" else c).reset_index(drop=True)


def _random_init_runs(data: SweepData) -> dict[str, pd.DataFrame]:
    """Per random-init variant (`random_init_of`): its final-checkpoint runs, when they cover every task of
    `curve_tasks` (else its GLUE-k is not there yet)."""
    labels = [v.label for v in data.ctx.spec.variants if v.random_init_of is not None]
    final = final_rows(data.scores)
    tasks = set(curve_tasks(data))
    out = {}
    for label in labels:
        g = final[final["variant"] == label] if len(final) else final
        if len(g) and set(g["task"]) >= tasks:
            out[label] = g
    return out


def random_init_floors(data: SweepData) -> dict[str, float]:
    """Per random-init variant: the GLUE-k (`curve_tasks`) of its task medians, the floor a curve has to clear."""
    out = {}
    for label, g in _random_init_runs(data).items():
        value = glue_of(g.groupby("task")["score"].median().to_dict())
        if value is not None:
            out[label] = value
    return out


def random_init_task_medians(data: SweepData) -> dict[str, dict[str, float]]:
    """Per random-init variant: its median score on each task (the per-task floors of the learning curves)."""
    return {label: g.groupby("task")["score"].median().to_dict() for label, g in _random_init_runs(data).items()}


def random_init_bands(data: SweepData) -> dict[str, tuple[float, float, float]]:
    """Per random-init variant: its floor (random_init_floors) and the quartiles of its per-seed GLUE-k, the band
    that the paper's Figure 4 shades for its no-pre-training baseline."""
    floors = random_init_floors(data)
    runs = _random_init_runs(data)
    out = {}
    for label, floor in floors.items():
        seeds = per_seed_glue(runs[label], curve_tasks(data))["glue"]
        low, high = (seeds.quantile(0.25), seeds.quantile(0.75)) if len(seeds) else (floor, floor)
        out[label] = (floor, float(low), float(high))
    return out


# FLOPs within this share of each other count as equal: an arm sized to the baseline's budget lands within a
# fraction of a percent of it (cpu_long: ELECTRA's 3.234e15 against BERT's 3.232e15), never exactly on it.
EQUAL_FLOPS = 0.02


def at_flops(curve: pd.DataFrame, flops: float) -> float | None:
    """`curve`'s (one arm's learning_curve rows) median at `flops`, interpolated linearly in log FLOPs between its
    checkpoints; its first or last checkpoint's within EQUAL_FLOPS of them; None outside (never extrapolated)."""
    g = curve.dropna(subset=["flops", "glue"]).sort_values("flops")
    if g.empty or math.isnan(flops):
        return None
    x, y = np.log(g["flops"].to_numpy()), g["glue"].to_numpy()
    lo, hi = x[0] + math.log(1 - EQUAL_FLOPS), x[-1] + math.log(1 + EQUAL_FLOPS)
    if not lo <= math.log(flops) <= hi:
        return None
    return float(np.interp(math.log(flops), x, y))  # clamps to the ends within the tolerance


def crossings(curve: pd.DataFrame, floor: float | None, baseline: str | None,
              band_top: float | None = None) -> list[dict]:
    """Per curve of `curve` (learning_curve), in order of pre-training FLOPs, each first checkpoint whose median is
    strictly above: the random-init `floor` (its median) and `band_top` (the upper quartile of its per-seed
    scores); and, for every curve but the baseline's, the baseline at equal FLOPs (`equal_flops`: each checkpoint
    against the baseline's curve interpolated there, at_flops; none outside its range) and the baseline's final
    median. None where no checkpoint is; beside each curve's last checkpoint's FLOPs and its best median. Points
    without a median (a task not fine-tuned yet) or without FLOPs are left out."""
    base_curve = curve[curve["variant"] == baseline] if baseline else curve.iloc[:0]
    base = base_curve[base_curve["fraction"] == 1.0]
    target = float(base["glue"].iloc[0]) if len(base) and not is_missing(base["glue"].iloc[0]) else None
    out = []
    for variant, g in curve.groupby("variant", sort=False):
        g = g.dropna(subset=["glue", "flops"]).sort_values("flops")
        if g.empty:
            continue
        first = {}
        for name, level in (("floor", floor), ("band", band_top), ("baseline_final", target)):
            above = g.iloc[:0] if level is None or (name == "baseline_final" and variant == baseline) else \
                g[g["glue"] > level]
            first[name] = None if above.empty else _point(above.iloc[0])
        equal = []
        if variant != baseline and len(base_curve):
            for _, r in g.iterrows():
                theirs = at_flops(base_curve, r["flops"])
                if theirs is not None:
                    equal.append({**_point(r), "baseline": theirs, "difference": float(r["glue"]) - theirs})
        out.append({"variant": variant, "floor": floor, "band_top": band_top, "baseline_final": target,
                    "first_above_floor": first["floor"], "first_above_band": first["band"],
                    "first_above_baseline_final": first["baseline_final"], "equal_flops": equal,
                    "first_above_baseline": next((e for e in equal if e["difference"] > 0), None),
                    "last_flops": float(g["flops"].iloc[-1]), "best": float(g["glue"].max())})
    return out


def _point(r: pd.Series) -> dict:
    return {"flops": float(r["flops"]), "fraction": float(r["fraction"]), "glue": float(r["glue"])}


def generator_size_points(data: SweepData) -> pd.DataFrame:
    """Per variant: discriminator hidden size, generator hidden size (None for unigram/uniform), generator
    kind, and the per-seed GLUE scores, from the pre-training runs' tags."""
    final = final_rows(data.scores)
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
