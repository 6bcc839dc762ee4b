"""A sweep of several GLUE tasks: the verdicts on the GLUE mean stay the headline, each task's difference and verdict
come from the same bootstrap, the "Which tasks see pre-training" table per task, the instrument named in the
console, in verdicts.json and in the README's table, and a task without local data skipped once.

The store is written the way fine-tuning writes runs (final score + dev predictions); per task and arm, each run
gets a set accuracy (with a little run noise) on a shared dev set: on CoLA ELECTRA > BERT > random init, on MRPC
ELECTRA = BERT < random init, and the sweep also lists RTE, whose data the sweep's data folder lacks."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import logging
import re
import time
from pathlib import Path

import numpy as np
import pytest

from electra_ablate.glue import features as glue_features
from electra_ablate.glue import metrics as glue_metrics
from electra_ablate.glue import tasks as glue
from electra_ablate.report import build, holds, verdicts
from electra_ablate.report.collect import collect
from electra_ablate.report.paper import load_paper_results
from electra_ablate.sweep import compose
from electra_ablate.sweep.jobs import PretrainJob
from electra_ablate.sweep.run import run_finetune_phase
from electra_ablate.tracking import runs as tracking
from electra_ablate.finetuning import run as finetuning
from tests.hermetic import finetune_hash_of

SWEEP_FILE = """
name: tasks_mini
description: "A miniature Table 5 on three GLUE tasks with a random-init floor"
paper: table5_efficiency
baseline: bert
tasks: [cola, mrpc, rte]
seeds: [0, 1]
pretrain_seeds: [0, 1]
pretrain: {model: tiny, trainer.max_steps: 100}
variants:
  electra: {objective: electra}
  bert: {objective: bert}
  scratch: {pretrained: none}
"""
FLOOR_SWEEP = """
name: tasks_floor
description: "Random init on three GLUE tasks"
tasks: [cola, mrpc, rte]
seeds: [0]
variants:
  scratch: {pretrained: none}
"""
ACCURACY = {"cola": {"electra": 0.90, "bert": 0.78, "scratch": 0.60},
            "mrpc": {"electra": 0.52, "bert": 0.52, "scratch": 0.88}}
N = 300
VS = "ELECTRA beats BERT"
FLOOR = "Pre-training beats no pre-training (sanity check): {} > scratch"


def data_without(data_dir: Path, tmp: Path, task: str) -> Path:
    """A data folder like `data_dir` whose glue/ lacks `task`."""
    out = tmp / "data"
    (out / "glue").mkdir(parents=True)
    for part in ("corpus", "vocab"):
        (out / part).symlink_to(data_dir / part)
    for t in glue.TASKS.values():
        if t.name != task and (data_dir / "glue" / t.dir_name).is_dir():
            (out / "glue" / t.dir_name).symlink_to(data_dir / "glue" / t.dir_name)
    return out


def make_context(tmp: Path, data_dir: Path, text: str = SWEEP_FILE, name: str = "tasks_mini") -> compose.SweepContext:
    path = tmp / f"{name}.yaml"
    path.write_text(text)
    paths = {"root_dir": str(tmp), "data_dir": str(data_dir), "output_root": str(tmp / "outputs"),
             "cache_dir": str(tmp / "outputs" / "cache")}
    return compose.make_context(path, None, paths, f"sqlite:///{tmp}/mlflow.db")


def log_finetune(client, tmp: Path, pretrain_id: str | None, variant: str, task: str, seed: int, rng,
                 hashes: dict) -> None:
    spec = glue.get_task(task)
    labels = np.random.default_rng(123).integers(0, 2, N)  # the same dev set for every run
    correct = rng.random(N) < ACCURACY[task][variant] + rng.normal(0, 0.02)
    preds = np.where(correct, labels, 1 - labels)
    tags = {"kind": "finetune", "task": task, "seed": seed, "pretrain_run_id": pretrain_id or "none",
            "pretrained_step": 100 if pretrain_id else 0, "variant": variant, "sweep": "tasks_mini",
            "config_hash": hashes[(pretrain_id, 100, task, seed) if pretrain_id else (variant, None, task, seed)]}
    time.sleep(0.002)
    run = tracking.RunLogger.start(client, "tasks_mini", f"{task}-s{seed}", tags, parent_run_id=pretrain_id)
    run.log_metrics({"final/score": 100 * glue_metrics.METRICS[spec.paper_metric](preds, labels)}, 3)
    features = glue_features.Features(np.zeros(0, np.int32), np.zeros(0, np.int8), np.zeros(N + 1, np.int64), labels,
                                      np.arange(N))
    out = tmp / run.run_id / "dev_predictions.tsv"
    run.log_artifact(finetuning.write_predictions(out, spec, {"dev": features}, {"dev": preds}), "predictions")
    run.finish("FINISHED")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, data_dir):
    """The store, the sweep's context (its data folder without RTE), and the report written from them."""
    tmp = tmp_path_factory.mktemp("tasks")
    data = data_without(data_dir, tmp, "rte")
    ctx = make_context(tmp, data)
    client = tracking.setup(ctx.tracking_uri, "tasks_mini")
    rng = np.random.default_rng(0)
    pretrained = {}
    for variant, pseed in itertools.product(("electra", "bert"), (0, 1)):
        cfg_hash = tracking.config_hash(ctx.compose_pretrain(PretrainJob(variant, pseed)))
        tags = {"kind": "pretrain", "config_hash": cfg_hash, "variant": variant, "sweep": "tasks_mini",
                "seed": pseed, "checkpoints": json.dumps({"100": "/ckpt/final"})}
        run = tracking.RunLogger.start(client, "tasks_mini", f"{variant}-s{pseed}", tags, {"trainer.max_steps": "100"})
        run.finish("FINISHED")
        pretrained[(variant, pseed)] = run.run_id
    hashes = finetune_hash_of(ctx, client)
    for (variant, _), run_id in pretrained.items():
        for task, seed in itertools.product(ACCURACY, (0, 1)):
            log_finetune(client, tmp, run_id, variant, task, seed, rng, hashes)
    for task, seed in itertools.product(ACCURACY, (0, 1)):
        log_finetune(client, tmp, None, "scratch", task, seed, rng, hashes)
    return ctx, client, tmp, data


@pytest.fixture(scope="module")
def report(sweep):
    """The report written once from the store: (markdown, console lines, verdicts.json, the SweepData it read, its
    verdicts). Reading the store composes a config per fine-tuning job, so it is read once, by the report."""
    ctx, client, tmp, _ = sweep
    read = []
    console = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(console):
        mp.setattr(build, "collect", lambda *args: read.append(collect(*args)) or read[-1])
        path = build.write_report(ctx, client, tmp / "reports")
    (data,) = read
    final = data.scores[data.scores["final"].astype(bool)]
    results = verdicts.verdicts(ctx.spec, final, client, load_paper_results(), predictions=data.predictions)
    return (path.read_text(), console.getvalue().splitlines(),
            json.loads((tmp / "reports" / "tasks_mini" / holds.RECORD).read_text()), data,
            {v.claim.text: v for v in results})


def rows(text: str, section: str) -> list[list[str]]:
    """The table rows (cells) of a report section (its heading without the hashes)."""
    body = re.split(rf"^#+ {re.escape(section)}\n", text, flags=re.M)[1]
    body = re.split(r"^#+ ", body, flags=re.M)[0]
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in body.splitlines()
            if line.startswith("|") and not line.startswith("|---")]


def estimate(final, variant: str, task: str) -> float:
    """An arm's multi-bootstrap estimate on one task from its final scores: mean over groups of the mean over runs."""
    g = final[(final["variant"] == variant) & (final["task"] == task)]
    if variant == "scratch":
        return float(g["score"].mean())  # each run its own group
    return float(g.groupby("pretrain_seed")["score"].mean().mean())


def test_each_claim_has_a_verdict_per_task_beside_the_glue_one(report):
    text, _, record, data, results = report
    final = data.scores[data.scores["final"].astype(bool)]
    vs = results[VS]
    assert vs.tasks == ("cola", "mrpc") and list(vs.per_task) == ["cola", "mrpc"]
    # CoLA separates the arms, MRPC (the same accuracy) does not; the GLUE-2 mean holds.
    assert vs.verdict == "holds" and vs.per_task["cola"].verdict == "holds"
    assert vs.per_task["mrpc"].verdict == "unresolved at this scale"
    for t in ("cola", "mrpc"):
        d = vs.per_task[t].difference
        assert d.estimate == pytest.approx(estimate(final, "electra", t) - estimate(final, "bert", t))
        assert d.low < d.estimate < d.high and vs.per_task[t].examples == N
    per_task_estimates = [vs.per_task[t].difference.estimate for t in ("cola", "mrpc")]
    assert vs.difference.estimate == pytest.approx(np.mean(per_task_estimates))
    # BERT clears random init on CoLA and falls below it on MRPC: the GLUE mean cannot tell.
    floor = results[FLOOR.format("bert")]
    assert floor.verdict == "unresolved at this scale"
    assert {t: tv.verdict for t, tv in floor.per_task.items()} == {"cola": "holds", "mrpc": "reversed"}

    # The report: the GLUE headline first, then per task.
    head = {r[0]: r for r in rows(text, "Verdicts on the paper's claims")}
    assert head[VS][3] == "GLUE-2: CoLA, MRPC"
    # The mean holds on CoLA alone: left out, what remains (MRPC) no longer resolves it, and the verdict says so.
    assert re.fullmatch(r"holds; rests on CoLA \(without CoLA: unresolved, \+\d+\.\d \[-\d+\.\d, \+\d+\.\d\]\)",
                        head[VS][6]), head[VS][6]
    without = {(r[0], r[1]): r for r in rows(text, "Without each task")}
    assert without[(VS, "CoLA")][4] == "**unresolved at this scale**" and without[(VS, "MRPC")][4] == "holds"
    assert head[FLOOR.format("bert")][6] == ("unresolved at this scale; per task: holds on CoLA; reversed on MRPC")
    assert text.index("## Verdicts on the paper's claims") < text.index("### Per task")
    per_task = {(r[0], r[1]): r for r in rows(text, "Per task")[1:]}
    d = vs.per_task["cola"].difference
    assert per_task[(VS, "CoLA")][2:5] == [f"{d.estimate:+.2f} [{d.low:+.2f}, {d.high:+.2f}]",
                                           f"{d.sign_probability:.2f}", "holds"]
    assert per_task[(VS, "CoLA")][5] == "–"
    mrpc = per_task[(VS, "MRPC")]
    assert mrpc[4] == "unresolved at this scale"
    assert mrpc[5] == vs.per_task["mrpc"].seeds and re.fullmatch(r"≈\d+ x 2|none: dev noise ±\d+\.\d", mrpc[5]), mrpc

    # verdicts.json: the instrument, the skipped task and each claim's per-task results.
    assert record["tasks"] == ["cola", "mrpc"] and record["skipped_tasks"] == ["rte"]
    (claim,) = [c for c in record["claims"] if c["claim"] == VS]
    assert claim["per_task"]["cola"]["verdict"] == "holds" and claim["per_task"]["mrpc"]["examples"] == N
    assert claim["per_task"]["cola"]["estimate"] == pytest.approx(vs.per_task["cola"].difference.estimate, abs=1e-4)
    assert claim["per_task"]["mrpc"]["dev_noise"] == pytest.approx(
        1.96 * vs.per_task["mrpc"].difference.sd_examples, abs=1e-2)


def test_the_sensitivity_table_says_which_tasks_see_pre_training(report):
    text, _, record, data, _ = report
    table = rows(text, "Which tasks see pre-training")
    header, body = table[0], {r[0]: r for r in table[1:]}
    assert header[:6] == ["task", "metric", "dev examples", "electra median", "bert median", "scratch median"]
    assert header[6:] == ["electra - scratch: Δ [95% CI]", "bert - scratch: Δ [95% CI]",
                          "dev-set noise (electra - scratch / bert - scratch)", "fine-tuning run (median)"]
    assert list(body) == ["CoLA", "MRPC"]
    assert body["CoLA"][1:3] == ["Matthews corr.", str(N)] and body["MRPC"][1] == "accuracy"
    final = data.scores[data.scores["final"].astype(bool)]
    assert body["CoLA"][3] == f"{final[(final.variant == 'electra') & (final.task == 'cola')]['score'].median():.1f}"
    # The differences are the sanity verdicts' (the same numbers as verdicts.json), bold where resolved.
    by_claim = {c["claim"]: c["per_task"] for c in record["claims"]}
    cola = by_claim[FLOOR.format("electra")]["cola"]
    assert body["CoLA"][6] == f"{cola['estimate']:+.1f} [{cola['low']:+.1f}, {cola['high']:+.1f}] **holds**"
    assert body["MRPC"][7].endswith("**reversed**")
    noise = [by_claim[FLOOR.format(a)]["mrpc"]["dev_noise"] for a in ("electra", "bert")]
    assert body["MRPC"][8] == " / ".join(f"±{x:.1f}" for x in noise) and all(x > 0 for x in noise)
    assert re.fullmatch(r"\d+ s", body["CoLA"][9]), body["CoLA"][9]  # these runs last milliseconds
    assert ("standard deviation of that difference over bootstrap samples that resample only the task's dev "
            "examples") in text


def test_the_console_names_the_instrument_and_the_tasks_that_resolve_otherwise(sweep, report):
    _, _, _, data_dir = sweep
    _, out, *_ = report
    assert out[0].startswith("tasks_mini (scale ")
    assert "GLUE-2: CoLA, MRPC dev, median over fine-tuning seeds:" in out
    assert [line for line in out if "RTE" in line] == [f"skipped RTE: no local GLUE data under {data_dir / 'glue'}"]
    i = out.index("verdicts on GLUE-2: CoLA, MRPC (95% multi-bootstrap interval, points):")
    lines = out[i + 1:i + 4]
    assert re.fullmatch(r"  holds       ELECTRA beats BERT: \+\d+\.\d \[\+\d+\.\d, \+\d+\.\d\]; rests on CoLA "
                        r"\(without CoLA: unresolved, \+\d+\.\d \[-\d+\.\d, \+\d+\.\d\]\)", lines[0]), lines[0]
    (bert,) = [line for line in lines if "bert > scratch" in line]
    assert re.fullmatch(r"  unresolved  .*: [-+]\d+\.\d \[[-+]\d+\.\d, [-+]\d+\.\d\]; holds on CoLA; reversed on MRPC",
                        bert), bert
    assert out[-1].startswith("report: ")


def test_a_task_without_local_data_is_skipped_once(sweep, report, caplog, tmp_path):
    _, _, _, data_dir = sweep
    text, _, _, data, _ = report
    assert data.skipped == ["rte"] and not [p for p in data.problems if "rte" in p]
    missing = text.split("## Failed and missing runs")[1].split("## How this was produced")[0]
    (line,) = [x for x in missing.splitlines() if x.startswith("- ")]
    # (the report shows the data folder as its portable form)
    assert line.startswith("- Skipped RTE: no local GLUE data under `")
    assert ("/glue` (its train and dev TSVs), so it was never fine-tuned and every GLUE score here averages over "
            "CoLA, MRPC") in line
    assert text.count("Skipped RTE") == 2  # above the GLUE table and in the list of what is missing
    # The sweep's fine-tuning phase warns once, naming the task, and launches the others.
    floor = make_context(tmp_path, data_dir, FLOOR_SWEEP, name="tasks_floor")
    with caplog.at_level(logging.WARNING):
        result = run_finetune_phase(floor, tracking.setup(floor.tracking_uri, floor.experiment), [], dry_run=True)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("no local GLUE data for RTE: "), warnings
    assert result.jobs == 2 and "task=cola,mrpc" in result.command


def test_the_readme_table_names_each_presets_instrument(tmp_path, report):
    """A GLUE-2 record under one preset beside an old SST-2 one (written before instruments were recorded)."""
    record = report[2]
    old = json.loads((holds.REPO_ROOT / "reports" / "cpu_regime" / holds.RECORD).read_text())
    assert "tasks" not in old and "per_task" not in old["claims"][0]  # as committed
    new = {**record, "sweep": "cpu_regime_30k", "scale": None, "report": "cpu_regime_30k.md"}
    for name, r in (("cpu_regime", old), ("cpu_regime_30k", new)):
        (tmp_path / f"{name}.md").write_text("# report\n")
        (tmp_path / name).mkdir()
        (tmp_path / name / holds.RECORD).write_text(json.dumps(r))
    short = holds.summary_table(*holds.preset_records(tmp_path))
    assert short[0] == ("| claim | `cpu_regime` (SST-2) | Δ [95% interval] | `cpu_regime_30k` (GLUE-2: CoLA, MRPC) | "
                        "Δ [95% interval] | `cpu_long` (250M tokens, 30k vocabulary): verdict, Δ [95% interval] | "
                        "reports |")
    (vs,) = [line for line in short if line.startswith(f"| {VS} |")]
    # The header names its instrument: the cell does not repeat it; it names the task the verdict rests on.
    assert vs.split(" | ")[3] == "**holds** (rests on CoLA)", vs
    full = holds.table(*holds.preset_records(tmp_path))
    (vs,) = [line for line in full if line.startswith(f"| {VS} |")]
    cells = [c.strip() for c in vs.strip("|").split("|")]
    assert cells[3].endswith(" on SST-2") and cells[5].endswith(" on GLUE-2: CoLA, MRPC")
    assert cells[4] == "**holds**; per task: **holds** on CoLA; unresolved on MRPC"
    assert any(line.startswith("- [cpu_regime_30k.md](reports/cpu_regime_30k.md): RTE skipped (no local GLUE data): "
                               "its verdicts are on GLUE-2: CoLA, MRPC") for line in full)


def test_a_cell_fed_by_reports_on_other_tasks_names_each(tmp_path, report):
    """Two reports of one preset measure a claim on different task sets: the cell shows both, each named."""
    record = report[2]
    old = json.loads((holds.REPO_ROOT / "reports" / "table5_efficiency_cpu" / holds.RECORD).read_text())
    new = {**record, "sweep": "cpu_regime", "scale": None, "report": "cpu_regime.md"}
    for name, r in (("cpu_regime", new), ("table5_efficiency_cpu", old)):
        (tmp_path / f"{name}.md").write_text("# report\n")
        (tmp_path / name).mkdir()
        (tmp_path / name / holds.RECORD).write_text(json.dumps(r))
    short = holds.summary_table(holds.load_records(tmp_path))
    (vs,) = [line for line in short if line.startswith(f"| {VS} |")]
    cells = [c.strip() for c in vs.strip("|").split("|")]
    assert cells[1] == ("**holds** (rests on CoLA) ([cpu_regime.md](reports/cpu_regime.md)); **reversed** "
                        "([table5_efficiency_cpu.md](reports/table5_efficiency_cpu.md))"), cells
    assert re.fullmatch(r"\+\d+\.\d \[\+\d+\.\d, \+\d+\.\d\] on GLUE-2: CoLA, MRPC; -7\.7 \[-10\.6, -5\.0\] on SST-2",
                        cells[2]), cells[2]
    (sane,) = [line for line in short if line.startswith(f"| {holds.SANITY}")]
    assert " on SST-2" in sane and " on GLUE-2: CoLA, MRPC" in sane, sane


def test_the_spread_over_pre_training_seeds_is_each_seeds_glue_of_medians(report):
    text, _, _, data, _ = report
    table = rows(text, "Spread over pre-training seeds")
    assert table[0] == ["variant", "pre-training seed", "CoLA", "MRPC", "GLUE-2", "runs"]
    body = {(r[0], r[1]): r for r in table[1:]}
    # electra and bert have two pre-training seeds each; scratch, not pre-trained, has none and no row.
    assert list(body) == [("electra", "0"), ("electra", "1"), ("bert", "0"), ("bert", "1")]  # the sweep's order
    final = data.scores[data.scores["final"].astype(bool)]
    glue = {}
    for (variant, seed), row in body.items():
        runs = final[(final.variant == variant) & (final.pretrain_seed == int(seed))]
        medians = [runs[runs.task == t]["score"].median() for t in ("cola", "mrpc")]
        glue[(variant, seed)] = np.mean(medians)
        assert row[2:] == [f"{medians[0]:.1f}", f"{medians[1]:.1f}", f"**{glue[(variant, seed)]:.1f}**", "4"]
    span = abs(glue[("electra", "0")] - glue[("electra", "1")])
    assert f"electra {span:.1f}" in text.split("## Spread over pre-training seeds")[1].split("\n\n")[1]
