"""Expected validation performance (Dodge et al. 2019, "Show Your Work: Improved Reporting of Experimental
Results", section 3): the expected best dev score among n runs drawn from the runs made, n = 1..N.

With the N observed scores sorted, v_(1) <= ... <= v_(N), and n runs drawn with replacement, the best of them
is v_(i) with probability (i/N)^n - ((i-1)/N)^n (the paper's equation 1 with the empirical CDF), which gives
the expectation and the spread (standard deviation) of the max. n = 1 is the mean; n = N is what a best-of-N
number overstates in expectation; the paper's medians of 10 sit between. The report draws one curve per
variant and task and one for the GLUE-style mean over tasks (per-seed scores).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd


def expected_max(scores: Sequence[float], n_max: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(E[max of n], sd of max of n) for n = 1..n_max (default: the number of scores)."""
    v = np.sort(np.asarray(scores, dtype=float))
    if not len(v):
        raise ValueError("expected_max: no scores")
    N = len(v)
    n = np.arange(1, (n_max or N) + 1)[:, None]  # (n, 1)
    cdf = np.arange(1, N + 1) / N  # (N,)
    p = cdf**n - (cdf - 1 / N) ** n  # (n, N): P(max of n draws = v_(i))
    mean = p @ v
    var = np.clip(p @ v**2 - mean**2, 0, None)
    return mean, np.sqrt(var)


def curves(final: pd.DataFrame, seed_glue: pd.DataFrame, tasks: Sequence[str]) -> dict[str, dict[str, tuple]]:
    """{panel (task, or 'glue'): {variant: (E[max], sd)}} from report score rows and per-seed GLUE scores."""
    out: dict[str, dict[str, tuple]] = {}
    for t in tasks:
        rows = final[final["task"] == t]
        out[t] = {v: expected_max(g["score"].to_numpy()) for v, g in rows.groupby("variant", sort=False)}
    if len(seed_glue):
        out["glue"] = {v: expected_max(g["glue"].to_numpy()) for v, g in seed_glue.groupby("variant", sort=False)}
    return out


def figure(panels: Mapping[str, Mapping[str, tuple]], titles: Mapping[str, str], order: Sequence[str],
           path: Path) -> bool:
    """One subplot per panel: E[max dev score of n runs] against n, band = +-1 sd, one line per variant."""
    panels = {k: v for k, v in panels.items() if v}
    if not panels:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    colors = {v: f"C{i}" for i, v in enumerate(order)}
    for ax, (key, by_variant) in zip(axes.flat, panels.items()):
        for v in order:
            if v not in by_variant:
                continue
            mean, sd = by_variant[v]
            n = np.arange(1, len(mean) + 1)
            ax.plot(n, mean, marker="o", ms=3, color=colors[v], label=v)
            ax.fill_between(n, mean - sd, mean + sd, color=colors[v], alpha=0.15)
        ax.set_title(titles.get(key, key), fontsize=9)
        ax.set_xlabel("fine-tuning runs n")
        ax.set_ylabel("expected max dev score")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
