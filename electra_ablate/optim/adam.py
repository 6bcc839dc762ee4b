"""The Adam optimizers of pre-training and fine-tuning.

Reference (google-research/electra `model/optimization.py`): Adam with decoupled weight decay that skips
LayerNorm and bias parameters. The reference optimizer has no bias correction (`reference_adam.ReferenceAdam`,
fine-tuning's default); `bias_correction=True` is torch's AdamW, pre-training's default (the update it used
before the option existed).
"""

from __future__ import annotations

import torch
from torch import nn

from electra_ablate.optim.groups import decay_groups
from electra_ablate.optim.reference_adam import ReferenceAdam


def adam(
    groups: list[dict],
    lr: float,
    betas: tuple[float, float],
    eps: float,
    fused: bool | None = None,
    bias_correction: bool = True,
) -> torch.optim.Optimizer:
    """Adam with decoupled weight decay over param groups that carry their own `weight_decay` (and lr), on
    torch's fused kernel if `fused`: the reference's update (`ReferenceAdam`) for bias_correction=False,
    torch's AdamW for True."""
    if bias_correction:
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused)
    return ReferenceAdam(groups, lr=lr, betas=tuple(betas), eps=eps, bias_correction=False, fused=fused)


def adam_over_parameters(
    named_params: list[tuple[str, nn.Parameter]],
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    fused: bool | None = None,
    bias_correction: bool = True,
) -> torch.optim.Optimizer:
    """`adam` over named parameters, `weight_decay` on all but LayerNorm and bias: the reference's update for
    bias_correction=False, torch's AdamW for True."""
    return adam(decay_groups(named_params, weight_decay), lr, betas, eps, fused=fused, bias_correction=bias_correction)
