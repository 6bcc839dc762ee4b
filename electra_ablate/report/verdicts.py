"""Verdicts on the paper's claims for one sweep: does each claim hold at this scale, and what would settle it?

The claims are data (electra_ablate/report/claims.yaml: which variant beats which, per paper table or figure). For a
sweep, every claim whose variants it ran is tested with the multi-bootstrap (electra_ablate.multibootstrap:
pre-training groups, fine-tuning runs and dev examples resampled together, MultiBERTs-style) on the final
checkpoints' dev predictions, which every fine-tuning run logs (`predictions/dev_predictions.tsv`). Runs
logged without that artifact fall back to their final scores (seeds resampled, examples not). A variant
without pre-training (`pretrained: none`, or `random_init_of: <variant>`: random weights shaped like that
variant's checkpoints) draws a fresh random encoder in every run, so each of its runs is its own group.

A claim is *degenerate* when an arm it compares is degenerate in every run (report/predictions.py: its
dev predictions are one class, or a constant): that arm scores the majority class whatever it was
pre-trained on, so no difference is estimated. Otherwise a claim *holds* when the 95% interval of
(better - worse) lies above 0, is *reversed* when it lies below, and is *unresolved at this scale*
otherwise, with any arm's degenerate runs named beside it; for an unresolved claim the table says how many
seeds the observed variance asks for (the seed part of the bootstrap variance shrinks as 1/seeds, the
dev-example part does not: multibootstrap.seeds_to_resolve).

The headline verdict is on the GLUE-k mean (the paper's score: the mean over the tasks run of each task's paper
metric); a sweep of several tasks also gets each task's difference and verdict from the same bootstrap samples
(`Verdict.per_task`), so that a reader sees which tasks separate the arms and which only add noise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from electra_ablate.glue import tasks as glue
from electra_ablate.report import carries
from electra_ablate.report import multibootstrap as mb
from electra_ablate.report.carries import verdict_of
from electra_ablate.report import predictions as pr
from electra_ablate.report.claims import (  # noqa: F401 (the claims are read through this module too)
    CLAIMS, NO_PRETRAINING, Claim, ClaimsError, load_claims, pretrained, sweep_claims)
from electra_ablate.report.tables import table

DEGENERATE = "degenerate"


# --- runs -> arms ------------------------------------------------------------------------------------------


def group_of(variant, pretrain_run) -> str | None:
    """A run's pre-training group: its pre-training run, the imported model for a `pretrained` variant, or
    None (its own group) when the variant has no pre-training (each run draws its own random encoder)."""
    if not pretrained(variant):
        return None
    if isinstance(pretrain_run, str) and pretrain_run:
        return pretrain_run
    return f"pretrained:{variant.pretrained}"


@dataclass
class Arms:
    """Per variant and task, each final-checkpoint run as RunPredictions (when its artifact exists), RunScore
    (always) and whether it is degenerate (True / False / None: unknown)."""

    predictions: dict[str, dict[str, list[mb.RunPredictions | None]]]
    scores: dict[str, dict[str, list[mb.RunScore]]]
    degenerate: dict[str, dict[str, list[bool | None]]] = field(default_factory=dict)

    def health(self, label: str, tasks: Sequence[str]) -> dict[str, pr.Count]:
        return {t: pr.count(self.degenerate.get(label, {}).get(t, [])) for t in tasks}

    def of(self, labels: Sequence[str]) -> tuple[dict[str, dict[str, list]], bool]:
        """{label: {task: runs}} for a comparison: predictions when every run of these labels has them."""
        complete = all(p is not None for v in labels for runs in self.predictions[v].values() for p in runs)
        source = self.predictions if complete else self.scores
        return {v: source[v] for v in labels}, complete


def collect_arms(spec, final: pd.DataFrame, client,
                 loaded: Mapping[str, mb.RunPredictions | None] | None = None) -> Arms:
    """Arms of every variant from the report's final-checkpoint score rows (report.collect); `loaded`: the
    runs' predictions already read (SweepData.predictions), by run id."""
    preds: dict = {v.label: {} for v in spec.variants}
    scores: dict = {v.label: {} for v in spec.variants}
    flags: dict = {v.label: {} for v in spec.variants}
    for _, r in final.iterrows():
        variant = spec.variant(r["variant"])
        group = group_of(variant, r["pretrain_run"])
        if loaded is not None and r["run_id"] in loaded:
            p = loaded[r["run_id"]]
        else:
            p = pr.load_run_predictions(client, r["run_id"], r["task"])
        preds[r["variant"]].setdefault(r["task"], []).append(
            None if p is None else p._replace(group=group, seed=int(r["seed"])))
        scores[r["variant"]].setdefault(r["task"], []).append(mb.RunScore(group, int(r["seed"]), float(r["score"])))
        flag = r["degenerate"] if "degenerate" in r.index else pr.is_degenerate(r["task"], p)
        flags[r["variant"]].setdefault(r["task"], []).append(None if pd.isna(flag) else bool(flag))
    return Arms(preds, scores, flags)


# --- verdicts -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskVerdict:
    """A claim on one task, from the samples of its GLUE verdict (multibootstrap.Bootstrap.tasks)."""

    difference: mb.Difference | None  # None: an arm predicts one class in every run of the task
    verdict: str
    seeds: str  # how many seeds would resolve it, in short (`seeds_needed`)
    examples: int  # dev examples compared (0: final scores only, examples not resampled)


@dataclass
class Verdict:
    claim: Claim
    difference: mb.Difference | None  # None: a variant has no finished run
    tasks: tuple[str, ...]
    groups: dict[str, int]
    runs_per_group: float  # fine-tuning runs per pre-training group and task (median over arms)
    examples: bool  # dev examples resampled (every run had predictions)
    verdict: str
    resolve: str
    health: dict[str, dict[str, pr.Count]] = field(default_factory=dict)  # arm -> task -> degenerate runs
    runs: dict[str, int] = field(default_factory=dict)  # arm -> fine-tuning runs compared (the fewest over tasks)
    per_task: dict[str, TaskVerdict] = field(default_factory=dict)  # several tasks: each one's, in GLUE order
    without: dict[str, mb.Difference] = field(default_factory=dict)  # several tasks: the GLUE mean without each

    @property
    def note(self) -> str:
        """The arms that learned nothing in every run (a degenerate verdict), else those partly degenerate."""
        if self.verdict == DEGENERATE:
            shown = [a for a, h in self.health.items() if pr.total(h).all]
        else:
            shown = [a for a, h in self.health.items() if pr.total(h).any]
        text = "; ".join(pr.phrase(a, self.health[a]) for a in shown)
        return text if self.verdict == DEGENERATE or not text else f"partly degenerate: {text}"


def what_it_takes(d: mb.Difference, verdict: str, groups: Mapping[str, int], per_group: float) -> str:
    single = min(groups.values()) < 2
    if verdict != "unresolved at this scale":
        return ("≥2 pre-training seeds per arm to cover pre-training variance" if single else
                "– (resolved over pre-training seeds, fine-tuning seeds and dev examples)")
    k = mb.seeds_to_resolve(d)
    if k is None:
        return (f"no number of seeds: the dev-set noise alone (±{mb.z_score() * d.sd_examples:.1f}) covers the estimate "
                f"{d.estimate:+.1f}; needs a larger scale (a bigger gap) or more dev examples")
    if single:
        return (f"≈{math.ceil(k * per_group)} fine-tuning seeds per arm (≈{k:.1f}x), if the estimate held; "
                "and ≥2 pre-training seeds per arm to cover pre-training variance")
    return (f"≈{math.ceil(k * min(groups.values()))} pre-training seeds per arm x {per_group:.0f} fine-tuning seeds "
            f"(≈{k:.1f}x), if the estimate held")


def seeds_needed(d: mb.Difference, verdict: str, groups: Mapping[str, int], per_group: float) -> str:
    """`what_it_takes` in a table cell's words: '–' (resolved), '≈6 x 5' (pre-training x fine-tuning seeds per
    arm), '≈12 fine-tuning seeds' (one pre-training seed), or 'none: dev noise ±1.9' (no number of seeds)."""
    single = min(groups.values()) < 2
    if verdict != "unresolved at this scale":
        return "≥2 pre-training seeds" if single else "–"
    k = mb.seeds_to_resolve(d)
    if k is None:
        return f"none: dev noise ±{mb.z_score() * d.sd_examples:.1f}"
    if single:
        return f"≈{math.ceil(k * per_group)} fine-tuning seeds, ≥2 pre-training seeds"
    return f"≈{math.ceil(k * min(groups.values()))} x {per_group:.0f}"


def _per_task(claim: Claim, boot: mb.Bootstrap, runs: Mapping, health: Mapping, tasks: Sequence[str]
              ) -> dict[str, TaskVerdict]:
    """Each task's difference and verdict for a claim, from the samples of its GLUE verdict."""
    out = {}
    for t in tasks:
        labels = list(dict.fromkeys(claim.better + claim.worse))
        n = boot.examples[t]
        if any(health[v][t].all for v in labels):  # that arm scores the majority class on this task
            out[t] = TaskVerdict(None, DEGENERATE, "–", n)
            continue
        d = mb.difference(mb.best_of([boot.tasks[t][v] for v in claim.better]),
                          mb.best_of([boot.tasks[t][v] for v in claim.worse]))
        per_group = float(np.median([len(runs[v][t]) / boot.groups[v] for v in labels]))
        verdict = verdict_of(d)
        out[t] = TaskVerdict(d, verdict, seeds_needed(d, verdict, boot.groups, per_group), n)
    return out


def _needs(labels: Sequence[str], waiting: Mapping[str, str]) -> str:
    """What a claim without final runs of `labels` needs: fine-tuning runs, or the end of a pre-training run."""
    idle = [v for v in labels if v not in waiting]
    return "; ".join(([f"fine-tuning runs of {', '.join(idle)}"] if idle else []) +
                     [waiting[v] for v in labels if v in waiting])


def verdicts(spec, final: pd.DataFrame, client, paper: Mapping, claims: Mapping | None = None,
             samples: int = mb.SAMPLES, seed: int | None = None,
             predictions: Mapping[str, mb.RunPredictions | None] | None = None,
             waiting: Mapping[str, str] | None = None) -> list[Verdict]:
    """One verdict per claim of the sweep, from its final-checkpoint runs (`final`: report score rows;
    `predictions`: their dev predictions by run id, when already read; `waiting`: per arm whose pre-training has
    not finished, what its claims wait for instead of fine-tuning runs)."""
    todo = sweep_claims(spec, paper, claims)
    if not todo:
        return []
    arms = collect_arms(spec, final, client, predictions)
    out = []
    for claim in todo:
        labels = list(dict.fromkeys(claim.better + claim.worse))
        runs, complete = arms.of(labels)
        missing = [v for v in labels if not runs[v]]
        tasks = [t for t in glue.TASKS if all(runs[v].get(t) for v in labels)]
        if missing or not tasks:
            out.append(Verdict(claim, None, (), {}, math.nan, False, "not run",
                               _needs(missing or labels, waiting or {})))
            continue
        health = {v: arms.health(v, tasks) for v in labels}
        dead = [v for v in labels if pr.total(health[v]).all]
        if dead:  # the arm scores the majority class whatever it was pre-trained on: nothing to estimate
            out.append(Verdict(claim, None, tuple(tasks), {}, math.nan, complete, DEGENERATE,
                               f"fine-tuning runs of {', '.join(dead)} that learn (as run, they score what a "
                               "constant prediction scores, whatever the pre-training)", health))
            continue
        boot = mb.bootstrap(runs, tasks, samples, seed)
        d = mb.difference(mb.best_of([boot.glue[v] for v in claim.better]),
                          mb.best_of([boot.glue[v] for v in claim.worse]))
        per_group = float(np.median([len(runs[v][t]) / boot.groups[v] for v in labels for t in tasks]))
        verdict = verdict_of(d)
        out.append(Verdict(claim, d, tuple(tasks), dict(boot.groups), per_group, complete, verdict,
                           what_it_takes(d, verdict, boot.groups, per_group), health,
                           {v: min(len(runs[v][t]) for t in tasks) for v in labels},
                           _per_task(claim, boot, runs, health, tasks) if len(tasks) > 1 else {},
                           carries.leave_one_out(claim.better, claim.worse, boot)))
    return out


def glue_label(tasks: Sequence[str]) -> str:
    """'GLUE' for the paper's eight tasks, else 'GLUE-<n>: <tasks>' (a subset is never plain GLUE)."""
    names = glue_task_names(tasks)
    return "GLUE" if len(names) == 8 and "WNLI" not in names else f"GLUE-{len(names)}: {', '.join(names)}"


def glue_task_names(tasks: Sequence[str]) -> list[str]:
    display = {t.name: t.dir_name for t in glue.TASKS.values()}
    return [display[t] for t in glue.TASKS if t in tasks]


def instrument(tasks: Sequence[str]) -> str:
    """What a score was measured on: the task for one ('SST-2'), else its GLUE label ('GLUE-3: SST-2, MRPC, STS-B')."""
    names = glue_task_names(tasks)
    return names[0] if len(names) == 1 else glue_label(tasks)


RESOLVED = ("holds", "reversed")


def resolved_elsewhere(verdict: str, per_task: Mapping[str, str]) -> str:
    """'holds on SST-2, MRPC; reversed on CoLA': the tasks (`per_task`: task -> verdict) on which a claim is
    resolved otherwise than on its GLUE mean (`verdict`); '' when there are none."""
    by_verdict: dict[str, list[str]] = {}
    for t, v in per_task.items():
        if v in RESOLVED and v != verdict:
            by_verdict.setdefault(v, []).append(t)
    return "; ".join(f"{v} on {', '.join(glue_task_names(ts))}" for v, ts in by_verdict.items())


def render(results: Sequence[Verdict]) -> list[str]:
    """The report's closing section: one row per claim on the GLUE mean (the headline), then, for a sweep of
    several tasks, one row per claim and task."""
    out = ["## Verdicts on the paper's claims", ""]
    if not results:
        return out + ["This sweep runs no pair of variants that a claim in electra_ablate/report/claims.yaml compares.", ""]
    several = [v for v in results if v.per_task]
    if several:
        label, _, names = glue_label(several[0].tasks).partition(": ")
        out += [f"The headline is each claim's verdict on the {label} mean ({names}), the paper's kind of score: the "
                "mean over tasks of each task's paper metric. The verdicts of each task alone follow under *Per task*.",
                ""]
    out += ["Each claim's difference (better - worse, mean over runs x 100 on the tasks named) is a multi-bootstrap "
            f"estimate (Sellam et al. 2022; {mb.SAMPLES} samples, seed {mb.SEED}) resampling pre-training seeds, "
            "fine-tuning seeds and dev examples together (examples paired across arms); a set of variants counts "
            "with its best member. Verdict: *degenerate* if an arm's every fine-tuning run predicts a single "
            "class (a constant for regression), so that it scores the majority class whatever its pre-training "
            "and no difference is estimated; else *holds* if the 95% interval is above 0, *reversed* if below, "
            "*unresolved at this scale* otherwise, with any degenerate runs named. P(sign) is the share of "
            "bootstrap samples whose difference has the estimate's sign.", ""]
    rows, notes = [], []
    for v in results:
        c = v.claim
        if v.verdict == DEGENERATE:
            rows.append([c.text, c.figure, c.paper or "–", glue_label(v.tasks), "–", "–", f"**degenerate**: {v.note}",
                         v.resolve])
            continue
        if v.difference is None:
            rows.append([c.text, c.figure, c.paper or "–", "–", "–", "–", v.verdict, v.resolve])
            continue
        d = v.difference
        covers = []
        if min(v.groups.values()) < 2:
            covers.append("one pre-training seed")
        if not v.examples:
            covers.append("no predictions: examples not resampled, degenerate runs unknown")
        verdict = v.verdict + (f" ({'; '.join(covers)})" if covers else "") + (f"; {v.note}" if v.note else "")
        split = resolved_elsewhere(v.verdict, {t: tv.verdict for t, tv in v.per_task.items()})
        verdict += f"; per task: {split}" if split else ""
        rests = carries.phrase(v.verdict, v.without)
        verdict += f"; {rests}" if rests else ""
        rows.append([c.text, c.figure, c.paper or "–", glue_label(v.tasks),
                     f"{d.estimate:+.2f} [{d.low:+.2f}, {d.high:+.2f}]", f"{d.sign_probability:.2f}", verdict,
                     v.resolve])
        if min(v.groups.values()) < 2:
            notes.append(c.text)
    out.append(table(["claim", "paper figure", "paper", "ours on", "ours: Δ [95% CI]", "P(sign)", "verdict",
                      "what would resolve it"], rows))
    out.append("")
    if notes:
        out += ["With one pre-training seed per arm the interval covers fine-tuning seeds and dev examples only: "
                "a verdict then holds for these pre-trained models, not for the pre-training recipe.", ""]
    return out + (_per_task_section(several) if several else []) + carries.section(several)


def _per_task_section(results: Sequence[Verdict]) -> list[str]:
    """Each claim on each task alone, from the bootstrap samples of its GLUE verdict."""
    out = ["### Per task", "",
           "Each claim on each task alone, from the same bootstrap samples as its GLUE verdict (Δ in the task's paper "
           "metric x 100: CoLA Matthews corr., STS-B Spearman, accuracy otherwise). *Seeds to resolve*: the "
           "pre-training x fine-tuning seeds per arm at which the task's interval would exclude 0 if its estimate "
           "held (as *what would resolve it* above); *none: dev noise ±x* where the dev examples alone spread the "
           "difference by ±x (1.96 sd of the difference when only the task's dev examples are resampled), more than "
           "the estimate, which no number of seeds changes; *degenerate* where an arm predicts one class in every "
           "run of the task.", ""]
    rows = []
    for v in results:
        for t, tv in v.per_task.items():
            name = glue_task_names([t])[0]
            if tv.difference is None:
                rows.append([v.claim.text, name, "–", "–", "**degenerate**", tv.seeds])
                continue
            d = tv.difference
            rows.append([v.claim.text, name, f"{d.estimate:+.2f} [{d.low:+.2f}, {d.high:+.2f}]",
                         f"{d.sign_probability:.2f}", tv.verdict, tv.seeds])
    return out + [table(["claim", "task", "Δ [95% CI]", "P(sign)", "verdict", "seeds to resolve"], rows), ""]

