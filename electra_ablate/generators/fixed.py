"""The two generators with no network of the paper's Figure 3 (left): replacements drawn uniformly from the
vocabulary, or by token frequency in the training corpus. Nothing to train and no FLOPs counted."""

from __future__ import annotations

import torch
from torch import nn

from electra_ablate.common.tokens import SpecialIds
from electra_ablate.generators.base import GeneratorKind
from electra_ablate.models.encoder import EncoderConfig


class _FixedDistribution(nn.Module, GeneratorKind):
    """A generator that ignores its input: the same log-probabilities at every position."""

    neural = False
    trainable = False
    paper = "Figure 3 (left)"

    def __init__(self, log_probs: torch.Tensor, special: SpecialIds):
        super().__init__()
        log_probs = log_probs.float().clone()
        # Never propose special tokens: they cannot be selected for replacement in the first place.
        log_probs[[special.pad, special.cls, special.sep, special.mask]] = float("-inf")
        self.register_buffer("log_probs", log_probs, persistent=False)

    def masked_logits(self, input_ids, attention_mask, token_type_ids, positions) -> torch.Tensor:
        # (B x N, V) view, no copy: one row per (B, N) slot, a count known from the shape alone.
        return self.log_probs.expand(positions.numel(), -1)


class UniformGenerator(_FixedDistribution):
    label = "uniform"
    display_name = "uniform replacements"

    def __init__(self, config: EncoderConfig, token_counts: torch.Tensor, special: SpecialIds):
        super().__init__(torch.zeros(config.vocab_size), special)


class UnigramGenerator(_FixedDistribution):
    label = "unigram"
    display_name = "unigram replacements"

    def __init__(self, config: EncoderConfig, token_counts: torch.Tensor, special: SpecialIds):
        counts = torch.as_tensor(token_counts, dtype=torch.float64)
        assert counts.numel() == config.vocab_size, (
            f"token counts cover {counts.numel()} ids but the vocabulary has {config.vocab_size}"
        )
        # Add-one smoothing so every ordinary token can be proposed.
        super().__init__(torch.log(counts + 1.0), special)
