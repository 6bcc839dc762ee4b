"""Optimizer and learning-rate schedule shared by pre-training and fine-tuning.

Reference (google-research/electra `model/optimization.py`): Adam with decoupled weight decay that skips
LayerNorm and bias parameters, a linear warmup and a linear decay to zero. The reference optimizer has no
bias correction (`reference_adam.ReferenceAdam`); `bias_correction=True` keeps torch's AdamW, the update
pre-training used before the option existed.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from electra_ablate.training.reference_adam import ReferenceAdam


def unique_parameters(modules: Iterable[nn.Module | None]) -> list[tuple[str, nn.Parameter]]:
    """Named trainable parameters of several modules, each shared tensor once (weight sharing, tying)."""
    seen: set[int] = set()
    out = []
    for i, module in enumerate(modules):
        if module is None:
            continue
        for name, p in module.named_parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                out.append((f"{i}.{name}", p))
    return out


def no_decay(name: str) -> bool:
    # Reference: exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"].
    return "LayerNorm" in name or "layer_norm" in name or name.endswith("bias")


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


def adamw(
    named_params: list[tuple[str, nn.Parameter]],
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    fused: bool | None = None,
    bias_correction: bool = True,
) -> torch.optim.Optimizer:
    groups = [
        {"params": [p for n, p in named_params if not no_decay(n)], "weight_decay": weight_decay},
        {"params": [p for n, p in named_params if no_decay(n)], "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    return adam(groups, lr, betas, eps, fused=fused, bias_correction=bias_correction)


def linear_warmup_decay(warmup_steps: int, total_steps: int):
    """LR multiplier per step, the reference's exact shape (`optimization.create_optimizer`): a linear decay
    from 1 at step 0 to 0 at `total_steps`, multiplied by min(1, step / warmup_steps)."""

    def factor(step: int) -> float:
        warm = min(1.0, step / warmup_steps) if warmup_steps > 0 else 1.0
        return warm * max(0.0, 1.0 - step / max(1, total_steps))

    return factor
