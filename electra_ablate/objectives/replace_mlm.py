"""Replace MLM (paper section 3.3): MLM whose selected positions hold generator samples, not [MASK].

The model being pre-trained never sees [MASK], isolating the pre-train/fine-tune mismatch. The generator
is trained as in ELECTRA (MLM on [MASK]ed input); the model predicts the original token at every selected
position, replaced or not. Loss = gen_weight x generator MLM + model MLM.
"""

from __future__ import annotations

from electra_ablate.models.encoder import Networks
from electra_ablate.models.flops import MASKED_FRACTION, Heads
from electra_ablate.objectives import positions as slots
from electra_ablate.objectives.base import (
    Batch, GeneratorObjective, ObjectiveOutput, fp32_scores, mlm_loss, ratio,
)


class ReplaceMLM(GeneratorObjective):
    display_name = "Replace MLM"
    paper = "section 3.3, Table 5 (GLUE 82.4)"
    flops = Heads("mlm", MASKED_FRACTION, generator=True)

    def forward(self, batch: Batch, nets: Networks) -> ObjectiveOutput:
        fake = self.corrupt(batch, nets.generator)
        hidden = nets.model(fake.input_ids, batch.attention_mask, batch.token_type_ids)
        logits = fp32_scores(self.slot_logits(nets.model.mlm_logits, hidden, fake.masked))  # (B x N, V)
        targets, weights = slots.flat(fake.masked.targets), slots.flat(fake.masked.positions.weights)
        model_loss = mlm_loss(logits, targets, weights)
        loss = model_loss if fake.gen_loss is None else model_loss + self.gen_weight * fake.gen_loss
        gen = self.generator_sums(fake, batch)
        sums = {
            "loss": ratio(loss, 1),
            "mlm_loss": ratio(model_loss, 1),
            "masked_lm_accuracy": ratio(((logits.detach().argmax(-1) == targets) & weights).sum(), weights.sum()),
            **{f"gen_{k}": v for k, v in gen.items() if k.startswith("masked_lm_accuracy")},  # the generator's
            "sampled_masked_lm_accuracy": gen["sampled_masked_lm_accuracy"],
            "replaced_fraction": ratio(fake.replaced.sum(), batch.attention_mask.sum()),
        }
        if fake.gen_loss is not None:
            sums["gen_loss"] = ratio(fake.gen_loss, 1)
        return ObjectiveOutput(loss, sums)
