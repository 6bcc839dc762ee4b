"""Pre-train one variant: `python -m electra_ablate.pretrain objective=electra sharing=embeddings model=small`.

A flat recipe: check the config, find finished or interrupted work in MLflow, build the data, the networks
and the objective, train with Lightning, save the pre-trained network (checkpoint.py format) and record it.
Outputs live under `<paths.output_root>/pretrain/<experiment>/<config hash>/` so a run with the same
config is found again: a finished one is skipped, an interrupted one resumes from its last checkpoint.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from pathlib import Path

import hydra
import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from electra_ablate.common import cli
from electra_ablate.models import fast
from electra_ablate.common import precision
from electra_ablate.tracking import runs as tracking
from electra_ablate.models.checkpoint import CONFIG_NAME, MODEL_NAME, save_pretrained
from electra_ablate.data.budget import corpus_budget, passes_warning
from electra_ablate.data.module import PretrainDataModule
from electra_ablate.models.flops import STAGES, pretrain_flops_per_step
from electra_ablate.models.encoder import ElectraForPretraining, EncoderConfig, share_weights
from electra_ablate.common.tokens import SpecialIds
from electra_ablate.tracking.store import IdentityLock

log = logging.getLogger(__name__)

MODEL_KEYS = ("embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "max_position_embeddings", "hidden_dropout_prob", "attention_probs_dropout_prob")


class ConfigError(ValueError):
    pass


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def value_problems(cfg: DictConfig) -> list[str]:
    """Settings outside their valid range, each with the key and the fix (the paper's value where it has one)."""
    out: list[str] = []

    def need(ok: bool, key: str, value, rule: str) -> None:
        if not ok:
            out.append(f"{key}={value!r} {rule}")

    o, d, t, m = cfg.optim, cfg.data, cfg.trainer, cfg.model
    need(_number(o.lr) and o.lr > 0, "optim.lr", o.lr, "must be a positive number (paper Table 6: 5e-4 Small, 2e-4 Base)")
    need(_number(o.eps) and o.eps > 0, "optim.eps", o.eps, "must be a positive number (the paper: 1e-6)")
    need(_number(o.weight_decay) and o.weight_decay >= 0, "optim.weight_decay", o.weight_decay,
         "must be a number >= 0 (the paper: 0.01)")
    need(_number(o.max_grad_norm) and o.max_grad_norm > 0, "optim.max_grad_norm", o.max_grad_norm,
         "must be a positive number (the reference clips at 1.0)")
    need(len(o.betas) == 2 and all(_number(b) and 0 <= b < 1 for b in o.betas), "optim.betas", list(o.betas),
         "must be two numbers in [0, 1) (the paper: [0.9, 0.999])")
    need(_integer(t.max_steps) and t.max_steps > 0, "trainer.max_steps", t.max_steps, "must be a positive number of steps")
    need(_integer(o.warmup_steps) and o.warmup_steps >= 0, "optim.warmup_steps", o.warmup_steps,
         "must be a number of steps >= 0")
    if _integer(o.warmup_steps) and _integer(t.max_steps) and t.max_steps > 0 and o.warmup_steps > t.max_steps:
        out.append(f"optim.warmup_steps={o.warmup_steps} is above trainer.max_steps={t.max_steps}: the learning "
                   "rate would never finish warming up; lower optim.warmup_steps (the paper: 10000 of 1M steps)")
    need(_integer(t.accumulate_grad_batches) and t.accumulate_grad_batches > 0, "trainer.accumulate_grad_batches",
         t.accumulate_grad_batches, "must be a positive integer (1 = no accumulation)")
    need(_integer(t.checkpoint_every_n_steps) and t.checkpoint_every_n_steps > 0, "trainer.checkpoint_every_n_steps",
         t.checkpoint_every_n_steps, "must be a positive number of steps")
    need(_integer(cfg.logger.log_every_n_steps) and cfg.logger.log_every_n_steps > 0, "logger.log_every_n_steps",
         cfg.logger.log_every_n_steps, "must be a positive number of steps")
    need(_integer(d.batch_size) and d.batch_size > 0, "data.batch_size", d.batch_size,
         "must be a positive integer (paper Table 6: 128 Small, 256 Base)")
    need(_integer(d.max_seq_length) and d.max_seq_length > 0, "data.max_seq_length", d.max_seq_length,
         "must be a positive integer (the paper: 128 Small, 512 Base)")
    for key in ("embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings"):
        need(_integer(m[key]) and m[key] > 0, f"model.{key}", m[key], "must be a positive integer")
    if _integer(m.hidden_size) and _integer(m.num_attention_heads) and m.num_attention_heads > 0 \
            and m.hidden_size % m.num_attention_heads:
        out.append(f"model.hidden_size={m.hidden_size} is not a multiple of model.num_attention_heads="
                   f"{m.num_attention_heads}; pick sizes whose ratio is a whole head size (e.g. 64)")
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
        need(_number(m[key]) and 0 <= m[key] < 1, f"model.{key}", m[key], "must be in [0, 1) (the paper: 0.1)")
    need(_number(m.generator_fraction) and 0 < m.generator_fraction <= 1, "model.generator_fraction",
         m.generator_fraction, "must be in (0, 1] (a fraction of the discriminator; the paper: 1/4 to 1/2)")
    gen = cfg.generator
    for key in ("hidden_size", "layers"):
        if key in gen:
            need(_number(gen[key]) and 0 < gen[key] <= 1, f"generator.{key}", gen[key],
                 "must be in (0, 1] (a multiplier of the discriminator's size)")
    obj = cfg.objective
    if "mask_prob" in obj:
        need(_number(obj.mask_prob) and 0 < obj.mask_prob < 1, "objective.mask_prob", obj.mask_prob,
             "must be in (0, 1) (the paper masks 0.15)")
    probs = [k for k in ("mask_token_prob", "random_token_prob") if k in obj]
    for key in probs:
        need(_number(obj[key]) and 0 <= obj[key] <= 1, f"objective.{key}", obj[key], "must be a probability in [0, 1]")
    if len(probs) == 2 and all(_number(obj[k]) for k in probs) and obj.mask_token_prob + obj.random_token_prob > 1:
        out.append(f"objective.mask_token_prob + objective.random_token_prob = "
                   f"{obj.mask_token_prob + obj.random_token_prob} must be <= 1 (BERT: 0.8 + 0.1)")
    if "temperature" in obj:
        need(_number(obj.temperature) and obj.temperature > 0, "objective.temperature", obj.temperature,
             "must be a positive number (1.0 samples the generator as is)")
    for key in ("gen_weight", "disc_weight"):
        if key in obj and not (key == "disc_weight" and obj[key] == "learned"):
            need(_number(obj[key]) and obj[key] >= 0, f"objective.{key}", obj[key],
                 "must be a finite number >= 0 (the paper: gen_weight 1, disc_weight 50)"
                 + ("; or `learned`" if key == "disc_weight" else ""))
    return out


def validate(cfg: DictConfig) -> None:
    """Reject configs that cannot work before any data is built, any step is taken or any run is recorded."""
    problems = value_problems(cfg)
    if problems:
        raise ConfigError("; ".join(problems))
    if cfg.data.max_seq_length > cfg.model.max_position_embeddings:
        raise ConfigError(
            f"data.max_seq_length={cfg.data.max_seq_length} is above model.max_position_embeddings="
            f"{cfg.model.max_position_embeddings}; lower data.max_seq_length or raise model.max_position_embeddings"
        )
    gen = cfg.generator
    if cfg.sharing.name == "all" and "hidden_size" in gen and (gen.hidden_size != 1.0 or gen.layers != 1.0):
        raise ConfigError(
            f"sharing=all needs generator and discriminator of equal size (paper section 3.2), but "
            f"generator.hidden_size={gen.hidden_size} generator.layers={gen.layers}; "
            "add generator.hidden_size=1.0 generator.layers=1.0, or use sharing=embeddings"
        )
    for f in cfg.trainer.export_fractions:
        if not 0 < f < 1:
            raise ConfigError(f"trainer.export_fractions has {f}; each must be in (0, 1) (the final step is always saved)")
    problems = hydra.utils.get_class(cfg.algorithm._target_).config_problems(cfg)  # e.g. two-stage: equal sizes
    if problems:
        raise ConfigError("; ".join(problems))


def resolve_precision(cfg: DictConfig) -> str:
    return precision.resolve(cfg.runtime.precision, precision.training_device(cfg.trainer.accelerator))


def build_networks(cfg: DictConfig, dm: PretrainDataModule, special: SpecialIds):
    disc_cfg = EncoderConfig(vocab_size=dm.vocab_size, pad_token_id=special.pad, **{k: cfg.model[k] for k in MODEL_KEYS})
    objective = instantiate(cfg.objective, special=special, vocab_size=dm.vocab_size, sampler=cfg.runtime.sampler)
    model = ElectraForPretraining(disc_cfg, **objective.model_heads)
    generator = None
    if objective.needs_generator:
        generator = instantiate(cfg.generator, disc_cfg, token_counts=torch.as_tensor(dm.token_counts), special=special)
        if isinstance(generator, ElectraForPretraining):
            share_weights(generator, model, cfg.sharing.name)
    fast.apply_runtime(cfg.runtime, model, generator)  # speed only: fast dropout masks, torch.compile
    return model, generator, objective


def run_tags(cfg: DictConfig, cfg_hash: str) -> dict[str, str]:
    gen = cfg.generator
    choice = gen._target_.rsplit(".", 1)[-1].removesuffix("Generator").lower()  # neural | uniform | unigram
    return {
        tracking.TAG_KIND: "pretrain",
        "objective": cfg.objective.name,
        "sharing": cfg.sharing.name,
        "algorithm": cfg.algorithm.name,
        "generator": choice,
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
    """Pre-train per `cfg`; returns the MLflow run id (None when `keep_going` swallowed a failure)."""
    validate(cfg)
    client = tracking.setup(cfg.logger.tracking_uri, cfg.logger.experiment)
    cfg_hash = tracking.config_hash(cfg)
    store = Path(cfg.paths.output_root) / "pretrain" / cfg.logger.experiment / cfg_hash
    # One process per identity: a second one would write the same checkpoints and the same MLflow run.
    with IdentityLock(store / "run.lock", f"pre-training {cfg.run_name} (config {cfg_hash}, outputs {store})"):
        return _train(cfg, client, cfg_hash, store, callbacks)


def missing_outputs(run) -> list[str]:
    """The pre-trained directories a FINISHED run recorded that are not (complete) on disk."""
    tags = run.data.tags
    paths = [tags[tracking.TAG_CHECKPOINT]] if tracking.TAG_CHECKPOINT in tags else []
    paths += list(json.loads(tags.get("checkpoints", "{}")).values())
    if not paths:
        return ["(no checkpoint_path tag)"]
    return [p for p in dict.fromkeys(paths) if not all((Path(p) / f).is_file() for f in (CONFIG_NAME, MODEL_NAME))]


def _train(cfg: DictConfig, client, cfg_hash: str, store: Path, callbacks: list[pl.Callback] | None) -> str | None:
    runs = tracking.runs_of_identity(client, cfg.logger.experiment, cfg_hash)
    done = next((r for r in runs if r.info.status == "FINISHED"), None)
    if done is not None:
        missing = missing_outputs(done)
        if not missing:
            tracking.retire_stale(client, runs, keep=done.info.run_id)
            log.info("already pre-trained: run %s (config %s); nothing to do", done.info.run_id, cfg_hash)
            return done.info.run_id
        log.warning("run %s (config %s) FINISHED but its outputs are gone (%s); pre-training again in the same run",
                    done.info.run_id, cfg_hash, ", ".join(missing))
    # One run per identity: the finished run whose outputs are gone, else the newest interrupted one.
    previous = done if done is not None else (runs[0] if runs else None)

    ckpt_dir = store / "checkpoints"
    last_ckpt = ckpt_dir / "last.ckpt"
    pl.seed_everything(cfg.seed, workers=True)
    torch.set_float32_matmul_precision(cfg.runtime.matmul_precision)

    on_gpu = torch.cuda.is_available() and cfg.trainer.accelerator in ("auto", "gpu", "cuda")
    # conf/data names the corpus's module: one file (PretrainDataModule) or many (TextFilesDataModule, HFDatasetDataModule). Called
    # directly rather than through instantiate() so that a DataError reaches the user unwrapped.
    data_args = OmegaConf.to_container(cfg.data, resolve=True, throw_on_missing=True)
    dm: PretrainDataModule = hydra.utils.get_class(data_args.pop("_target_"))(
        **data_args,
        cache_dir=cfg.paths.cache_dir,
        num_workers=cfg.runtime.num_workers,
        pin_memory=on_gpu if cfg.runtime.pin_memory == "auto" else bool(cfg.runtime.pin_memory),
        seed=cfg.seed,
    )
    dm.prepare()  # builds or loads the token cache; bad data fails here, before any network exists
    special = dm.special
    model, generator, objective = build_networks(cfg, dm, special)

    system = instantiate(
        cfg.algorithm,
        model=model,
        generator=generator,
        objective=objective,
        lr=cfg.optim.lr,
        betas=list(cfg.optim.betas),
        eps=cfg.optim.eps,
        weight_decay=cfg.optim.weight_decay,
        warmup_steps=cfg.optim.warmup_steps,
        max_grad_norm=cfg.optim.max_grad_norm,
        max_steps=cfg.trainer.max_steps,
        log_every_n_steps=cfg.logger.log_every_n_steps,
        fused_adam=None if cfg.runtime.fused_adam == "auto" else bool(cfg.runtime.fused_adam),
        _recursive_=False,
    )

    exported: dict[int, str] = json.loads((store / "checkpoints.json").read_text()) if (store / "checkpoints.json").is_file() else {}

    def save(step: int, name: str | None = None) -> Path:
        nets = system.exported_networks()
        path = save_pretrained(
            store / "pretrained" / (name or f"step_{step}"),
            nets.model,
            dm.vocab_path,
            meta={
                "objective": cfg.objective.name,
                "sharing": cfg.sharing.name,
                "algorithm": cfg.algorithm.name,
                "model_name": cfg.model.name,
                "do_lower_case": bool(cfg.data.lowercase),
                "step": step,
                "run_id": run.run_id,
                "flops": system.flops_at(step),
            },
            generator=nets.generator,
        )
        exported[str(step)] = str(path)
        tmp = store / "checkpoints.json.tmp"
        tmp.write_text(json.dumps(exported, indent=1, sort_keys=True))
        tmp.replace(store / "checkpoints.json")
        run.set_tags({"checkpoints": json.dumps(exported, sort_keys=True)})
        return path

    export_steps = [int(round(f * cfg.trainer.max_steps)) for f in cfg.trainer.export_fractions]
    trainer = pl.Trainer(
        max_steps=cfg.trainer.max_steps,
        accelerator=cfg.trainer.accelerator,
        devices=cfg.trainer.devices,
        strategy=cfg.trainer.strategy,
        num_nodes=cfg.trainer.num_nodes,
        precision=resolve_precision(cfg),
        gradient_clip_val=cfg.optim.max_grad_norm if system.automatic_optimization else None,
        accumulate_grad_batches=cfg.trainer.accumulate_grad_batches if system.automatic_optimization else 1,
        logger=False,
        enable_progress_bar=cfg.trainer.enable_progress_bar,
        enable_model_summary=False,
        default_root_dir=str(store),
        callbacks=[
            pl.callbacks.ModelCheckpoint(
                dirpath=str(ckpt_dir), every_n_train_steps=cfg.trainer.checkpoint_every_n_steps, save_top_k=0, save_last=True
            ),
            ExportPretrained(export_steps, save),
            *([fast.CompileTimer()] if cfg.runtime.compile else []),
            *(callbacks or []),
        ],
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    # Paper accounting: FLOPs of one optimizer step over the global batch (all devices, all micro-batches).
    gen_cfg = generator.config if isinstance(generator, ElectraForPretraining) else None
    global_batch = cfg.data.batch_size * cfg.trainer.accumulate_grad_batches * trainer.world_size
    flops_args = (model.config, gen_cfg, cfg.objective.name, global_batch, cfg.data.max_seq_length)
    system.flops_per_step = pretrain_flops_per_step(*flops_args)
    system.stage_flops = {stage: pretrain_flops_per_step(*flops_args, stage=stage) for stage in STAGES}
    # How often this run goes over its corpus, against the paper's ~5 passes (ELECTRA-Small, 3.3B tokens).
    budget = corpus_budget(dm.cache.meta["num_tokens"], dm.num_examples, cfg.trainer.max_steps,
                           cfg.data.batch_size * trainer.accumulate_grad_batches * trainer.world_size,
                           cfg.data.max_seq_length)
    log.info("corpus: %.1fM word pieces in %d examples; the run sees %.2fB tokens: %.1f passes over it",
             budget["corpus/tokens"] / 1e6, budget["corpus/examples"], budget["corpus/tokens_to_see"] / 1e9,
             budget["corpus/passes"])
    warning = passes_warning(budget)
    if warning:
        log.warning(warning)

    # The identity's run continues: from the last checkpoint when there is one (metrics already logged are
    # not logged again), else from step 0 in place. RUNNING leftovers of dead processes are marked KILLED.
    resume = previous is not None and last_ckpt.is_file()
    if previous is not None:
        how = (f"resumed from {last_ckpt}" if resume else f"restarted from step 0 in place: no checkpoint at {last_ckpt}")
        if previous.info.status == "FINISHED":
            how += "; its outputs were missing"
        run = tracking.RunLogger.adopt(client, previous, how, {"store": str(store)})
        log.info("run %s (%s): %s", previous.info.run_id, previous.info.status, how)
    else:
        run = tracking.RunLogger.start(
            client,
            cfg.logger.experiment,
            run_name=cfg.run_name,
            tags=run_tags(cfg, cfg_hash),
            params={**tracking.flatten(OmegaConf.to_container(cfg, resolve=True)), **data_provenance(dm),
                    "runtime.resolved_precision": resolve_precision(cfg),
                    **{k: str(round(v, 4) if isinstance(v, float) else v) for k, v in budget.items()}},
        )
        run.set_tags({"store": str(store), "hydra_output_dir": str(cfg.paths.output_dir)})
        run.log_metrics(budget, 0)
    tracking.retire_stale(client, runs, keep=run.run_id)
    system.metrics_sink = run.log_metrics
    system.metrics_flush = run.flush  # at every checkpoint: the store has each metric up to it
    system.last_good_checkpoint = lambda: str(last_ckpt) if last_ckpt.is_file() else None
    try:
        trainer.fit(system, datamodule=dm, ckpt_path=str(last_ckpt) if resume else None)
        if trainer.interrupted:
            raise KeyboardInterrupt("pre-training was interrupted")
        final = save(trainer.global_step, "final")
        run.log_metrics({"flops/total": system.flops_at(trainer.global_step)}, trainer.global_step)
        run.set_tags({tracking.TAG_CHECKPOINT: str(final)})
        run.finish("FINISHED")
    except BaseException as error:
        status, reason = tracking.end_status(error)
        run.finish(status, reason)
        if cfg.sweep.keep_going and isinstance(error, Exception):
            log.exception("pre-training failed; run %s marked %s, going on (sweep.keep_going=true)", run.run_id, status)
            return None
        raise
    log.info("pre-trained %s -> %s (MLflow run %s)", cfg.run_name, final, run.run_id)
    return run.run_id


@hydra.main(config_path=str(cli.CONF_DIR), config_name="pretrain", version_base="1.3")
def main(cfg: DictConfig) -> str | None:
    return train(cfg)


def cli_main() -> None:
    """Console entry: a misspelt key stops here with the keys it may mean, before Hydra starts (cli.py)."""
    cli.check_args("pretrain")
    main()


if __name__ == "__main__":
    cli_main()
