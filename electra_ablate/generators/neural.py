"""The paper's generator: a small MLM Transformer sized as a fraction of the discriminator (hidden size and
layer count multipliers; heads = max(1, hidden // 64), FFN = 4 x hidden as the reference
`get_generator_config`). Built from the discriminator's config and the corpus's token counts, it answers
`masked_logits(...)` with (B x N, V) logits at the prediction slots only (objectives/positions.py).
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from electra_ablate.generators.base import GeneratorKind
from electra_ablate.models.encoder import ElectraForPretraining, EncoderConfig
from electra_ablate.common.tokens import SpecialIds
from electra_ablate.objectives import positions as slots


class NeuralGenerator(ElectraForPretraining, GeneratorKind):
    label = "neural"
    display_name = "MLM generator"
    paper = "section 2; sizes: section 3.2, Figure 3"
    neural = True
    trainable = True

    @classmethod
    def config_problems(cls, cfg: DictConfig) -> list[str]:
        out = []
        for key in ("hidden_size", "layers"):
            value = cfg.generator[key]
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1
            if not ok:
                out.append(f"generator.{key}={value!r} must be in (0, 1] (a multiplier of the discriminator's size)")
        return out

    @classmethod
    def size_multipliers(cls, gen_cfg: DictConfig) -> tuple[float, float]:
        return float(gen_cfg.hidden_size), float(gen_cfg.layers)

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

    def masked_logits(self, input_ids, attention_mask, token_type_ids, positions) -> torch.Tensor:
        """(B x N, V) logits at the (B, N) slot `positions`, row-major; the vocabulary projection runs there only."""
        hidden = self(input_ids, attention_mask, token_type_ids)  # (B, T, H)
        return self.mlm_logits(slots.flat(slots.gather(hidden, positions)))

