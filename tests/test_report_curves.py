"""The learning curves of a long multi-task sweep (sweeps/cpu_long.yaml: one pre-training seed per arm, six
fractions, five GLUE tasks, a random-init arm), read on the GLUE-5 mean: each arm's GLUE-5 and its per-seed IQR
per fraction beside random init's band, the paper's ELECTRA-Small fractions dashed, where each arm first clears
random init and where ELECTRA first beats BERT at equal FLOPs (BERT's curve interpolated), and a checkpoint not yet
fine-tuned on every task left without a GLUE-5.

The scores are synthetic and built so that every number is known: each task's score is the arm's level at that
fraction plus a task offset (the offsets average 0, so GLUE-5 = the level) plus a per-seed shift shared by the
tasks (so per-seed GLUE-5 = level + shift)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from electra_ablate.report.collect import SweepData
from electra_ablate.report.curves import learning_section
from electra_ablate.report.stats import crossings, learning_curve, random_init_bands
from electra_ablate.sweep.spec import load_sweep

TASKS = ("cola", "sst2", "mrpc", "stsb", "rte")
OFFSET = {"cola": -20.0, "sst2": 20.0, "mrpc": 10.0, "stsb": -10.0, "rte": 0.0}
SHIFT = (-1.0, -0.5, 0.0, 0.5, 1.0)  # per fine-tuning seed: the per-seed GLUE-5 quartiles are level -/+ 0.5
FRACTIONS = (0.03125, 0.0625, 0.125, 0.25, 0.5, 1.0)
# GLUE-5 by fraction. Random init: 60 (per-seed 58-62, quartiles 59 and 61). BERT clears it at 1/8, its band at 1/4;
# ELECTRA, a hair more FLOPs per fraction (as sized in the sweep), is below BERT until 1/4, above it from there.
LEVEL = {"bert": (58.0, 59.5, 61.0, 62.0, 63.0, 64.0), "electra": (57.0, 58.0, 60.5, 62.5, 63.5, 65.0)}
STEPS = {"bert": 15264, "electra": 9312}
FLOPS = {"bert": 3.232e15, "electra": 3.234e15}  # at the end of each run


def scores(drop: tuple[str, float, str] | None = None) -> tuple[pd.DataFrame, dict]:
    rows, flops = [], {}
    for variant, levels in LEVEL.items():
        for fraction, level in zip(FRACTIONS, levels):
            step = round(STEPS[variant] * fraction)
            flops[(variant, step)] = FLOPS[variant] * fraction
            for task in TASKS:
                if drop == (variant, fraction, task):
                    continue
                for seed, shift in enumerate(SHIFT):
                    rows.append((variant, 0, variant, step, fraction, fraction == 1.0, task, seed,
                                 level + OFFSET[task] + shift))
    for task in TASKS:  # random init of bert's shape: each run its own encoder, on bert's final checkpoint
        for seed, shift in enumerate(SHIFT):
            rows.append(("none", 0, "bert", STEPS["bert"], 1.0, True, task, seed, 60.0 + OFFSET[task] + 2 * shift))
    frame = pd.DataFrame(rows, columns=["variant", "pretrain_seed", "pretrain_run", "step", "fraction", "final", "task",
                                        "seed", "score"])
    return frame.assign(run_id=[f"r{i}" for i in range(len(frame))], degenerate=False), flops


@pytest.fixture(scope="module")
def long_sweep():
    spec = load_sweep("cpu_long")
    assert (tuple(spec.tasks), tuple(spec.checkpoints), tuple(spec.pretrain_seeds)) == (TASKS, FRACTIONS, (0,))

    def data(drop=None) -> SweepData:
        frame, flops = scores(drop)
        return SweepData(SimpleNamespace(spec=spec), [], [], frame, [], pd.DataFrame(), flops=flops)
    return spec, data


def test_the_curve_is_read_on_the_glue_5_mean_beside_random_inits_band(long_sweep):
    spec, data = long_sweep
    curve = learning_curve(data()).set_index(["variant", "fraction"])
    assert list(curve.loc["electra", "glue"]) == pytest.approx(LEVEL["electra"])
    assert (curve.loc[("bert", 0.25), "q25"], curve.loc[("bert", 0.25), "q75"]) == pytest.approx((61.5, 62.5))
    assert "none" not in curve.index.get_level_values("variant")  # random init is the band, not a curve
    assert random_init_bands(data()) == {"none": pytest.approx((60.0, 59.0, 61.0))}

    text = "\n".join(learning_section(data(), {}, load_paper()))
    assert "GLUE-5 = mean of the task medians over CoLA, SST-2, MRPC, STS-B, RTE" in text
    header = next(line for line in text.splitlines() if line.startswith("| variant |"))
    assert header == ("| variant | fraction of steps | step | pre-train FLOPs | CoLA | SST-2 | MRPC | STS-B | RTE | "
                      "GLUE-5 (median) | IQR of per-seed GLUE-5 | Δ vs bert at equal FLOPs (bert there) | paper | "
                      "seeds (pre-training x fine-tuning) | degenerate runs |")
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line for line in text.splitlines()
            if line.startswith("| ")}
    # ELECTRA at 1/16 beside the paper's ELECTRA-Small at 6.25% (Table 1), and behind BERT at the same FLOPs.
    cells = [c.strip() for c in rows[("electra", "0.0625")].strip("|").split("|")]
    assert cells[2:] == ["582", "2.02e+14", "38.0", "78.0", "68.0", "48.0", "58.0", "58.0", "57.5–58.5",
                         "-1.5 (59.5)", "74.1", "1 x 5", "0 of 25"], cells
    assert [c.strip() for c in rows[("bert", "1")].strip("|").split("|")][9:12] == ["64.0", "63.5–64.5", "baseline"]
    # Random init: its median and quartiles, the band.
    cells = [c.strip() for c in rows[("none (random init of bert)", "–")].strip("|").split("|")]
    assert cells[3:11] == ["0", "40.0", "80.0", "70.0", "50.0", "60.0", "60.0", "59.0–61.0"], cells
    assert cells[-2] == "5 runs"


def test_where_each_arm_clears_random_init_and_electra_crosses_bert_at_equal_flops(long_sweep):
    spec, data = long_sweep
    lines = learning_section(data(), {}, load_paper())
    said = "\n".join(lines)
    # The rules are stated, then each arm's reading.
    assert "*Clears random init*: the first point whose median is above none's median (60.0)" in said
    assert "the upper quartile of none's per-seed GLUE-5 (61.0)" in said
    assert "bert's curve interpolated linearly in log FLOPs between its checkpoints (FLOPs within 2%" in said
    assert ("- bert: clears random init first at 4e+14 FLOPs (0.125 of its steps: 61.0); above its band first at "
            "8.1e+14 FLOPs (0.25 of its steps: 62.0).") in lines
    (electra,) = [line for line in lines if line.startswith("- electra: ")]
    assert electra == ("- electra: clears random init first at 4e+14 FLOPs (0.125 of its steps: 60.5); above its band "
                       "first at 8.1e+14 FLOPs (0.25 of its steps: 62.5); above bert at equal FLOPs first at 8.1e+14 "
                       "FLOPs (0.25 of its steps: 62.5 against 62.0), at 3 of its 6 points in bert's range (0.25, 0.5, "
                       "1); above bert's final median (64.0) first at 3.2e+15 FLOPs (1 of its steps: 65.0).")


def test_equal_flops_never_extrapolates_past_the_baselines_curve():
    curve = pd.DataFrame([("bert", f, 1e14 * f, g) for f, g in ((0.5, 60.0), (1.0, 64.0))] +
                         [("electra", f, 1e14 * f, g) for f, g in ((0.25, 61.0), (0.5, 61.0), (0.75, 62.0), (1.0, 63.5),
                                                                    (1.015, 63.9), (2.0, 70.0))],
                         columns=["variant", "fraction", "flops", "glue"])
    (electra,) = [r for r in crossings(curve, None, "bert") if r["variant"] == "electra"]
    # Below bert's first checkpoint and past its last (beyond 2%) nothing is compared; 0.75 is read off the line
    # between 0.5 and 1 in log FLOPs (60 + 4 * log(1.5) / log(2) = 62.34), 1.015 against bert's last.
    assert [e["fraction"] for e in electra["equal_flops"]] == [0.5, 0.75, 1.0, 1.015]
    assert electra["equal_flops"][1]["baseline"] == pytest.approx(62.34, abs=0.01)
    assert electra["first_above_baseline"]["fraction"] == 0.5  # 61 against 60
    assert electra["equal_flops"][3]["difference"] == pytest.approx(63.9 - 64.0)


def test_a_checkpoint_not_fine_tuned_on_every_task_has_no_glue_5(long_sweep):
    spec, data = long_sweep
    partial = data(drop=("electra", 0.5, "rte"))
    curve = learning_curve(partial).set_index(["variant", "fraction"])
    assert pd.isna(curve.loc[("electra", 0.5), "glue"]) and curve.loc[("electra", 0.5), "tasks"] == 4
    lines = "\n".join(learning_section(partial, {}, load_paper())).splitlines()
    (row,) = [line for line in lines if line.startswith("| electra | 0.5 |")]
    assert "| – (4 of 5 tasks) | – | – |" in row, row
    (electra,) = [line for line in lines if line.startswith("- electra: ")]
    assert "at 2 of its 5 points in bert's range (0.25, 1)" in electra, electra


def test_the_figure_draws_the_band_and_the_papers_fractions_dashed(long_sweep):
    from electra_ablate.report.figures import _pyplot, learning_curves_drawing

    spec, data = long_sweep
    fig = learning_curves_drawing(data())
    try:
        flops_axis, fraction_axis = fig.axes[:2]
        assert flops_axis.get_ylabel() == "GLUE-5 dev (median)"
        dashed = [line for line in fraction_axis.get_lines() if line.get_linestyle() == "--"]
        assert [list(line.get_ydata()) for line in dashed] == [[74.1, 76.0, 77.7, 79.0, 79.9]]
        assert dashed[0].get_label() == "ELECTRA-Small (paper, GLUE)"
        for axis in (flops_axis, fraction_axis):
            bands = [(p.get_y(), p.get_y() + p.get_height()) for p in axis.patches if hasattr(p, "get_height")]
            assert (59.0, 61.0) in bands
            assert any(line.get_label() == "none (random init): median, IQR" and list(line.get_ydata()) == [60.0, 60.0]
                       for line in axis.get_lines())
    finally:
        _pyplot().close(fig)


def test_a_curve_of_first_checkpoints_alone_keeps_a_readable_flops_axis(long_sweep):
    """Beside a long pre-training only each run's first checkpoint may be fine-tuned, at nearly equal FLOPs: the FLOPs
    axis still spans a decade, so that its tick labels stay apart."""
    from electra_ablate.report.figures import _pyplot, learning_curves_drawing

    spec, data = long_sweep
    full = data()
    first = full.scores[full.scores["fraction"] == FRACTIONS[0]]
    fig = learning_curves_drawing(SweepData(full.ctx, [], [], first.reset_index(drop=True), [], pd.DataFrame(),
                                            flops=full.flops))
    try:
        low, high = fig.axes[0].get_xlim()
        points = [FLOPS[v] * FRACTIONS[0] for v in FLOPS]
        assert high / low == pytest.approx(10.0) and low < min(points) <= max(points) < high
        fig.canvas.draw()  # labelled at powers of ten alone: one in view at least, no minor tick labelled
        labels = [t.get_text() for t in fig.axes[0].get_xticklabels() if t.get_text()]
        assert labels and all("times" not in t for t in labels), labels
        assert not [t.get_text() for t in fig.axes[0].get_xticklabels(minor=True) if t.get_text()]
    finally:
        _pyplot().close(fig)
    fig = learning_curves_drawing(full)  # the whole run spans 32x: left as matplotlib draws it
    try:
        low, high = fig.axes[0].get_xlim()
        assert high / low > 32
    finally:
        _pyplot().close(fig)


def load_paper():
    from electra_ablate.report.paper import load_paper_results

    return load_paper_results()
