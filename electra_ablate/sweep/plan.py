"""What of a sweep is done and what is left, read from MLflow (one experiment per sweep, named after it): a
pre-training job is found by its config hash (tracking.config_hash of the same composed config the job will
see), a fine-tuning job by (pre-training run, step, task, seed). Both the runner (what to launch) and the report
(what to show, what failed, what is missing) ask here."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from electra_ablate.finetuning import tasks as finetuning
from electra_ablate.finetuning.source import normalise_spec
from electra_ablate.glue import tasks as glue
from electra_ablate.sweep.compose import FINETUNE_GROUP, SweepContext, compose_session
from electra_ablate.sweep.jobs import RANDOM_SOURCE, Checkpoint, FinetuneKey, PretrainJob
from electra_ablate.sweep.spec import SweepSpec
from electra_ablate.tracking import runs as tracking
from electra_ablate.tracking.origin import is_imported, origin_id
from electra_ablate.training import pretraining

class PretrainState(NamedTuple):
    job: PretrainJob
    config_hash: str
    run: Any  # the newest FINISHED mlflow Run, or None
    failed: Any  # the newest unfinished (FAILED / RUNNING / KILLED) run when none finished, or None
    max_steps: int
    outputs_missing: bool = False  # FINISHED, but its pre-trained directories are gone: pre-training runs again
    # FINISHED in another store and imported from a results bundle without its pre-trained directories: never
    # trained again (its results are here); a fine-tuning job that needs them is refused (missing_exports)
    imported_without_exports: bool = False

    @property
    def latest(self) -> Any:
        """The finished run, else the newest unfinished one, else None."""
        return self.run if self.run is not None else self.failed

    @property
    def needs_pretraining(self) -> bool:
        return self.run is None or self.outputs_missing


def pretrain_states(ctx: SweepContext, client) -> list[PretrainState]:
    ctx.write_pretrain_configs()
    exp = client.get_experiment_by_name(ctx.experiment)
    out = []
    with compose_session():
        jobs = [(job, ctx.compose_pretrain(job)) for job in ctx.pretrain_jobs()]
    for job, cfg in jobs:
        hashes = tracking.identity_hashes(cfg)  # runs recorded before data paths left the identity too
        cfg_hash = hashes[0]
        runs = [] if exp is None else tracking.runs_of_identity(client, ctx.experiment, hashes)
        # A FINISHED run whose pre-trained directories are gone is not done: its job runs again (in that run).
        # Its fine-tuning results stay valid and reported meanwhile.
        finished = next((r for r in runs if r.info.status == "FINISHED"), None)
        failed = None if finished is not None or not runs else runs[0]
        missing = finished is not None and bool(pretraining.missing_outputs(finished))
        imported = missing and is_imported(finished)
        out.append(PretrainState(job, cfg_hash, finished, failed, int(cfg.trainer.max_steps), missing and not imported,
                                 imported))
    return out


def checkpoints_of(state: PretrainState, fractions: Sequence[float]) -> tuple[list[Checkpoint], list[str]]:
    """The run's checkpoints at `fractions` of its steps, and a message per fraction it did not save."""
    run = state.run
    saved = {int(k): v for k, v in json.loads(run.data.tags.get("checkpoints", "{}")).items()}
    final_step = max(saved) if saved else state.max_steps
    found, missing = [], []
    for f in fractions:
        step = final_step if f == 1.0 else int(round(f * state.max_steps))
        if step in saved or f == 1.0:
            found.append(Checkpoint(state.job.variant, state.job.seed, origin_id(run), step, f == 1.0, f))
        else:
            missing.append(f"{state.job.variant} seed {state.job.seed}: no checkpoint at step {step} ({f:g} of {state.max_steps})")
    return found, missing


def saved_so_far(state: PretrainState, fractions: Sequence[float]) -> list[Checkpoint]:
    """The checkpoints an unfinished run (running, stopped or failed) has already saved at `fractions` < 1 of its
    steps, complete on disk. A resumed run goes on from its last checkpoint, past them, so they stay as they are:
    a long run's early points are fine-tuned and reported while it goes on; its final one waits for its end."""
    run = state.failed
    if state.run is not None or run is None:
        return []
    saved = {int(k): v for k, v in json.loads(run.data.tags.get("checkpoints", "{}")).items()}
    found = []
    for f in fractions:
        step = int(round(f * state.max_steps))
        if f < 1.0 and step in saved and pretraining.is_complete(saved[step]):
            found.append(Checkpoint(state.job.variant, state.job.seed, origin_id(run), step, False, f))
    return found


def finetune_runs(client, experiment: str) -> tuple[dict[FinetuneKey, list], dict[FinetuneKey, Any]]:
    """FINISHED fine-tuning runs per key (newest first), and the newest unfinished one for keys with none finished."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return {}, {}
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.{tracking.TAG_KIND} = 'finetune'",
                              order_by=["attributes.start_time DESC"], max_results=50000)
    done: dict[FinetuneKey, list] = {}
    failed: dict[FinetuneKey, Any] = {}
    for r in runs:
        key = finetune_key(r.data.tags)
        if key is None:
            continue
        if r.info.status == "FINISHED":
            done.setdefault(key, []).append(r)
        else:
            failed.setdefault(key, r)
    return done, {k: v for k, v in failed.items() if k not in done}


def finetune_key(tags: Mapping[str, str]) -> FinetuneKey | None:
    try:
        seed = int(tags["seed"])
    except (KeyError, ValueError):
        return None
    source = tags.get(tracking.TAG_PRETRAIN_RUN) or "none"
    if source == "none":
        source = f"variant:{tags.get(tracking.TAG_VARIANT, '')}"
    elif tags.get(tracking.TAG_RANDOM_INIT) == "true":
        source = RANDOM_SOURCE + source
    return FinetuneKey(source, _key_step(source, str(tags.get("pretrained_step", ""))), tags.get("task", ""), seed)


def key_of(ckpt: Checkpoint, task: str, seed: int) -> FinetuneKey:
    return FinetuneKey(ckpt.source, _key_step(ckpt.source, str(ckpt.step)), task, seed)


def _key_step(source: str, step: str) -> str:
    """The step as a key holds it: none for an imported model (its step is whatever the import reports) or a
    random-init arm (it loads no weights, so every checkpoint of its run gives the same encoder)."""
    return "" if source.startswith(("variant:", RANDOM_SOURCE)) else step


def random_init_checkpoints(spec: SweepSpec, found: Sequence[Checkpoint]) -> list[Checkpoint]:
    """The random-init variants' checkpoints: per pre-training run of the variant each is shaped like, the run's
    final checkpoint in `found`, else (a run still going) its first saved one. Only the shape and vocabulary are
    read, the same at every step, so a long run's random-init arm is fine-tuned while the run goes on, and its
    runs stay the arm's when the run has finished (their key and identity leave the step out)."""
    out = []
    for v in (v for v in spec.variants if v.random_init_of is not None):
        pick: dict[str, Checkpoint] = {}
        for c in found:
            if c.variant != v.random_init_of or c.random_init or c.run_id is None:
                continue
            held = pick.get(c.run_id)
            if held is None or (c.final, -c.step) > (held.final, -held.step):
                pick[c.run_id] = c
        out += [c._replace(variant=v.label, random_init=True) for c in pick.values()]
    return out


def under_recipes(spec: SweepSpec, checkpoints: Sequence[Checkpoint],
                  recipes: Sequence[str] | None = None) -> list[Checkpoint]:
    """Each checkpoint under each of the sweep's recipes (or those of `recipes`), recipe-major; a sweep without
    `recipes` fine-tunes them as they are, under its variants' own fine-tuning overrides."""
    if not spec.recipes:
        return list(checkpoints)
    return [c._replace(recipe=r) for r in (spec.recipes if recipes is None else recipes) for c in checkpoints
            if spec.fine_tunes(r, 1.0 if c.random_init else c.fraction)]


def matches(done: Mapping[FinetuneKey, list], key: FinetuneKey,
            config_hash: str | Sequence[str] | None = None) -> Any:
    """The newest finished run for `key` (with `config_hash`, or any of these hashes, when given: a run of
    another fine-tuning config, e.g. before the optimizer's defaults changed, is not this job)."""
    wanted = [config_hash] if isinstance(config_hash, str) else config_hash
    return next((r for r in done.get(key, []) if wanted is None or r.data.tags.get(tracking.TAG_CONFIG_HASH) in wanted),
                None)


def finetune_hashes(ctx: SweepContext, checkpoints: Sequence[Checkpoint]) -> dict[tuple[str, str, int], list[str]]:
    """The config hashes (tracking.identity_hashes of finetuning.tasks.run_identity: the current one first,
    then the legacy spellings) a fine-tuning job of the grid may be tagged with, by (checkpoint config name,
    task, seed)."""
    out = {}
    with compose_session():
        for c in checkpoints:
            ctx.write_finetune_config(c)
            for task in ctx.spec.tasks:
                for seed in ctx.spec.seeds:
                    cfg = ctx.compose_finetune([ctx.searchpath, f"+{FINETUNE_GROUP}={c.config_name}", f"task={task}",
                                                f"seed={seed}"])
                    (spec, task_cfg), = finetuning.selected_tasks(cfg)
                    cfg, task_cfg = finetuning.for_task(cfg, spec.name, task_cfg)  # the task's per_task settings
                    ident = finetuning.run_identity(cfg, task_cfg, normalise_spec(cfg.pretrained))
                    out[(c.config_name, task, seed)] = tracking.identity_hashes(ident)
    return out


def finetune_plan(ctx: SweepContext, client) -> tuple[list[tuple[Checkpoint, str, int]], list[Checkpoint], list[str]]:
    """(missing (checkpoint, task, seed) jobs, every checkpoint, messages about checkpoints that are missing)."""
    checkpoints: list[Checkpoint] = [Checkpoint(v.label, None, None, None, True, None)
                                     for v in ctx.spec.variants if v.pretrained is not None]
    notes: list[str] = []
    for state in pretrain_states(ctx, client):
        if state.run is None:
            checkpoints += saved_so_far(state, ctx.spec.checkpoints)
            continue
        if state.outputs_missing:  # its weights are gone (and pre-training them again failed): nothing to load
            notes.append(f"{state.job.variant} seed {state.job.seed}: FINISHED run {state.run.info.run_id} has lost "
                         "its pre-trained directories; its missing fine-tuning jobs wait for pre-training to redo them")
            continue
        found, missing = checkpoints_of(state, ctx.spec.checkpoints)
        checkpoints += found
        notes += missing
    checkpoints = under_recipes(ctx.spec, checkpoints + random_init_checkpoints(ctx.spec, checkpoints))
    done, _ = finetune_runs(client, ctx.experiment)
    hashes = finetune_hashes(ctx, checkpoints)
    todo = [(c, t, s) for c in checkpoints for t in ctx.spec.tasks for s in ctx.spec.seeds
            if matches(done, key_of(c, t, s), hashes[(c.config_name, t, s)]) is None]
    return todo, checkpoints, notes


def missing_exports(ctx: SweepContext, client, todo: Sequence[tuple[Checkpoint, str, int]]) -> list[str]:
    """The pre-trained directories that planned fine-tuning jobs need and this store lacks: those of runs imported
    from a results bundle without them (electra_ablate.results), one line each."""
    states = {origin_id(s.run): s for s in pretrain_states(ctx, client) if s.imported_without_exports}
    lines = []
    for c in dict.fromkeys(c._replace(recipe=None) for c, _, _ in todo):
        state = states.get(c.run_id)
        if state is None:
            continue
        tags = state.run.data.tags
        saved = json.loads(tags.get("checkpoints", "{}"))
        where = saved.get(str(c.step)) or tags.get(tracking.TAG_CHECKPOINT, "?")
        lines.append(f"{c.variant} seed {c.pretrain_seed} step {c.step}: {where} (pre-training run {c.run_id})")
    return lines


def available_tasks(ctx: SweepContext) -> list[str] | None:
    """GLUE tasks with local data when fine-tuning reads TSVs (None = the HF loader, anything goes)."""
    cfg = ctx.compose_finetune()
    if cfg.glue_data.source != "tsv":
        return None
    return glue.available_tasks(cfg.glue_data.dir)
