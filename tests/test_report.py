"""The report on MLflow runs written the way pre-training and fine-tuning write them: its medians equal the
medians recomputed from the store, the newest finished run wins, failed and missing jobs are listed, the
figures and the provenance are there, and the paper's numbers come from the one data file."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from electra_ablate.report.build import write_report
from electra_ablate.report.collect import collect
from electra_ablate.report.paper import load_paper_results, paper_glue, paper_row
from electra_ablate.report.provenance import UNRECORDED, vocabularies, vocabulary_warning
from electra_ablate.report.stats import bootstrap_difference, glue_of, learning_curve, random_init_floors, summarize
from electra_ablate.sweep import compose
from electra_ablate.sweep.jobs import PretrainJob
from electra_ablate.sweep.spec import load_sweep
from electra_ablate.tracking import runs as tracking
from tests.hermetic import finetune_hash_of

SWEEP_FILE = """
name: mini
description: "A miniature Table 5"
paper: table5_efficiency
baseline: electra
figures: [learning_curves, generator_size]
tasks: [rte, mrpc]
seeds: [0, 1, 2]
checkpoints: [0.5, 1.0]
pretrain: {model: tiny, trainer.max_steps: 100}
variants:
  electra: {objective: electra}
  bert: {objective: bert}
  replace_mlm: {objective: replace_mlm}
"""

# Final-checkpoint scores: variant -> task -> seed -> score (bert's rte seed 2 failed).
FINAL = {
    "electra": {"rte": [60.0, 64.0, 62.0], "mrpc": [80.0, 70.0, 75.0]},
    "bert": {"rte": [55.0, 57.0], "mrpc": [71.0, 73.0, 72.0]},
}
HALF = {"electra": {"rte": [58.0, 59.0, 57.0], "mrpc": [70.0, 71.0, 72.0]},
        "bert": {"rte": [50.0, 52.0, 51.0], "mrpc": [69.0, 69.5, 70.0]}}


def make_context(tmp_path: Path, data_dir: Path, sweep_file: str = SWEEP_FILE) -> compose.SweepContext:
    path = tmp_path / "mini.yaml"
    path.write_text(sweep_file)
    paths = {"root_dir": str(tmp_path), "data_dir": str(data_dir), "output_root": str(tmp_path / "outputs"),
             "cache_dir": str(tmp_path / "outputs" / "cache")}
    return compose.make_context(path, None, paths, f"sqlite:///{tmp_path}/mlflow.db")


def start(client, tags, params=None) -> tracking.RunLogger:
    time.sleep(0.003)  # distinct start times: "newest" must be well defined
    return tracking.RunLogger.start(client, "mini", tags.get("variant", "run"), {k: str(v) for k, v in tags.items()}, params)


def pretrain_run(client, ctx, variant: str, status: str = "FINISHED", seed: int = 0, vocab: str | None = None,
                 checkpoints: dict | None = None, last_step: int = 100) -> str:
    cfg_hash = tracking.config_hash(ctx.compose_pretrain(PretrainJob(variant, seed)))
    checkpoints = {"50": "/ckpt/step_50", "100": "/ckpt/final"} if checkpoints is None else checkpoints
    tags = {"kind": "pretrain", "config_hash": cfg_hash, "variant": variant, "sweep": "mini", "seed": seed,
            "objective": variant, "generator": "neural", "generator_hidden_size": 0.25, "disc_hidden_size": 128,
            "git_commit": "abc123", "checkpoints": json.dumps(checkpoints)}
    run = start(client, tags, {"trainer.max_steps": "100", **({tracking.PARAM_VOCAB_SHA256: vocab} if vocab else {})})
    per_step = 1e9 if variant == "electra" else 0.8e9
    for step in range(10, last_step + 1, 10):
        run.log_metrics({"train/flops": per_step * step}, step)
    run.log_metrics({"flops/total": per_step * 100}, 100)
    run.finish(status)
    return run.run_id


def finetune_run(client, pretrain_id: str, variant: str, step: int, task: str, seed: int, score: float | None,
                 status: str = "FINISHED", vocab: str | None = None, hashes: dict | None = None,
                 random_init: bool = False) -> str:
    """A fine-tuning run of the grid's current config (`hashes`: hermetic.finetune_hash_of), else of another."""
    config_hash = (hashes or {}).get((variant, step, task, seed), f"other-{variant}{step}{task}{seed}")
    tags = {"kind": "finetune", "task": task, "seed": seed, "pretrain_run_id": pretrain_id, "pretrained_step": step,
            "variant": variant, "sweep": "mini", "config_hash": config_hash, "git_commit": "abc123",
            "random_init": str(random_init).lower()}
    run = start(client, tags, {tracking.PARAM_VOCAB_SHA256: vocab} if vocab else None)
    if score is not None:
        run.log_metrics({"final/score": score, "final/accuracy": score / 100}, 3)
    run.finish(status)
    return run.run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory, data_dir):
    ctx = make_context(tmp_path_factory.mktemp("store"), data_dir)
    client = tracking.setup(ctx.tracking_uri, "mini")
    ids = {v: pretrain_run(client, ctx, v) for v in ("electra", "bert")}
    pretrain_run(client, ctx, "replace_mlm", status="FAILED")
    pretrain_run(client, ctx, "electra", seed=5)  # same sweep, a seed outside the grid: never counted
    hashes = finetune_hash_of(ctx, client)
    # An older finished electra run for rte seed 0 with another score: the newest one must win.
    finetune_run(client, ids["electra"], "electra", 100, "rte", 0, 1.0, hashes=hashes)
    # A newer run of another fine-tuning config (a changed default) for rte seed 1: never counted.
    finetune_run(client, ids["electra"], "electra", 100, "rte", 1, 99.0)
    for scores, step in ((HALF, 50), (FINAL, 100)):
        for variant, per_task in scores.items():
            for task, values in per_task.items():
                for seed, score in enumerate(values):
                    finetune_run(client, ids[variant], variant, step, task, seed, score, hashes=hashes)
    finetune_run(client, ids["bert"], "bert", 100, "rte", 2, None, status="FAILED", hashes=hashes)
    return ctx, client, ids


def recomputed_medians(uri: str) -> dict[tuple[str, str], float]:
    """Medians straight from the store: newest FINISHED run per (pre-training run, task, seed), final step."""
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("mini")
    runs = client.search_runs([exp.experiment_id], "tags.kind = 'finetune' and attributes.status = 'FINISHED' "
                              "and tags.pretrained_step = '100'", order_by=["attributes.start_time DESC"])
    newest: dict = {}
    for r in runs:
        newest.setdefault((r.data.tags["variant"], r.data.tags["task"], r.data.tags["seed"]), r.data.metrics["final/score"])
    values: dict = {}
    for (variant, task, _), score in newest.items():
        values.setdefault((variant, task), []).append(score)
    return {k: float(np.median(v)) for k, v in values.items()}


def test_report_medians_equal_the_stored_runs(store, tmp_path):
    ctx, client, ids = store
    path = write_report(ctx, client, tmp_path / "reports")
    data = collect(ctx, client)
    summary = summarize(data)

    expected = recomputed_medians(ctx.tracking_uri)
    assert expected[("electra", "rte")] == 62.0  # the newer run (60.0) replaced the older 1.0
    for (variant, task), median in expected.items():
        assert summary.medians.loc[variant, task] == pytest.approx(median)
    assert summary.tasks == ["mrpc", "rte"]  # GLUE order
    assert summary.glue["electra"] == pytest.approx((62.0 + 75.0) / 2)
    assert summary.glue["bert"] == pytest.approx((56.0 + 72.0) / 2)
    assert summary.glue["replace_mlm"] is None

    text = path.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| electra (ELECTRA) |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # variant, MRPC, RTE, GLUE, paper, Δ paper, Δ vs baseline, runs
    assert cells[1:4] == ["75.0", "62.0", "**68.5**"] and cells[4] == "85.0" and cells[5] == "-16.5"
    assert cells[6] == "baseline" and cells[7] == "3"
    bert_row = next(line for line in text.splitlines() if line.startswith("| bert (BERT) |"))
    assert "| 2–3 |" in bert_row  # rte has 2 finished runs, mrpc 3


def test_bootstrap_interval_and_spread(store, tmp_path):
    ctx, client, _ = store
    summary = summarize(collect(ctx, client))
    d, lo, hi = summary.differences["bert"]
    assert d == pytest.approx(64.0 - 68.5)
    assert lo <= d <= hi
    # Deterministic: the fixed seed gives the same interval twice.
    assert summarize(collect(ctx, client)).differences["bert"] == (d, lo, hi)
    stats = summary.stats.loc[("electra", "mrpc")]
    assert (stats["n"], stats["min"], stats["max"], stats["best"]) == (3, 70.0, 80.0, 80.0)
    assert stats["std"] == pytest.approx(np.std([80.0, 70.0, 75.0], ddof=1))
    # Per-seed GLUE only for seeds with every task: bert seed 2 has no rte.
    seeds = summary.seed_glue
    assert sorted(seeds[seeds["variant"] == "bert"]["glue"]) == [(55.0 + 71.0) / 2, (57.0 + 73.0) / 2]


def test_bootstrap_interval_covers_zero_for_identical_samples():
    x = {"rte": np.array([60.0, 61.0, 59.0, 62.0])}
    d, lo, hi = bootstrap_difference(x, x)
    # Each side is resampled on its own, so identical runs still give an interval of non-zero width around 0,
    # inside the runs' range (a difference of medians of resamples cannot exceed max - min = 3).
    assert d == 0 and -3 <= lo < 0 < hi <= 3
    # A shift of every run moves the observed difference and both ends by exactly the shift (same seed, same
    # draws), and one run per side has nothing to resample: a zero-width interval at the difference.
    assert bootstrap_difference({"rte": x["rte"] + 10}, x) == pytest.approx((10, lo + 10, hi + 10))
    assert bootstrap_difference({"rte": np.array([64.0])}, {"rte": np.array([60.0])}) == (4.0, 4.0, 4.0)


def test_failed_and_missing_runs_are_listed_not_fatal(store, tmp_path):
    ctx, client, ids = store
    text = write_report(ctx, client, tmp_path / "reports").read_text()
    section = text.split("## Failed and missing runs")[1].split("##")[0]
    assert re.search(r"pre-training replace_mlm seed 0 .*: FAILED .*not fine-tuned", section)
    assert "fine-tuning bert-s0-final rte seed 2: FAILED" in section
    assert "electra seed 5" not in text  # outside the grid


def test_an_unfinished_run_is_fine_tuned_and_reported_at_the_checkpoints_it_saved(tmp_path, data_dir):
    """A long run's early checkpoints count while it goes on; its missing final one is waited for, not faked."""
    from electra_ablate.models.checkpoint import CONFIG_NAME, MODEL_NAME
    from electra_ablate.sweep.plan import finetune_plan

    ctx = make_context(tmp_path, data_dir)
    client = tracking.setup(ctx.tracking_uri, "mini")
    saved = {}
    for name in ("bert/step_50", "bert/final", "electra/step_50"):
        saved[name] = tmp_path / name
        saved[name].mkdir(parents=True)
        for file in (CONFIG_NAME, MODEL_NAME):
            (saved[name] / file).write_text("{}")
    bert = pretrain_run(client, ctx, "bert", checkpoints={"50": str(saved["bert/step_50"]), "100": str(saved["bert/final"])})
    # Stopped before its step-50 metrics were logged: the FLOPs its checkpoint recorded place it.
    (saved["electra/step_50"] / CONFIG_NAME).write_text(json.dumps({"format": "electra-ablate/1", "flops": 55e9}))
    electra = pretrain_run(client, ctx, "electra", status="KILLED", checkpoints={"50": str(saved["electra/step_50"])},
                           last_step=40)
    # Saved, but its directory is gone: not fine-tuned, not reported.
    pretrain_run(client, ctx, "replace_mlm", status="RUNNING", checkpoints={"50": str(tmp_path / "gone")})

    todo, _, _ = finetune_plan(ctx, client)
    by_source = {(c.run_id, c.step, c.final) for c, _, _ in todo}
    assert by_source == {(bert, 50, False), (bert, 100, True), (electra, 50, False)}
    assert len([j for j in todo if j[0].run_id == electra]) == 2 * 3  # rte and mrpc x 3 seeds

    hashes = finetune_hash_of(ctx, client)
    for task in ("rte", "mrpc"):
        for seed in range(3):
            finetune_run(client, electra, "electra", 50, task, seed, 60.0 + seed, hashes=hashes)
    data = collect(ctx, client)
    electra_rows = data.scores[data.scores["variant"] == "electra"]
    assert set(electra_rows["step"]) == {50} and not electra_rows["final"].any() and len(electra_rows) == 6
    assert any(re.search(r"pre-training electra seed 0 .*: KILLED .*fine-tuned only at the steps it saved "
                         r"\(50 of 100\)", p) for p in data.problems)
    assert any(re.search(r"pre-training replace_mlm seed 0 .*: RUNNING .*not fine-tuned", p) for p in data.problems)
    curve = learning_curve(data).set_index(["variant", "fraction"])
    assert curve.loc[("electra", 0.5), "flops"] == pytest.approx(55e9)
    assert curve.loc[("electra", 0.5), "glue"] == pytest.approx(61.0)
    text = write_report(ctx, client, tmp_path / "reports").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| electra | 0.5 | 50 |"))
    assert "| 1 x 3 |" in row  # one pre-training run, three fine-tuning seeds
    assert "fine-tuned only at the steps it saved (50 of 100)" in text.split("## Failed and missing runs")[1]
    # Its compute counts; replace_mlm's, with nothing reported, does not.
    assert re.search(r"pretrain \S+ (s|min|h) over 2 runs, 1 of them not finished \(their time so far\)", text)


def test_a_long_run_s_random_init_arm_runs_from_its_first_checkpoint_and_stays_done_when_the_run_ends(tmp_path,
                                                                                                    data_dir):
    """The floor of a learning curve is there while the run goes on, and the run's end does not fine-tune it again."""
    from electra_ablate.models.checkpoint import CONFIG_NAME, MODEL_NAME
    from electra_ablate.report.stats import random_init_bands
    from electra_ablate.sweep.plan import finetune_plan

    ctx = make_context(tmp_path, data_dir, SWEEP_FILE.replace("  replace_mlm: {objective: replace_mlm}\n",
                                                              "  none: {random_init_of: bert}\n"))
    client = tracking.setup(ctx.tracking_uri, "mini")
    saved = {}
    for name in ("bert/step_50", "bert/final"):
        saved[name] = tmp_path / name
        saved[name].mkdir(parents=True)
        for file in (CONFIG_NAME, MODEL_NAME):
            (saved[name] / file).write_text("{}")
    bert = pretrain_run(client, ctx, "bert", status="KILLED", checkpoints={"50": str(saved["bert/step_50"])},
                        last_step=60)
    todo, _, _ = finetune_plan(ctx, client)
    going = {(c.variant, c.step, c.random_init) for c, _, _ in todo if c.run_id == bert}
    assert going == {("bert", 50, False), ("none", 50, True)}  # the floor does not wait for the run's end
    hashes = finetune_hash_of(ctx, client)
    for task in ("rte", "mrpc"):
        for seed in range(3):
            finetune_run(client, bert, "bert", 50, task, seed, 55.0 + seed, hashes=hashes)
            finetune_run(client, bert, "none", 50, task, seed, 50.0 + seed, hashes=hashes, random_init=True)
    data = collect(ctx, client)
    assert random_init_bands(data)["none"] == pytest.approx((51.0, 50.5, 51.5))
    assert set(data.scores[data.scores["variant"] == "none"]["final"]) == {True}
    verdict_table = write_report(ctx, client, tmp_path / "reports").read_text().split("## Verdicts")[1]
    row = next(line for line in verdict_table.splitlines() if "bert > none" in line)
    assert "| not run | the end of bert's pre-training (KILLED in MLflow; the sweep resumes it) |" in row, row
    row = next(line for line in verdict_table.splitlines() if "electra > none" in line)
    assert "| not run | fine-tuning runs of electra |" in row, row  # never started: nothing to wait for

    # The run resumes and finishes in the same MLflow run; its final checkpoint joins.
    client.set_tag(bert, "checkpoints", json.dumps({"50": str(saved["bert/step_50"]), "100": str(saved["bert/final"])}))
    client.set_tag(bert, "checkpoint_path", str(saved["bert/final"]))
    client.set_terminated(bert, "FINISHED")
    todo, _, _ = finetune_plan(ctx, client)
    assert {(c.variant, c.step, c.final) for c, _, _ in todo if c.run_id == bert} == {("bert", 100, True)}
    assert finetune_hash_of(ctx, client)[("none", 100, "rte", 0)] == hashes[("none", 50, "rte", 0)]
    data = collect(ctx, client)
    none = data.scores[data.scores["variant"] == "none"]
    assert len(none) == 6 and set(none["final"]) == {True}
    assert random_init_bands(data)["none"] == pytest.approx((51.0, 50.5, 51.5))


def test_learning_curves_use_flops_at_each_checkpoint(store, tmp_path):
    ctx, client, ids = store
    data = collect(ctx, client)
    curve = learning_curve(data).set_index(["variant", "fraction"])
    assert curve.loc[("electra", 0.5), "flops"] == pytest.approx(50e9)
    assert curve.loc[("bert", 1.0), "flops"] == pytest.approx(80e9)
    assert curve.loc[("electra", 0.5), "glue"] == pytest.approx((58.0 + 71.0) / 2)
    assert random_init_floors(data) == {}  # no random-init variant in this sweep: no floor drawn


def test_two_stage_checkpoints_up_to_the_switch_are_reported_as_its_generator():
    from types import SimpleNamespace

    def pretrained(run_id, metrics, finished=True, params=None):
        run = SimpleNamespace(info=SimpleNamespace(run_id=run_id), data=SimpleNamespace(metrics=metrics,
                                                                                        params=params or {}))
        return SimpleNamespace(run=run if finished else None, failed=None if finished else run, latest=run,
                               max_steps=400)

    variants = [SimpleNamespace(label=v, random_init_of=None) for v in ("joint", "two_stage", "going")]
    steps = {"joint": [100, 200, 400], "two_stage": [100, 200, 400], "going": [100, 200, 300]}
    scores = pd.DataFrame([{"variant": v, "pretrain_run": v, "pretrain_seed": 0, "step": st, "fraction": st / 400,
                            "final": st == 400, "task": "sst2", "seed": 0, "score": 60.0}
                           for v, sts in steps.items() for st in sts])
    data = SimpleNamespace(ctx=SimpleNamespace(spec=SimpleNamespace(variants=variants)), scores=scores, flops={},
                           pretrain=[pretrained("joint", {}), pretrained("two_stage", {"train/switch_step": 200.0}),
                                     # still pre-training, its switch not logged yet: its configured switch counts
                                     pretrained("going", {}, finished=False, params={"algorithm.switch_fraction": "0.5"})])
    curve = learning_curve(data).set_index(["variant", "step"])["network"]
    # The export at the switch step comes before the switch: the discriminator is still untrained there.
    assert curve.to_dict() == {("joint", 100): "discriminator", ("joint", 200): "discriminator",
                               ("joint", 400): "discriminator", ("two_stage", 100): "generator",
                               ("two_stage", 200): "generator", ("two_stage", 400): "discriminator",
                               ("going", 100): "generator", ("going", 200): "generator",
                               ("going", 300): "discriminator"}


def test_the_random_init_floor_is_its_final_glue_of_task_medians():
    from types import SimpleNamespace

    variants = [SimpleNamespace(label="bert", random_init_of=None),
                SimpleNamespace(label="none", random_init_of="bert")]
    scores = pd.DataFrame({"variant": ["none"] * 5 + ["bert"] * 2,
                           "task": ["sst2", "sst2", "sst2", "rte", "rte", "sst2", "sst2"],
                           "score": [60.0, 70.0, 65.0, 50.0, 54.0, 80.0, 90.0],
                           "final": [True] * 4 + [False] + [True] * 2})  # the non-final rte run is left out
    data = SimpleNamespace(ctx=SimpleNamespace(spec=SimpleNamespace(variants=variants)), scores=scores)
    assert random_init_floors(data) == {"none": pytest.approx(glue_of({"sst2": 65.0, "rte": 50.0}))}


def test_where_a_curve_clears_the_random_init_band_and_crosses_the_baseline_is_read_off_its_medians():
    from types import SimpleNamespace

    from electra_ablate.report.curves import _crossing_lines
    from electra_ablate.report.stats import crossings, random_init_bands

    # bert to 1x its budget; electra_4x to 4x bert's FLOPs: under the floor at first, over it at 1x, over bert at 4x.
    curve = pd.DataFrame([("bert", f, 1e14 * f, g) for f, g in ((0.5, 64.0), (1.0, 69.0))] +
                         [("electra_4x", f, 4e14 * f, g) for f, g in ((0.125, 60.0), (0.25, 66.5), (0.5, 68.0),
                                                                       (1.0, 70.0))] +
                         [("electra", f, 1e14 * f, g) for f, g in ((0.5, 61.0), (1.0, 62.0))],
                         columns=["variant", "fraction", "flops", "glue"])
    rows = {r["variant"]: r for r in crossings(curve, 66.0, "bert", 67.0)}
    assert set(rows) == {"bert", "electra_4x", "electra"}  # the baseline too clears random init or not
    assert rows["electra_4x"]["first_above_floor"] == {"flops": 1e14, "fraction": 0.25, "glue": 66.5}
    assert rows["electra_4x"]["first_above_band"] == {"flops": 2e14, "fraction": 0.5, "glue": 68.0}
    assert rows["electra_4x"]["first_above_baseline_final"] == {"flops": 4e14, "fraction": 1.0, "glue": 70.0}
    # At equal FLOPs only its points within bert's range are compared: 0.125 and 0.25 (bert's 0.5 and 1).
    assert [(e["fraction"], e["difference"]) for e in rows["electra_4x"]["equal_flops"]] == [(0.125, -4.0), (0.25, -2.5)]
    assert rows["electra"]["first_above_floor"] is None and rows["electra"]["best"] == 62.0
    assert rows["bert"]["equal_flops"] == [] and rows["bert"]["first_above_baseline_final"] is None
    spec = SimpleNamespace(baseline="bert", pretrain_seeds=(0,))
    lines = _crossing_lines(spec, curve, {"none": (66.0, 65.0, 67.0)})
    assert "- electra_4x: clears random init first at 1e+14 FLOPs (0.25 of its steps: 66.5); above its band first at " \
           "2e+14 FLOPs (0.5 of its steps: 68.0); above bert at equal FLOPs never, at 0 of its 2 points in bert's " \
           "range; above bert's final median (69.0) first at 4e+14 FLOPs (1 of its steps: 70.0)." in lines
    assert "- electra: clears random init never, up to 1e+14 FLOPs (its best median 62.0); above its band never, up " \
           "to 1e+14 FLOPs (its best median 62.0); above bert at equal FLOPs never, at 0 of its 2 points in bert's " \
           "range; above bert's final median (69.0) never, up to 1e+14 FLOPs (its best median 62.0)." in lines
    # No random-init arm: only the comparison with the baseline is read.
    assert not any("clears random init" in line for line in _crossing_lines(spec, curve, {}))

    # The band: the random-init arm's median and the quartiles of its per-seed scores.
    variants = [SimpleNamespace(label="bert", random_init_of=None), SimpleNamespace(label="none", random_init_of="bert")]
    scores = pd.DataFrame({"variant": "none", "task": "sst2", "pretrain_seed": [0, 0, 0, 0, 1],
                           "seed": [0, 1, 2, 3, 0], "score": [60.0, 62.0, 64.0, 66.0, 90.0], "final": True})
    data = SimpleNamespace(ctx=SimpleNamespace(spec=SimpleNamespace(variants=variants)), scores=scores)
    assert random_init_bands(data) == {"none": (64.0, 62.0, 66.0)}


def test_report_files_are_written_whole(store, tmp_path):
    ctx, client, _ = store
    out = tmp_path / "reports"
    write_report(ctx, client, out)
    write_report(ctx, client, out)  # again over the old one
    assert sorted(p.name for p in out.iterdir()) == ["mini", "mini.md"]
    assert sorted(p.name for p in (out / "mini").iterdir()) == ["expected_max.png", "generator_size.png", "glue.png",
                                                          "learning_curves.png", "task_curves.png", "verdicts.json"]
    text = (out / "mini.md").read_text()
    for ref in re.findall(r"!\[[^]]*\]\(([^)]+)\)", text):
        assert (out / ref).is_file(), ref
    assert "Git commit(s) of the runs in the tables: abc123" in text
    assert "mlflow ui --backend-store-uri" in text and "--host 127.0.0.1" in text


def test_paper_numbers_come_from_the_data_file():
    paper = load_paper_results()
    assert paper["table5_efficiency"]["rows"]["electra"]["glue"] == 85.0
    assert paper["weight_sharing"]["rows"]["all"]["glue"] == 84.4
    assert paper["table1_small"]["rows"]["electra"]["by_fraction"][0.0625] == 74.1
    assert paper["readme_expected_results"]["rows"]["electra_base"]["rte"] == 82.7
    for section in paper.values():
        assert section["source"] and isinstance(section["rows"], dict)
    # The released-models sweep's rows resolve, and a README row's GLUE is the mean of its task numbers.
    spec = load_sweep("released_models")
    for v in spec.variants:
        row, source = paper_row(spec, v.label)
        assert row is not None and "README" in source
    row = paper["readme_expected_results"]["rows"]["electra_small"]
    assert paper_glue(row, ["cola", "rte"]) == (pytest.approx((57.0 + 66.7) / 2), True)


def test_a_sweep_with_no_runs_yet_reports_everything_missing(tmp_path, data_dir):
    ctx = make_context(tmp_path, data_dir)
    client = tracking.setup(ctx.tracking_uri, "mini")
    text = write_report(ctx, client, tmp_path / "reports").read_text()
    assert "No fine-tuning run of a final checkpoint has finished yet." in text
    for variant in ("electra", "bert", "replace_mlm"):
        assert f"pre-training {variant} seed 0 (config " in text and "missing (no MLflow run)" in text


@pytest.mark.parametrize("bert_vocab", ["a" * 64, "b" * 64])
def test_report_lists_each_arms_vocabulary_and_warns_when_they_differ(tmp_path, data_dir, bert_vocab):
    ctx = make_context(tmp_path, data_dir)
    client = tracking.setup(ctx.tracking_uri, "mini")
    vocab = {"electra": "a" * 64, "bert": bert_vocab}
    for variant in ("electra", "bert"):
        run_id = pretrain_run(client, ctx, variant, vocab=vocab[variant])
        finetune_run(client, run_id, variant, 100, "rte", 0, 60.0, vocab=vocab[variant],
                     hashes=finetune_hash_of(ctx, client))
    text = write_report(ctx, client, tmp_path / "reports").read_text()
    provenance = text.split("## How this was produced")[1]
    assert f"electra `{'a' * 12}`; bert `{bert_vocab[:12]}`; replace_mlm no runs" in provenance
    differ = bert_vocab != vocab["electra"]
    # The warning opens the report (above the tables) and is repeated in the provenance.
    assert text.count("Warning: the runs compared here used different vocabularies") == (2 if differ else 0)
    if differ:
        assert text.index("Warning") < text.index("## GLUE dev")


def test_runs_without_a_vocabulary_digest_are_unrecorded_and_do_not_warn(store, tmp_path):
    ctx, client, _ = store
    data = collect(ctx, client)
    vocabs = vocabularies(data)
    assert vocabs == {"electra": {UNRECORDED}, "bert": {UNRECORDED}, "replace_mlm": set()}
    assert vocabulary_warning(vocabs) is None
    assert vocabulary_warning({"electra": {"a" * 64, UNRECORDED}, "bert": {"a" * 64}}) is None
    assert "within electra" in vocabulary_warning({"electra": {"a" * 64, "c" * 64}, "bert": {"a" * 64}})


def test_the_end_of_pretraining_names_each_objectives_own_accuracies():
    from types import SimpleNamespace

    from electra_ablate.report import arms
    from electra_ablate.report.markdown import end_of_pretraining_section

    def state(variant, **metrics):
        run = SimpleNamespace(data=SimpleNamespace(metrics={f"train/{k}": v for k, v in metrics.items()}))
        return SimpleNamespace(job=SimpleNamespace(variant=variant), run=run)

    # training_algorithms' arms; two_stage given a masked LM's metrics with a generator, as All-Tokens MLM logs
    states = [state("bert", mlm_loss=2.4, masked_lm_accuracy=0.50), state("bert", mlm_loss=2.5, masked_lm_accuracy=0.40),
              state("joint", mlm_loss=4.8, masked_lm_accuracy=0.18, masked_lm_accuracy_at_mask=0.04,
                    masked_lm_accuracy_at_kept=0.97, sampled_masked_lm_accuracy=0.16, disc_auc=0.63,
                    disc_precision=0.40, disc_recall=0.05, replaced_fraction=0.12),
              state("two_stage", masked_lm_accuracy=0.22, gen_masked_lm_accuracy=0.29, replaced_fraction=0.11),
              SimpleNamespace(job=SimpleNamespace(variant="adversarial"), run=None)]  # not finished: no row
    joint = arms.end_of_pretraining(states[2].run)
    assert joint["generator_mlm_accuracy"] == 0.18 and joint["encoder_mlm_accuracy"] is None  # the generator's
    assert arms.end_of_pretraining(states[3].run)["encoder_mlm_accuracy"] == 0.22
    spec = load_sweep("training_algorithms", "tiny")  # its scale with BERT's reference line
    rows = [line for line in "\n".join(end_of_pretraining_section(spec, states)).splitlines() if line.startswith("| ")]
    assert rows[0].endswith("| paper: generator's MLM accuracy |")  # paper Appendix F: joint 65, adversarial 58
    # The generator copies: 97% where the original was kept, 4% at [MASK]; the discriminator's precision/recall.
    assert joint["generator_mlm_accuracy_at_mask"] == 0.04 and joint["generator_mlm_accuracy_at_kept"] == 0.97
    assert rows[1:] == ["| joint | 1 | – | 18.0 / 4.0 / 97.0 | 16.0 | 0.630 | 40.0 / 5.0 | 12.0 | 65 |",
                        "| two_stage | 1 | 22.0 / – / – | 29.0 / – / – | – | – | – | 11.0 | – |",
                        "| bert | 2 | 45.0 / – / – | – | – | – | – | – | – |"]
    assert end_of_pretraining_section(spec, states[4:]) == []


def test_pretraining_curves_follow_each_finished_run_against_its_flops(tmp_path, data_dir):
    from electra_ablate.report.collect import pretraining_curves
    from electra_ablate.report.figures import pretraining_curves_figure

    ctx = make_context(tmp_path, data_dir)
    client = tracking.setup(ctx.tracking_uri, "mini")
    electra, bert = pretrain_run(client, ctx, "electra"), pretrain_run(client, ctx, "bert")
    stopped = pretrain_run(client, ctx, "replace_mlm", status="KILLED")  # not finished: drawn as far as it got
    client.log_metric(stopped, "train/masked_lm_accuracy", 0.01, step=10)
    for step in range(10, 101, 10):
        client.log_metric(electra, "train/masked_lm_accuracy_at_mask", step / 1000, step=step)
        client.log_metric(electra, "train/masked_lm_accuracy", step / 500, step=step)
        client.log_metric(electra, "train/disc_auc", 0.5 + step / 1000, step=step)
        client.log_metric(bert, "train/masked_lm_accuracy", step / 400, step=step)  # a run from before the split
    client.log_metric(electra, "train/disc_auc", 0.61, step=100)  # a window logged again by a resumed run
    data = collect(ctx, client)
    curves = pretraining_curves(client, data.pretrain)
    assert sorted(set(curves["run_id"])) == sorted([electra, bert, stopped])
    assert set(curves.loc[curves["run_id"] == stopped, "finished"]) == {False}
    assert set(curves.loc[curves["run_id"] != stopped, "finished"]) == {True}
    auc = curves[(curves["metric"] == "disc_auc")].sort_values("step")
    assert list(auc["step"])[:2] == [10, 20] and auc["flops"].iloc[0] == pytest.approx(10e9)  # electra: 1e9 a step
    at_bert = curves[(curves["run_id"] == bert)]
    assert set(at_bert["metric"]) == {"mlm_accuracy"} and at_bert["flops"].max() == pytest.approx(80e9)
    assert pretraining_curves_figure(data, tmp_path / "curves.png") and (tmp_path / "curves.png").stat().st_size > 0
    text = write_report(ctx, client, tmp_path / "reports").read_text()
    assert "![pre-training curves](mini/pretraining_curves.png)" in text
    assert (tmp_path / "reports" / "mini" / "pretraining_curves.png").is_file()


def test_no_pretraining_curve_no_figure(tmp_path, data_dir):
    from electra_ablate.report.figures import pretraining_curves_figure

    ctx = make_context(tmp_path, data_dir)
    client = tracking.setup(ctx.tracking_uri, "mini")
    pretrain_run(client, ctx, "bert")  # only train/flops logged
    data = collect(ctx, client)
    assert data.curves.empty and not pretraining_curves_figure(data, tmp_path / "curves.png")
    assert "pre-training curves" not in write_report(ctx, client, tmp_path / "reports").read_text()


def test_a_sweep_whose_pretraining_runs_are_all_unfinished_shows_them_so_far(tmp_path, data_dir):
    ctx = make_context(tmp_path, data_dir)
    client = tracking.setup(ctx.tracking_uri, "mini")
    running = pretrain_run(client, ctx, "electra", status="RUNNING")
    for step in (10, 20):
        client.log_metric(running, "train/disc_auc", 0.6, step=step)
    text = write_report(ctx, client, tmp_path / "reports").read_text()
    section = text.split("## Pre-training so far")[1].split("\n## ")[0]
    assert "No pre-training run has finished yet." in section and "![pre-training curves]" in section
