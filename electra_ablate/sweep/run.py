"""Run one paper comparison end to end: `python -m electra_ablate.sweep sweep=quick [scale=small]
[hydra/launcher=joblib]`.

A sweep file (sweeps/<name>.yaml, read by sweep.spec) lists the variants of one paper table or figure, the
seeds, the GLUE tasks and a scale knob. The runner does three phases, each an ordinary Hydra multirun so that
any Hydra launcher places the jobs (basic = one after the other, joblib = in parallel on this machine,
submitit = SLURM, Ray):

1. pre-train every variant x pre-training seed: `python -m electra_ablate.pretrain -m +sweep_variant=<labels>
   seed=<seeds>`, each variant a generated config (sweep.compose);
2. fine-tune every (pre-training run, checkpoint, task, seed): `python -m electra_ablate.finetune -m
   +sweep_checkpoint=<checkpoints> task=<tasks> seed=<seeds>`, one generated config per checkpoint (a run
   not finished yet contributes the intermediate checkpoints it has saved: `phases=[finetune]` beside a long
   pre-training fills its learning curve as it goes);
3. write the report: the callable `report_writer` of conf/sweep.yaml names (electra_ablate.report's
   `write_report`). The report reads runs through this package's spec and plan, so the runner is handed it
   rather than importing it.

Work already done is found in MLflow (sweep.plan) and not launched again; the entry points also skip finished
work themselves. A failed job ends its MLflow run FAILED and the multirun goes on with the others (Hydra's
launchers run every job of a batch, then report the first failure); the report lists failed and missing jobs,
and the sweep exits non-zero when a phase's multirun did (a job failed or could not run).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig

from electra_ablate.common import cli, console, stops
from electra_ablate.glue import tasks as glue
from electra_ablate.sweep import cost
from electra_ablate.sweep import precision as sweep_precision
from electra_ablate.sweep.compose import FINETUNE_GROUP, PRETRAIN_GROUP, SweepContext, context_from_cfg, validate
from electra_ablate.sweep.launch import check_launcher, launch, launcher_overrides, multirun_command, shell_join
from electra_ablate.sweep.plan import available_tasks, finetune_plan, missing_exports, pretrain_states
from electra_ablate.sweep.progress import PhaseConsole
from electra_ablate.sweep.provenance import environment, process, process_gone
from electra_ablate.sweep.spec import REPO_ROOT, SweepError
from electra_ablate.tracking import attempts
from electra_ablate.tracking import runs as tracking
from electra_ablate.tracking.store import IdentityLock, RunBusyError

log = logging.getLogger(__name__)


class ReportWriter(Protocol):
    """Writes <report_dir>/<sweep>.md from the sweep's runs and returns its path; `running_sweep_run` is the
    sweep's own MLflow run, still RUNNING, and `running_wall_time` its seconds so far; with `echo`, prints what
    the report says (its main table and verdicts) to the console; `bootstrap_seed` draws every bootstrap from
    another seed than the committed reports' 0."""

    def __call__(self, ctx: SweepContext, client, report_dir: Path, running_sweep_run: str | None = None,
                 running_wall_time: float | None = None, echo: bool = True,
                 bootstrap_seed: int | None = None) -> Path: ...


@dataclass
class PhaseResult:
    name: str
    jobs: int = 0  # jobs launched (0 = everything was already done)
    command: list[str] = field(default_factory=list)
    returncode: int = 0
    seconds: float = 0.0
    planned: list = field(default_factory=list)  # pre-training: every job's PretrainState; fine-tuning: its jobs


@dataclass
class SweepResult:
    phases: list[PhaseResult]
    report: Path | None
    cost: str | None = None  # a dry run: what the jobs it would launch cost (sweep/cost.py)


    @property
    def failure(self) -> str | None:
        """Why the sweep did not do all its work (a phase's multirun exited non-zero: a job failed or could not
        run, e.g. its identity was busy), else None. The sweep command then exits non-zero."""
        failed = [r for r in self.phases if r.returncode]
        if not failed:
            return None
        def what(code: int) -> str:  # 128 + a signal: one of its jobs was stopped (a scheduler's time limit)
            return f" (a job was stopped by {stops.name(code - 128)})" if code - 128 in stops.SIGNALS else ""

        return ("; ".join(f"the {r.name} multirun exited with {r.returncode}{what(r.returncode)}" for r in failed)
                + ": a job failed, was stopped or could not run (the multirun's output and the report say which); "
                "run the same command again once it is fixed: finished work is skipped")


def run_pretrain_phase(ctx: SweepContext, client, launcher: Sequence[str], dry_run: bool) -> PhaseResult:
    states = pretrain_states(ctx, client)
    todo = [s.job for s in states if s.needs_pretraining]
    result = PhaseResult("pretrain", jobs=len(todo), planned=states)
    if not todo:
        print(f"pretrain: 0 job(s) launched (all {len(states)} already finished)", flush=True)
        return result
    # The multirun is a product; the smallest product covering the missing jobs (finished ones are skipped
    # by the entry point itself).
    # A variant that runs fewer seeds (its own `pretrain_seeds`) ends at once for the others (training/pretraining.py).
    # Seed-major order, so that a launcher with one worker per core starts each seed's variants side by side
    # and a long arm of one seed runs beside the other seeds' arms rather than alone at the end.
    labels = sorted({j.variant for j in todo}, key=[v.label for v in ctx.spec.variants].index)
    seeds = sorted({j.seed for j in todo})
    sweep_dir = ctx.workdir / "multirun" / f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_pretrain"
    command = multirun_command(
        "electra_ablate.pretrain", [f"seed={','.join(map(str, seeds))}", f"+{PRETRAIN_GROUP}={','.join(labels)}"],
        ctx, launcher, ctx.pretrain_overrides, sweep_dir)
    return _launch_phase(result, command, dry_run, "pre-training multirun exited with %d: some jobs failed "
                                                   "(listed in the report); going on",
                         PhaseConsole("pretrain", len(labels) * len(seeds), sweep_dir / "console.log", todo=len(todo)))


def run_finetune_phase(ctx: SweepContext, client, launcher: Sequence[str], dry_run: bool) -> PhaseResult:
    todo, _, notes = finetune_plan(ctx, client)
    for note in notes:
        log.warning("%s", note)
    available = available_tasks(ctx)
    if available is not None:
        absent = sorted({t for _, t, _ in todo} - set(available))
        if absent:
            log.warning("no local GLUE data for %s: its fine-tuning jobs are not launched, and the report averages "
                        "its GLUE score over the other tasks, naming the skipped ones once (glue_data.source=hf reads "
                        "them from the Hugging Face hub)", ", ".join(glue.get_task(t).dir_name for t in absent))
            todo = [j for j in todo if j[1] in available]
    absent = missing_exports(ctx, client, todo)
    if absent:
        said = (f"{len(todo)} fine-tuning job(s) need pre-trained directories this store lacks (their runs were "
                f"imported from a results bundle without weights): {absent[0]}" + (f" and {len(absent) - 1} more"
                if len(absent) > 1 else "") + "; copy those folders from the store the runs came from, or import "
                "the bundle into that store (cpu_long's: python ../shared/cpu_long/restore.py into a new folder)")
        if not dry_run:
            raise SweepError(said)
        print(f"finetune: would be refused: {said}", flush=True)
    result = PhaseResult("finetune", jobs=len(todo), planned=todo)
    if not todo:
        print("finetune: 0 job(s) launched (nothing left to run)", flush=True)
        return result
    ckpts = sorted({c for c, _, _ in todo}, key=lambda c: c.config_name)
    for c in ckpts:
        ctx.write_finetune_config(c)
    tasks = [t for t in ctx.spec.tasks if t in {t for _, t, _ in todo}]
    seeds = sorted({s for _, _, s in todo})
    sweep_dir = ctx.workdir / "multirun" / f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_finetune"
    command = multirun_command(
        "electra_ablate.finetune",
        [f"+{FINETUNE_GROUP}={','.join(c.config_name for c in ckpts)}", f"task={','.join(tasks)}",
         f"seed={','.join(map(str, seeds))}"],
        ctx, launcher, ctx.finetune_overrides, sweep_dir)
    return _launch_phase(result, command, dry_run,
                         "fine-tuning multirun exited with %d: some jobs failed (listed in the report)",
                         PhaseConsole("finetune", len(ckpts) * len(tasks) * len(seeds), sweep_dir / "console.log",
                                      todo=len(todo)))


def _launch_phase(result: PhaseResult, command: list[str], dry_run: bool, failed: str,
                  watch: PhaseConsole) -> PhaseResult:
    """Run a phase's multirun `command`, timed, into `result`, `watch` showing its progress; a non-zero exit is
    logged (`failed` % code)."""
    result.command = command
    tic = time.perf_counter()
    result.returncode = launch(command, dry_run, watch)
    result.seconds = time.perf_counter() - tic
    if result.returncode:
        log.warning(failed, result.returncode)
    return result


def run_sweep(
    ctx: SweepContext,
    launcher: Sequence[str] = (),
    phases: Sequence[str] = ("pretrain", "finetune", "report"),
    report_dir: Path | None = None,
    dry_run: bool = False,
    command: str = "",
    write_report: ReportWriter | None = None,
    precision: str = "auto",
) -> SweepResult:
    """Run the phases; returns what was launched and the report's path. The sweep itself is one MLflow run
    (kind=sweep) holding its command, launcher, phases, environment, machine, wall time and the one precision
    every job trains in (`precision`: auto keeps the sweep's recorded one; sweep/precision.py): the report's
    provenance."""
    unknown = sorted(set(phases) - {"pretrain", "finetune", "report"})
    if unknown:
        raise SweepError(f"unknown phase(s) {unknown}; phases are pretrain, finetune, report")
    if "report" in phases and write_report is None and not dry_run:
        raise SweepError("the report phase needs a report writer (report_writer in conf/sweep.yaml)")
    check_launcher(launcher)
    validate(ctx)
    client = tracking.setup(ctx.tracking_uri, ctx.experiment)
    env = environment()
    ctx, chosen = sweep_precision.applied(ctx, sweep_precision.choose(client, ctx, precision))
    record = None
    if not dry_run:
        for run_id in retire_dead_sweeps(client, ctx):
            log.info("sweep record %s was left RUNNING by a process that has ended: marked KILLED", run_id)
        record = tracking.RunLogger.start(
            client, ctx.experiment, f"sweep-{ctx.spec.scale_name}",
            tags={tracking.TAG_KIND: "sweep", tracking.TAG_SWEEP: ctx.spec.name, "scale": ctx.spec.scale_name,
                  "command": command or f"python -m electra_ablate.sweep sweep={ctx.spec.name}",
                  "launcher": " ".join(launcher) or "hydra/launcher=basic", "git_commit": tracking.git_commit(),
                  **env, **process(), **attempts.hardware(), attempts.TAG_PRECISION: chosen.precision,
                  attempts.TAG_PRECISION_HOW: chosen.how})
    results: list[PhaseResult] = []
    report_path = None
    tic = time.perf_counter()
    phase = "pretrain"
    with stops.handled():  # SIGTERM stops the sweep as Ctrl-C does: its record ends KILLED (common/stops.py)
        try:
            if "pretrain" in phases:
                results.append(run_pretrain_phase(ctx, client, launcher, dry_run))
            phase = "finetune"
            if "finetune" in phases:
                results.append(run_finetune_phase(ctx, client, launcher, dry_run))
            phase = "report"
            if record is not None:
                record.set_tags({f"phase.{r.name}": json.dumps({"jobs": r.jobs, "returncode": r.returncode,
                                                                "seconds": round(r.seconds, 1),
                                                                "command": shell_join(r.command)}) for r in results})
                record.log_metrics({"wall_time_s": time.perf_counter() - tic}, step=0)
            if "report" in phases and not dry_run:
                report_path = write_report(ctx, client, report_dir or REPO_ROOT / "reports",
                                           running_sweep_run=record.run_id if record else None,
                                           running_wall_time=time.perf_counter() - tic)
                if record is not None and report_path is not None:  # the report and its figures, with the sweep's run
                    folder = Path(report_path).with_suffix("")
                    record.record_files([Path(report_path), *([folder] if folder.is_dir() else [])], "report")
        except BaseException as error:  # Ctrl-C or SIGTERM: KILLED; anything else: FAILED, the reason recorded
            if record is not None:
                retired = retire_interrupted(client, ctx)
                for run_id in retired:
                    log.info("run %s was stopped before it could end itself: marked KILLED (resumed by the next run "
                             "of the sweep)", run_id)
                status, reason = tracking.end_status(error)
                record.finish(status, reason)
                if status == "KILLED" and stops.received() is not None:
                    stops.report(f"sweep {ctx.spec.name} (scale {ctx.spec.scale_name}) in its {phase} phase (MLflow "
                                 f"run {record.run_id}) is recorded KILLED, with the runs it was running; the same "
                                 "command resumes it: finished work is skipped, stopped pre-training resumes from "
                                 "its checkpoints")
            raise
    result = SweepResult(results, report_path, dry_run_cost(ctx, client, results) if dry_run else None)
    if record is not None:
        record.log_metrics({"wall_time_s": time.perf_counter() - tic}, step=1)
        record.finish("FAILED", result.failure) if result.failure else record.finish("FINISHED")
    return result


def dry_run_cost(ctx: SweepContext, client, results: Sequence[PhaseResult]) -> str:
    """What the phases of a dry run would cost (sweep/cost.py): pre-training's jobs, fine-tuning's, and those of the
    checkpoints that pre-training would save first."""
    step_costs = cost.load_step_costs()
    phases = {r.name: r for r in results}
    out = []
    if "pretrain" in phases:
        out.append(cost.pretrain_cost(ctx, phases["pretrain"].planned, step_costs))
    if "finetune" in phases:
        future = {}
        if "pretrain" in phases:
            available = available_tasks(ctx)
            tasks = [t for t in ctx.spec.tasks if available is None or t in available]
            future = cost.future_finetune_jobs(ctx, phases["pretrain"].planned, tasks)
        out.append(cost.finetune_cost(ctx, client, phases["finetune"].planned, future))
    return cost.describe(out, step_costs)


def retire_interrupted(client, ctx: SweepContext) -> list[str]:
    """Mark KILLED this sweep's pre-training and fine-tuning runs left RUNNING by a job that a stop ended before
    it could end its run itself (it was killed after the grace period): a run counts when its identity lock
    (training/pretraining.py, finetuning/run.py) is free, so runs of processes still alive (another invocation
    sharing the experiment) stay as they are. Such runs are resumed by the next run of the sweep."""
    exp = client.get_experiment_by_name(ctx.experiment)
    if exp is None:
        return []
    found = client.search_runs([exp.experiment_id], max_results=10000, filter_string=(
        f"tags.{tracking.TAG_SWEEP} = '{ctx.spec.name}' and attributes.status = 'RUNNING'"))
    gone = []
    for r in found:
        kind, cfg_hash = r.data.tags.get(tracking.TAG_KIND), r.data.tags.get(tracking.TAG_CONFIG_HASH)
        lock = ctx.output_root / str(kind) / ctx.experiment / str(cfg_hash) / "run.lock"
        if kind not in ("pretrain", "finetune") or not cfg_hash or not lock.is_file():
            continue  # not a job of this sweep, or no lock to tell whether its process lives
        try:
            with IdentityLock(lock, f"{kind} run {r.info.run_id}"):
                gone.append(r)
        except RunBusyError:
            continue
    for r in gone:
        client.set_tag(r.info.run_id, tracking.TAG_END_REASON,
                       "stopped with its sweep (SIGINT/SIGTERM), killed before it could end the run")
        client.set_terminated(r.info.run_id, status="KILLED")
    return [r.info.run_id for r in gone]


def retire_dead_sweeps(client, ctx: SweepContext) -> list[str]:
    """Mark KILLED (with the reason) this sweep's records that a process which has since ended left RUNNING
    (a SIGKILL, or the end of a session, gives no chance to finish them); records of live processes, other
    machines or other boots stay as they are (provenance.process_gone)."""
    exp = client.get_experiment_by_name(ctx.experiment)
    if exp is None:
        return []
    found = client.search_runs([exp.experiment_id], max_results=1000, filter_string=(
        f"tags.{tracking.TAG_KIND} = 'sweep' and tags.{tracking.TAG_SWEEP} = '{ctx.spec.name}' "
        "and attributes.status = 'RUNNING'"))
    return tracking.retire_stale(client, [r for r in found if process_gone(r.data.tags)], keep=None)


@hydra.main(config_path=str(cli.CONF_DIR), config_name="sweep", version_base="1.3")
@cli.one_line_errors
def main(cfg: DictConfig) -> str | None:
    console.setup()
    ctx = context_from_cfg(cfg)
    hydra_args = [o for o in HydraConfig.get().overrides.hydra if not o.startswith("hydra.mode=")]
    command = shell_join(["python", "-m", "electra_ablate.sweep", *HydraConfig.get().overrides.task, *hydra_args])
    result = run_sweep(ctx, launcher_overrides(hydra_args), list(cfg.phases), Path(cfg.report_dir), bool(cfg.dry_run),
                       command, instantiate(cfg.report_writer), str(cfg.precision))
    if cfg.dry_run:
        for r in result.phases:
            print(f"{r.name}: {r.jobs} job(s) launched (dry run: printed above, not run)")
        print(result.cost)
    if result.failure:
        sys.exit(f"error: {result.failure}")  # SystemExit passes Hydra's job runner: the command's exit status
    return str(result.report) if result.report else None


@cli.one_line_errors
def cli_main() -> None:
    """Console entry: a misspelt key stops here with the keys it may mean, before Hydra starts; a stop ends the
    command with one line and its exit status (cli.py)."""
    console.take_verbose_flag()
    cli.check_args("sweep")
    main()

