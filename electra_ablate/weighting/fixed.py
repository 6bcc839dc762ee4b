"""Fixed weights: loss = gen_weight x MLM + disc_weight x disc (paper section 2, lambda = 50)."""

from __future__ import annotations

import torch

from electra_ablate.weighting.base import LossWeighting


class FixedWeights(LossWeighting):
    display_name = "fixed lambda"
    paper = "section 2 (lambda = 50)"
    learned = False

    def forward(self, gen_loss: torch.Tensor | None, disc_loss: torch.Tensor) -> torch.Tensor:
        loss = self.disc_weight * disc_loss
        return loss if gen_loss is None else loss + self.gen_weight * gen_loss
