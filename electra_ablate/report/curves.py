"""The report's learning curves (the paper's Figure 4 and Table 1's ELECTRA-Small fractions): each arm's GLUE at
every checkpoint it fine-tuned against pre-training FLOPs, beside random initialisation's band and the paper's
numbers by fraction, and a reading of where each curve clears random init and crosses the baseline at equal FLOPs
(stats.crossings), by the rules the section states."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from electra_ablate.report import predictions as pr
from electra_ablate.report import verdicts
from electra_ablate.report.collect import SweepData, is_missing
from electra_ablate.report.paper import paper_row
from electra_ablate.report.stats import (EQUAL_FLOPS, at_flops, crossings, curve_runs, curve_tasks, learning_curve,
                                         random_init_bands)
from electra_ablate.report.tables import TASK_NAMES, fmt, signed, table


def short_glue(tasks: Sequence[str]) -> str:
    """'GLUE' for the paper's eight tasks, else 'GLUE-<n>' (the text names the tasks): a score over a subset is
    never labelled plain GLUE."""
    return verdicts.glue_label(tasks).split(":")[0]



def learning_section(data: SweepData, figures: Mapping[str, str], paper: Mapping) -> list[str]:
    spec = data.ctx.spec
    tasks = curve_tasks(data)
    score = short_glue(tasks) if tasks else "GLUE"
    named = f" {score} = mean of the task medians over {', '.join(TASK_NAMES[t] for t in tasks)}" if len(tasks) > 1 else ""
    out = ["## Learning curves: GLUE against pre-training FLOPs", "",
           "Fine-tuning runs of every checkpoint the sweep fine-tunes, intermediate ones included: each cell is the "
           "median over its fine-tuning runs, of the pre-training runs that have reached that fraction (a run still "
           "pre-training counts at the checkpoints it has saved; the seeds column says how many each cell holds); "
           "FLOPs as the paper counts them (electra_ablate.models.flops: forward + backward of generator and "
           f"discriminator).{named}" + ("; a checkpoint not yet fine-tuned on every one of them has no "
                                        f"{score} (its tasks' medians are shown)." if named else "")
           + f" The IQR is that of the per-seed {score} (runs with every task); random initialisation's median and "
           "IQR are the band the curves have to clear (drawn grey).", ""]
    if "learning_curves" in figures:
        out += [f"![learning curves]({figures['learning_curves']})", ""]
    if "task_curves" in figures:
        out += ["Each task's median against pre-training FLOPs (dotted: random initialisation's median on the task), "
                "to show which task moves the mean:", "", f"![learning curves per task]({figures['task_curves']})", ""]
    curve = learning_curve(data)
    if curve.empty:
        return out + ["No fine-tuning run of an intermediate checkpoint has finished yet.", ""]
    runs = curve_runs(data)
    shows_network = (curve["network"] == "generator").any()  # two-stage: its generator up to the switch
    if shows_network:
        out += ["Two-stage training's checkpoints up to its switch are its generator, an MLM model (the "
                "discriminator is still untrained there; paper section 3.2): the table says which network was "
                "fine-tuned, and the figure draws those points hollow.", ""]
    base_curve = curve[curve["variant"] == spec.baseline] if spec.baseline else curve.iloc[:0]
    compares = len(base_curve) and (curve["variant"] != spec.baseline).any()
    per_task = len(tasks) > 1
    rows = []
    for _, r in curve.iterrows():
        row_paper, _ = paper_row(spec, r["variant"], paper)
        by_fraction = (row_paper or {}).get("by_fraction") or {}
        theirs = next((v for f, v in by_fraction.items() if math.isclose(float(f), r["fraction"])), None)
        at = runs[(runs["variant"] == r["variant"]) & (runs["fraction"] == r["fraction"])]
        medians = at.groupby("task")["score"].median()
        median = fmt(r["glue"]) if not is_missing(r["glue"]) else f"– ({int(r['tasks'])} of {len(tasks)} tasks)"
        cells = [r["variant"], *([r["network"]] if shows_network else []), f"{r['fraction']:g}", int(r["step"]),
                 f"{r['flops']:.3g}" if not is_missing(r["flops"]) else "–",
                 *([fmt(medians.get(t)) for t in tasks] if per_task else []), median, _iqr(r["q25"], r["q75"])]
        if compares:
            base = None if r["variant"] == spec.baseline or is_missing(r["glue"]) else at_flops(base_curve, r["flops"])
            cells.append("baseline" if r["variant"] == spec.baseline else
                         "–" if base is None else f"{signed(r['glue'] - base)} ({fmt(base)})")
        rows.append([*cells, fmt(theirs), f"{int(r['pretrain_seeds'])} x {int(r['n'])}",
                     pr.cell(pr.counts(at, r["variant"], tasks))])
    bands = random_init_bands(data)
    final = data.scores[data.scores["final"].astype(bool)]
    for label, (floor, low, high) in bands.items():
        at = final[final["variant"] == label]
        medians = at.groupby("task")["score"].median()
        of = next(v.random_init_of for v in spec.variants if v.label == label)
        rows.append([f"{label} (random init of {of})", *(["–"] if shows_network else []), "–", "–", "0",
                     *([fmt(medians.get(t)) for t in tasks] if per_task else []), fmt(floor), _iqr(low, high),
                     *(["–"] if compares else []), "–", f"{at['seed'].nunique()} runs", pr.cell(pr.counts(at, label, tasks))])
    header = ["variant", *(["network fine-tuned"] if shows_network else []), "fraction of steps", "step", "pre-train FLOPs",
              *(TASK_NAMES[t] for t in tasks if per_task), f"{score} (median)", f"IQR of per-seed {score}",
              *([f"Δ vs {spec.baseline} at equal FLOPs ({spec.baseline} there)"] if compares else []), "paper",
              "seeds (pre-training x fine-tuning)", "degenerate runs"]
    out += [table(header, rows), ""]
    return out + _crossing_lines(spec, curve, bands, score)


def _iqr(low, high) -> str:
    return "–" if is_missing(low) or is_missing(high) else f"{fmt(low)}–{fmt(high)}"


def _crossing_lines(spec, curve, bands: Mapping[str, tuple[float, float, float]], score: str = "GLUE") -> list[str]:
    """Where each curve first clears random initialisation (the paper's Figure 4 asks where pre-training starts to
    pay) and where each crosses the baseline at equal pre-training FLOPs: a reading of the medians above, by the
    rules it states, not a verdict. `bands`: stats.random_init_bands."""
    floor_label, (floor, _, top) = next(iter(bands.items())) if bands else (None, (None, None, None))
    rows = crossings(curve, floor, spec.baseline, top)
    compared = [r for r in rows if r["equal_flops"]]
    if not rows or (floor is None and not compared):
        return []
    baseline = spec.baseline
    one_seed = " and with one pre-training seed per arm a curve is one encoder's" if len(spec.pretrain_seeds) == 1 else ""
    out = [f"Reading the curves ({score} medians above; one reading of the runs, not a verdict: the verdicts are the "
           f"claims' intervals{one_seed}). Points in order of pre-training FLOPs; a point without a median (a task not "
           "fine-tuned yet) is skipped.", ""]
    if floor is not None:
        out.append(f"- *Clears random init*: the first point whose median is above {floor_label}'s median "
                   f"({fmt(floor)}); *above its band*: above the band's top, the upper quartile of {floor_label}'s "
                   f"per-seed {score} ({fmt(top)}).")
    if compared:
        out.append(f"- *Above {baseline} at equal FLOPs*: the point's median against {baseline}'s at the same "
                   f"pre-training FLOPs, {baseline}'s curve interpolated linearly in log FLOPs between its "
                   f"checkpoints (FLOPs within {EQUAL_FLOPS:.0%} of its first or last checkpoint's count as equal to "
                   "it; beyond them nothing is compared): the Δ column above. A claim of pre-training efficiency is "
                   "one at equal compute, so equal fractions of the two runs count only where their FLOPs are equal.")
    out.append("")
    for r in rows:
        parts = []
        if floor is not None:
            parts += [f"clears random init {_first(r['first_above_floor'], r)}",
                      f"above its band {_first(r['first_above_band'], r)}"]
        if r["equal_flops"]:
            above = [e for e in r["equal_flops"] if e["difference"] > 0]
            first = r["first_above_baseline"]
            said = (f"first at {first['flops']:.2g} FLOPs ({first['fraction']:g} of its steps: {fmt(first['glue'])} "
                    f"against {fmt(first['baseline'])})" if first else "never")
            where = ", ".join(f"{e['fraction']:g}" for e in above)
            parts.append(f"above {baseline} at equal FLOPs {said}, at {len(above)} of its {len(r['equal_flops'])} "
                         f"points in {baseline}'s range" + (f" ({where})" if above else ""))
        if r["variant"] != baseline and r["baseline_final"] is not None:
            parts.append(f"above {baseline}'s final median ({fmt(r['baseline_final'])}) "
                         f"{_first(r['first_above_baseline_final'], r)}")
        if parts:
            out.append(f"- {r['variant']}: " + "; ".join(parts) + ".")
    return out + [""]


def _first(point: Mapping | None, r: Mapping) -> str:
    if point is None:
        return f"never, up to {r['last_flops']:.2g} FLOPs (its best median {fmt(r['best'])})"
    return f"first at {point['flops']:.2g} FLOPs ({point['fraction']:g} of its steps: {fmt(point['glue'])})"
