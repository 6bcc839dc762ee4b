"""Fine-tune a pre-trained encoder on GLUE tasks: one job per selected task (`python -m electra_ablate.finetune`).

The recipe of the paper's GLUE results (Clark et al. 2020, section 3.1 and Appendix Table 7; reference
run_finetuning.py): load a checkpoint (a pre-trained directory, an MLflow pre-training run, a transformers
checkpoint, or nothing for the random-init floor), add a classifier, train for 3 epochs (10 for RTE and
STS-B) and report the dev metric after the last epoch; the paper's table entries are medians over 10 seeds,
so each (task, seed) is its own MLflow run linked to its pre-training run. A run whose identity (the
resolved config without speed and bookkeeping settings) already FINISHED is not recomputed, so a sweep can be
re-run after a crash or with more seeds. All data and checkpoint checks run before any MLflow run is created.
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError
import pytorch_lightning as pl
import torch

from electra_ablate.common import console, io, stops
from electra_ablate.common import precision as precision_lib
from electra_ablate.data.tokenizer import load_tokenizer
from electra_ablate.finetuning.checks import validate
from electra_ablate.finetuning.data import GlueDataModule, predict
from electra_ablate.finetuning.source import (FinetuneError, Pretrained, normalise_spec, reinit_top_layers,
                                              resolve_pretrained)
from electra_ablate.finetuning.system import FinetuneSystem, OptimSettings
from electra_ablate.finetuning.tasks import for_task, load_task_data, run_identity, selected_tasks
from electra_ablate.glue import submit
from electra_ablate.glue import tasks as glue
from electra_ablate.glue.features import Features, cached_features, file_digest, prediction_rows
from electra_ablate.glue.metrics import glue_score, task_score
from electra_ablate.glue.readers import double_unordered, load_split
from electra_ablate.models import fast
from electra_ablate.tracking import attempts
from electra_ablate.tracking import runs as tracking
from electra_ablate.tracking.store import IdentityLock, RunBusyError
from electra_ablate.training.build import attempt_precision
from electra_ablate.training.heartbeat import Heartbeat

log = logging.getLogger(__name__)

# --- runtime (speed-only settings) ------------------------------------------------------------------------


on_gpu = precision_lib.on_gpu  # where a run of cfg trains, and at which precision (common/precision.py)
precision = precision_lib.for_config


def auto_flag(value, default: bool) -> bool | None:
    return default if value == "auto" else bool(value)


# --- one run -------------------------------------------------------------------------------------------


def protocol(cfg: DictConfig, pretrained: Pretrained) -> OptimSettings:
    o = cfg.finetune_optim
    lr = o.lr if o.lr is not None else o.lr_by_size[pretrained.size]
    decay = o.layerwise_lr_decay if o.layerwise_lr_decay is not None else o.layerwise_lr_decay_by_size[pretrained.size]
    return OptimSettings(
        lr=float(lr),
        layerwise_lr_decay=float(decay),
        reference_off_by_one=bool(o.reference_off_by_one),
        betas=tuple(o.betas),
        eps=float(o.eps),
        weight_decay=float(o.weight_decay),
        warmup_fraction=float(o.warmup_fraction),
        fused=None if cfg.runtime.fused_adam == "auto" else bool(cfg.runtime.fused_adam),
        bias_correction=bool(o.bias_correction),
        loss_reduction=str(o.loss_reduction),
    )


def lowercase(cfg: DictConfig, pretrained: Pretrained) -> bool:
    """glue_data.lowercase, else the checkpoint's tokenizer setting, else True (BERT uncased, as ELECTRA)."""
    for value in (cfg.glue_data.lowercase, pretrained.lowercase):
        if value is not None:
            return bool(value)
    return True


def check_compatible(cfg: DictConfig, pretrained: Pretrained, tokenizer) -> None:
    vocab = tokenizer.get_vocab_size()
    if vocab != pretrained.config.vocab_size:
        raise FinetuneError(
            f"pretrained={pretrained.spec}: the encoder's word embeddings have vocab_size="
            f"{pretrained.config.vocab_size} but its vocabulary {pretrained.vocab_file} has {vocab} entries; "
            "fine-tune with the vocab.txt the checkpoint was pre-trained with"
        )
    if cfg.reinit_top_layers > pretrained.config.num_hidden_layers:
        raise FinetuneError(
            f"reinit_top_layers={cfg.reinit_top_layers} exceeds the encoder's {pretrained.config.num_hidden_layers} "
            f"layers ({pretrained.spec}); re-initialise at most {pretrained.config.num_hidden_layers}"
        )
    if cfg.glue_data.max_seq_length > pretrained.config.max_position_embeddings:
        raise FinetuneError(
            f"glue_data.max_seq_length={cfg.glue_data.max_seq_length} exceeds the encoder's "
            f"max_position_embeddings={pretrained.config.max_position_embeddings}; lower glue_data.max_seq_length"
        )


def write_predictions(path: Path, task: glue.TaskSpec, features: dict[str, Features], predictions) -> Path:
    with io.atomic_file(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\", lineterminator="\n")
        writer.writerow(["split", "index", "label", "prediction"])
        for split, feats in features.items():
            writer.writerows(prediction_rows(task, split, feats, predictions[split]))
    return path


def train_task(cfg, task, task_cfg, data, pretrained: Pretrained, tokenizer, client, ident, cfg_hash,
               test: dict[str, list[glue.Example]] | None = None) -> float:
    """`_train_task` holding this identity's lock: a second identical process stops with a clear message."""
    lock = Path(cfg.paths.output_root) / "finetune" / cfg.logger.experiment / cfg_hash / "run.lock"
    with IdentityLock(lock, f"fine-tuning {task.name} seed={cfg.seed} of {pretrained.spec} (config {cfg_hash})"):
        return _train_task(cfg, task, task_cfg, data, pretrained, tokenizer, client, ident, cfg_hash, test)


def _train_task(cfg, task, task_cfg, data, pretrained: Pretrained, tokenizer, client, ident, cfg_hash,
                test: dict[str, list[glue.Example]] | None = None) -> float:
    """Tokenize, open the MLflow run, fine-tune, log (and predict `test`, the unlabelled test splits); the run
    ends FAILED (KILLED for a signal) on any exception."""
    runs = tracking.runs_of_identity(client, cfg.logger.experiment, tracking.identity_hashes(ident))
    done = next((r for r in runs if r.info.status == "FINISHED"), None)
    if done is not None:  # finished by another process while this one waited to start
        tracking.retire_stale(client, runs, keep=done.info.run_id)
        return done.data.metrics["final/score"]
    vocab_digest = file_digest(pretrained.vocab_file)
    features = {split: _features(cfg, task, examples, pretrained, tokenizer, vocab_digest)
                for split, examples in data.items()}
    dev = {s.name: features[s.name] for s in task.dev_splits}
    optim = protocol(cfg, pretrained)
    # A run restarted in place keeps the precision of its earlier attempts, whatever `auto` means here.
    choice = attempt_precision(cfg, runs[0] if runs else None)
    params = _run_params(cfg, ident, pretrained, optim, len(features["train"]), vocab_digest, choice.precision)
    run = _open_run(cfg, client, runs, task, pretrained, cfg_hash, params, choice)
    try:
        system = _fit(cfg, task, task_cfg, pretrained, optim, features, dev, tokenizer, run, choice.precision)
        final, score = _log_scores(run, task, system)
        out = Path(cfg.paths.output_dir) / "predictions" / task.name / "dev_predictions.tsv"
        run.log_artifact(write_predictions(out, task, dev, system.predictions), "predictions")
        if test:
            test_preds = {
                split: predict(system, _features(cfg, task, examples, pretrained, tokenizer, vocab_digest),
                               int(cfg.glue_data.eval_batch_size), tokenizer.token_to_id("[PAD]") or 0,
                               choice.precision if on_gpu(cfg) else None)
                for split, examples in test.items()
            }
            out = out.with_name("test_predictions.tsv")
            run.log_artifact(submit.write_test_predictions(out, task, test, test_preds), "predictions")
        run.finish("FINISHED")
    except BaseException as error:
        status, reason = tracking.end_status(error)
        run.finish(status, reason)
        if status == "KILLED" and stops.received() is not None:
            at = f" at step {error.step}" if getattr(error, "step", None) is not None else ""
            stops.report(f"fine-tuning {task.name} seed={cfg.seed} of {pretrained.spec}{at} (MLflow run {run.run_id})"
                         " is recorded KILLED; it keeps no checkpoint: the same command runs it again from step 0")
        raise
    key = task.paper_metric
    # The run's outcome, on the console too (common/console.py).
    console.say(log, "%s seed=%s: final/%s=%.4f (score %.2f) after %d epochs; MLflow run %s", task.name, cfg.seed, key,
                final[key], score, len(system.history), run.run_id)
    return score


def _features(cfg, task: glue.TaskSpec, examples, pretrained: Pretrained, tokenizer, vocab_digest: str) -> Features:
    d = cfg.glue_data
    return cached_features(examples, tokenizer, vocab_digest, lowercase(cfg, pretrained), int(d.max_seq_length),
                           task.is_regression, cfg.paths.cache_dir)


def _run_params(cfg, ident: dict, pretrained: Pretrained, optim: OptimSettings, train_examples: int,
                vocab_digest: str, run_precision: str) -> dict[str, str]:
    """The run's MLflow params: its identity, and what was resolved from it (provenance, not identity)."""
    params = tracking.flatten(ident)
    params.update({"resolved.size": pretrained.size, "resolved.lr": str(optim.lr),
                   "resolved.layerwise_lr_decay": str(optim.layerwise_lr_decay),
                   # Always shown, though the identity leaves them out at torch AdamW's values (true, mean).
                   "finetune_optim.bias_correction": str(optim.bias_correction),
                   "finetune_optim.loss_reduction": optim.loss_reduction,
                   "pooling": str(cfg.pooling),
                   "reinit_top_layers": str(cfg.reinit_top_layers),
                   "preset": str(cfg.get("preset")),  # the named recipe, if any (not part of the identity)
                   "resolved.train_examples": str(train_examples),
                   attempts.PARAM_RESOLVED_PRECISION: run_precision,
                   tracking.PARAM_VOCAB_SHA256: vocab_digest})
    return params


def _open_run(cfg, client, runs, task: glue.TaskSpec, pretrained: Pretrained, cfg_hash: str,
              params: dict[str, str], choice: attempts.Choice) -> tracking.RunLogger:
    """The identity's MLflow run, nested under the pre-training run, tagged with the attempt's precision and
    machine (tracking/attempts.py); its other runs retired."""
    tags = {
        tracking.TAG_KIND: "finetune",
        "task": task.name,
        "seed": cfg.seed,
        tracking.TAG_PRETRAIN_RUN: pretrained.run_id or "none",
        "pretrained": pretrained.spec,
        "pretrained_step": "unknown" if pretrained.step is None else pretrained.step,
        tracking.TAG_RANDOM_INIT: str(bool(cfg.random_init)).lower(),
        "model": pretrained.model_name or pretrained.size,
        tracking.TAG_CONFIG_HASH: cfg_hash,
        # The sweep and variant of the pre-training run unless this config names them.
        tracking.TAG_SWEEP: cfg.sweep.name or pretrained.tags.get(tracking.TAG_SWEEP, ""),
        tracking.TAG_VARIANT: cfg.sweep.variant or pretrained.tags.get(tracking.TAG_VARIANT, ""),
        "git_commit": tracking.git_commit(),
    }
    if runs:
        # One run per identity: an interrupted one starts again from step 0 in place (fine-tuning saves no
        # checkpoint: a run is minutes long); steps it had already logged are not logged twice.
        run = tracking.RunLogger.adopt(client, runs[0], "restarted from step 0 in place (fine-tuning keeps no checkpoint)",
                                      {**{k: v for k, v in tags.items() if k != tracking.TAG_CONFIG_HASH},
                                       **attempts.attempt_tags(tracking.next_attempt(runs[0]), choice)})
    else:
        tags.update(attempts.attempt_tags(1, choice))
        run = tracking.RunLogger.start(client, cfg.logger.experiment, f"{task.name}-s{cfg.seed}", tags, params,
                                       parent_run_id=None if cfg.random_init else pretrained.run_id)
    tracking.retire_stale(client, runs, keep=run.run_id)
    return run


def _fit(cfg, task: glue.TaskSpec, task_cfg, pretrained: Pretrained, optim: OptimSettings,
         features: dict[str, Features], dev: dict[str, Features], tokenizer, run: tracking.RunLogger,
         run_precision: str) -> FinetuneSystem:
    """Seed, build the system and its data, and train it for task.epochs (or trainer.max_steps) in `run_precision`,
    ending with an evaluation at the last step; metrics go to `run` as they come."""
    d = cfg.glue_data
    pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
    torch.set_float32_matmul_precision(str(cfg.runtime.matmul_precision))
    encoder = reinit_top_layers(pretrained.make_encoder(), int(cfg.reinit_top_layers), int(cfg.seed))
    # Speed only: without dropout (and in evaluation) CPU attention is written out (models/fast.py); with
    # dropout it stays torch's SDPA and its own masks, so runs with dropout draw the same random numbers.
    fast.set_fast_dropout(encoder, False, cpu_attention=str(cfg.runtime.cpu_attention))
    if cfg.runtime.compile:
        # In place: parameter names (and layer-wise lrs) unchanged. Fixed or bucketed lengths
        # (runtime.finetune_padding) keep static shapes: one graph per length, CUDA-graph friendly.
        encoder.compile(dynamic=str(cfg.runtime.finetune_padding) == "dynamic")
    system = FinetuneSystem(encoder, task, optim, {n: f.labels for n, f in dev.items()},
                            float(cfg.dropout.classifier), int(cfg.logger.log_every_n_steps), str(cfg.pooling))
    system.metrics_sink = run.log_metrics
    system.metrics_flush = run.flush  # after every epoch: a killed run's history reaches the store
    datamodule = GlueDataModule(
        features["train"], dev, int(d.batch_size), int(d.eval_batch_size), int(cfg.seed),
        length_buckets=bool(d.length_buckets), num_workers=int(cfg.runtime.num_workers),
        pin_memory=bool(auto_flag(cfg.runtime.pin_memory, on_gpu(cfg))),
        pad_id=tokenizer.token_to_id("[PAD]") or 0,
        padding=str(cfg.runtime.get("finetune_padding", "dynamic")), max_len=int(d.max_seq_length),
    )
    trainer = pl.Trainer(
        max_epochs=int(task_cfg.epochs),
        max_steps=int(cfg.trainer.max_steps),
        accelerator=cfg.trainer.accelerator,
        devices=cfg.trainer.devices,
        precision=run_precision,
        gradient_clip_val=float(cfg.finetune_optim.max_grad_norm),
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        enable_progress_bar=bool(cfg.trainer.enable_progress_bar),
        default_root_dir=cfg.paths.output_dir,
        callbacks=[Heartbeat()],  # the step a sweep's console shows; nothing else
    )
    stops.fit(trainer, system, datamodule)  # a stop (Ctrl-C, SIGTERM) ends it after the current step: Stopped
    if system.global_step == 0:  # never a FINISHED run that did not train
        raise FinetuneError(f"{task.name}: fine-tuning took no training step (task.epochs={task_cfg.epochs}, "
                            f"trainer.max_steps={cfg.trainer.max_steps}, {len(features['train'])} training examples)")
    if system.evaluated_at_step != system.global_step:  # trainer.max_steps stopped it mid-epoch
        trainer.validate(system, datamodule=datamodule, verbose=False)
    return system


def _log_scores(run: tracking.RunLogger, task: glue.TaskSpec, system: FinetuneSystem) -> tuple[dict, float]:
    """Log the last epoch's metrics (what the paper reports), the best epoch's and the task score; returns the
    last epoch's metrics and the score."""
    final = system.history[-1]
    values = np.array([h[task.paper_metric] for h in system.history], dtype=float)
    best_epoch = int(np.nanargmax(values)) + 1 if np.isfinite(values).any() else len(values)
    best = system.history[best_epoch - 1]
    score = task_score(task, final)
    summary = {f"final/{k}": v for k, v in final.items()}
    summary.update({f"best/{k}": v for k, v in best.items()})
    summary.update({"best_epoch": best_epoch, "final/score": score})
    run.log_metrics(summary, step=len(system.history))
    return final, score


# --- the run ---------------------------------------------------------------------------------------------


def run(cfg: DictConfig) -> float:
    """Fine-tune every selected task; returns its final score (x100), or the GLUE score for task=glue
    (over the tasks that finished; NaN when none did and sweep.keep_going let a failure pass)."""
    validate(cfg)
    tasks = [(task, *for_task(cfg, task.name, task_cfg)) for task, task_cfg in selected_tasks(cfg)]
    for _, task_run_cfg, _ in tasks:
        validate(task_run_cfg)
    # Finished runs are looked up in the store if there is one; it is created only once the work can start, so
    # a refused command (missing data, a checkpoint that does not fit) leaves no store behind.
    client = tracking.existing_client(cfg.logger.tracking_uri, cfg.logger.experiment)
    spec = normalise_spec(cfg.pretrained)
    scores: dict[str, float] = {}
    todo = []
    for task, task_run_cfg, task_cfg in tasks:
        ident = run_identity(task_run_cfg, task_cfg, spec)
        cfg_hash = tracking.config_hash(ident)
        done = (tracking.find_finished_run(client, cfg.logger.experiment, tracking.identity_hashes(ident))
                if client is not None else None)
        if done is not None and task_run_cfg.glue_data.predict_test and not submit.has_test_predictions(client, done):
            print(f"{task.name} seed={cfg.seed}: FINISHED run {done.info.run_id} kept no test predictions; "
                  "running it again with glue_data.predict_test=true")
            done = None
        if done is not None:
            scores[task.name] = done.data.metrics["final/score"]
            print(f"{task.name} seed={cfg.seed}: already done in FINISHED run {done.info.run_id} "
                  f"(config_hash {cfg_hash}, final/score {scores[task.name]:.2f}); skipping")
            continue
        d = task_run_cfg.glue_data
        test = submit.load_test_splits(task, d.source, d.dir, d.hf_path) if d.predict_test else None
        # checked before any run
        todo.append((task_run_cfg, task, task_cfg, load_task_data(task_run_cfg, task), ident, cfg_hash, test))
    if todo:
        pretrained = resolve_pretrained(cfg, client)
        tokenizer = load_tokenizer(pretrained.vocab_file, lowercase(cfg, pretrained))
        for task_run_cfg, *_ in todo:
            check_compatible(task_run_cfg, pretrained, tokenizer)
        client = tracking.setup(cfg.logger.tracking_uri, cfg.logger.experiment)
        busy: list[RunBusyError] = []
        for task_run_cfg, task, task_cfg, data, ident, cfg_hash, test in todo:
            try:
                scores[task.name] = train_task(
                    task_run_cfg, task, task_cfg, data, pretrained, tokenizer, client, ident, cfg_hash, test
                )
            except RunBusyError as error:  # not run at all: keep_going goes on, but the job does not succeed
                if not cfg.sweep.keep_going:
                    raise
                log.error("%s", error)
                busy.append(error)
            except Exception:
                if not cfg.sweep.keep_going or stops.received() is not None:
                    raise
                log.exception("%s seed=%s failed: its run is marked FAILED; going on (sweep.keep_going=true)",
                              task.name, cfg.seed)
        if busy:
            raise RunBusyError("; ".join(map(str, busy)))
    if "members" not in cfg.task:
        return scores.get(cfg.task.name, float("nan"))
    if not any(t != "wnli" for t in scores):
        return float("nan")
    result = glue_score(scores)
    print(f"GLUE score {result.score:.2f} over {', '.join(result.tasks)}")
    return result.score
