"""The report's PNG figures (matplotlib, Agg backend): GLUE per fine-tuning seed, GLUE against generator size
(paper Figure 3, left) and learning curves against pre-training FLOPs and fraction of steps.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from electra_ablate.report.collect import SweepData
from electra_ablate.report.curves import short_glue
from electra_ablate.report.tables import TASK_NAMES
from electra_ablate.report.paper import load_paper_results, paper_glue, paper_row
from electra_ablate.report.stats import (Summary, curve_runs, curve_tasks, generator_size_points, learning_curve,
                                         random_init_bands, random_init_floors, random_init_task_medians)


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
    final = data.final
    for i, v in enumerate(labels):
        seeds = summary.seed_glue[summary.seed_glue["variant"] == v]["glue"].to_numpy()
        mine = final[final["variant"] == v] if len(final) else final
        if len(mine) and mine["degenerate"].eq(True).all():  # every run predicts one class: say so on the plot
            ax.annotate("degenerate:\none class", (i, float(np.min(seeds)) if len(seeds) else 0.0),
                        textcoords="offset points", xytext=(0, 8), ha="center", fontsize=7, color="C3")
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
    for label, floor in random_init_floors(data).items():  # the floor every generator has to clear
        ax.axhline(floor, ls=":", color="0.4", label=f"{label} (no pre-training)")
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
    """GLUE-k (stats.curve_tasks) against pre-training FLOPs (left) and fraction of steps (right), one line per arm
    with its per-seed IQR shaded, random initialisation's median and IQR as a grey band on both, the paper's
    numbers by fraction (`by_fraction` of the sweep's paper row) dashed on the right; False when no curve."""
    fig = learning_curves_drawing(data)
    if fig is None:
        return False
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return True


def learning_curves_drawing(data: SweepData):
    """The learning-curve figure (a matplotlib Figure, not saved), or None without a curve."""
    curve = learning_curve(data)
    if curve.empty:
        return None
    plt = _pyplot()
    paper = load_paper_results()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.8))
    with_paper = False
    for i, (variant, g) in enumerate(curve.groupby("variant", sort=False)):
        color = f"C{i}"
        hollow = g["network"] == "generator"  # two-stage's generator, before the switch
        for axis, x in ((ax, g["flops"]), (bx, g["fraction"])):
            axis.plot(x, g["glue"], marker="o", color=color, label=variant)
            if hollow.any():
                axis.plot(x[hollow], g["glue"][hollow], ls="none", marker="o", color=color, markerfacecolor="white",
                          label=f"{variant}: its generator (MLM), before the switch")
            axis.fill_between(x, g["q25"], g["q75"], color=color, alpha=0.2)
        row = paper_row(data.ctx.spec, variant, paper)[0] or {}
        by_fraction = row.get("by_fraction") or {}
        if by_fraction:
            with_paper = True
            bx.plot([float(f) for f in by_fraction], list(by_fraction.values()), ls="--", marker="x", color=color,
                    label=f"{row.get('label', variant)} (paper, GLUE)")
    for label, (floor, low, high) in random_init_bands(data).items():  # the floor every curve has to clear
        for axis in (ax, bx):  # its median and the quartiles of its runs, as the paper's Figure 4 shades it
            axis.axhline(floor, ls=":", color="0.4", label=f"{label} (random init): median, IQR")
            axis.axhspan(low, high, color="0.5", alpha=0.15, lw=0)
    tasks = curve_tasks(data)
    score = TASK_NAMES[tasks[0]] if len(tasks) == 1 else short_glue(tasks)
    _flops_axis(ax, curve["flops"])
    ax.set_xlabel("pre-training FLOPs (paper accounting)")
    ax.set_ylabel(f"{score} dev (median)")
    ax.set_title(f"{score} vs pre-training compute")
    bx.set_xscale("log", base=2)
    bx.set_xlabel("fraction of pre-training steps")
    bx.set_title("vs fraction of training" + (" (paper: dashed)" if with_paper else ""))
    for a in (ax, bx):
        a.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _flops_axis(axis, values) -> None:
    """A log FLOPs axis labelled at powers of ten alone: spanning less than two decades, matplotlib labels its minor
    ticks too (2x, 3x, 4x, 6x) and on a half-width panel they run into one another. Points within a factor of 10 of
    one another (a run's first checkpoints alone, at nearly equal FLOPs) get a decade around their geometric middle,
    so that a power of ten, and its label, is always in view."""
    import matplotlib.ticker as ticker

    axis.set_xscale("log")
    axis.xaxis.set_minor_formatter(ticker.NullFormatter())
    values = [float(v) for v in values if v and v > 0]
    if values and max(values) / min(values) < 10.0:
        middle = float(np.sqrt(min(values) * max(values)))
        axis.set_xlim(middle / np.sqrt(10.0), middle * np.sqrt(10.0))


def pretraining_curves_figure(data: SweepData, path: Path) -> bool:
    """Each pre-training run's masked-LM accuracy at [MASK] (left) and discriminator ROC AUC (right) against
    its pre-training FLOPs, one line per run (dashed while unfinished), one colour per arm: whether and when
    each objective's signal formed, at equal compute. False (nothing drawn) when no run logged either."""
    curves = data.curves.dropna(subset=["flops"])
    if curves.empty:
        return False
    curves = curves.drop_duplicates(["run_id", "metric", "step"], keep="last")  # a resumed window, logged twice
    # At [MASK] only where every run logged it (runs from before the split have the whole accuracy alone).
    runs_with = {m: set(curves.loc[curves["metric"] == m, "run_id"]) for m in ("mlm_accuracy_at_mask", "mlm_accuracy")}
    mlm = "mlm_accuracy_at_mask" if runs_with["mlm_accuracy"] <= runs_with["mlm_accuracy_at_mask"] else "mlm_accuracy"
    panels = [(mlm, "masked-LM accuracy at [MASK] (%)" if mlm == "mlm_accuracy_at_mask" else "masked-LM accuracy (%)",
               100.0), ("disc_auc", "discriminator ROC AUC", 1.0)]
    panels = [p for p in panels if (curves["metric"] == p[0]).any()]
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    colours = {label: f"C{i}" for i, label in enumerate(v.label for v in data.ctx.spec.variants)}
    for ax, (metric, ylabel, factor) in zip(axes[0], panels):
        shown = set()
        for (variant, finished, _), g in curves[curves["metric"] == metric].groupby(["variant", "finished", "run_id"],
                                                                                   sort=False):
            g = g.sort_values("step")
            label = variant if finished else f"{variant} (unfinished)"
            ax.plot(g["flops"], g["value"] * factor, color=colours.get(variant, "0.3"), lw=1, alpha=0.8,
                    ls="-" if finished else "--", label=None if label in shown else label)
            shown.add(label)
        if metric == "disc_auc":
            ax.axhline(0.5, ls=":", color="0.4", label="chance")
        _flops_axis(ax, curves.loc[curves["metric"] == metric, "flops"])
        ax.set_xlabel("pre-training FLOPs (paper accounting)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
    axes[0][0].set_title(f"{data.ctx.spec.name}: pre-training, one line per run", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def task_curves_figure(data: SweepData, path: Path) -> bool:
    """One panel per task of `curve_tasks`: each pre-trained arm's median score at each checkpoint against its
    pre-training FLOPs, random initialisation's median as a dotted line, so that a reader sees which task moves a
    GLUE curve; False with fewer than two tasks or no curve."""
    tasks = curve_tasks(data)
    runs = curve_runs(data)
    if len(tasks) < 2 or not len(runs):
        return False
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(tasks), figsize=(2.6 * len(tasks), 3.0), squeeze=False)
    order = [v.label for v in data.ctx.spec.variants if v.label in set(runs["variant"])]
    floors = random_init_task_medians(data)
    for ax, task in zip(axes[0], tasks):
        for i, variant in enumerate(order):
            g = runs[(runs["variant"] == variant) & (runs["task"] == task)]
            points = sorted((float(np.mean([data.flops[k] for k in {(r, s) for r, s in zip(h["pretrain_run"], h["step"])}
                                            if k in data.flops] or [np.nan])), float(h["score"].median()))
                            for _, h in g.groupby("fraction"))
            points = [(x, y) for x, y in points if np.isfinite(x)]
            if points:
                ax.plot(*zip(*points), marker="o", ms=3, color=f"C{i}", label=variant)
        for label, medians in floors.items():
            if task in medians:
                ax.axhline(medians[task], ls=":", color="0.4", label=f"{label} (random init)")
        ax.set_xscale("log")
        ax.set_title(TASK_NAMES[task], fontsize=10)
        ax.set_xlabel("pre-training FLOPs", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("dev score x 100 (median)", fontsize=8)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
