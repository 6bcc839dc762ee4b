"""ELECTRA's replaced token detection (Clark et al. 2020, section 2).

The generator is trained with MLM on the selected positions; its samples replace those tokens; the
discriminator predicts for every non-pad token whether it was replaced. Loss = gen_weight x MLM +
disc_weight x disc, with lambda = disc_weight = 50 (paper section 2 / reference `disc_weight`).

How the two losses are added is the `weighting` config group (electra_ablate/weighting/): the paper's fixed
weights by default, or a learned lambda.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from electra_ablate.common.values import is_number
from electra_ablate.models.encoder import Networks
from electra_ablate.models.flops import Heads
from electra_ablate.objectives.base import (Batch, Fake, GeneratorObjective, ObjectiveOutput, disc_sums, need, ratio,
                                           rtd_loss)
from electra_ablate.weighting.base import LossWeighting
from electra_ablate.weighting.fixed import FixedWeights


class Electra(GeneratorObjective):
    display_name = "ELECTRA"
    paper = "section 2, Table 5 (GLUE 85.0)"
    model_heads = {"disc_head": True}
    flops = Heads("disc", 1.0, generator=True)
    weighted = True
    detects_replacements = True

    @classmethod
    def config_problems(cls, cfg: DictConfig) -> list[str]:
        out = super().config_problems(cfg)
        if "disc_weight" in cfg.objective:
            w = cfg.objective.disc_weight
            need(out, is_number(w) and w >= 0, "objective.disc_weight", w, "must be a finite number >= 0 (the paper: "
                 "gen_weight 1, disc_weight 50); to learn lambda add weighting=learned")
        return out

    def __init__(self, *masking, disc_weight: float = 50.0, weighting: LossWeighting | None = None, **generator_args):
        # The masking and sampling arguments are Objective's and GeneratorObjective's, defined there once.
        super().__init__(*masking, **generator_args)
        if isinstance(disc_weight, str):
            raise ValueError(f"objective.disc_weight={disc_weight!r}: give a number (lambda; the paper uses 50); "
                             "to learn lambda, add weighting=learned")
        self.disc_weight = disc_weight
        self.weighting = weighting if weighting is not None else FixedWeights("fixed", self.gen_weight, disc_weight)

    def disc_weights(self, batch: Batch, fake: Fake) -> torch.Tensor:
        """(B, T) bool: where the discriminator loss applies -- every non-pad token ([CLS]/[SEP] included, as
        the reference weights by `input_mask`)."""
        return batch.attention_mask.bool()

    def combine(self, gen_loss: torch.Tensor | None, disc_loss: torch.Tensor) -> torch.Tensor:
        return self.weighting(gen_loss, disc_loss)

    def forward(self, batch: Batch, nets: Networks) -> ObjectiveOutput:
        fake = self.corrupt(batch, nets.generator)
        hidden = nets.model(fake.input_ids, batch.attention_mask, batch.token_type_ids)
        logits = nets.model.disc_logits(hidden)  # (B, T)
        weights = self.disc_weights(batch, fake)
        disc_loss = rtd_loss(logits, fake.replaced, weights)
        loss = self.combine(fake.gen_loss, disc_loss)
        sums = {
            "loss": ratio(loss, 1),
            "disc_loss": ratio(disc_loss, 1),
            **self.generator_sums(fake, batch),
            **disc_sums(logits, fake.replaced, weights),
        }
        if fake.gen_loss is not None:
            sums["mlm_loss"] = ratio(fake.gen_loss, 1)
        lam = self.weighting.lambda_now()
        if lam is not None:
            sums["disc_weight"] = ratio(lam, 1)
        # Every position, with its weight, for disc_auc: no data-dependent shape.
        probs = torch.sigmoid(logits.detach().float()).reshape(-1)
        return ObjectiveOutput(loss, sums, probs, fake.replaced.reshape(-1), weights.reshape(-1))
