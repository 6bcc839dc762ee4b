"""All-Tokens MLM (paper section 3.3): replace-MLM inputs, and the model predicts every token's identity.

With the paper's copy mechanism: a sigmoid copy probability D_t per position (the `discriminator_predictions`
head) and p(x_t) = D_t * 1[x_t = input_t] + (1 - D_t) * softmax(...)[x_t]; the loss is -log p over all
non-pad tokens. Computed in log space: log p = logaddexp(log D, log(1-D) + log q) where the input equals the
target, and log(1-D) + log q elsewhere.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from electra_ablate.models.encoder import Networks
from electra_ablate.models.flops import Heads
from electra_ablate.objectives.base import Batch, GeneratorObjective, ObjectiveOutput, ratio


def copy_log_prob(copy_logit: torch.Tensor, log_q: torch.Tensor, is_copy: torch.Tensor) -> torch.Tensor:
    """log p(target) under the copy mixture; all arguments (N,)."""
    log_d = F.logsigmoid(copy_logit)
    log_not_d = F.logsigmoid(-copy_logit)
    return torch.where(is_copy, torch.logaddexp(log_d, log_not_d + log_q), log_not_d + log_q)


def copy_distribution(copy_logit: torch.Tensor, logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """The full (N, V) output distribution p(x) -- for checks; training only needs the target's log p."""
    d = torch.sigmoid(copy_logit.float())[:, None]
    return d * F.one_hot(input_ids, logits.shape[-1]).float() + (1 - d) * torch.softmax(logits.float(), -1)


class AllTokensMLM(GeneratorObjective):
    display_name = "All-Tokens MLM"
    paper = "section 3.3, Table 5 (GLUE 84.3)"
    model_heads = {"mlm_head": True, "disc_head": True}
    flops = Heads("mlm", 1.0, generator=True)  # predicts every token

    def forward(self, batch: Batch, nets: Networks) -> ObjectiveOutput:
        fake = self.corrupt(batch, nets.generator)
        # Every position of the (B, T) batch is predicted; padding has weight 0 (no data-dependent shape).
        weights = batch.attention_mask.bool().reshape(-1)  # (B x T,) every non-pad token
        hidden = nets.model(fake.input_ids, batch.attention_mask, batch.token_type_ids)
        h = hidden.reshape(-1, hidden.shape[-1])  # (B x T, H)
        logits = nets.model.mlm_logits(h).float()  # (B x T, V)
        copy_logit = nets.model.disc_logits(h).float()  # (B x T,)
        targets = batch.input_ids.reshape(-1)
        inputs = fake.input_ids.reshape(-1)
        log_q = torch.log_softmax(logits, -1).gather(1, targets[:, None]).squeeze(1)
        log_p = copy_log_prob(copy_logit, log_q, inputs == targets)
        model_loss = -(log_p * weights).sum() / weights.sum().clamp(min=1)
        loss = model_loss if fake.gen_loss is None else model_loss + self.gen_weight * fake.gen_loss
        selected = fake.masked.selected.reshape(-1)  # a subset of the non-pad tokens
        with torch.no_grad():
            # The model's prediction: copy the input if D > 1/2, else the MLM argmax (accuracy at selected positions).
            pred = torch.where(copy_logit > 0, inputs, logits.argmax(-1))
        gen = self.generator_sums(fake, batch)
        sums = {
            "loss": ratio(loss, 1),
            "mlm_loss": ratio(model_loss, 1),
            "masked_lm_accuracy": ratio(((pred == targets) & selected).sum(), selected.sum()),
            **{f"gen_{k}": v for k, v in gen.items() if k.startswith("masked_lm_accuracy")},  # the generator's
            "sampled_masked_lm_accuracy": gen["sampled_masked_lm_accuracy"],
            "replaced_fraction": ratio(fake.replaced.sum(), weights.sum()),
        }
        if fake.gen_loss is not None:
            sums["gen_loss"] = ratio(fake.gen_loss, 1)
        return ObjectiveOutput(loss, sums)
