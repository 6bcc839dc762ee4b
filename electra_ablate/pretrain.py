"""Pre-train one variant: `python -m electra_ablate.pretrain objective=electra sharing=embeddings model=small`.

A flat recipe: check the config, find finished or interrupted work in MLflow, build the data, the networks
and the objective, train with Lightning, save the pre-trained network (checkpoint.py format) and record it.
Outputs live under `<paths.output_root>/pretrain/<experiment>/<config hash>/` so a run with the same
config is found again: a finished one is skipped, an interrupted one resumes from its last checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable
import logging
from pathlib import Path

import hydra
import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from electra_ablate import fast, tracking
from electra_ablate.checkpoint import save_pretrained
from electra_ablate.corpus import corpus_budget, passes_warning
from electra_ablate.data import PretrainDataModule
from electra_ablate.flops import STAGES, pretrain_flops_per_step
from electra_ablate.model import ElectraForPretraining, EncoderConfig, share_weights
from electra_ablate.objectives.base import SpecialIds

log = logging.getLogger(__name__)

MODEL_KEYS = ("embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "max_position_embeddings", "hidden_dropout_prob", "attention_probs_dropout_prob")


class ConfigError(ValueError):
    pass


def validate(cfg: DictConfig) -> None:
    """Reject configs that cannot work before any data is built or any step is taken."""
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
    if cfg.trainer.max_steps <= 0:
        raise ConfigError(f"trainer.max_steps={cfg.trainer.max_steps} must be positive")
    for f in cfg.trainer.export_fractions:
        if not 0 < f < 1:
            raise ConfigError(f"trainer.export_fractions has {f}; each must be in (0, 1) (the final step is always saved)")
    problems = hydra.utils.get_class(cfg.algorithm._target_).config_problems(cfg)  # e.g. two-stage: equal sizes
    if problems:
        raise ConfigError("; ".join(problems))


def resolve_precision(cfg: DictConfig) -> str:
    if cfg.runtime.precision != "auto":
        return str(cfg.runtime.precision)
    # bf16 is ~6x slower than fp32 on CPUs without bf16 instructions; on GPUs it is the fast path.
    on_gpu = torch.cuda.is_available() and cfg.trainer.accelerator in ("auto", "gpu", "cuda")
    return "bf16-mixed" if on_gpu else "32-true"


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
    done = tracking.find_finished_run(client, cfg.logger.experiment, cfg_hash)
    if done is not None:
        log.info("already pre-trained: run %s (config %s); nothing to do", done.info.run_id, cfg_hash)
        return done.info.run_id

    store = Path(cfg.paths.output_root) / "pretrain" / cfg.logger.experiment / cfg_hash
    ckpt_dir = store / "checkpoints"
    last_ckpt = ckpt_dir / "last.ckpt"
    pl.seed_everything(cfg.seed, workers=True)
    torch.set_float32_matmul_precision(cfg.runtime.matmul_precision)

    on_gpu = torch.cuda.is_available() and cfg.trainer.accelerator in ("auto", "gpu", "cuda")
    # conf/data names the corpus's module: one file (data.PretrainDataModule) or many (corpus.py). Called
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
    special = SpecialIds(*dm.special)
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

    # An interrupted run with the same config continues in its own MLflow run from its last checkpoint.
    resumed = _interrupted_run(client, cfg, cfg_hash) if last_ckpt.is_file() else None
    if resumed is not None:
        run = tracking.RunLogger(client, resumed)
        client.update_run(resumed, status="RUNNING")
        log.info("resuming run %s from %s", resumed, last_ckpt)
    else:
        run = tracking.RunLogger.start(
            client,
            cfg.logger.experiment,
            run_name=cfg.run_name,
            tags=run_tags(cfg, cfg_hash),
            params={**tracking.flatten(OmegaConf.to_container(cfg, resolve=True)),
                    **{k: str(round(v, 4) if isinstance(v, float) else v) for k, v in budget.items()}},
        )
        run.set_tags({"store": str(store), "hydra_output_dir": str(cfg.paths.output_dir)})
        run.log_metrics(budget, 0)
    system.metrics_sink = run.log_metrics
    try:
        trainer.fit(system, datamodule=dm, ckpt_path=str(last_ckpt) if resumed else None)
        if trainer.interrupted:
            raise KeyboardInterrupt("pre-training was interrupted")
        final = save(trainer.global_step, "final")
        run.log_metrics({"flops/total": system.flops_at(trainer.global_step)}, trainer.global_step)
        run.set_tags({tracking.TAG_CHECKPOINT: str(final)})
        run.finish("FINISHED")
    except BaseException as error:
        run.finish("FAILED")
        if cfg.sweep.keep_going and isinstance(error, Exception):
            log.exception("pre-training failed; run %s marked FAILED, going on (sweep.keep_going=true)", run.run_id)
            return None
        raise
    log.info("pre-trained %s -> %s (MLflow run %s)", cfg.run_name, final, run.run_id)
    return run.run_id


def _interrupted_run(client, cfg: DictConfig, cfg_hash: str) -> str | None:
    exp = client.get_experiment_by_name(cfg.logger.experiment)
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.{tracking.TAG_CONFIG_HASH} = '{cfg_hash}' and attributes.status != 'FINISHED'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0].info.run_id if runs else None


@hydra.main(config_path="../conf", config_name="pretrain", version_base="1.3")
def main(cfg: DictConfig) -> str | None:
    return train(cfg)


if __name__ == "__main__":
    main()
