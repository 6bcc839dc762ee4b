"""The units of work of a sweep and the keys that find them again in MLflow: a pre-training job (variant x
seed), a checkpoint to fine-tune (a pre-training run's step, a `pretrained` model as is, or a random-init encoder
shaped like a run; under one fine-tuning recipe where the sweep lists several), and the key of a fine-tuning job
(source, step, task, seed: the recipe is not in it, the config hash of the job's composed config tells recipes
apart, as sweep.plan.matches reads it)."""

from __future__ import annotations

from typing import NamedTuple

class PretrainJob(NamedTuple):
    variant: str
    seed: int


class Checkpoint(NamedTuple):
    """One network to fine-tune: a pre-training run's checkpoint at `step`, or a `pretrained` model as is."""

    variant: str
    pretrain_seed: int | None
    run_id: str | None  # pre-training run (None for `pretrained` variants)
    step: int | None
    final: bool
    fraction: float | None
    random_init: bool = False  # the run's architecture and vocabulary with fresh random weights
    # The fine-tuning recipe (conf/recipe/) of a sweep that lists several (`recipes`); None: the variant's own
    # fine-tuning overrides, as a sweep of one recipe has them.
    recipe: str | None = None

    @property
    def arm_final(self) -> bool:
        """Whether it is its arm's last point, the one verdicts read: a pre-training run's final checkpoint, a
        `pretrained` model, or a random-init encoder (whichever of its run's checkpoints lent it the shape)."""
        return self.final or self.random_init

    @property
    def config_name(self) -> str:
        name = self.variant if self.run_id is None else (
            f"{self.variant}-s{self.pretrain_seed}-{'final' if self.final else f'step{self.step}'}")
        return name if self.recipe is None else f"{name}-{self.recipe}"

    @property
    def source(self) -> str:
        """The FinetuneKey source of its fine-tuning runs."""
        if self.run_id is None:
            return f"variant:{self.variant}"
        return f"{RANDOM_SOURCE}{self.run_id}" if self.random_init else self.run_id


RANDOM_SOURCE = "random:"  # FinetuneKey source prefix of random-init runs shaped like a pre-training run


class FinetuneKey(NamedTuple):
    """What identifies a fine-tuning job within a sweep (its MLflow tags)."""

    source: str  # pre-training run id, `random:<run id>` for a random-init arm, `variant:<label>` for `pretrained`
    step: str  # pretrained_step tag; "" where the step is not the job's: see sweep.plan.finetune_key
    task: str
    seed: int

