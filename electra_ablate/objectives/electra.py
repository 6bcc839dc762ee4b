"""ELECTRA's replaced token detection (Clark et al. 2020, section 2).

The generator is trained with MLM on the selected positions; its samples replace those tokens; the
discriminator predicts for every non-pad token whether it was replaced. Loss = gen_weight x MLM +
disc_weight x disc, with lambda = disc_weight = 50 (paper section 2 / reference `disc_weight`).

`disc_weight=learned` (beyond the paper) learns the weights by uncertainty weighting (Kendall, Gal and
Cipolla 2018, in its common simplified form): loss = exp(-s_gen) MLM + s_gen + exp(-s_disc) disc + s_disc
with learned log-variances s, which pulls each weight towards 1 / its loss, i.e. lambda towards MLM / disc.
They start at the fixed weights (gen_weight, 50), so the learned lambda starts at the paper's value; the
effective lambda exp(-s_disc) / exp(-s_gen) is logged as train/disc_weight. The log-variances are loss
weights, not network weights: their name ends in `bias`, so AdamW leaves them out of weight decay
(`optim.no_decay`), which would otherwise pull both weights towards 1.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from electra_ablate.models.encoder import Networks
from electra_ablate.common.tokens import SpecialIds
from electra_ablate.objectives.base import Batch, Fake, GeneratorObjective, ObjectiveOutput, disc_sums, ratio, rtd_loss


LEARNED = "learned"
PAPER_DISC_WEIGHT = 50.0  # lambda (paper section 2); where disc_weight=learned starts


class Electra(GeneratorObjective):
    model_heads = {"disc_head": True}

    def __init__(
        self,
        name: str,
        special: SpecialIds,
        vocab_size: int,
        mask_prob: float = 0.15,
        mask_token_prob: float = 0.85,
        random_token_prob: float = 0.0,
        sampler: str = "gumbel",
        temperature: float = 1.0,
        gen_weight: float = 1.0,
        disc_weight: float | str = 50.0,
    ):
        super().__init__(
            name, special, vocab_size, mask_prob, mask_token_prob, random_token_prob, sampler, temperature, gen_weight
        )
        self.learned = disc_weight == LEARNED
        if self.learned:
            if gen_weight <= 0:
                raise ValueError(
                    f"objective.disc_weight=learned starts from gen_weight, which must be > 0 (got {gen_weight})"
                )
            # (2,) [s_gen, s_disc]: log-variances, starting where exp(-s) equals the fixed weights.
            self.log_var_bias = nn.Parameter(torch.tensor([-math.log(gen_weight), -math.log(PAPER_DISC_WEIGHT)]))
        elif isinstance(disc_weight, str):
            raise ValueError(
                f"objective.disc_weight={disc_weight!r}: give a number (lambda; the paper uses 50) or 'learned'"
            )
        self.disc_weight = disc_weight

    def disc_weights(self, batch: Batch, fake: Fake) -> torch.Tensor:
        """(B, T) bool: where the discriminator loss applies -- every non-pad token ([CLS]/[SEP] included, as
        the reference weights by `input_mask`)."""
        return batch.attention_mask.bool()

    def combine(self, gen_loss: torch.Tensor | None, disc_loss: torch.Tensor) -> torch.Tensor:
        if self.learned:
            s_gen, s_disc = self.log_var_bias
            loss = torch.exp(-s_disc) * disc_loss + s_disc
            return loss if gen_loss is None else loss + torch.exp(-s_gen) * gen_loss + s_gen
        loss = self.disc_weight * disc_loss
        return loss if gen_loss is None else loss + self.gen_weight * gen_loss

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
        if self.learned:
            s_gen, s_disc = self.log_var_bias
            sums["disc_weight"] = ratio(torch.exp(s_gen - s_disc), 1)  # lambda relative to the MLM weight
        return ObjectiveOutput(loss, sums, torch.sigmoid(logits[weights].detach().float()), fake.replaced[weights])
