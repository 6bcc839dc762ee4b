"""The discriminator's ROC AUC (`disc_auc`, reference metric vocabulary) from score histograms kept on the device.

Each step adds its weighted (probability, label) pairs to a (2, bins) histogram with one scatter-add: fixed
memory, and no shape or branch that depends on the data, so the step never waits on the device (a general
AUROC metric filters ignored entries and checks value ranges, both of which do). The area is computed once
per logging window, as the trapezoid under the ROC curve traced by the bin edges: pairs that share a bin count
as half-ordered, so the binned area is within about 1/bins of the exact one.
"""

from __future__ import annotations

import torch
from torch import nn


class BinnedAUC(nn.Module):
    def __init__(self, bins: int = 200):
        super().__init__()
        self.bins = bins
        # Not in the state_dict (the checkpoint carries it beside the weights, as metric sums are).
        self.register_buffer("counts", torch.zeros(2, bins, dtype=torch.long), persistent=False)
        self._update_count = 0

    @property
    def update_count(self) -> int:
        return self._update_count

    @property
    def metric_state(self) -> dict[str, torch.Tensor]:
        return {"counts": self.counts}

    @torch.no_grad()
    def update(self, probs: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None) -> None:
        """(N,) probabilities in [0, 1], (N,) 0/1 labels, optional (N,) bool weights (False: left out)."""
        bin_of = (probs.detach().float() * self.bins).long().clamp_(0, self.bins - 1)
        w = torch.ones_like(bin_of) if weights is None else weights.long()
        self.counts.index_put_((labels.long(), bin_of), w, accumulate=True)
        self._update_count += 1

    def compute(self) -> torch.Tensor:
        neg, pos = self.counts.double().cpu()
        # Thresholds from the top bin down: true and false positive rates at each bin edge.
        tpr = torch.cat([torch.zeros(1, dtype=torch.float64), pos.flip(0).cumsum(0)]) / pos.sum().clamp(min=1)
        fpr = torch.cat([torch.zeros(1, dtype=torch.float64), neg.flip(0).cumsum(0)]) / neg.sum().clamp(min=1)
        return torch.trapezoid(tpr, fpr).float()

    def reset(self) -> None:
        self.counts.zero_()
        self._update_count = 0
