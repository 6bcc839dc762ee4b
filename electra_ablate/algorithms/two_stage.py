"""Two-stage training (paper section 3.2, "Training algorithms"; Figure 3 right): `algorithm=two_stage`.

1. Only the generator is trained, with the MLM loss, for n = round(switch_fraction x max_steps) steps.
2. The discriminator's encoder is initialised with the generator's weights (so both must be the same size:
   generator.hidden_size=1.0 generator.layers=1.0; the discriminator head keeps its own initialisation),
   the generator is frozen, and the discriminator is trained with the objective's discriminator loss for the
   remaining max_steps - n steps (the paper: n and n, switch_fraction=0.5).

Each stage has its own Adam (joint training's update: torch's AdamW, or the reference's with
optim.bias_correction=false) and its own warmup + linear decay over its own steps, as two training runs
would. The frozen generator keeps proposing replacements as in joint training (training mode, dropout on),
with no gradient. `sharing` must be `none`: shared weights would keep training the "frozen" generator in
stage two, and the discriminator takes all of the generator's weights at the switch anyway.

Before the switch the discriminator is untrained, so the network exported for fine-tuning
(trainer.export_fractions) is the generator, an MLM model like BERT: the part of the paper's two-stage curve
left of the switch. FLOPs (flops.py `stage`): stage one counts the generator's forward and backward, stage
two the generator's forward (sampling) plus the discriminator's forward and backward. The switch closes the
metric window (no logged average mixes the stages) and logs train/switch_step; every window logs
train/stage (1 or 2).
"""

from __future__ import annotations

import torch
from hydra.utils import get_class
from omegaconf import DictConfig

from electra_ablate.algorithms.manual import ManualSystem
from electra_ablate.generators.base import generator_multipliers
from electra_ablate.models.encoder import ElectraForPretraining, Networks
from electra_ablate.objectives.base import Batch, ObjectiveOutput, ratio


class FrozenGenerator:
    """The generator after the switch: it proposes replacements with no gradient and no MLM loss
    (`GeneratorObjective.corrupt` computes the loss only for a `trainable` generator)."""

    trainable = False

    def __init__(self, generator: ElectraForPretraining):
        self.generator = generator

    def masked_logits(self, input_ids, attention_mask, token_type_ids, positions) -> torch.Tensor:
        with torch.no_grad():
            return self.generator.masked_logits(input_ids, attention_mask, token_type_ids, positions)  # (B x N, V)


class TwoStage(ManualSystem):
    display_name = "two-stage training"
    paper = "section 3.2, Figure 3 (right)"

    def __init__(self, *, switch_fraction: float = 0.5, **system_args):
        super().__init__(**system_args)
        self.switch_step = int(round(switch_fraction * self.max_steps))
        assert 0 < self.switch_step < self.max_steps, (
            f"algorithm.switch_fraction={switch_fraction} of {self.max_steps} steps leaves a stage empty"
        )
        gen = self.generator
        assert isinstance(gen, ElectraForPretraining) and gen.config == self.model.config, (
            "two-stage training initialises the discriminator with the generator's weights: use generator=neural "
            "generator.hidden_size=1.0 generator.layers=1.0"
        )
        assert not {id(p) for p in gen.parameters()} & {id(p) for p in self.model.parameters()}, (
            "two-stage training freezes the generator in stage two, so it may share no weights: use sharing=none"
        )
        self.switched = False

    @classmethod
    def config_problems(cls, cfg: DictConfig) -> list[str]:
        problems = super().config_problems(cfg)
        size = generator_multipliers(cfg)
        if size is None:
            problems.append(
                "algorithm=two_stage initialises the discriminator with a neural generator's weights; use "
                "generator=neural generator.hidden_size=1.0 generator.layers=1.0"
            )
        elif size != (1.0, 1.0):
            problems.append(
                "algorithm=two_stage initialises the discriminator with the generator's weights, so both must be "
                f"the same size (paper section 3.2), but generator.hidden_size={size[0]} "
                f"generator.layers={size[1]}; add generator.hidden_size=1.0 generator.layers=1.0"
            )
        if get_class(cfg.sharing._target_).shares_weights:
            problems.append(
                f"algorithm=two_stage freezes the generator while the discriminator trains, which sharing="
                f"{cfg.sharing.name} would undo (the discriminator takes all of the generator's weights at the "
                "switch anyway); add sharing=none"
            )
        steps = cfg.trainer.max_steps
        switch = int(round(cfg.algorithm.switch_fraction * steps))
        if not 0 < switch < steps:
            problems.append(
                f"algorithm.switch_fraction={cfg.algorithm.switch_fraction} of trainer.max_steps={steps} puts the "
                f"switch at step {switch}, leaving a stage empty; choose a fraction in (0, 1) and enough steps"
            )
        strategy = str(cfg.trainer.strategy)
        if "ddp" in strategy and "find_unused_parameters_true" not in strategy:
            problems.append(
                f"algorithm=two_stage leaves one network without gradients in each stage, which trainer.strategy="
                f"{strategy} rejects; use trainer.strategy=ddp_find_unused_parameters_true"
            )
        return problems

    def configure_optimizers(self):
        gen = self.adam_over([self.generator])
        disc = self.adam_over([self.model, self.objective])
        schedules = [self.schedule(gen, self.switch_step), self.schedule(disc, self.max_steps - self.switch_step)]
        return [gen, disc], schedules

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        (gen_opt, disc_opt), (gen_schedule, disc_schedule) = self.optimizers(), self.lr_schedulers()
        inputs = Batch(**batch)
        if self.global_step < self.switch_step:
            out, opt, schedule = self.generator_stage(inputs), gen_opt, gen_schedule
        else:
            if not self.switched:
                self.switch()
            out = self.objective(inputs, Networks(self.model, FrozenGenerator(self.generator)))
            opt, schedule = disc_opt, disc_schedule
        opt.zero_grad(set_to_none=True)
        self.manual_backward(out.loss)
        opt.step()  # clipped in on_before_optimizer_step
        schedule.step()
        self.accumulate(out, batch)
        return out.loss.detach()

    def generator_stage(self, batch: Batch) -> ObjectiveOutput:
        """Stage one: the objective's masking and the generator's MLM loss, nothing else."""
        fake = self.objective.corrupt(batch, self.generator)
        sums = {"loss": ratio(fake.gen_loss, 1), "mlm_loss": ratio(fake.gen_loss, 1),
                **self.objective.generator_sums(fake, batch)}
        return ObjectiveOutput(fake.gen_loss, sums)

    @torch.no_grad()
    def switch(self) -> None:
        """Initialise the discriminator's encoder with the generator's (paper section 3.2); stage two begins."""
        step = self.global_step
        if self._sums:  # close the stage-one window
            self._last_logged = step
            self.log_window(step)
        self.model.electra.load_state_dict(self.generator.electra.state_dict())
        self.switched = True
        if self.metrics_sink is not None:
            self.metrics_sink({"train/switch_step": float(step)}, step)

    @classmethod
    def stage_steps(cls, cfg: DictConfig) -> dict[str, int]:
        steps = int(cfg.trainer.max_steps)
        switch = int(round(cfg.algorithm.switch_fraction * steps))  # as __init__ places the switch
        return {"generator": switch, "discriminator": steps - switch}

    # --- what the base system asks ------------------------------------------------------------------------
    def exported_networks(self) -> Networks:
        # Before the switch the discriminator is untrained: the generator (an MLM model) is the network to
        # fine-tune, as on the left of the switch in the paper's two-stage curve.
        return Networks(self.model if self.switched else self.generator, self.generator)

    def flops_at(self, step: int) -> float:
        first = min(step, self.switch_step)
        per_step = self.stage_flops
        return first * per_step.get("generator", 0.0) + (step - first) * per_step.get("discriminator", 0.0)

    def window_metrics(self, step: int) -> dict[str, float]:
        stage_two = step > self.switch_step  # the window's last step ran in stage two
        lr = self.optimizers()[int(stage_two)].param_groups[0]["lr"] if self._trainer else self.lr
        return {"train/lr": lr, "train/flops": self.flops_at(step), "train/stage": 2.0 if stage_two else 1.0}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["two_stage_switched"] = self.switched

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self.switched = bool(checkpoint["two_stage_switched"])
