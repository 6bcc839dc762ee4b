"""One pre-training run, from a composed config to a recorded checkpoint.

Check the config, find finished or interrupted work of the same identity in MLflow, build the pieces
(training/build.py), train with Lightning, save the pre-trained network (models/checkpoint.py format) and
record it. Outputs live under `<paths.output_root>/pretrain/<experiment>/<config hash>/` so a run with the
same config is found again: a finished one is skipped, an interrupted one resumes from its last checkpoint.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytorch_lightning as pl
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from electra_ablate.common import precision, stops
from electra_ablate.data.budget import corpus_budget, count, passes_warning
from electra_ablate.data.module import PretrainDataModule
from electra_ablate.models.checkpoint import CONFIG_NAME, MODEL_NAME, save_pretrained
from electra_ablate.tracking import attempts
from electra_ablate.tracking import runs as tracking
from electra_ablate.tracking.store import IdentityLock
from electra_ablate.training import build, durable_run, run_folder
from electra_ablate.training.checks import validate
from electra_ablate.training.heartbeat import Heartbeat

log = logging.getLogger(__name__)


def run_tags(cfg: DictConfig, cfg_hash: str) -> dict[str, str]:
    gen = cfg.generator
    return {
        tracking.TAG_KIND: "pretrain",
        "objective": cfg.objective.name,
        "sharing": cfg.sharing.name,
        "algorithm": cfg.algorithm.name,
        "generator": get_class(gen._target_).label,  # neural | uniform | unigram
        "weighting": cfg.weighting.name,
        "generator_hidden_size": str(gen.get("hidden_size", "")),
        "generator_layers": str(gen.get("layers", "")),
        "model": cfg.model.name,
        "disc_hidden_size": str(cfg.model.hidden_size),
        "seed": str(cfg.seed),
        "git_commit": tracking.git_commit(),
        tracking.TAG_CONFIG_HASH: cfg_hash,
        tracking.TAG_SWEEP: str(cfg.sweep.name or ""),
        tracking.TAG_VARIANT: str(cfg.sweep.variant or cfg.run_name),
    }


def data_provenance(dm: PretrainDataModule) -> dict[str, str]:
    """Digests of the vocabulary and the packed examples: run params for checking that two runs saw the same
    data, kept out of the run identity (the config hash), which the config alone decides."""
    return {tracking.PARAM_VOCAB_SHA256: dm.vocab_sha256, tracking.PARAM_EXAMPLES_SHA256: dm.examples_sha256}




class ExportPretrained(pl.Callback):
    """Saves the pre-trained network at the configured fractions of training (for learning curves)."""

    def __init__(self, steps: list[int], save: Callable[[int], Path]):
        self.steps = set(steps)
        self.save = save

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step in self.steps:
            self.save(trainer.global_step)



def train(cfg: DictConfig, callbacks: list[pl.Callback] | None = None) -> str | None:
    """Pre-train per `cfg`; returns the MLflow run id (None when `keep_going` swallowed a failure, when a sweep
    did not plan this seed for this variant, and in every process of a multi-process run but the first)."""
    planned = cfg.get("sweep", {}).get("seeds")
    if planned is not None and cfg.seed not in planned:
        # A sweep's multirun is a product of variants and seeds; a variant that runs fewer seeds (its own
        # `pretrain_seeds`) is handed the others too, and they end here.
        log.info("pre-training %s: seed %s is not one of the seeds %s the sweep planned for it; nothing to do",
                 cfg.sweep.variant, cfg.seed, list(planned))
        return None
    validate(cfg)
    hashes = tracking.identity_hashes(cfg)  # this identity, then its spelling before data paths left it
    cfg_hash = hashes[0]
    # The outputs of a run recorded under its legacy identity stay where they are (its checkpoints resume).
    stores = [Path(cfg.paths.output_root) / "pretrain" / cfg.logger.experiment / h for h in hashes]
    store = next((d for d in stores if d.is_dir()), stores[0])
    if rank_zero_only.rank != 0:
        # Another process of a DDP run (Lightning started it with the same command line): it trains its
        # shard of every global batch; the first process alone holds the lock, the MLflow run and the outputs.
        _replica(cfg, store, callbacks)
        return None
    settings = durable_run.checked(cfg)  # a bad durable store (URL, credentials, bucket) is refused before compute
    build.seeded(cfg)
    dm = build.data_module(cfg)
    dm.prepare()  # builds or loads the token cache; bad data is refused here, before the store, the lock or a run
    client = tracking.setup(cfg.logger.tracking_uri, cfg.logger.experiment)
    # One process per identity: a second one would write the same checkpoints and the same MLflow run; with a
    # durable store, one job per identity across machines too (its lease).
    what = f"pre-training {cfg.run_name} (config {cfg_hash})"
    with IdentityLock(store / "run.lock", f"{what[:-1]}, outputs {store})"), \
            durable_run.owned(settings, cfg, store, what) as remote:
        return _train(cfg, client, cfg_hash, store, dm, callbacks, remote)


def _replica(cfg: DictConfig, store: Path, callbacks: list[pl.Callback] | None) -> None:
    build.seeded(cfg)  # the same initial weights on every rank (DDP also broadcasts)
    dm = build.data_module(cfg)
    dm.prepare()
    _, _, system = build.trained_system(cfg, dm)
    # The first process's precision: the run's own, read from the store as the first process reads it.
    client = tracking.existing_client(cfg.logger.tracking_uri, cfg.logger.experiment)
    runs = tracking.runs_of_identity(client, cfg.logger.experiment, tracking.identity_hashes(cfg)) if client else []
    choice = attempts.choose(cfg.runtime.precision, precision.training_device(cfg.trainer.accelerator),
                             runs[0] if runs else None)
    trainer = build.trainer(cfg, store, system.automatic_optimization, list(callbacks or []), choice.precision)
    durable_run.fetch_checkpoint(cfg, store)  # with a durable store, as the first process fetches it
    start = run_folder.newest_checkpoint(store / "checkpoints")  # the one the first process resumes from
    # A stop saves the checkpoint on every process (the first writes it; all take part in its collectives).
    stops.fit(trainer, system, datamodule=dm, ckpt_path=_str_or_none(start),
              on_stop=lambda t: t.save_checkpoint(store / "checkpoints" / run_folder.LAST))


def missing_outputs(run, store: Path | None = None) -> list[str]:
    """The pre-trained directories a FINISHED run recorded that are not (complete) on disk; with its `store`, one
    found there by its tail (the store moved since: run_folder.located) is not missing."""
    tags = run.data.tags
    paths = [tags[tracking.TAG_CHECKPOINT]] if tracking.TAG_CHECKPOINT in tags else []
    paths += list(json.loads(tags.get("checkpoints", "{}")).values())
    if not paths:
        return ["(no checkpoint_path tag)"]
    return [p for p in dict.fromkeys(paths) if not is_complete(run_folder.located(store, p) if store else p)]


def _relocate(client, run, store: Path) -> None:
    """Point a FINISHED run's tags at its store and its exports where they are now, once the store has moved, for
    what reads them (fine-tuning, the sweep's planner, the report, export)."""
    tags = run.data.tags
    now = {"store": str(store)} if "store" in tags and not Path(tags["store"]).is_dir() else {}
    if tracking.TAG_CHECKPOINT in tags:
        now[tracking.TAG_CHECKPOINT] = str(run_folder.located(store, tags[tracking.TAG_CHECKPOINT]))
    if "checkpoints" in tags:
        saved = json.loads(tags["checkpoints"])
        now["checkpoints"] = json.dumps({k: str(run_folder.located(store, v)) for k, v in saved.items()}, sort_keys=True)
    changed = {k: v for k, v in now.items() if tags.get(k) != v}
    for key, value in changed.items():
        client.set_tag(run.info.run_id, key, value)
    if changed:
        log.info("run %s: its outputs moved to %s; its tags %s now say so", run.info.run_id, store, sorted(changed))


def is_complete(path: str | Path) -> bool:
    """Whether a pre-trained directory holds its config and its weights."""
    return all((Path(path) / f).is_file() for f in (CONFIG_NAME, MODEL_NAME))


def _train(cfg: DictConfig, client, cfg_hash: str, store: Path, dm: PretrainDataModule,
           callbacks: list[pl.Callback] | None, remote: durable_run.DurableRun | None = None) -> str | None:
    if remote is not None:  # a finished run's exports come back from the durable store, not trained again
        remote.restore_exports(store, is_complete)
    runs = tracking.runs_of_identity(client, cfg.logger.experiment, tracking.identity_hashes(cfg))
    done = next((r for r in runs if r.info.status == "FINISHED"), None)
    if done is not None:
        missing = missing_outputs(done, store)
        if not missing:
            _relocate(client, done, store)
            tracking.retire_stale(client, runs, keep=done.info.run_id)
            log.info("already pre-trained: run %s (config %s); nothing to do", done.info.run_id, cfg_hash)
            return done.info.run_id
        log.warning("run %s (config %s) FINISHED but its outputs are gone (%s); pre-training again in the same run",
                    done.info.run_id, cfg_hash, ", ".join(missing))
    # One run per identity: the finished run whose outputs are gone, else the newest interrupted one.
    previous = done if done is not None else (runs[0] if runs else None)
    choice = build.attempt_precision(cfg, previous)  # a resumed run keeps its precision, whatever `auto` means here

    checkpoints = store / "checkpoints"
    last_ckpt = checkpoints / run_folder.LAST  # every checkpoint is written here
    sharing = build.sharing_mode(cfg)
    model, generator, system = build.trained_system(cfg, dm, sharing)

    exports = Exports(cfg, store, system, sharing, dm.vocab_path, remote.exported if remote else None)
    export_steps = [int(round(f * cfg.trainer.max_steps)) for f in cfg.trainer.export_fractions]
    trainer = build.trainer(cfg, store, system.automatic_optimization,
                            [ExportPretrained(export_steps, exports.save), Heartbeat(),
                             *([durable_run.RenewLease(remote.lease)] if remote else []), *(callbacks or [])],
                            choice.precision, remote.checkpoint_saved if remote else None)
    build.count_flops(cfg, system, model, generator, trainer)
    budget = _corpus_budget(cfg, dm, trainer)

    # The newest whole checkpoint: the durable store's when it is newer (downloaded to last.ckpt), else last.ckpt
    # or a last-v<N>.ckpt that a folder written before holds.
    restored = remote.restore_checkpoint(checkpoints) if remote is not None else None
    start = run_folder.newest_checkpoint(checkpoints) if previous is not None or restored is not None else None
    with stops.deferred(raise_after=False):  # a stop now waits for the run to be open, to end it KILLED below
        run = exports.run = _open_run(cfg, client, cfg_hash, store, previous, start, last_ckpt, dm, budget, choice)
        run.record_job(cfg.paths.output_dir)  # its config and Hydra record now, its log at the end
        if remote is not None:
            remote.run_id = run.run_id
            run.set_tags({"durable_area": remote.area.url})
    try:
        tracking.retire_stale(client, runs, keep=run.run_id)
        system.metrics_sink = run.log_metrics
        system.metrics_flush = run.flush  # at every checkpoint: the store has each metric up to it
        system.last_good_checkpoint = lambda: _str_or_none(run_folder.newest_checkpoint(checkpoints))
        # A stop (Ctrl-C, SIGTERM) ends training after the current step and saves the checkpoint of that step.
        stops.fit(trainer, system, datamodule=dm, ckpt_path=_str_or_none(start),
                  on_stop=lambda t: t.save_checkpoint(last_ckpt))
        with stops.deferred(raise_after=False):  # the final export and the run's end are written whole
            final = exports.save(trainer.global_step, "final")
            run.log_metrics({"flops/total": system.flops_at(trainer.global_step)}, trainer.global_step)
            run.set_tags({tracking.TAG_CHECKPOINT: str(final)})
            run.finish("FINISHED")
    except BaseException as error:
        if run.finished:
            raise
        status, reason = tracking.end_status(error)
        run.finish(status, reason)
        if status == "KILLED" and stops.received() is not None:
            stops.report(_stopped(cfg, run.run_id, error, checkpoints))
        if cfg.sweep.keep_going and isinstance(error, Exception) and status != "KILLED":
            log.exception("pre-training failed; run %s marked %s, going on (sweep.keep_going=true)", run.run_id, status)
            return None
        raise
    log.info("pre-trained %s -> %s (MLflow run %s)", cfg.run_name, final, run.run_id)
    return run.run_id


def _str_or_none(path: Path | None) -> str | None:
    return str(path) if path is not None else None


def _stopped(cfg: DictConfig, run_id: str, error: BaseException, checkpoints: Path) -> str:
    """The stop's line: the run, the step it stopped after, where it resumes from."""
    step = getattr(error, "step", None)
    at = f" at step {step} of {cfg.trainer.max_steps}" if step is not None else ""
    newest = run_folder.newest_checkpoint(checkpoints)
    saved = run_folder.checkpoint_step(newest) if newest is not None else None
    resume = (f"its checkpoint at step {saved} is saved: the same command resumes from it" if saved is not None
              else "no checkpoint was saved yet: the same command starts it again from step 0 in the same run")
    return f"pre-training {cfg.run_name}{at} (MLflow run {run_id}) is recorded KILLED; {resume}"


class Exports:
    """The pre-trained directories of one run (models/checkpoint.py format): saved at the export steps and at
    the end, listed in <store>/checkpoints.json (relative to the store: training/run_folder.py) and in the run's
    `checkpoints` tag (where they are now)."""

    def __init__(self, cfg: DictConfig, store: Path, system: pl.LightningModule, sharing, vocab_path: Path,
                 uploaded: Callable[[Path, int], None] | None = None):
        self.cfg, self.store, self.system, self.sharing, self.vocab_path = cfg, store, system, sharing, vocab_path
        self.uploaded = uploaded  # each saved directory is handed to it (training/durable_run.py uploads it)
        self.saved: dict[str, Path] = run_folder.read_exports(store)  # step -> directory
        self.run: tracking.RunLogger | None = None  # set once the run is open, before the first step

    def save(self, step: int, name: str | None = None) -> Path:
        cfg, system = self.cfg, self.system
        directory = self.store / "pretrained" / (name or f"step_{step}")
        if name is None and self.saved.get(str(step)) == directory and is_complete(directory):
            # A resumed run passes a step it had exported before it stopped. That export stays as it is: it
            # may be fine-tuned already, or being fine-tuned now (sweep.plan.saved_so_far).
            log.info("step %d: %s was exported before the run stopped; kept as it is", step, directory)
            if self.uploaded is not None:  # in the durable store too (a stop may have come before its upload)
                self.uploaded(directory, step)
            return directory
        nets = self.sharing.exported(system.exported_networks())  # e.g. sharing=gdes folds its E_delta in
        path = save_pretrained(
            directory,
            nets.model,
            self.vocab_path,
            meta={
                "objective": cfg.objective.name,
                "sharing": cfg.sharing.name,
                "algorithm": cfg.algorithm.name,
                "model_name": cfg.model.name,
                "do_lower_case": bool(cfg.data.lowercase),
                "step": step,
                "run_id": self.run.run_id,
                "flops": system.flops_at(step),
            },
            generator=nets.generator,
        )
        self.saved[str(step)] = Path(path)
        run_folder.write_exports(self.store, self.saved)
        if self.uploaded is not None:
            self.uploaded(Path(path), step)
        self.run.set_tags({"checkpoints": json.dumps({k: str(v) for k, v in self.saved.items()}, sort_keys=True)})
        return path


def _corpus_budget(cfg: DictConfig, dm: PretrainDataModule, trainer: pl.Trainer) -> dict[str, float]:
    """How often this run goes over its corpus, against the paper's ~5 passes (ELECTRA-Small, 3.3B tokens);
    logged, with a warning when it is far more."""
    budget = corpus_budget(dm.cache.meta["num_tokens"], dm.num_examples, cfg.trainer.max_steps,
                           cfg.data.batch_size * trainer.accumulate_grad_batches * trainer.world_size,
                           cfg.data.max_seq_length)
    log.info("corpus: %s word pieces in %d examples; the run sees %s tokens: %.1f passes over it",
             count(budget["corpus/tokens"]), budget["corpus/examples"], count(budget["corpus/tokens_to_see"]),
             budget["corpus/passes"])
    warning = passes_warning(budget)
    if warning:
        log.warning(warning)
    return budget


def _open_run(cfg: DictConfig, client, cfg_hash: str, store: Path, previous, start: Path | None, last_ckpt: Path,
              dm: PretrainDataModule, budget: dict[str, float], choice: attempts.Choice) -> tracking.RunLogger:
    """The identity's run continues: from its newest checkpoint when there is one (metrics already logged are not
    logged again), else from step 0 in place; with no previous run, a new one with the config as params. Either
    way the attempt's precision and machine are tagged (tracking/attempts.py)."""
    if previous is not None:
        how = (f"resumed from {start}" if start else f"restarted from step 0 in place: no checkpoint at {last_ckpt}")
        if previous.info.status == "FINISHED":
            how += "; its outputs were missing"
        run = tracking.RunLogger.adopt(client, previous, how, {
            "store": str(store), **attempts.attempt_tags(tracking.next_attempt(previous), choice)})
        log.info("run %s (%s): %s", previous.info.run_id, previous.info.status, how)
        return run
    run = tracking.RunLogger.start(
        client,
        cfg.logger.experiment,
        run_name=cfg.run_name,
        tags={**run_tags(cfg, cfg_hash), **attempts.attempt_tags(1, choice)},
        params={**tracking.flatten(OmegaConf.to_container(cfg, resolve=True)), **data_provenance(dm),
                attempts.PARAM_RESOLVED_PRECISION: choice.precision,
                **{k: str(round(v, 4) if isinstance(v, float) else v) for k, v in budget.items()}},
    )
    run.set_tags({"store": str(store), "hydra_output_dir": str(cfg.paths.output_dir)})
    run.log_metrics(budget, 0)
    return run
