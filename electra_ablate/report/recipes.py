"""A sweep fine-tuned under several recipes (sweeps/<name>.yaml `recipes`): each recipe's GLUE table and verdicts side
by side, and per claim whether the verdict is the same under every recipe and which task moves it most.

Fine-tuning budgets move BERT-style comparisons (few epochs on small sets leave an encoder under-fitted: Mosbach et
al., 2021), so a verdict read through a recipe cut to fit a CPU may be the recipe's. The report's other sections read
the first recipe; this one reads each recipe's runs (report/collect.py `collect(..., recipe=)`) through the same
verdicts (report/verdicts.py), bootstrap samples and seed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from electra_ablate.glue import tasks as glue
from electra_ablate.report import carries, holds_record, verdicts
from electra_ablate.report.collect import SweepData, collect
from electra_ablate.report.recipe import recipe_lines
from electra_ablate.report.stats import Summary, glue_of, summarize
from electra_ablate.report.tables import table


@dataclass
class UnderRecipe:
    """One recipe's runs and what the report reads from them."""

    recipe: str
    data: SweepData
    summary: Summary
    results: list[verdicts.Verdict]
    # The verdicts the recipes are compared by: on the tasks every recipe has finished runs of (`common`), so that a
    # recipe still running is not compared on another mean; `results` itself where every recipe has the same tasks.
    judged: list[verdicts.Verdict] = field(default_factory=list)
    common: list[str] = field(default_factory=list)


def under(data: SweepData, summary: Summary, results: list) -> UnderRecipe:
    return UnderRecipe(data.recipe or "", data, summary, results)


def gather(ctx, client, first: UnderRecipe, paper, waiting) -> list[UnderRecipe]:
    """`first` (the report's main recipe), then every other recipe of the sweep, collected and judged alike; [] for a
    sweep of one recipe."""
    if len(ctx.spec.recipes) < 2:
        return []
    out = [first]
    for recipe in ctx.spec.recipes[1:]:
        data = collect(ctx, client, recipe)
        results = verdicts.verdicts(ctx.spec, data.final, client, paper, predictions=data.predictions,
                                    waiting=waiting)
        out.append(UnderRecipe(recipe, data, summarize(data), results))
    every = sorted({a for r in out for a in r.summary.medians.index})
    common = tasks_of(every, out)
    for r in out:
        r.common, r.judged = common, _judged(ctx, client, r, out, paper, waiting)
    return out


def tasks_of(arms, runs: Sequence[UnderRecipe]) -> list[str]:
    """The tasks on which every one of `arms` has a finished run under every recipe, GLUE order."""
    def has(r: UnderRecipe, arm: str, task: str) -> bool:
        m = r.summary.medians
        return arm in m.index and task in m.columns and pd.notna(m.loc[arm, task])
    return [t for t in glue.TASKS if all(has(r, a, t) for r in runs for a in arms)]


def _judged(ctx, client, r: UnderRecipe, runs: Sequence[UnderRecipe], paper, waiting) -> list[verdicts.Verdict]:
    """Each claim of `r` judged on the tasks its arms have finished under every recipe (the recipes then compare one
    mean); the report's own verdict where those are all of its tasks."""
    final, by_tasks, out = r.data.final, {}, []
    for v in r.results:
        tasks = tuple(tasks_of(dict.fromkeys(v.claim.better + v.claim.worse), runs))
        if not tasks or list(tasks) == list(v.tasks):
            out.append(v)
            continue
        if tasks not in by_tasks:
            by_tasks[tasks] = verdicts.verdicts(ctx.spec, final[final["task"].isin(tasks)], client, paper,
                                                predictions=r.data.predictions, waiting=waiting)
        out.append(next(w for w in by_tasks[tasks] if w.claim.text == v.claim.text))
    return out


def medians_on(summary: Summary, tasks: Sequence[str]) -> dict[str, dict[str, float]]:
    """variant -> task -> median on `tasks`, with their mean as "glue" (report/stats.py glue_of)."""
    out = {}
    for v, row in summary.as_record().items():
        kept = {t: row[t] for t in tasks if t in row}
        out[v] = {**kept, **({"glue": glue_of(kept)} if len(kept) == len(tasks) and kept else {})}
    return out


def _name(task: str) -> str:
    return glue.get_task(task).dir_name


def _cell(v: verdicts.Verdict | None) -> str:
    if v is None:
        return "not judged"
    if v.difference is None:
        return v.verdict
    return f"{v.verdict.replace(' at this scale', '')}, {carries.interval(v.difference)}"


def _moved_most(per_recipe: Sequence[verdicts.Verdict | None]) -> str:
    """The task whose difference moves most from the first recipe to any other, with both estimates."""
    first = per_recipe[0]
    if first is None or not first.per_task:
        return "–"
    best, shift = "", 0.0
    for other in per_recipe[1:]:
        for t, tv in (other.per_task if other is not None else {}).items():
            base = first.per_task.get(t)
            if tv.difference is None or base is None or base.difference is None:
                continue
            delta = tv.difference.estimate - base.difference.estimate
            if abs(delta) > abs(shift):
                shift = delta
                best = (f"{_name(t)}: {base.difference.estimate:+.1f} → {tv.difference.estimate:+.1f} "
                        f"(alone: {tv.verdict.replace(' at this scale', '')})")
    return best or "–"


def agreement(runs: Sequence[UnderRecipe]) -> list[tuple[str, list[verdicts.Verdict | None], bool]]:
    """Per claim of the first recipe: its verdict under each recipe, and whether they are all the same."""
    out = []
    for v in runs[0].judged:
        each = [next((w for w in r.judged if w.claim.text == v.claim.text), None) for r in runs]
        same = all(w is not None and w.verdict == v.verdict for w in each)
        out.append((v.claim.text, each, same))
    return out


def _on(each: Sequence[verdicts.Verdict | None]) -> str:
    tasks = next((w.tasks for w in each if w is not None), ())
    return verdicts.glue_label(tasks) if tasks else "–"


def agreement_lines(runs: Sequence[UnderRecipe]) -> list[str]:
    """One line per claim, for the console and the report's words: agrees or differs across recipes."""
    lines = []
    for text, each, same in agreement(runs):
        where = "; ".join(f"{r.recipe}: {_cell(w)}" for r, w in zip(runs, each))
        word = "the same under every recipe" if same else "differs across recipes"
        moved = _moved_most(each)
        lines.append(f"{text}, on {_on(each)}: {word} ({where})" + (f"; moved most by {moved}" if moved != "–" else ""))
    return lines


def as_record(runs: Sequence[UnderRecipe], spec, scale) -> dict:
    """verdicts.json's `recipes` (each recipe's record, as report/holds_record.py writes the first's) and
    `agreement` (per claim: the same verdict under every recipe, and the task that moves most)."""
    if len(runs) < 2:
        return {}
    return {"recipes": {r.recipe: {**holds_record.record(spec, r.judged, scale, r.data.problems, r.common, r.data.skipped,
                                                         medians_on(r.summary, r.common)),
                                   "finished_tasks": list(r.summary.tasks)} for r in runs},
            "agreement": [{"claim": text, "same": same, "verdicts": {r.recipe: (w.verdict if w else None)
                                                                     for r, w in zip(runs, each)},
                           "moved_most": _moved_most(each)} for text, each, same in agreement(runs)]}


def section(runs: Sequence[UnderRecipe]) -> list[str]:
    """## Under each fine-tuning recipe: the medians and GLUE score of each (variant, recipe), then each claim's
    verdict per recipe with the agreement and the task that moves most; each recipe's settings per task."""
    if len(runs) < 2:
        return []
    names = ", ".join(f"`{r.recipe}`" for r in runs)
    tasks = [t for t in glue.TASKS if any(t in r.summary.tasks for r in runs)]
    out = ["## Under each fine-tuning recipe", "",
           f"Every checkpoint of this sweep is fine-tuned under {len(runs)} recipes ({names}); the sections above read "
           f"`{runs[0].recipe}`. Here each recipe's final-checkpoint medians and GLUE score, then each claim's "
           "verdict under each, judged alike (the same bootstrap, samples and seed). A verdict that differs across "
           "recipes is the fine-tuning protocol's as much as the pre-training's.", ""]
    partial = any(set(r.summary.tasks) != set(runs[0].common) for r in runs)
    rows = []
    for v in dict.fromkeys(label for r in runs for label in r.summary.medians.index):
        for r in runs:
            if v not in r.summary.medians.index:
                continue
            med = r.summary.medians.loc[v]
            cells = [f"{med[t]:.1f}" if t in med and pd.notna(med[t]) else "–" for t in tasks]
            glue_score = r.summary.glue.get(v)
            n = int(med.notna().sum())  # this arm's tasks under this recipe
            short = f" (of {n} task{'s' if n != 1 else ''})" if n < len(tasks) else ""
            cells.append("–" if glue_score is None else f"{glue_score:.1f}{short}")
            if partial:
                on_common = medians_on(r.summary, r.common).get(v, {}).get("glue")
                cells.append("–" if on_common is None else f"{on_common:.1f}")
            rows.append([v, f"`{r.recipe}`", *cells])
    header = ["variant", "recipe", *(_name(t) for t in tasks), verdicts.glue_label(tasks).partition(":")[0]]
    if partial:
        header.append(f"{verdicts.glue_label(runs[0].common).partition(':')[0]} (the tasks all have)")
    out += [table(header, rows), ""]
    if partial:
        out += ["Not every recipe has finished runs of every task: each claim below is judged, under every recipe, on "
                "the tasks where its arms have finished runs under all of them (its *on* column), so that the recipes "
                "are compared on one mean; the sections above read the first recipe on all of its tasks.", ""]
    claim_rows = []
    for text, each, same in agreement(runs):
        claim_rows.append([text, _on(each), *(_cell(w) for w in each), "same" if same else "**differs**",
                           _moved_most(each)])
    out += [table(["claim", "on", *(f"`{r.recipe}`" for r in runs), "across recipes",
                   "task that moves most (Δ first → other)"], claim_rows), ""]
    out += ["In words:", "", *(f"- {line}" for line in agreement_lines(runs)), ""]
    for r in runs[1:]:
        if r.data.problems:
            out += [f"`{r.recipe}` is not complete: {len(r.data.problems)} line(s) of missing or failed fine-tuning "
                    f"(its scores and verdicts cover the runs that finished), the first: {r.data.problems[0]}.", ""]
    for r in runs[1:]:
        settings = recipe_lines(r.data.final, r.data.frame)
        if settings:
            out += [f"### The `{r.recipe}` recipe's settings", "", *settings[1:]]
    return out
