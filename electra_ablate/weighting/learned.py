"""Learned weights (beyond the paper): uncertainty weighting (Kendall, Gal and Cipolla 2018, in its common
simplified form), loss = exp(-s_gen) MLM + s_gen + exp(-s_disc) disc + s_disc with learned log-variances s,
which pulls each weight towards 1 / its loss, i.e. lambda towards MLM / disc.

They start at the fixed weights (objective.gen_weight and objective.disc_weight, the paper's 1 and 50), so the
learned lambda starts at the paper's value; the effective lambda exp(-s_disc) / exp(-s_gen) is logged as
train/disc_weight. The log-variances are loss weights, not network weights: their name ends in `bias`, so
the optimizer leaves them out of weight decay (`optim.groups.no_decay`), which would otherwise pull both weights
towards 1."""

from __future__ import annotations

import math

import torch
from torch import nn

from electra_ablate.weighting.base import LossWeighting


class LearnedWeights(LossWeighting):
    display_name = "learned lambda"
    paper = "beyond the paper (uncertainty weighting)"
    learned = True

    def __init__(self, name: str, gen_weight: float, disc_weight: float):
        super().__init__(name, gen_weight, disc_weight)
        if not gen_weight > 0 or not disc_weight > 0:
            raise ValueError(f"weighting={name} starts from objective.gen_weight={gen_weight} and "
                             f"objective.disc_weight={disc_weight}, which must both be > 0")
        # (2,) [s_gen, s_disc]: log-variances, starting where exp(-s) equals the fixed weights.
        self.log_var_bias = nn.Parameter(torch.tensor([-math.log(gen_weight), -math.log(disc_weight)]))

    def forward(self, gen_loss: torch.Tensor | None, disc_loss: torch.Tensor) -> torch.Tensor:
        s_gen, s_disc = self.log_var_bias
        loss = torch.exp(-s_disc) * disc_loss + s_disc
        return loss if gen_loss is None else loss + torch.exp(-s_gen) * gen_loss + s_gen

    def lambda_now(self) -> torch.Tensor:
        s_gen, s_disc = self.log_var_bias
        return torch.exp(s_gen - s_disc)  # lambda relative to the MLM weight
