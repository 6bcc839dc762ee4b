"""The runs of one sweep's grid, read from its MLflow experiment: pre-training runs found by config hash,
fine-tuning runs by (pre-training run, step, task, seed), newest finished first, each with whether it learned
anything (report/predictions.py); failed and missing jobs as one line each (a task without local GLUE data that
never ran: the task once, as skipped); pre-training FLOPs at each checkpoint counted as the paper does
(electra_ablate.models.flops).

Note 1: a task without local GLUE data is *skipped* only in a report read from a store (the HF loader has every
task); one rendered from a results bundle does not depend on the reader's data folder, so there a job without a
run is missing whatever data the machine has.

A finished run whose score is undefined (NaN: the Spearman correlation of constant STS-B predictions) is a
degenerate run, not a failure: it counts with score 0 (no ranking information, as one class gets an MCC of
0), so that dropping it cannot raise its arm's median.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from electra_ablate.models.checkpoint import CheckpointError, read_info
from electra_ablate.report import multibootstrap as mb
from electra_ablate.report.predictions import is_degenerate, load_run_predictions
from electra_ablate.sweep.compose import SweepContext
from electra_ablate.sweep.jobs import Checkpoint, FinetuneKey
from electra_ablate.sweep.plan import (PretrainState, available_tasks, checkpoints_of, finetune_hashes, finetune_key,
                                       key_of, pretrain_states, random_init_checkpoints, saved_so_far, under_recipes)
from electra_ablate.tracking import runs as tracking


@dataclass
class SweepData:
    ctx: SweepContext
    pretrain: list[PretrainState]
    checkpoints: list[Checkpoint]  # every checkpoint the sweep fine-tunes (of finished pre-training runs)
    scores: pd.DataFrame  # one row per finished fine-tuning job of the grid (`degenerate`: True/False/None)
    problems: list[str]  # failed and missing jobs, one line each
    frame: pd.DataFrame  # every run of the experiment (tracking.runs_frame)
    flops: dict[tuple[str, int], float] = field(default_factory=dict)  # (pretrain run, step) -> FLOPs
    # run id -> dev predictions (None: no artifact), for the final checkpoints' runs (the verdicts' input)
    predictions: dict[str, mb.RunPredictions | None] = field(default_factory=dict)
    # each grid job's pre-training run's logged curves, finished or as far as it got (pretraining_curves)
    curves: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=CURVE_COLUMNS))
    # tasks of the sweep without local GLUE data and without a finished run: never fine-tuned, so every GLUE score
    # of the report averages over the other tasks (said once, not as a missing job per seed); and where they were
    # looked for
    skipped: list[str] = field(default_factory=list)
    glue_dir: str | None = None
    recipe: str | None = None  # the fine-tuning recipe of `scores` where the sweep lists several (spec.recipes)

    @property
    def final(self) -> pd.DataFrame:
        """The rows of `scores` at each arm's final checkpoint (the ones verdicts and the main table read)."""
        return final_rows(self.scores)

    @property
    def intermediate(self) -> bool:
        """Whether the sweep fine-tunes checkpoints before the last (the report then shows learning curves)."""
        return has_intermediate(self.checkpoints)


def final_rows(scores: pd.DataFrame) -> pd.DataFrame:
    """The rows of a scores frame at each arm's final checkpoint."""
    return scores[scores["final"].astype(bool)] if len(scores) else scores


def has_intermediate(checkpoints: Sequence[Checkpoint]) -> bool:
    return any(not c.arm_final for c in checkpoints)


def _tags(row: pd.Series) -> dict[str, str]:
    return {c[len("tags."):]: str(v) for c, v in row.items() if c.startswith("tags.") and isinstance(v, str)}


def _current(rows: Sequence[pd.Series], config_hashes: Sequence[str]) -> pd.Series | None:
    """The newest of `rows` (newest first) run with any of `config_hashes` (tracking.identity_hashes)."""
    return next((r for r in rows if r.get(f"tags.{tracking.TAG_CONFIG_HASH}") in config_hashes), None)


def _checkpoints(spec, states: Sequence[PretrainState]) -> tuple[list[Checkpoint], list[str]]:
    """The checkpoints the sweep fine-tunes (a run still going: those it has saved), and a line per pre-training
    job that is not finished or lacks one."""
    problems: list[str] = []
    checkpoints: list[Checkpoint] = [Checkpoint(v.label, None, None, None, True, None)
                                     for v in spec.variants if v.pretrained is not None]
    for s in states:
        what = f"pre-training {s.job.variant} seed {s.job.seed} (config {s.config_hash})"
        if s.run is not None:
            found, missing = checkpoints_of(s, spec.checkpoints)
            checkpoints += found
            problems += [f"{m}: its fine-tuning jobs were not run" for m in missing]
        elif s.failed is not None:
            found = saved_so_far(s, spec.checkpoints)
            checkpoints += found
            done = (f"fine-tuned only at the steps it saved ({', '.join(str(c.step) for c in found)} of "
                    f"{s.max_steps})" if found else "not fine-tuned")
            problems.append(f"{what}: {s.failed.info.status} (MLflow run {s.failed.info.run_id}); {done}")
        else:
            problems.append(f"{what}: missing (no MLflow run); not fine-tuned")
    return checkpoints + random_init_checkpoints(spec, checkpoints), problems


def _by_key(spec, checkpoints: Sequence[Checkpoint], hashes: dict) -> dict[FinetuneKey, set[str]]:
    """Every config hash a job of the grid may have, by its key: those of all the sweep's recipes together."""
    out: dict[FinetuneKey, set[str]] = {}
    for c in checkpoints:
        for task in spec.tasks:
            for seed in spec.seeds:
                out.setdefault(key_of(c, task, seed), set()).update(hashes[(c.config_name, task, seed)])
    return out


def collect(ctx: SweepContext, client, recipe: str | None = None) -> SweepData:
    """The sweep's runs; where it lists several fine-tuning recipes, those of `recipe` (default: the first)."""
    spec = ctx.spec
    frame = tracking.runs_frame(client, ctx.experiment)
    states = pretrain_states(ctx, client)
    checkpoints, problems = _checkpoints(spec, states)
    recipe = (recipe or spec.recipes[0]) if spec.recipes else None
    every = under_recipes(spec, checkpoints)  # a run of another of the sweep's recipes is not an outdated one
    checkpoints = under_recipes(spec, checkpoints, [recipe])

    ft = frame[frame.get("tags.kind", pd.Series(dtype=str)) == "finetune"] if len(frame) else frame
    ft = ft.sort_values("start_time", ascending=False) if len(ft) else ft
    # Newest first, every run of a key: only a run of the fine-tuning config the sweep asks for now counts (its
    # config_hash tag, as sweep.plan counts them), so a changed default never reports the old config's scores.
    done: dict[FinetuneKey, list[pd.Series]] = {}
    failed: dict[FinetuneKey, list[pd.Series]] = {}
    for _, row in ft.iterrows():
        key = finetune_key(_tags(row))
        if key is None:
            continue
        finished = row["status"] == "FINISHED" and (not is_missing(row.get("metrics.final/score"))
                                                    or "final/score" in client.get_run(row["run_id"]).data.metrics)
        (done if finished else failed).setdefault(key, []).append(row)

    hashes = finetune_hashes(ctx, every) if checkpoints and spec.tasks and spec.seeds else {}
    sweeps_own = _by_key(spec, every, hashes)
    available = available_tasks(ctx) if spec.tasks and not ctx.bundle else None  # None: any task can run (note 1)
    no_data: dict[str, list[str]] = {}  # task without local data -> its missing jobs' lines
    records = []
    predictions: dict[str, mb.RunPredictions | None] = {}
    for c in checkpoints:
        for task in spec.tasks:
            absent, superseded = [], []
            for seed in spec.seeds:
                key, want = key_of(c, task, seed), hashes[(c.config_name, task, seed)]
                row = _current(done.get(key, []), want)
                if row is None:
                    bad = _current(failed.get(key, []), want)
                    if bad is not None:
                        problems.append(f"fine-tuning {c.config_name} {task} seed {seed}: {bad['status']} "
                                        f"(MLflow run {bad['run_id']})")
                    elif _current(done.get(key, []), sweeps_own[key]) is None and done.get(key):
                        superseded.append(seed)
                    else:
                        absent.append(seed)
                    continue
                undefined = is_missing(row.get("metrics.final/score"))
                preds = load_run_predictions(client, row["run_id"], task)
                if c.arm_final:
                    predictions[row["run_id"]] = preds
                records.append({
                    "variant": c.variant, "pretrain_seed": c.pretrain_seed, "pretrain_run": c.run_id,
                    "step": c.step, "fraction": 1.0 if c.random_init else c.fraction, "final": c.arm_final,
                    "task": task, "seed": seed,
                    "score": 0.0 if undefined else float(row["metrics.final/score"]), "run_id": row["run_id"],
                    "degenerate": is_degenerate(task, preds, undefined),
                })
            if absent:
                line = (f"fine-tuning {c.config_name} {task} seed{'s' if len(absent) > 1 else ''} "
                        f"{', '.join(map(str, absent))}: missing (no MLflow run)")
                if available is not None and task not in available:
                    no_data.setdefault(task, []).append(line)
                else:
                    problems.append(line)
            if superseded:
                problems.append(f"fine-tuning {c.config_name} {task} seed{'s' if len(superseded) > 1 else ''} "
                                f"{', '.join(map(str, superseded))}: finished only with another fine-tuning config "
                                "(not counted); run the sweep again to fine-tune with the current one")
    ran = {r["task"] for r in records}
    skipped = [t for t in spec.tasks if t in no_data and t not in ran]
    problems += [line for t, lines in no_data.items() if t in ran for line in lines]  # its data went after some ran
    scores = pd.DataFrame.from_records(records, columns=[
        "variant", "pretrain_seed", "pretrain_run", "step", "fraction", "final", "task", "seed", "score", "run_id",
        "degenerate"])
    data = SweepData(ctx, states, checkpoints, scores, problems, frame, predictions=predictions,
                     curves=pretraining_curves(client, states), skipped=skipped,
                     glue_dir=str(ctx.compose_finetune().glue_data.dir) if skipped else None, recipe=recipe)
    if "learning_curves" in spec.figures or data.intermediate:
        data.flops = checkpoint_flops(client, states, checkpoints)
    return data


CURVE_COLUMNS = ["variant", "pretrain_seed", "run_id", "finished", "metric", "step", "flops", "value"]
# What the pre-training curves show, by the name a report gives it: the masked-LM accuracy at [MASK] positions
# (the encoder's where it is a masked LM, the generator's where there is one; copying the input scores nothing
# there), the whole masked-LM accuracy for runs logged before the split, and the discriminator's ROC AUC.
CURVE_METRICS = {"mlm_accuracy_at_mask": ("train/gen_masked_lm_accuracy_at_mask", "train/masked_lm_accuracy_at_mask"),
                 "mlm_accuracy": ("train/gen_masked_lm_accuracy", "train/masked_lm_accuracy"),
                 "disc_auc": ("train/disc_auc",)}


def pretraining_curves(client, states: Sequence[PretrainState]) -> pd.DataFrame:
    """The logged training-window curves of each grid job's pre-training run, against its steps and FLOPs
    (train/flops at the same step): its finished run, else its newest unfinished one (running, or stopped and
    resumable), as far as it got. One row per (run, metric, step), metric a key of CURVE_METRICS, the first of
    its MLflow keys the run has (the generator's accuracy before the encoder's, which for ELECTRA is the
    generator's anyway)."""
    rows = []
    for s in states:
        run = s.run if s.run is not None else s.failed
        if run is None:
            continue
        run_id, logged = run.info.run_id, run.data.metrics
        flops = dict((m.step, m.value) for m in client.get_metric_history(run_id, "train/flops"))
        for name, keys in CURVE_METRICS.items():
            key = next((k for k in keys if k in logged), None)
            if key is None:
                continue
            for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step):
                rows.append((s.job.variant, s.job.seed, run_id, s.run is not None, name, m.step,
                             flops.get(m.step, math.nan), m.value))
    return pd.DataFrame.from_records(rows, columns=CURVE_COLUMNS)


def is_missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def checkpoint_flops(client, states: Sequence[PretrainState], checkpoints: Sequence[Checkpoint]) -> dict:
    """Pre-training FLOPs at each checkpoint: the run's train/flops at that step (interpolated between logged
    steps), else what the checkpoint recorded when it was saved (a run still going has not logged its latest
    steps yet), else flops/total scaled by step / max_steps."""
    out = {}
    runs = {s.latest.info.run_id: s for s in states if s.latest is not None}
    for c in checkpoints:
        if c.run_id is None or c.run_id not in runs:
            continue
        history = sorted((m.step, m.value) for m in client.get_metric_history(c.run_id, "train/flops"))
        if history and history[0][0] <= c.step <= history[-1][0]:
            steps, values = zip(*history)
            out[(c.run_id, c.step)] = float(np.interp(c.step, steps, values))
            continue
        state = runs[c.run_id]
        run = state.latest
        saved = json.loads(run.data.tags.get("checkpoints", "{}")).get(str(c.step))
        recorded = _recorded_flops(saved) if saved else None
        if recorded is not None:
            out[(c.run_id, c.step)] = recorded
        elif "flops/total" in run.data.metrics:
            out[(c.run_id, c.step)] = run.data.metrics["flops/total"] * c.step / max(c.step, state.max_steps)
    return out


def _recorded_flops(directory: str) -> float | None:
    """The FLOPs a pre-trained directory recorded when it was saved (training.pretraining.Exports), if readable."""
    try:
        flops = read_info(directory).get("flops")
    except (CheckpointError, OSError, ValueError):
        return None
    return float(flops) if flops is not None else None
