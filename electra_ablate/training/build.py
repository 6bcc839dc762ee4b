"""Everything pre-training builds from a composed config, each piece chosen by `_target_` in its config group:
the data module (`data`), the objective (`objective`) with its loss weighting (`weighting`), the generator
(`generator`) tied to the discriminator by the sharing mode (`sharing`), the training system (`algorithm`),
the Lightning Trainer, and the paper's FLOPs accounting of one step."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import pytorch_lightning as pl
import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.plugins import TorchCheckpointIO

from electra_ablate.common import io, precision
from electra_ablate.common.tokens import SpecialIds
from electra_ablate.data.module import PretrainDataModule
from electra_ablate.models import fast
from electra_ablate.models.encoder import ElectraForPretraining, EncoderConfig
from electra_ablate.models.flops import STAGES, pretrain_flops_per_step
from electra_ablate.sharing.base import SharingMode
from electra_ablate.tracking import attempts
from electra_ablate.training.checks import MODEL_KEYS

log = logging.getLogger(__name__)


# Lightning warns that a checkpoint of a run that steps its optimizers by hand (algorithms/two_stage.py,
# adversarial.py) holds the weights after step N; saved beside global_step N and the optimizer's state after step N,
# that is exactly what resuming needs, so the warning (and its example code) only clutters the log.
warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization", category=UserWarning)
# A run's folder may move (training/run_folder.py); its checkpoints then name the folder they were written in, and
# Lightning warns that it keeps none of their ModelCheckpoint bookkeeping, none of which a run here uses.
warnings.filterwarnings("ignore", message="The dirpath has changed from", category=UserWarning)

resolve_precision = precision.for_config  # where a run of cfg trains, and at which precision (common/precision.py)
on_gpu = precision.on_gpu


def attempt_precision(cfg: DictConfig, previous=None) -> attempts.Choice:
    """The precision this attempt of a run of `cfg` trains in (tracking/attempts.py): a run it continues
    (`previous`, an mlflow Run) keeps its own unless runtime.precision names one; where this machine is much slower
    at it, one warning line says so before any compute."""
    choice = attempts.choose(cfg.runtime.precision, precision.training_device(cfg.trainer.accelerator), previous)
    if choice.warning:
        log.warning("%s", choice.warning)
    else:
        log.info("precision %s: %s", choice.precision, choice.how)
    return choice


def data_module(cfg: DictConfig) -> PretrainDataModule:
    """conf/data names the corpus's module: one file (PretrainDataModule) or many (TextFilesDataModule, HFDatasetDataModule). Called directly
    rather than through instantiate() so that a DataError reaches the user unwrapped."""
    data_args = OmegaConf.to_container(cfg.data, resolve=True, throw_on_missing=True)
    return get_class(data_args.pop("_target_"))(
        **data_args,
        cache_dir=cfg.paths.cache_dir,
        num_workers=cfg.runtime.num_workers,
        pin_memory=on_gpu(cfg) if cfg.runtime.pin_memory == "auto" else bool(cfg.runtime.pin_memory),
        fixed_length=fast.static_shapes(cfg.runtime),
        seed=cfg.seed,
    )


def discriminator_config(cfg: DictConfig, vocab_size: int, pad_token_id: int) -> EncoderConfig:
    return EncoderConfig(vocab_size=vocab_size, pad_token_id=pad_token_id, **{k: cfg.model[k] for k in MODEL_KEYS})


def sharing_mode(cfg: DictConfig) -> SharingMode:
    """The `sharing` group's mode: ties the networks (`build_networks`) and says what pre-training saves."""
    return instantiate(cfg.sharing)


def build_networks(cfg: DictConfig, dm: PretrainDataModule, special: SpecialIds, sharing: SharingMode | None = None):
    """(discriminator or MLM model, generator or None, objective) for `cfg`, ready to train; a neural generator
    is tied to the discriminator by `sharing` (built from `cfg` when not given)."""
    disc_cfg = discriminator_config(cfg, dm.vocab_size, special.pad)
    extra = {}
    if get_class(cfg.objective._target_).weighted:
        extra["weighting"] = instantiate(cfg.weighting, gen_weight=cfg.objective.gen_weight,
                                         disc_weight=cfg.objective.disc_weight)
    objective = instantiate(cfg.objective, special=special, vocab_size=dm.vocab_size, sampler=cfg.runtime.sampler,
                            **extra)
    model = ElectraForPretraining(disc_cfg, **objective.model_heads)
    generator = None
    if objective.needs_generator:
        generator = instantiate(cfg.generator, disc_cfg, token_counts=torch.as_tensor(dm.token_counts), special=special)
        if generator.neural:
            (sharing or sharing_mode(cfg)).tie(generator, model)
    # Speed only: fast dropout masks, torch.compile of the networks (runtime.compile=step: `trained_system`).
    fast.apply_runtime(cfg.runtime, model, generator, device_type="cuda" if on_gpu(cfg) else "cpu")
    return model, generator, objective


def system(cfg: DictConfig, model, generator, objective) -> pl.LightningModule:
    """The training algorithm's LightningModule (config group `algorithm`) with the optimizer settings."""
    return instantiate(
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
        bias_correction=cfg.optim.bias_correction,
        _recursive_=False,
    )


def seeded(cfg: DictConfig) -> None:
    """Seed every generator and set the matmul precision, first thing before anything random is built."""
    pl.seed_everything(cfg.seed, workers=True)
    torch.set_float32_matmul_precision(cfg.runtime.matmul_precision)


def trained_system(cfg: DictConfig, dm: PretrainDataModule, sharing: SharingMode | None = None):
    """(model, generator, system) of `cfg` over the prepared data module, the system carrying `cfg.seed`."""
    model, generator, objective = build_networks(cfg, dm, dm.special, sharing)
    built = system(cfg, model, generator, objective)
    built.seed = cfg.seed
    if fast.compile_scope(cfg.runtime) == "step":
        built.compile_step(fast.compile_mode(cfg.runtime, "cuda" if on_gpu(cfg) else "cpu"))
    return model, generator, built


def count_flops(cfg: DictConfig, system_: pl.LightningModule, model, generator, trainer_: pl.Trainer) -> int:
    """Give the system its FLOPs per step (paper accounting) over the global batch; returns that batch."""
    global_batch = cfg.data.batch_size * cfg.trainer.accumulate_grad_batches * trainer_.world_size
    system_.stage_flops = step_flops(cfg, model, generator, global_batch)
    system_.flops_per_step = system_.stage_flops["joint"]
    return global_batch


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint written to a temporary file beside it and renamed over it (common/io.py): a process
    killed while it writes (a scheduler's SIGKILL after its grace period) leaves the previous checkpoint whole.
    Lightning's own writer stages the file in the system's temporary folder, from which it is copied, not
    renamed, when that folder is on another file system. `after_save(path, step)` runs once the file is in place
    (training/durable_run.py uploads it)."""

    def __init__(self, after_save: Callable[[Path, int], None] | None = None):
        super().__init__()
        self.after_save = after_save

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        with io.atomic_file(path) as tmp:
            super().save_checkpoint(checkpoint, tmp, storage_options)
        if self.after_save is not None:
            self.after_save(Path(path), int(checkpoint["global_step"]))


def trainer(cfg: DictConfig, store: Path, automatic_optimization: bool, callbacks: Sequence[pl.Callback],
            run_precision: str | None = None, after_save: Callable[[Path, int], None] | None = None) -> pl.Trainer:
    """The Lightning Trainer: the `trainer` group's placement and steps, `run_precision` (else what
    runtime.precision resolves to here), checkpoints every trainer.checkpoint_every_n_steps to
    `store`/checkpoints/last.ckpt (written whole or not at all, then handed to `after_save`), no Lightning logger (metrics go to MLflow in
    batches)."""
    return pl.Trainer(
        max_steps=cfg.trainer.max_steps,
        accelerator=cfg.trainer.accelerator,
        devices=cfg.trainer.devices,
        strategy=cfg.trainer.strategy,
        num_nodes=cfg.trainer.num_nodes,
        precision=run_precision or resolve_precision(cfg),
        # Algorithms that step their optimizers by hand clip and accumulate themselves.
        gradient_clip_val=cfg.optim.max_grad_norm if automatic_optimization else None,
        accumulate_grad_batches=cfg.trainer.accumulate_grad_batches if automatic_optimization else 1,
        logger=False,
        enable_progress_bar=cfg.trainer.enable_progress_bar,
        enable_model_summary=False,
        default_root_dir=str(store),
        callbacks=[
            # Every save overwrites last.ckpt: with Lightning's version counter, a resumed process that found a stop's
            # last.ckpt in place wrote last-v1.ckpt, last-v2.ckpt, ... beside it, which a resume did not read.
            pl.callbacks.ModelCheckpoint(dirpath=str(store / "checkpoints"), every_n_train_steps=cfg.trainer.checkpoint_every_n_steps,
                                         save_top_k=0, save_last=True, enable_version_counter=False),
            *([fast.CompileTimer()] if fast.compile_scope(cfg.runtime) != "false" else []),
            *callbacks,
        ],
        num_sanity_val_steps=0,
        limit_val_batches=0,
        plugins=[AtomicCheckpointIO(after_save)],
    )


def step_flops(cfg: DictConfig, model: ElectraForPretraining, generator, global_batch: int) -> dict[str, float]:
    """Paper accounting: FLOPs of one optimizer step over the global batch (all devices, all micro-batches), for
    joint training and for each stage of two-stage training."""
    gen_cfg = generator.config if generator is not None and generator.neural else None
    heads = get_class(cfg.objective._target_).flops
    args = (model.config, gen_cfg, heads, global_batch, cfg.data.max_seq_length)
    return {stage: pretrain_flops_per_step(*args, stage=stage) for stage in STAGES}


def config_step_flops(cfg: DictConfig, vocab_size: int) -> dict[str, float]:
    """The same accounting from the config alone, with a vocabulary of `vocab_size` (no data, no network built), for
    one process's batch: what a sweep's dry run prices a job with (sweep/cost.py)."""
    disc = discriminator_config(cfg, vocab_size, pad_token_id=0)
    gen = get_class(cfg.generator._target_).network_config(disc, cfg.generator)
    heads = get_class(cfg.objective._target_).flops
    batch = cfg.data.batch_size * cfg.trainer.accumulate_grad_batches
    return {stage: pretrain_flops_per_step(disc, gen, heads, batch, cfg.data.max_seq_length, stage=stage)
            for stage in STAGES}

