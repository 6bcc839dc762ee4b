"""Checks of a pre-training config that need no data and no network: every bad value is reported with its
key and the fix before anything is built, run or recorded."""

from __future__ import annotations

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from electra_ablate.common.values import is_integer as _integer
from electra_ablate.common.values import is_number as _number
from electra_ablate.models.encoder import LAYER_NORMS
from electra_ablate.models import fast
from electra_ablate.models.fast import CPU_ATTENTION

# The config groups whose `_target_` class carries its own constraints (`config_problems(cfg)`).
AXES = ("objective", "generator", "sharing", "weighting", "algorithm")

MODEL_KEYS = ("embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "max_position_embeddings", "hidden_dropout_prob", "attention_probs_dropout_prob", "layer_norm",
              "linear_bias")


class ConfigError(ValueError):
    pass


def value_problems(cfg: DictConfig) -> list[str]:
    """Settings outside their valid range, each with the key and the fix (the paper's value where it has one).
    A variant's own settings (objective.mask_prob, ...) are checked by its class (`config_problems`)."""
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
    need(isinstance(o.bias_correction, bool), "optim.bias_correction", o.bias_correction,
         "must be true (torch's AdamW) or false (the reference's update, model/optimization.py)")
    need(len(o.betas) == 2 and all(_number(b) and 0 <= b < 1 for b in o.betas), "optim.betas", list(o.betas),
         "must be two numbers in [0, 1) (the paper: [0.9, 0.999])")
    need(_integer(t.max_steps) and t.max_steps > 0, "trainer.max_steps", t.max_steps, "must be a positive number of steps")
    need(cfg.runtime.cpu_attention in CPU_ATTENTION, "runtime.cpu_attention", cfg.runtime.cpu_attention,
         "must be math (attention written out on CPU, the faster there) or sdpa (torch's fused kernel)")
    runtime_errors = []  # compile_mode and static_shapes read runtime.compile too: each message once
    for setting in (fast.compile_scope, lambda r: fast.compile_mode(r, "cpu"), fast.static_shapes):
        try:
            setting(cfg.runtime)
        except ValueError as error:
            runtime_errors.append(str(error))
    out.extend(dict.fromkeys(runtime_errors))
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
    need(m.layer_norm in LAYER_NORMS, "model.layer_norm", m.layer_norm,
         f"must be one of {', '.join(LAYER_NORMS)} (the paper: post)")
    need(isinstance(m.linear_bias, bool), "model.linear_bias", m.linear_bias, "must be true or false (the paper: true)")
    need(_number(m.generator_fraction) and 0 < m.generator_fraction <= 1, "model.generator_fraction",
         m.generator_fraction, "must be in (0, 1] (a fraction of the discriminator; the paper: 1/4 to 1/2)")
    return out


def validate(cfg: DictConfig) -> None:
    """Reject configs that cannot work before any data is built, any step is taken or any run is recorded."""
    missing = sorted(OmegaConf.missing_keys(cfg))  # `???`: a value only the user can give (data.paths)
    if missing:
        raise ConfigError("; ".join(f"{k} has no value (??? in conf/{k.split('.')[0]}/): give it, e.g. {k}=... on the "
                                    "command line; the option's file shows examples" for k in missing))
    problems = value_problems(cfg)
    if problems:
        raise ConfigError("; ".join(problems))
    if cfg.data.max_seq_length > cfg.model.max_position_embeddings:
        raise ConfigError(
            f"data.max_seq_length={cfg.data.max_seq_length} is above model.max_position_embeddings="
            f"{cfg.model.max_position_embeddings}; lower data.max_seq_length or raise model.max_position_embeddings"
        )
    for f in cfg.trainer.export_fractions:
        if not 0 < f < 1:
            raise ConfigError(f"trainer.export_fractions has {f}; each must be in (0, 1) (the final step is always saved)")
    # Each variant axis checks its own constraints (e.g. sharing=all: equal sizes; two-stage: no sharing).
    problems = [p for group in AXES for p in get_class(cfg[group]._target_).config_problems(cfg)]
    if problems:
        raise ConfigError("; ".join(problems))
