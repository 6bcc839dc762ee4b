"""What a sweep would cost before it runs: `dry_run=true` prints, beside the commands, the core-hours of the jobs it
would launch (those not finished in MLflow), per phase, and says what each figure rests on.

Pre-training: a job's steps still to run x its seconds per step, taken as the seconds per paper FLOP of the closest
step the bench timed x the job's own FLOPs per step (training/build.py `config_step_flops`, each stage of a
two-stage run apart). The bench's timed steps (bench/step_costs.py) are `reports/benchmarks_presets.json`, a step
at each named CPU preset and objective on one thread, and `reports/benchmarks_throughput.json`, the `cpu_regime`
step on a free core. The presets were timed side by side under one load, so their ratios hold but their seconds
need not: where the throughput file times a step of the same preset, objective, precision and attention path, the
presets' seconds are scaled by the ratio of the two. Closest: the same encoder shape (hidden size, layers, heads,
intermediate and embedding sizes; no estimate otherwise), then the same objective, the same main head, the same
generator, the nearest vocabulary, sequence length and batch. A job on a GPU, or of an encoder the bench never timed,
gets "no measured step cost" and counts in no total.

Fine-tuning: the median wall time of the finished fine-tuning runs of the same task in the sweep's MLflow experiment;
with none, no estimate. A sweep of several recipes prices each recipe's jobs apart: its training examples x epochs
(from the local data, as the job will read it) at the finished runs' median seconds per example and epoch. When the sweep pre-trains first, the jobs of checkpoints its pre-training has still to save
(and the random-init arms shaped like them) count too.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from hydra.utils import get_class

from electra_ablate.common import precision
from electra_ablate.finetuning import tasks as finetuning
from electra_ablate.sweep.compose import FINETUNE_GROUP, SweepContext, compose_session
from electra_ablate.sweep.jobs import Checkpoint
from electra_ablate.sweep.plan import PretrainState, saved_so_far
from electra_ablate.sweep.spec import REPO_ROOT
from electra_ablate.tracking import runs as tracking
from electra_ablate.training import build, run_folder

REPORTS = REPO_ROOT / "reports"
PRESETS_JSON, THROUGHPUT_JSON = "benchmarks_presets.json", "benchmarks_throughput.json"
BENCH_COMMAND = "python -m electra_ablate.bench --models tiny --sections presets --out reports/benchmarks_presets.md"
SHAPE_KEYS = ("embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


class Timed(NamedTuple):
    """One step the bench timed, its seconds on a free core (as far as the files say) and what it was."""

    label: str  # "cpu_regime_30k bert", "cpu_regime_30k data.max_seq_length=64 electra"
    objective: str
    heads: dict  # the objective's models/flops.py Heads: {"main": "mlm" | "disc", "generator": bool}
    model: dict
    vocab: int
    batch: int
    seq: int
    attention: str
    precision: str
    seconds: float
    flops: float


class StepCosts(NamedTuple):
    rows: list[Timed]
    sources: list[str]  # where the seconds come from, a line a file: the CPU, the load, the scaling


class PhaseCost(NamedTuple):
    phase: str
    jobs: int
    priced: int  # of them with a measured cost
    core_hours: float  # of the priced ones
    lines: list[str]


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _provenance(data: dict, name: str) -> str:
    """`name` (its CPU, one thread, its date, its load; the markdown it was converted from), and a warning when this
    machine's CPU is another."""
    load = data.get("load_start") or []
    said = [str(data.get("cpu")), "one thread", str(data.get("date"))]
    said += [f"load {load[0]:.1f} on {data.get('cores')} cores"] if load else []
    said += [f"converted from {data['converted_from']}"] if data.get("converted_from") else []
    here = precision.cpu_name()
    other = f"; this machine's CPU is {here}: expect other seconds" if data.get("cpu") and here != data["cpu"] else ""
    return f"{name} ({', '.join(said)}){other}"


def _timed(row: dict, seconds: float) -> Timed:
    label = " ".join([row.get("preset") or row.get("experiment", "?"), *row.get("overrides", []), row["objective"]])
    if row.get("kind") == "attention":
        label += f" ({row['attention']} attention)"
    return Timed(label, row["objective"], dict(row.get("heads", {})), dict(row["model"]), int(row["vocab"]),
                 int(row["batch"][0]), int(row["batch"][1]), str(row.get("attention", "")),
                 str(row.get("precision", "")), float(seconds), float(row["flops"]))


def load_step_costs(reports: Path | None = None) -> StepCosts | None:
    """The bench's timed steps (in `reports`, default the checkout's reports/), the presets' seconds scaled to a free
    core where the throughput file allows."""
    reports = REPORTS if reports is None else Path(reports)
    presets, throughput = _read(reports / PRESETS_JSON), _read(reports / THROUGHPUT_JSON)
    if presets is None and throughput is None:
        return None
    free = [r for r in (throughput or {}).get("rows", []) if r.get("kind") == "attention"]
    rows = [r for r in (presets or {}).get("rows", []) if r.get("kind") == "preset"]
    pairs = [(f, p) for f in free for p in rows
             if (p["preset"], p["overrides"], p["objective"], p["precision"], p["attention"])
             == (f["experiment"], [], f["objective"], f["precision"], f["attention"])]
    scale = statistics.mean(f["step_s"] / p["step_s"] for f, p in pairs) if pairs else 1.0
    parts = []
    if presets is not None:
        parts.append(_provenance(presets, f"reports/{PRESETS_JSON}"))
        if pairs:
            steps = ", ".join(f"{f['objective']} {f['step_s']:.3f} s against {p['step_s']:.3f} s" for f, p in pairs)
            parts[-1] += (f", its seconds x {scale:.3f}: the free-core steps of reports/{THROUGHPUT_JSON} at "
                          f"{pairs[0][1]['preset']} ({steps})")
        else:
            parts[-1] += ", its seconds as timed (no free-core step of the same shape to scale them by)"
    if throughput is not None:
        parts.append(_provenance(throughput, f"reports/{THROUGHPUT_JSON}"))
    timed = [_timed(r, r["step_s"] * scale) for r in rows] + [_timed(r, r["step_s"]) for r in free]
    return StepCosts(timed, parts)


# --- pre-training -------------------------------------------------------------------------------------------


def vocab_size(cfg) -> int | None:
    """The vocabulary a run of `cfg` trains with: the size it trains one of, else its vocabulary file's lines."""
    if int(cfg.data.get("train_vocab_size") or 0) > 0:
        return int(cfg.data.train_vocab_size)
    path = Path(str(cfg.data.get("vocab_file") or ""))
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line) if path.is_file() else None


def _distance(row: Timed, objective: str, heads, vocab: int, batch: int, seq: int, attention: str) -> tuple:
    """How far a timed step is from a job's: objective, main head, generator, attention path, then shape."""
    shape = abs(math.log(vocab / row.vocab)) + abs(math.log(seq / row.seq)) + abs(math.log(batch / row.batch))
    return (row.objective != objective, row.heads.get("main") != heads.main,
            row.heads.get("generator") != heads.generator, row.attention != attention, shape)


def price_pretrain(cfg, costs: StepCosts | None, done: int = 0) -> tuple[float | None, str]:
    """(seconds the job of `cfg` still needs from step `done` on, on one thread, or None; what that rests on)."""
    if costs is None:
        return None, f"no measured step cost: no reports/{PRESETS_JSON} ({BENCH_COMMAND} writes it)"
    if precision.on_gpu(cfg):
        return None, "no measured step cost for a GPU step (the bench timed CPU presets)"
    model = {k: int(cfg.model[k]) for k in SHAPE_KEYS}
    rows = [r for r in costs.rows if r.model == model]
    if not rows:
        return None, (f"no measured step cost for model {cfg.model.get('name', '?')} ({model['hidden_size']} wide, "
                      f"{model['num_hidden_layers']} layers): the bench timed encoders "
                      f"{', '.join(str(w) for w in sorted({r.model['hidden_size'] for r in costs.rows}))} wide only")
    vocab = vocab_size(cfg)
    if vocab is None:
        return None, f"no measured step cost: the vocabulary {cfg.data.get('vocab_file')} is not on this machine"
    heads = get_class(cfg.objective._target_).flops
    batch, seq = int(cfg.data.batch_size) * int(cfg.trainer.accumulate_grad_batches), int(cfg.data.max_seq_length)
    attention, objective = str(cfg.runtime.cpu_attention), str(cfg.objective.name)
    row = min(rows, key=lambda r: _distance(r, objective, heads, vocab, batch, seq, attention))
    flops = build.config_step_flops(cfg, vocab)
    stages = get_class(cfg.algorithm._target_).stage_steps(cfg)
    seconds, start = 0.0, 0
    for stage, steps in stages.items():  # the stages in order; `done` steps of them have run
        seconds += max(0, start + steps - max(done, start)) * flops[stage] * row.seconds / row.flops
        start += steps
    same = ((row.objective, row.vocab, row.batch, row.seq) == (objective, vocab, batch, seq)
            and list(stages) == ["joint"])
    how = f"{row.label}, timed" if same else (
        f"{row.label}'s seconds per FLOP x {flops['joint'] / row.flops:.2f}x its FLOPs per step"
        + ("" if row.objective == objective else f"; no {objective} step was timed"))
    run_precision = precision.for_config(cfg)
    if row.precision and row.precision != run_precision:
        how += f"; timed at {row.precision}, this job runs {run_precision}"
    return seconds, how


def resumes_at(state: PretrainState) -> int:
    """The step an unfinished run resumes from: its newest checkpoint's (0 without one); read without its tensors."""
    run = state.failed
    store = run.data.tags.get("store") if run is not None and state.run is None else None
    newest = run_folder.newest_checkpoint(Path(store) / "checkpoints") if store else None
    return (run_folder.checkpoint_step(newest) or 0) if newest is not None else 0


def pretrain_cost(ctx: SweepContext, states: Sequence[PretrainState], costs: StepCosts | None) -> PhaseCost:
    todo = [s for s in states if s.needs_pretraining]
    lines, total, priced = [], 0.0, 0
    with compose_session():
        for variant in dict.fromkeys(s.job.variant for s in todo):
            jobs = [s for s in todo if s.job.variant == variant]
            cfg = ctx.compose_pretrain(jobs[0].job)  # its jobs differ in their seed alone
            done = [resumes_at(s) for s in jobs]
            priced_jobs = [price_pretrain(cfg, costs, d) for d in done]
            steps = sum(s.max_steps - d for s, d in zip(jobs, done))
            left = f"{steps:,} steps" + (f" left of {sum(s.max_steps for s in jobs):,}" if any(done) else "")
            seconds = [p[0] for p in priced_jobs]
            if None in seconds:
                lines.append(f"{variant}: {len(jobs)} job(s), {left}: {priced_jobs[0][1]}")
                continue
            total, priced = total + sum(seconds), priced + len(jobs)
            lines.append(f"{variant}: {len(jobs)} job(s), {left} x {sum(seconds) / max(steps, 1):.2f} s = "
                         f"{sum(seconds) / 3600:.1f} core-hours ({priced_jobs[0][1]})")
    return PhaseCost("pretrain", len(todo), priced, total / 3600, lines)


# --- fine-tuning -------------------------------------------------------------------------------------------


def finetune_seconds(client, experiment: str) -> dict[str, list[tuple[float, float | None]]]:
    """(wall seconds, work) of the FINISHED fine-tuning runs in `experiment`, by task; the work is the training
    examples times the epochs the run recorded (None where it did not)."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return {}
    runs = client.search_runs([exp.experiment_id], max_results=50000, filter_string=(
        f"tags.{tracking.TAG_KIND} = 'finetune' and attributes.status = 'FINISHED'"))
    out: dict[str, list[tuple[float, float | None]]] = {}
    for r in runs:
        if r.info.start_time and r.info.end_time and r.data.tags.get("task"):
            out.setdefault(r.data.tags["task"], []).append(((r.info.end_time - r.info.start_time) / 1000,
                                                            _work(r.data.params)))
    return out


def _work(params) -> float | None:
    try:
        return float(params["resolved.train_examples"]) * float(params["task.epochs"])
    except (KeyError, ValueError):
        return None


def job_work(ctx: SweepContext, ckpt: Checkpoint, task: str) -> tuple[int, int] | None:
    """(training examples, epochs) of a fine-tuning job as its config gives them, the examples counted in the local
    data as the run will read them (cut, pairs of an unordered task doubled); None without local data."""
    ctx.write_finetune_config(ckpt)
    cfg = ctx.compose_finetune([ctx.searchpath, f"+{FINETUNE_GROUP}={ckpt.config_name}", f"task={task}"])
    (spec, task_cfg), = finetuning.selected_tasks(cfg)
    cfg, task_cfg = finetuning.for_task(cfg, spec.name, task_cfg)
    if cfg.glue_data.source != "tsv":
        return None
    try:
        data = finetuning.load_task_data(cfg, spec)
    except (OSError, ValueError):
        return None
    return len(data["train"]), int(task_cfg.epochs)


def future_finetune_jobs(ctx: SweepContext, states: Sequence[PretrainState],
                         tasks: Sequence[str]) -> dict[tuple[str, str | None], int]:
    """Fine-tuning jobs, by (task, recipe), of the checkpoints the pre-training still to run will save (and of the
    random-init arms shaped like a run that has saved none yet: plan.random_init_checkpoints), under each of the
    sweep's recipes (those of `recipe_checkpoints` at the fractions they take)."""
    spec = ctx.spec
    out: dict[tuple[str, str | None], int] = {}
    for recipe in spec.recipes or (None,):
        per_task = 0
        for state in (s for s in states if s.needs_pretraining):
            saved = {c.fraction for c in saved_so_far(state, spec.checkpoints)}
            per_task += sum(1 for f in spec.checkpoints if f not in saved and spec.fine_tunes(recipe, f)) * len(spec.seeds)
            if not saved and spec.fine_tunes(recipe, 1.0):
                shaped = sum(1 for v in spec.variants if v.random_init_of == state.job.variant)
                per_task += shaped * len(spec.seeds)
        out.update({(t, recipe): per_task for t in tasks if per_task})
    return out


def finetune_cost(ctx: SweepContext, client, todo: Sequence[tuple[Checkpoint, str, int]],
                  future: dict[tuple[str, str | None], int]) -> PhaseCost:
    """Each task's jobs x the median wall time of its finished runs; where the sweep lists several recipes, each
    recipe's jobs of a task apart, priced by their work (examples x epochs) at the finished runs' median seconds
    per example and epoch, since recipes differ in exactly that."""
    measured = finetune_seconds(client, ctx.experiment)
    lines, total, priced, jobs = [], 0.0, 0, 0
    recipes = ctx.spec.recipes or (None,)
    for task in ctx.spec.tasks:
        for recipe in recipes:
            mine = [c for c, t, _ in todo if t == task and c.recipe == recipe]
            now, later = len(mine), future.get((task, recipe), 0)
            if not now + later:
                continue
            jobs += now + later
            label = task if recipe is None else f"{task} ({recipe})"
            count = f"{now + later} job(s)" + (f", {later} of them of checkpoints pre-training has still to save"
                                               if later else "")
            runs = measured.get(task, [])
            if not runs:
                lines.append(f"{label}: {count}: no measured cost (no fine-tuning run of {task} has finished in MLflow "
                             f"experiment {ctx.experiment})")
                continue
            each, why = _finetune_each(ctx, task, recipe, mine, runs)
            total, priced = total + each * (now + later), priced + now + later
            lines.append(f"{label}: {count} x {each:.0f} s = {each * (now + later) / 3600:.1f} core-hours ({why})")
    return PhaseCost("finetune", jobs, priced, total / 3600, lines)


def _finetune_each(ctx: SweepContext, task: str, recipe: str | None, mine: Sequence[Checkpoint],
                   runs: Sequence[tuple[float, float | None]]) -> tuple[float, str]:
    """The seconds of one job and what they rest on."""
    median = (statistics.median(s for s, _ in runs),
              f"the median of {len(runs)} finished {task} run(s) in MLflow experiment {ctx.experiment}")
    rates = [s / w for s, w in runs if w]
    if recipe is None or not rates:
        return median
    v = ctx.spec.variants[0]  # jobs of checkpoints still to be saved: any checkpoint's config has the recipe's work
    stand_in = (Checkpoint(v.label, None, None, None, True, None, recipe=recipe) if v.pretrained
                else Checkpoint(v.label, 0, "0" * 32, 1, True, 1.0, v.random_init_of is not None, recipe=recipe))
    with compose_session():
        work = job_work(ctx, mine[0] if mine else stand_in, task)
    if work is None:
        return median
    rate = statistics.median(rates)
    return rate * work[0] * work[1], (f"{work[0]:,} examples x {work[1]} epochs at {rate * 1000:.2f} ms an example "
                                      f"and epoch, the median of {len(rates)} finished {task} run(s) in MLflow "
                                      f"experiment {ctx.experiment}")


def describe(costs: Sequence[PhaseCost], step_costs: StepCosts | None) -> str:
    """The dry run's cost block: each phase's total and lines, where the step costs come from, the total."""
    out = ["cost of what this sweep would run (one thread a job; finished work skipped):"]
    for c in costs:
        head = f"  {c.phase}: {c.jobs} job(s)"
        if c.priced:
            head += f", about {c.core_hours:.1f} core-hours" + (f" for {c.priced} of them" if c.priced < c.jobs else "")
        out += [head] + [f"    {line}" for line in c.lines]
    if any(c.phase == "pretrain" and c.jobs for c in costs) and step_costs is not None:
        out += [f"  step costs: {line}" for line in step_costs.sources]
    jobs, priced = sum(c.jobs for c in costs), sum(c.priced for c in costs)
    total = f"  total: about {sum(c.core_hours for c in costs):.1f} core-hours"
    out.append(total + (f" for {priced} of {jobs} job(s); the other {jobs - priced} have no measured cost (above)"
                        if priced < jobs else f" for {jobs} job(s)"))
    return "\n".join(out)
