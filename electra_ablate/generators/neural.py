"""Generators: what proposes the replacement tokens (config group `generator`).

`NeuralGenerator` is the paper's small MLM Transformer, sized as a fraction of the discriminator (hidden
size and layer count multipliers; heads = max(1, hidden // 64), FFN = 4 x hidden as the reference
`get_generator_config`). `UniformGenerator` and `UnigramGenerator` are the two non-neural generators of the
paper's Figure 3 (left). Every generator is built from the discriminator's config and the corpus's token
counts, and answers `masked_logits(...)` with (N, V) logits at the selected positions only.
"""

from __future__ import annotations

import torch
from torch import nn

from electra_ablate.models.encoder import ElectraForPretraining, EncoderConfig
from electra_ablate.common.tokens import SpecialIds


class NeuralGenerator(ElectraForPretraining):
    trainable = True

    def __init__(
        self,
        config: EncoderConfig,
        token_counts: torch.Tensor,
        special: SpecialIds,
        hidden_size: float = 0.25,
        layers: float = 1.0,
    ):
        assert 0 < hidden_size <= 1 and 0 < layers <= 1, (
            f"generator.hidden_size={hidden_size} and generator.layers={layers} are multipliers of the "
            "discriminator's size and must be in (0, 1]"
        )
        super().__init__(config.scaled(hidden_size, layers), mlm_head=True)
        self.hidden_multiplier = hidden_size
        self.layer_multiplier = layers

    def masked_logits(self, input_ids, attention_mask, token_type_ids, selected) -> torch.Tensor:
        hidden = self(input_ids, attention_mask, token_type_ids)  # (B, T, H)
        return self.mlm_logits(hidden[selected])  # (N, V): logits only where tokens were selected


class _FixedDistribution(nn.Module):
    """A generator that ignores its input: the same log-probabilities at every position."""

    trainable = False

    def __init__(self, log_probs: torch.Tensor, special: SpecialIds):
        super().__init__()
        log_probs = log_probs.float().clone()
        # Never propose special tokens: they cannot be selected for replacement in the first place.
        log_probs[[special.pad, special.cls, special.sep, special.mask]] = float("-inf")
        self.register_buffer("log_probs", log_probs, persistent=False)

    def masked_logits(self, input_ids, attention_mask, token_type_ids, selected) -> torch.Tensor:
        return self.log_probs.expand(int(selected.sum()), -1)  # (N, V) view, no copy


class UniformGenerator(_FixedDistribution):
    def __init__(self, config: EncoderConfig, token_counts: torch.Tensor, special: SpecialIds):
        super().__init__(torch.zeros(config.vocab_size), special)


class UnigramGenerator(_FixedDistribution):
    def __init__(self, config: EncoderConfig, token_counts: torch.Tensor, special: SpecialIds):
        counts = torch.as_tensor(token_counts, dtype=torch.float64)
        assert counts.numel() == config.vocab_size, (
            f"token counts cover {counts.numel()} ids but the vocabulary has {config.vocab_size}"
        )
        # Add-one smoothing so every ordinary token can be proposed.
        super().__init__(torch.log(counts + 1.0), special)
