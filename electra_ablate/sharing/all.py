"""All weights shared: one encoder for generator and discriminator (paper section 3.2: GLUE 84.4). Only
possible at equal sizes, which the paper notes makes the generator as costly as the discriminator."""

from __future__ import annotations

from omegaconf import DictConfig

from electra_ablate.models.encoder import ElectraForPretraining
from electra_ablate.generators.base import generator_multipliers
from electra_ablate.sharing.base import SharingMode


class AllSharing(SharingMode):
    display_name = "all weights shared"
    paper = "section 3.2 (GLUE 84.4)"

    @classmethod
    def config_problems(cls, cfg: DictConfig) -> list[str]:
        size = generator_multipliers(cfg)
        if size is not None and size != (1.0, 1.0):
            return [f"sharing={cfg.sharing.name} needs generator and discriminator of equal size (paper section "
                    f"3.2), but generator.hidden_size={size[0]} generator.layers={size[1]}; add "
                    "generator.hidden_size=1.0 generator.layers=1.0, or use sharing=embeddings"]
        return []

    def tie(self, generator: ElectraForPretraining, model: ElectraForPretraining) -> None:
        if generator.config != model.config:
            raise ValueError(
                f"sharing={self.name} needs a generator the same size as the discriminator (paper section 3.2); "
                f"got generator hidden {generator.config.hidden_size} x {generator.config.num_hidden_layers} "
                f"layers vs {model.config.hidden_size} x {model.config.num_hidden_layers}. "
                "Set generator.hidden_size=1.0 generator.layers=1.0 or choose sharing=embeddings.")
        generator.electra = model.electra
        generator.tie_weights()
