"""Adversarial training (paper Appendix F; Figure 3 right): `algorithm=adversarial`.

The generator is trained to maximise the discriminator's loss instead of the MLM likelihood. Sampling is not
differentiable, so its gradient is REINFORCE (Williams 1992) under the paper's simplifying assumption that
the discriminator's verdict on a position depends only on the token sampled there:

    grad E[R] ~= sum over selected t of  grad log p_G(x^_t | x^masked) (R_t - b_t)
    R_t = the discriminator's loss at t: -log D(x^corrupt, t) if the sample equals the original, else
          -log(1 - D(x^corrupt, t))   (D = P(original); here the logit is P(replaced), label 1 = replaced)
    b_t = -log sigmoid(w^T h_G(x^masked)_t), a learned baseline on the generator's encoder outputs, trained
          with cross-entropy to match the reward: BCE(w^T h_G_t, target exp(-R_t)).

The baseline reads the generator's states without a gradient into the generator (it must not shape the
policy's features); its own loss is minimised by the generator's optimizer. One backward pass of
`lambda x disc loss + gen_weight x REINFORCE surrogate + baseline loss` gives every network its gradient (the
reward is detached and the samples are discrete, so the terms meet only in shared embeddings, as in joint
training). Then two Adam optimizers step (joint training's update: torch's AdamW, or the reference's with
optim.bias_correction=false), each clipped to max_grad_norm, each with warmup + linear decay over max_steps:
the discriminator's (with any weights it shares with the generator) and the generator's (+ the baseline). No MLE term is added: the paper's adversarial generator gets "no explicit feedback about which
generated tokens are correct", reaches ~58% MLM accuracy vs ~65% with maximum likelihood (256 hidden) and
produces low-entropy samples; train/masked_lm_accuracy and train/gen_entropy track both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from electra_ablate.algorithms.manual import ManualSystem
from electra_ablate.models.encoder import ElectraForPretraining
from electra_ablate.objectives import positions as slots
from electra_ablate.objectives.base import (
    Batch, Fake, ObjectiveOutput, disc_sums, mlm_loss, ratio, rtd_loss, sample_tokens,
)


def _mean(values: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """Mean of (N,) values, over the rows (N,) bool `weights` keeps when given."""
    if weights is None:
        return values.mean()
    w = weights.float()
    return (values * w).sum() / w.sum().clamp(min=1.0)


def reinforce_loss(log_probs: torch.Tensor, actions: torch.Tensor, reward: torch.Tensor,
                   baseline: torch.Tensor | None = None, weights: torch.Tensor | None = None) -> torch.Tensor:
    """A surrogate whose gradient is minus the REINFORCE estimate of grad E[reward], averaged over rows.

    log_probs (N, V): the policy's log-probabilities; actions (N,): draws from it; reward, baseline (N,);
    weights (N,) bool: the rows that count (None: all). The advantage R - b carries no gradient: only
    log p(action) is differentiated.
    """
    chosen = log_probs.gather(-1, actions[:, None]).squeeze(-1)  # (N,)
    advantage = reward if baseline is None else reward - baseline
    return -_mean(chosen * advantage.detach(), weights)


def baseline_loss(baseline_logit: torch.Tensor, reward: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy that fits b = -log sigmoid(logit) to the reward R = -log(probability the discriminator gave
    the right label): the target probability is exp(-R) (paper Appendix F). All (N,)."""
    losses = F.binary_cross_entropy_with_logits(baseline_logit.float(), torch.exp(-reward.detach().float()),
                                                reduction="none")
    return _mean(losses, weights)


def entropy(log_probs: torch.Tensor) -> torch.Tensor:
    """(N, V) log-probabilities -> (N,) entropies in nats."""
    return -(log_probs.exp() * log_probs).sum(-1)


class Adversarial(ManualSystem):
    display_name = "adversarial training"
    paper = "section 3.2, Figure 3 (right); Appendix F"

    def __init__(self, **system_args):
        super().__init__(**system_args)
        gen = self.generator
        assert isinstance(gen, ElectraForPretraining) and gen.has_mlm_head, (
            "adversarial training trains a neural generator by REINFORCE: use generator=neural"
        )
        # w of b = -log sigmoid(w^T h_G); zeros start it at log 2, the discriminator's loss at chance.
        self.baseline = nn.Linear(gen.config.hidden_size, 1)
        nn.init.zeros_(self.baseline.weight)
        nn.init.zeros_(self.baseline.bias)

    @classmethod
    def config_problems(cls, cfg: DictConfig) -> list[str]:
        problems = super().config_problems(cfg)
        if "hidden_size" not in cfg.generator:
            problems.append(
                "algorithm=adversarial trains the generator by REINFORCE (paper Appendix F); a fixed uniform or "
                "unigram generator has nothing to train: use generator=neural"
            )
        return problems

    def configure_optimizers(self):
        disc = self.adam_over([self.model, self.objective])
        gen = self.adam_over([self.generator, self.baseline], exclude=self.model.parameters())
        return [gen, disc], [self.schedule(gen, self.max_steps), self.schedule(disc, self.max_steps)]

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        (gen_opt, disc_opt), (gen_schedule, disc_schedule) = self.optimizers(), self.lr_schedulers()
        out = self.losses(Batch(**batch))
        gen_opt.zero_grad(set_to_none=True)
        disc_opt.zero_grad(set_to_none=True)
        self.manual_backward(out.loss)
        self.step_uncounted(gen_opt)  # both clipped in on_before_optimizer_step
        disc_opt.step()  # the batch's one counted global step
        gen_schedule.step()
        disc_schedule.step()
        self.accumulate(out, batch)
        return out.loss.detach()

    def losses(self, batch: Batch) -> ObjectiveOutput:
        obj = self.objective
        masked = obj.mask(batch)
        index = masked.positions.index  # (B, N) prediction slots (objectives/positions.py): no data-dependent shape
        targets = slots.flat(masked.targets)  # (B x N,)
        # The slots whose sample is in the input (a position drawn twice keeps its first slot's sample).
        acted = slots.flat(masked.positions.first)
        hidden = self.generator(masked.input_ids, batch.attention_mask, batch.token_type_ids)
        hidden = slots.flat(slots.gather(hidden, index))  # (B x N, Hg)
        logits = self.generator.mlm_logits(hidden).float()  # (B x N, V)
        log_probs = torch.log_softmax(logits / obj.temperature, dim=-1)  # the distribution samples come from
        disallow = targets if obj.disallow_correct else None
        sampled = sample_tokens(logits.detach(), obj.temperature, obj.sampler, disallow)  # (B x N,)
        fake_ids = slots.scatter(batch.input_ids, masked.positions, sampled.view_as(index))
        replaced = fake_ids != batch.input_ids  # a sample equal to the original is labelled original
        fake = Fake(masked, None, logits.detach().argmax(-1) == targets, sampled, fake_ids, replaced)

        disc_logits = self.model.disc_logits(self.model(fake_ids, batch.attention_mask, batch.token_type_ids))  # (B, T)
        weights = obj.disc_weights(batch, fake)
        disc_loss = rtd_loss(disc_logits, replaced, weights)
        reward = F.binary_cross_entropy_with_logits(
            slots.flat(slots.gather(disc_logits.detach().float(), index)),
            slots.flat(slots.gather(replaced, index)).float(), reduction="none",
        )  # (B x N,) the discriminator's loss at each sampled position
        baseline_logit = self.baseline(hidden.detach()).squeeze(-1)  # (B x N,)
        baseline = -F.logsigmoid(baseline_logit.float())
        gen_loss = reinforce_loss(log_probs, sampled, reward, baseline, acted)
        fit_loss = baseline_loss(baseline_logit, reward, acted)
        loss = obj.combine(gen_loss, disc_loss) + fit_loss

        n = acted.sum()
        predicted = slots.flat(masked.positions.weights)
        sums = {
            "loss": ratio(loss, 1),
            "disc_loss": ratio(disc_loss, 1),
            # not trained on: how MLM-good it gets
            "mlm_loss": ratio(mlm_loss(logits.detach(), targets, predicted), 1),
            "gen_reward": ratio((reward * acted).sum(), n),
            "baseline_loss": ratio(fit_loss, 1),
            "gen_entropy": ratio((entropy(log_probs.detach()) * acted).sum(), n),
            **obj.generator_sums(fake, batch),
            **disc_sums(disc_logits, replaced, weights),
        }
        probs = torch.sigmoid(disc_logits.detach().float()).reshape(-1)  # every position, with its weight
        return ObjectiveOutput(loss, sums, probs, replaced.reshape(-1), weights.reshape(-1))

    def window_metrics(self, step: int) -> dict[str, float]:
        # Both optimizers follow the same schedule; the discriminator's is reported.
        lr = self.optimizers()[1].param_groups[0]["lr"] if self._trainer else self.lr
        return {"train/lr": lr, "train/flops": self.flops_at(step)}
