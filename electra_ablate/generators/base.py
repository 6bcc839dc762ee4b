"""What every generator class (config group `generator`, chosen by `_target_`) tells the rest of the system
without being built: whether it is a network (it then costs FLOPs, can share weights and is trained) and, if
so, its size relative to the discriminator."""

from __future__ import annotations

from typing import ClassVar

from hydra.utils import get_class
from omegaconf import DictConfig

from electra_ablate.models.encoder import EncoderConfig


class GeneratorKind:
    label: ClassVar[str]  # the run tag `generator`
    display_name: ClassVar[str]
    paper: ClassVar[str]
    neural: ClassVar[bool]  # a Transformer whose FLOPs count and whose weights can be shared and trained

    @classmethod
    def config_problems(cls, cfg: DictConfig) -> list[str]:
        """What makes `cfg` impossible for this generator, each with the key and the fix (empty when fine)."""
        return []

    @classmethod
    def size_multipliers(cls, gen_cfg: DictConfig) -> tuple[float, float] | None:
        """(hidden, layers) multipliers of the discriminator's size, or None when there is no network."""
        return None

    @classmethod
    def network_config(cls, disc: EncoderConfig, gen_cfg: DictConfig) -> EncoderConfig | None:
        """The generator network's config for a discriminator `disc` (None when there is no network)."""
        size = cls.size_multipliers(gen_cfg)
        return None if size is None else disc.scaled(*size)


def generator_multipliers(cfg: DictConfig) -> tuple[float, float] | None:
    """(hidden, layers) multipliers of the composed config's generator, or None when it has no network."""
    return get_class(cfg.generator._target_).size_multipliers(cfg.generator)
