"""A fixed number of prediction slots per sequence, so that masking never waits on the device.

Boolean-mask indexing (`hidden[selected]`) returns a tensor whose size depends on the data, so the host must
wait for the device to learn it: one synchronisation per use, several per step. The reference
(google-research/electra `pretrain_helpers.py`: `mask`, `gather_positions`, `scatter_update`) instead keeps
`max_predictions_per_seq` slots per sequence (`configure_pretraining.py`: int((mask_prob + 0.005) x
max_seq_length)): slot positions (B, N) and weights (B, N), with the unused slots padded and weighted 0. Every
shape then follows from the batch's shape alone. This module holds that bookkeeping: choosing the slots, and
gathering from and scattering into (B, T) tensors through them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

# How slot positions are drawn (objective.position_sampling).
#   without_replacement: k distinct positions uniformly among the candidates, k = round(mask_prob x #candidates).
#   reference: as `pretrain_helpers.mask` -- k = round(mask_prob x #non-pad tokens) draws with replacement
#     (tf.random.categorical) uniformly among the candidates; a position drawn twice is predicted twice (both
#     slots keep weight 1) but replaced once.
SAMPLING = ("without_replacement", "reference")


class Positions(NamedTuple):
    index: torch.Tensor  # (B, N) long: position in the row of each slot; 0 in unused slots
    weights: torch.Tensor  # (B, N) bool: the slot is a prediction (counts in losses and metrics)
    first: torch.Tensor  # (B, N) bool: a used slot whose position no earlier slot of its row holds (what is replaced)


def max_predictions(mask_prob: float, length: int, cap: int | None = None) -> int:
    """Slots per sequence for a batch padded to `length` tokens (a Python int: shapes never depend on data).

    `cap` None: the reference's int((mask_prob + 0.005) x length), raised to round(mask_prob x length) where
    that is larger (short sequences only: from length 40 up at mask_prob 0.15), so that it never lowers the
    number of predictions round(mask_prob x #candidates) below what it is without a cap.
    """
    if cap is None:
        cap = max(int((mask_prob + 0.005) * length), round(mask_prob * length))
    return max(1, min(int(cap), length))


def choose(
    candidates: torch.Tensor,
    tokens: torch.Tensor,
    mask_prob: float,
    slots: int,
    sampling: str = "without_replacement",
) -> Positions:
    """Pick the prediction positions of each row: (B, T) bool `candidates` (maskable) and `tokens` (non-pad)."""
    B, T = candidates.shape
    if sampling == "without_replacement":
        n = candidates.sum(dim=1, keepdim=True)  # (B, 1)
        k = torch.clamp(torch.round(n.float() * mask_prob), min=1).long()
        k = torch.minimum(torch.clamp(k, max=slots), n)
        # The k smallest of T uniform scores, candidates only: k positions uniformly without replacement.
        scores = torch.rand(candidates.shape, device=candidates.device)
        scores.masked_fill_(~candidates, 2.0)  # non-candidates sort last
        order = scores.topk(slots, dim=1, largest=False).indices  # (B, N), ascending score
        weights = torch.arange(slots, device=candidates.device)[None] < k
        # Ascending positions, unused slots last: reads the sequence in order (and as boolean indexing did).
        index = torch.where(weights, order, T).sort(dim=1).values
        weights = index < T
        index = index.masked_fill(~weights, 0)
        return Positions(index, weights, weights)
    if sampling == "reference":
        n = tokens.sum(dim=1, keepdim=True)  # (B, 1): the reference counts the input mask, not the candidates
        k = torch.clamp(torch.round(n.float() * mask_prob), max=slots).clamp(min=1).long()
        # Draws with replacement, uniform over the candidates (tf.random.categorical in the reference): the
        # r-th candidate of the row, r uniform in 1..#candidates, found by a search in the running count.
        count = candidates.long().cumsum(dim=1)  # (B, T)
        ranks = (torch.rand(B, slots, device=candidates.device) * count[:, -1:]).long() + 1  # (B, N)
        ranks = torch.minimum(ranks, count[:, -1:])  # float rounding can reach the count itself
        index = torch.searchsorted(count, ranks).clamp(max=T - 1)
        weights = (torch.arange(slots, device=candidates.device)[None] < k) & (count[:, -1:] > 0)
        index = index.masked_fill(~weights, 0)
        same = index[:, :, None] == index[:, None, :]  # (B, N, N)
        earlier = torch.ones(slots, slots, dtype=torch.bool, device=index.device).tril(-1)  # [i, j]: j < i
        repeated = (same & earlier & weights[:, None, :]).any(dim=2)
        return Positions(index, weights, weights & ~repeated)
    raise ValueError(f"objective.position_sampling={sampling!r}; valid: {', '.join(SAMPLING)}")


def gather(sequence: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(B, T) or (B, T, D) -> (B, N) or (B, N, D): the values at the slots' positions (reference `gather_positions`)."""
    if sequence.dim() == 3:
        return sequence.gather(1, index[:, :, None].expand(-1, -1, sequence.shape[-1]))
    return sequence.gather(1, index)


def scatter(sequence: torch.Tensor, positions: Positions, updates: torch.Tensor) -> torch.Tensor:
    """A copy of (B, T) `sequence` with (B, N) `updates` written at the positions of the `first` slots
    (reference `scatter_update`; a position drawn twice takes its first slot's update, where the reference
    averages the two)."""
    B, T = sequence.shape
    # Unused and repeated slots write to a scratch column T that is dropped: no data-dependent shape.
    index = positions.index.masked_fill(~positions.first, T)
    out = torch.cat([sequence, sequence.new_zeros(B, 1)], dim=1)
    return out.scatter(1, index, updates.to(out.dtype))[:, :T]


def selected(positions: Positions, length: int) -> torch.Tensor:
    """(B, T) bool: the positions some slot predicts."""
    zeros = torch.zeros(positions.index.shape[0], length, dtype=torch.bool, device=positions.index.device)
    return scatter(zeros, positions, positions.first)


def flat(values: torch.Tensor) -> torch.Tensor:
    """(B, N, ...) -> (B x N, ...), slots in row-major order (the order `masked_logits` returns rows in)."""
    return values.reshape(-1, *values.shape[2:])
