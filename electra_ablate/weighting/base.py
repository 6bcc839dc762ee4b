"""How an objective's generator and discriminator losses are added into one (config group `weighting`).

The paper fixes the weights (loss = gen_weight x MLM + lambda x disc, lambda = disc_weight = 50, section 2);
the numbers belong to the objective (`objective.gen_weight`, `objective.disc_weight`), the rule that combines
them is a class chosen by `_target_` in conf/weighting/<name>.yaml."""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from typing import ClassVar

import torch
from omegaconf import DictConfig
from torch import nn


class LossWeighting(nn.Module, metaclass=ABCMeta):
    display_name: ClassVar[str]
    paper: ClassVar[str]
    learned: ClassVar[bool]  # has parameters of its own that training moves (an algorithm may not allow it)

    @classmethod
    def config_problems(cls, cfg: DictConfig) -> list[str]:
        """What makes `cfg` impossible for this weighting, each with the key and the fix (empty when fine)."""
        return []

    def __init__(self, name: str, gen_weight: float, disc_weight: float):
        super().__init__()
        if not gen_weight >= 0 or not disc_weight >= 0:
            raise ValueError(f"objective.gen_weight={gen_weight} and objective.disc_weight={disc_weight} must be >= 0")
        self.name = name
        self.gen_weight = gen_weight
        self.disc_weight = disc_weight

    @abstractmethod
    def forward(self, gen_loss: torch.Tensor | None, disc_loss: torch.Tensor) -> torch.Tensor:
        """The one loss the optimizer minimises."""

    def lambda_now(self) -> torch.Tensor | None:
        """The effective lambda (disc weight over MLM weight) when it changes during training, else None."""
        return None
