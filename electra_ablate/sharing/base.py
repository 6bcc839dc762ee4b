"""Generator/discriminator weight sharing (paper section 3.2), config group `sharing`.

A sharing mode is a small class chosen by `_target_` in conf/sharing/<name>.yaml. It says, before anything is
built, whether a config can work (`config_problems`), and then ties a built generator to the discriminator
(`tie`), and turns the trained networks into the ones pre-training saves (`exported`). The rest of the system
asks it only these and `shares_weights`; it never compares a mode's name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from omegaconf import DictConfig

from electra_ablate.models.encoder import ElectraForPretraining, Networks


class SharingMode(ABC):
    display_name: ClassVar[str]
    paper: ClassVar[str]  # where the paper reports it
    # Whether the generator uses any of the discriminator's tensors (two-stage training needs none shared).
    shares_weights: ClassVar[bool] = True

    def __init__(self, name: str):
        self.name = name

    @classmethod
    def config_problems(cls, cfg: DictConfig) -> list[str]:
        """What makes `cfg` impossible for this mode, each with the key and the fix (empty when fine)."""
        return []

    @abstractmethod
    def tie(self, generator: ElectraForPretraining, model: ElectraForPretraining) -> None:
        """Make the built `generator` use the `model`'s (the discriminator's) parameters."""

    def exported(self, nets: Networks) -> Networks:
        """The networks pre-training saves, from the trained ones: plain ELECTRA networks that models/checkpoint.py,
        fine-tuning and the transformers export read. Modes whose tying leaves plain networks return them as is."""
        return nets
