"""BERT's masked language modelling (Devlin et al. 2019), the paper's baseline: no generator.

15% of tokens selected; of those 80% [MASK], 10% a random token, 10% unchanged; cross-entropy on the
selected positions only.
"""

from __future__ import annotations

from electra_ablate.models.encoder import Networks
from electra_ablate.models.flops import MASKED_FRACTION, Heads
from electra_ablate.objectives import positions as slots
from electra_ablate.objectives.base import (
    Batch, Objective, ObjectiveOutput, copy_split_sums, fp32_scores, mlm_loss, ratio,
)


class Bert(Objective):
    display_name = "BERT"
    paper = "section 3.3, Table 5 (GLUE 82.2)"
    flops = Heads("mlm", MASKED_FRACTION, generator=False)

    def forward(self, batch: Batch, nets: Networks) -> ObjectiveOutput:
        masked = self.mask(batch)
        hidden = nets.model(masked.input_ids, batch.attention_mask, batch.token_type_ids)
        logits = fp32_scores(self.slot_logits(nets.model.mlm_logits, hidden, masked))  # (B x N, V): slots only
        targets, weights = slots.flat(masked.targets), slots.flat(masked.positions.weights)
        loss = mlm_loss(logits, targets, weights)
        hits = logits.detach().argmax(-1) == targets  # (B x N,)
        inputs = slots.flat(slots.gather(masked.input_ids, masked.positions.index))
        return ObjectiveOutput(
            loss,
            {"loss": ratio(loss, 1), "mlm_loss": ratio(loss, 1),
             "masked_lm_accuracy": ratio((hits & weights).sum(), weights.sum()),
             **copy_split_sums(hits, inputs, targets, weights, self.special, self.mask_token_prob,
                               self.random_token_prob)},
        )
