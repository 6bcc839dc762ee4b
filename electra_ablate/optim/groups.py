"""Which parameters an optimizer owns and which of them decay (reference `exclude_from_weight_decay`)."""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn


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


def decay_groups(named_params: list[tuple[str, nn.Parameter]], weight_decay: float) -> list[dict]:
    """Two param groups: `weight_decay` on every parameter but LayerNorm and bias, none on those; empty ones
    left out."""
    groups = [
        {"params": [p for n, p in named_params if not no_decay(n)], "weight_decay": weight_decay},
        {"params": [p for n, p in named_params if no_decay(n)], "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]
