"""Shared embeddings (paper section 3.2: GLUE 84.3; the paper's default).

Token, position and token-type embeddings and the embedding LayerNorm become one module. A generator of a
smaller hidden size keeps its own `embeddings_project` (the reference's `embedding_size` projection), so any
generator size works as long as the embedding sizes agree."""

from __future__ import annotations

from omegaconf import DictConfig

from electra_ablate.models.encoder import ElectraForPretraining
from electra_ablate.sharing.base import SharingMode


class EmbeddingSharing(SharingMode):
    display_name = "shared embeddings"
    paper = "section 3.2 (GLUE 84.3)"

    @classmethod
    def config_problems(cls, cfg: DictConfig) -> list[str]:
        return []  # the generator is scaled from the discriminator's config and keeps its embedding size

    def tie(self, generator: ElectraForPretraining, model: ElectraForPretraining) -> None:
        if generator.config.embedding_size != model.config.embedding_size:
            raise ValueError(f"sharing={self.name} needs equal embedding_size for generator and discriminator; got "
                             f"{generator.config.embedding_size} and {model.config.embedding_size}")
        generator.electra.embeddings = model.electra.embeddings
        generator.tie_weights()
