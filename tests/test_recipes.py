"""A sweep fine-tuned under several recipes (`recipes` in the sweep file): each (checkpoint, recipe, task, seed) is a
run of its own identity where the recipes' settings for the task differ and the same run where they do not; the
first recipe's runs are those of a sweep of it alone; the report puts the recipes side by side with a line per
claim saying whether the verdict is the same; the dry run prices each recipe's jobs apart; `base` and `exports`
let a second sweep fine-tune fewer checkpoints of another sweep's runs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from electra_ablate.report import headline
from electra_ablate.report.build import write_report
from electra_ablate.sweep import compose, cost
from electra_ablate.sweep.jobs import Checkpoint, PretrainJob
from electra_ablate.sweep.plan import finetune_hashes, finetune_plan, under_recipes
from electra_ablate.sweep.spec import SweepError, load_sweep
from electra_ablate.tracking import runs as tracking

ONE_RECIPE = """
name: mini
paper: table5_efficiency
baseline: bert
tasks: [cola, stsb]
seeds: [0, 1, 2]
pretrain: {model: tiny, trainer.max_steps: 100}
finetune: {recipe: cpu_glue}
variants:
  electra: {objective: electra}
  bert: {objective: bert}
"""
TWO_RECIPES = ONE_RECIPE + "recipes: [cpu_glue, paper_glue]\n"


def make_context(tmp_path: Path, data_dir: Path, text: str, name: str = "mini") -> compose.SweepContext:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    paths = {"root_dir": str(tmp_path), "data_dir": str(data_dir), "output_root": str(tmp_path / "outputs"),
             "cache_dir": str(tmp_path / "outputs" / "cache")}
    return compose.make_context(path, None, paths, f"sqlite:///{tmp_path}/mlflow.db")


def final(variant: str, recipe: str | None = None) -> Checkpoint:
    return Checkpoint(variant, 0, f"{variant:0<32}", 100, True, 1.0, recipe=recipe)


def test_two_recipes_are_runs_apart_where_their_settings_differ_and_the_first_keeps_its_identities(tmp_path, data_dir):
    one = make_context(tmp_path / "one", data_dir, ONE_RECIPE)
    two = make_context(tmp_path / "two", data_dir, TWO_RECIPES)
    alone = finetune_hashes(one, [final("bert")])
    both = finetune_hashes(two, under_recipes(two.spec, [final("bert")]))
    assert len(both) == 2 * len(alone) == 2 * 2 * 3  # (checkpoint, recipe, task, seed)
    for (name, task, seed), hashes in alone.items():
        assert both[(f"{name}-cpu_glue", task, seed)] == hashes  # the first recipe: the runs it has alone
        paper = both[(f"{name}-paper_glue", task, seed)]
        if task == "cola":  # not cut by cpu_glue: under both recipes the same run, found finished once
            assert paper == hashes
        else:  # STS-B: 2,500 pairs and 3 epochs against the whole set and 10
            assert paper[0] != hashes[0]
    assert len({h[0] for (_, task, _), h in both.items() if task == "stsb"}) == 6


def test_a_recipe_that_is_not_in_conf_recipe_stops_the_sweep_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(ONE_RECIPE + "recipes: [cpu_glue, paper_glu]\n")
    with pytest.raises(SweepError, match=r"recipes names \['paper_glu'\].*known: .*paper_glue"):
        load_sweep(path)


def test_a_sweep_over_another_keeps_its_exports_and_finds_its_pretraining(tmp_path, data_dir):
    """A second look at a sweep's runs (`base`) fine-tunes only its finals: what pre-training saved is in its runs'
    identity, so `exports` keeps it and the pre-training jobs are the base sweep's."""
    base = make_context(tmp_path, data_dir, ONE_RECIPE + "checkpoints: [0.25, 0.5, 1.0]\n")
    over = make_context(tmp_path, data_dir, f"base: {tmp_path / 'mini.yaml'}\nexperiment: mini\ncheckpoints: [1.0]\n"
                                            "exports: [0.25, 0.5]\nrecipes: [cpu_glue, paper_glue]\n", name="over")
    assert over.spec.name == "over" and over.spec.experiment == "mini" and over.spec.tasks == ("cola", "stsb")
    for variant in ("bert", "electra"):
        job = PretrainJob(variant, 0)
        assert tracking.config_hash(over.compose_pretrain(job)) == tracking.config_hash(base.compose_pretrain(job))
    path = tmp_path / "short.yaml"
    path.write_text(f"base: {tmp_path / 'mini.yaml'}\ncheckpoints: [0.25, 1.0]\nexports: [0.5]\n")
    with pytest.raises(SweepError, match=r"checkpoints \[0.25\] are not in exports"):
        load_sweep(path)


def start(client, tags, params=None) -> tracking.RunLogger:
    time.sleep(0.003)
    return tracking.RunLogger.start(client, "mini", tags.get("variant", "run"), {k: str(v) for k, v in tags.items()},
                                    params)


# variant -> recipe -> task -> seed scores: ELECTRA ahead on STS-B under the cut recipe only.
SCORES = {
    "electra": {"cpu_glue": {"cola": [10, 11, 12], "stsb": [60, 61, 62]},
                "paper_glue": {"cola": [10, 11, 12], "stsb": [70, 71, 72]}},
    "bert": {"cpu_glue": {"cola": [12, 13, 14], "stsb": [30, 31, 32]},
             "paper_glue": {"cola": [12, 13, 14], "stsb": [74, 75, 76]}},
}


@pytest.fixture(scope="module")
def store(tmp_path_factory, data_dir):
    return fill(tmp_path_factory.mktemp("recipes"), data_dir)


def fill(tmp_path: Path, data_dir: Path, leave_out: tuple[str, str] | None = None):
    """The two-recipe sweep's store, with every job of SCORES finished but those of `leave_out` (recipe, task)."""
    ctx = make_context(tmp_path, data_dir, TWO_RECIPES)
    client = tracking.setup(ctx.tracking_uri, "mini")
    ids = {}
    for variant in ("electra", "bert"):
        cfg_hash = tracking.config_hash(ctx.compose_pretrain(PretrainJob(variant, 0)))
        run = start(client, {"kind": "pretrain", "config_hash": cfg_hash, "variant": variant, "seed": 0,
                             "checkpoints": '{"100": "/ckpt/final"}'}, {"trainer.max_steps": "100"})
        run.finish("FINISHED")
        ids[variant] = run.run_id
    checkpoints = under_recipes(ctx.spec, [Checkpoint(v, 0, ids[v], 100, True, 1.0) for v in ids])
    hashes = finetune_hashes(ctx, checkpoints)
    examples = {("cpu_glue", "stsb"): 5000, ("paper_glue", "stsb"): 11498}
    logged = set()
    for c in checkpoints:
        for task, values in SCORES[c.variant][c.recipe].items():
            if (c.recipe, task) == leave_out:
                continue
            for seed, score in enumerate(values):
                h = hashes[(c.config_name, task, seed)][0]
                if h in logged:  # CoLA: one run under both recipes
                    continue
                logged.add(h)
                run = start(client, {"kind": "finetune", "task": task, "seed": seed, "pretrain_run_id": ids[c.variant],
                                     "pretrained_step": 100, "variant": c.variant, "config_hash": h},
                            {"resolved.train_examples": str(examples.get((c.recipe, task), 8551)),
                             "task.epochs": "10" if (c.recipe, task) == ("paper_glue", "stsb") else "3"})
                run.log_metrics({"final/score": float(score)}, 3)
                run.finish("FINISHED")
    return ctx, client


def test_the_report_puts_the_recipes_side_by_side_and_says_where_a_verdict_differs(store, tmp_path):
    ctx, client = store
    text = write_report(ctx, client, tmp_path, echo=False).read_text()
    section = text[text.index("## Under each fine-tuning recipe"):]
    rows = [line for line in section.splitlines() if line.startswith("| electra") or line.startswith("| bert")]
    assert rows[:2] == ["| electra | `cpu_glue` | 11.0 | 61.0 | 36.0 |", "| electra | `paper_glue` | 11.0 | 71.0 | 41.0 |"]
    assert rows[2:4] == ["| bert | `cpu_glue` | 13.0 | 31.0 | 22.0 |", "| bert | `paper_glue` | 13.0 | 75.0 | 44.0 |"]
    claim = next(line for line in section.splitlines() if line.startswith("| ELECTRA beats BERT |"))
    cells = [c.strip() for c in claim.strip("|").split("|")]
    assert cells[1] == "GLUE-2: CoLA, STS-B"
    assert cells[2].startswith("holds, +14.0") and cells[3].startswith("reversed, -3.0")
    assert cells[4] == "**differs**" and cells[5].startswith("STS-B: +30.0 → -4.0")
    assert "- ELECTRA beats BERT, on GLUE-2: CoLA, STS-B: differs across recipes (cpu_glue: holds" in section
    # The report's other sections read the first recipe: its main table is cpu_glue's.
    assert "| 36.0" in text[:text.index("## Under each fine-tuning recipe")]
    # verdicts.json holds each recipe's record and the agreement, and the long run's headline reads them so.
    record = json.loads((tmp_path / "mini" / "verdicts.json").read_text())
    assert record["medians"]["electra"]["glue"] == 36.0 and record["recipes"]["paper_glue"]["medians"]["bert"]["glue"] == 44.0
    (agree,) = record["agreement"]
    assert agree["verdicts"] == {"cpu_glue": "holds", "paper_glue": "reversed"} and not agree["same"]
    said = headline.protocol_text(record, "reports/mini.md")
    assert "**holds** under `cpu_glue`, +14.0" in said and "**reversed** under `paper_glue`, -3.0" in said
    assert "(not the same verdict; moved most by STS-B: +30.0 → -4.0 (alone: reversed))" in said
    assert "`cpu_glue` GLUE-2 electra 36.0, bert 22.0; `paper_glue` GLUE-2 bert 44.0, electra 41.0" in said
    assert headline.protocol_text({**record, "recipes": {"cpu_glue": record["recipes"]["cpu_glue"]}}) == ""


def test_a_recipe_still_running_is_compared_on_the_tasks_every_recipe_has(tmp_path, data_dir):
    ctx, client = fill(tmp_path, data_dir, leave_out=("paper_glue", "stsb"))
    text = write_report(ctx, client, tmp_path, echo=False).read_text()
    section = text[text.index("## Under each fine-tuning recipe"):]
    assert "| variant | recipe | CoLA | STS-B | GLUE-2 | GLUE-1 (the tasks all have) |" in section
    assert "| electra | `paper_glue` | 11.0 | – | 11.0 (of 1 task) | 11.0 |" in section
    assert "each claim below is judged, under every recipe, on the tasks where its arms have finished runs" in section
    claim = next(line for line in section.splitlines() if line.startswith("| ELECTRA beats BERT |"))
    cells = [c.strip() for c in claim.strip("|").split("|")]
    assert cells[1] == "GLUE-1: CoLA" and cells[4] == "same"  # on CoLA alone, where both recipes are the same runs
    assert "`paper_glue` is not complete: 2 line(s) of missing or failed fine-tuning" in section
    record = json.loads((tmp_path / "mini" / "verdicts.json").read_text())
    assert record["recipes"]["paper_glue"]["tasks"] == ["cola"] == record["recipes"]["cpu_glue"]["tasks"]
    assert record["recipes"]["cpu_glue"]["finished_tasks"] == ["cola", "stsb"]
    assert record["recipes"]["cpu_glue"]["medians"]["bert"] == {"cola": 13.0, "glue": 13.0}


def test_the_dry_run_prices_each_recipe_s_jobs_by_their_work(store):
    ctx, client = store
    todo, _, _ = finetune_plan(ctx, client)
    assert todo == []  # every job of both recipes is found finished (CoLA's once)
    jobs = [(c._replace(recipe=r), "stsb", 0) for r in ("cpu_glue", "paper_glue") for c in [final("bert")]]
    lines = cost.finetune_cost(ctx, client, jobs, {}).lines
    cut, whole = (next(line for line in lines if line.startswith(f"stsb ({r})")) for r in ("cpu_glue", "paper_glue"))
    assert "x 3 epochs" in cut and "x 10 epochs" in whole
    with compose.compose_session():
        works = [cost.job_work(ctx, final("bert", r), "stsb") for r in ("cpu_glue", "paper_glue")]
    assert works[0][1] == 3 and works[1][1] == 10 and works[0][0] <= works[1][0]
    assert f"{works[1][0]:,} examples x 10 epochs" in whole  # the local data as the job reads it (pairs doubled)


def test_a_recipe_may_take_a_subset_of_the_checkpoints(tmp_path, data_dir):
    """`recipe_checkpoints`: the paper's protocol on the finals only, the cut recipe on every fraction (Table 5 at
    the long run's budget); the planner, the pricing of checkpoints still to come and the report follow it."""
    text = TWO_RECIPES.replace("seeds: [0, 1, 2]", "seeds: [0, 1, 2]\ncheckpoints: [0.5, 1.0]")
    ctx = make_context(tmp_path / "subset", data_dir, text + "recipe_checkpoints: {paper_glue: [1.0]}\n")
    half, end = (Checkpoint("bert", 0, "b" * 32, s, s == 100, s / 100) for s in (50, 100))
    got = under_recipes(ctx.spec, [half, end])
    assert [(c.recipe, c.step) for c in got] == [("cpu_glue", 50), ("cpu_glue", 100), ("paper_glue", 100)]
    state = SimpleNamespace(needs_pretraining=True, run=None, failed=None, job=PretrainJob("bert", 0), max_steps=100)
    future = cost.future_finetune_jobs(ctx, [state], ["stsb"])
    assert future == {("stsb", "cpu_glue"): 6, ("stsb", "paper_glue"): 3}  # 2 fractions x 3 seeds; the final x 3
    for bad, said in (("{paper_glue: [0.25]}", r"recipe_checkpoints.paper_glue=\[0.25\] must be a non-empty list of "
                                               r"the sweep's checkpoints \[0.5, 1.0\]"),
                      ("{cola_glue: [1.0]}", r"recipe_checkpoints names 'cola_glue', which is not in recipes")):
        path = tmp_path / "bad.yaml"
        path.write_text(text + f"recipe_checkpoints: {bad}\n")
        with pytest.raises(SweepError, match=said):
            load_sweep(path)
