"""What the training algorithms with their own optimizers share (Lightning manual optimisation).

Under manual optimisation Lightning neither clips gradients nor steps learning-rate schedulers, and it counts
every `LightningOptimizer.step()` as one global step. `ManualSystem` clips each optimizer's gradients in
`on_before_optimizer_step` (Lightning calls it after un-scaling fp16 gradients, right before the update),
builds optimizers and schedules exactly as joint training does (`optim.adam.adam_over_parameters`,
`optim.schedule.linear_warmup_decay`),
lets a second optimizer step without advancing the step counter, and rejects configs it cannot honour.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from hydra.utils import get_class
from omegaconf import DictConfig
from pytorch_lightning.core.optimizer import LightningOptimizer
from torch import nn

from electra_ablate.optim.adam import adam_over_parameters
from electra_ablate.optim.groups import unique_parameters
from electra_ablate.optim.schedule import linear_warmup_decay
from electra_ablate.training.system import PretrainSystem


class ManualSystem(PretrainSystem):
    """A `PretrainSystem` whose subclass steps its optimizers in `training_step`. Constructor arguments are
    the joint system's (`system_args`), forwarded unchanged."""

    def __init__(self, **system_args):
        super().__init__(**system_args)
        self.automatic_optimization = False

    @classmethod
    def config_problems(cls, cfg: DictConfig) -> list[str]:
        problems = super().config_problems(cfg)
        algorithm = f"algorithm={cfg.algorithm.name}"
        if not get_class(cfg.objective._target_).detects_replacements:
            problems.append(
                f"{algorithm} trains a discriminator on a generator's samples (paper section 3.2), so it needs an "
                f"objective that detects replaced tokens (e.g. objective=electra or objective=electra_15), not "
                f"objective={cfg.objective.name}"
            )
        elif get_class(cfg.weighting._target_).learned:
            problems.append(
                f"{algorithm} does not minimise one weighted sum of the MLM and discriminator losses (two-stage: "
                "one loss per stage; adversarial: the generator's term is a REINFORCE surrogate), so there is no "
                "lambda to learn; use weighting=fixed (weighting=learned is meant for algorithm=joint)"
            )
        if str(cfg.runtime.compile) == "step":
            problems.append(
                f"runtime.compile=step captures the joint training step; {algorithm} steps its networks by hand, "
                "one stage or player at a time; use runtime.compile=networks (or false)"
            )
        if cfg.trainer.accumulate_grad_batches != 1:
            problems.append(
                f"{algorithm} steps its optimizers by hand and does not accumulate gradients; set "
                "trainer.accumulate_grad_batches=1 (and raise data.batch_size for a larger batch)"
            )
        return problems

    # --- optimisation helpers -----------------------------------------------------------------------------
    def adam_over(
        self, modules: Iterable[nn.Module | None], exclude: Iterable[nn.Parameter] = ()
    ) -> torch.optim.Optimizer:
        """Adam over the modules' trainable parameters (each once; no decay on LayerNorm and bias), leaving out
        `exclude`: parameters another optimizer owns, such as embeddings shared with the discriminator. The
        update is joint training's: torch's AdamW, or the reference's (no bias correction) with
        optim.bias_correction=false."""
        skip = {id(p) for p in exclude}
        params = [(n, p) for n, p in unique_parameters(modules) if id(p) not in skip]
        fused = self.fused_adam if self.fused_adam is not None else self.device.type == "cuda"
        return adam_over_parameters(params, self.lr, self.betas, self.eps, self.weight_decay, fused=fused,
                                    bias_correction=self.bias_correction)

    def schedule(self, optimizer: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
        """Linear warmup over `warmup_steps`, then linear decay to zero after `steps` updates of `optimizer`."""
        return torch.optim.lr_scheduler.LambdaLR(optimizer, linear_warmup_decay(self.warmup_steps, steps))

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Reference: clip the global gradient norm to max_grad_norm; here per optimizer, over its own parameters.
        if self.max_grad_norm:
            self.clip_gradients(optimizer, gradient_clip_val=self.max_grad_norm, gradient_clip_algorithm="norm")

    def step_uncounted(self, optimizer: LightningOptimizer) -> None:
        """Step `optimizer` through the strategy (precision plugin, clipping hook) without counting a global
        step. Lightning counts each `LightningOptimizer.step()` of a manual training step, so a batch that
        steps two optimizers would advance `global_step` by two and halve max_steps, checkpoint intervals
        and export steps; one optimizer per batch steps through this instead."""
        self.trainer.strategy.optimizer_step(optimizer.optimizer, closure=_no_closure)


def _no_closure() -> None:
    """The loss was computed and back-propagated before the step (manual optimisation)."""
