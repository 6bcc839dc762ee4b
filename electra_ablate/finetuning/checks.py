"""Fine-tuning settings that cannot work, refused before any data is read or any MLflow run exists, each with
the key and the fix (the pre-training counterpart is training/checks.py)."""

from __future__ import annotations

import math

from omegaconf import DictConfig

from electra_ablate.finetuning.data import FINETUNE_PADDING
from electra_ablate.finetuning.source import FinetuneError
from electra_ablate.finetuning.system import POOLINGS
from electra_ablate.models.fast import CPU_ATTENTION


def _positive(value, key: str, fix: str, integer: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if ok and integer and int(value) != value:
        ok = False
    if not ok:
        kind = "a positive integer" if integer else "a positive number"
        raise FinetuneError(f"{key}={value!r} must be {kind}; {fix}")


def validate(cfg: DictConfig) -> None:
    """Reject fine-tuning settings that cannot work, naming the key and the fix, before any data is read or any
    MLflow run exists (a run of 0 epochs would otherwise be recorded FINISHED, untrained)."""
    members = cfg.task.members.items() if "members" in cfg.task else [(cfg.task.name, cfg.task)]
    for name, task_cfg in members:
        key = f"task.members.{name}.epochs" if "members" in cfg.task else "task.epochs"
        _positive(task_cfg.epochs, key, f"the paper fine-tunes {name} for 3 epochs (10 for rte and stsb)", integer=True)
    d = cfg.glue_data
    _positive(d.batch_size, "glue_data.batch_size", "the paper uses 32", integer=True)
    _positive(d.eval_batch_size, "glue_data.eval_batch_size", "e.g. 128", integer=True)
    _positive(d.max_seq_length, "glue_data.max_seq_length", "the paper uses 128", integer=True)
    for key in ("max_train_examples", "max_eval_examples"):
        if d[key] is not None:
            _positive(d[key], f"glue_data.{key}", "or null for every row", integer=True)
    o = cfg.finetune_optim
    if o.lr is not None:
        _positive(o.lr, "finetune_optim.lr", "or null for the paper's lr by model size")
    for size, lr in o.lr_by_size.items():
        _positive(lr, f"finetune_optim.lr_by_size.{size}", "the paper: small 3e-4, base 1e-4, large 5e-5")
    decays = [("finetune_optim.layerwise_lr_decay", o.layerwise_lr_decay)] if o.layerwise_lr_decay is not None else []
    decays += [(f"finetune_optim.layerwise_lr_decay_by_size.{k}", v) for k, v in o.layerwise_lr_decay_by_size.items()]
    for key, value in decays:
        if not (isinstance(value, (int, float)) and 0 < value <= 1):
            raise FinetuneError(f"{key}={value!r} must be in (0, 1] (1 = no decay); the paper uses 0.8 (0.9 for large)")
    if not (isinstance(o.warmup_fraction, (int, float)) and 0 <= o.warmup_fraction < 1):
        raise FinetuneError(f"finetune_optim.warmup_fraction={o.warmup_fraction!r} must be in [0, 1): the fraction of "
                            "the steps spent warming up (the paper: 0.1)")
    if not (isinstance(o.max_grad_norm, (int, float)) and o.max_grad_norm > 0 and math.isfinite(o.max_grad_norm)):
        raise FinetuneError(f"finetune_optim.max_grad_norm={o.max_grad_norm!r} must be a positive number (the paper: 1.0)")
    if not isinstance(o.bias_correction, bool):
        raise FinetuneError(f"finetune_optim.bias_correction={o.bias_correction!r} must be true or false (false: the "
                            "reference's Adam, model/optimization.py; true: torch's AdamW)")
    if o.loss_reduction not in ("sum", "mean"):
        raise FinetuneError(f"finetune_optim.loss_reduction={o.loss_reduction!r} must be sum (the reference "
                            "run_finetuning.py sums the per-example losses over the batch) or mean")
    if cfg.runtime.cpu_attention not in CPU_ATTENTION:
        raise FinetuneError(f"runtime.cpu_attention={cfg.runtime.cpu_attention!r} must be math (attention written out "
                            "on CPU, the faster there) or sdpa (torch's fused kernel)")
    padding = cfg.runtime.get("finetune_padding", "dynamic")
    if padding not in FINETUNE_PADDING:
        raise FinetuneError(f"runtime.finetune_padding={padding!r} must be dynamic (each batch to its longest row), "
                            "bucket (to a multiple of 32) or max (to glue_data.max_seq_length: one shape, for graphs)")
    if cfg.pooling not in POOLINGS:
        raise FinetuneError(f"pooling={cfg.pooling!r} must be cls (the paper: the final [CLS] state) or mean (the "
                            "mean over the example's tokens)")
    n = cfg.reinit_top_layers
    if not (isinstance(n, int) and not isinstance(n, bool) and n >= 0):
        raise FinetuneError(f"reinit_top_layers={n!r} must be a whole number of top layers to re-initialise before "
                            "fine-tuning, 0 (the paper) or more")
    for key in ("hidden", "attention", "classifier"):
        value = cfg.dropout[key]
        if not (isinstance(value, (int, float)) and 0 <= value < 1):
            raise FinetuneError(f"dropout.{key}={value!r} must be in [0, 1) (the paper: 0.1)")
    steps = cfg.trainer.max_steps
    if not (isinstance(steps, int) and (steps == -1 or steps > 0)):
        raise FinetuneError(f"trainer.max_steps={steps!r} must be -1 (train for task.epochs) or a positive step count")
