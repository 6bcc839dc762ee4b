"""The Lightning system that pre-trains any objective jointly (paper section 2: one weighted loss, one optimizer).

It never branches on the objective: the objective turns a batch and the networks into a loss and metric
sums. Metrics are added up on the device over `log_every_n_steps` steps and sent to MLflow in one batch,
so the step has no host-device synchronisation. Checkpoints carry the RNG state and the unsent metric sums,
so a resumed run continues exactly where it stopped (data position: see `PretrainDataModule.state_dict`).
Training algorithms with their own optimisation (two-stage, adversarial) subclass this and switch to
Lightning's manual optimisation.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

import numpy as np
import pytorch_lightning as pl
import torch
from omegaconf import DictConfig
from torch import nn

from electra_ablate.common.peaks import Peak, device_peak
from electra_ablate.models.encoder import ElectraForPretraining, Networks
from electra_ablate.objectives.base import Batch, Objective, ObjectiveOutput
from electra_ablate.optim.adam import adam_over_parameters
from electra_ablate.optim.clipping import FusedClipping
from electra_ablate.optim.groups import unique_parameters
from electra_ablate.optim.schedule import linear_warmup_decay
from electra_ablate.training.auc import BinnedAUC

log = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    pass


class PretrainSystem(FusedClipping, pl.LightningModule):
    option = "joint"  # conf/algorithm/joint.yaml: generator and discriminator trained by one weighted loss
    display_name = "joint training"
    paper = "section 2"

    def __init__(
        self,
        name: str,
        model: ElectraForPretraining,
        generator: nn.Module | None,
        objective: Objective,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        warmup_steps: int,
        max_grad_norm: float,
        max_steps: int,
        log_every_n_steps: int = 50,
        flops_per_step: float = 0.0,
        fused_adam: bool | None = None,
        bias_correction: bool = True,
    ):
        super().__init__()
        self.algorithm = name
        self.model = model
        self.generator = generator
        self.objective = objective
        self.lr = lr
        self.betas = tuple(betas)
        self.eps = eps
        self.weight_decay = weight_decay
        self.warmup_steps = warmup_steps
        self.max_grad_norm = max_grad_norm
        self.max_steps = max_steps
        self.log_every_n_steps = log_every_n_steps
        self.flops_per_step = flops_per_step
        # Training FLOPs per step of each stage of flops.STAGES, for algorithms whose steps differ (two-stage).
        self.stage_flops: dict[str, float] = {}
        self.fused_adam = fused_adam
        # False: the reference's update (model/optimization.py, no bias correction); True: torch's AdamW.
        self.bias_correction = bias_correction
        # Where finished log windows go: (metrics, step) -> None. Set by the entry point (MLflow).
        self.metrics_sink: Callable[[dict[str, float], int], None] | None = None
        # Called after every checkpoint's metrics are closed: sends them to the store, so a resumed run has
        # every window up to its checkpoint (RunLogger.flush).
        self.metrics_flush: Callable[[], None] | None = None
        # (step, loss) of the latest windows and steps, for the message of a diverged run.
        self.recent_losses: collections.deque[tuple[int, float]] = collections.deque(maxlen=8)
        # Set by the entry point: the checkpoint a diverged run can be inspected or resumed from.
        self.last_good_checkpoint: Callable[[], str | None] | None = None
        self.history: list[tuple[int, dict[str, float]]] = []
        self.auroc = BinnedAUC(bins=200)  # binned: fixed memory, updated on device with no sync
        self._sums: dict[str, torch.Tensor] = {}
        self._tokens = 0
        self._window_start = time.perf_counter()
        self._last_logged = -1
        self._window_first_step = 0  # the global step the open window started at (for train/mfu)
        # The device's peak FLOP/s at the run's precision (common/peaks.py), found at the start of training.
        self.peak: Peak | None = None
        self._pending_rng: dict | None = None
        # The run's seed, set by the entry point: the processes of a DDP run after the first draw their masks
        # and samples from streams of their own, derived from it.
        self.seed: int | None = None
        # runtime.compile=step: the objective over the networks as one compiled graph (`compile_step`).
        self._compiled_step: Callable[..., ObjectiveOutput] | None = None
        self._cuda_graphs = False

    @property
    def nets(self) -> Networks:
        return Networks(self.model, self.generator)

    @classmethod
    def config_problems(cls, cfg: DictConfig) -> list[str]:
        """What this algorithm cannot run with in a composed pre-training config, each with its fix; checked
        before any data is built. Joint training runs with anything the other checks let through."""
        return []

    @classmethod
    def stage_steps(cls, cfg: DictConfig) -> dict[str, int]:
        """The stages of flops.STAGES a run of `cfg` trains, in order, with their steps (what a sweep's dry run prices
        before any network exists); every step of joint training is a joint one."""
        return {"joint": int(cfg.trainer.max_steps)}

    def exported_networks(self) -> Networks:
        """What pre-training saves for fine-tuning: the network to fine-tune and the neural generator, if any."""
        return Networks(self.model, self.generator if isinstance(self.generator, ElectraForPretraining) else None)

    def flops_at(self, step: int) -> float:
        """Training FLOPs of the first `step` steps (train/flops)."""
        return self.flops_per_step * step

    # --- optimisation -----------------------------------------------------------------------------------
    def configure_optimizers(self):
        params = unique_parameters([self.model, self.generator, self.objective])
        fused = self.fused_adam if self.fused_adam is not None else self.device.type == "cuda"
        optimizer = adam_over_parameters(params, self.lr, self.betas, self.eps, self.weight_decay, fused=fused,
                                         bias_correction=self.bias_correction)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_warmup_decay(self.warmup_steps, self.max_steps))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        out = self.objective_step(batch)
        self.accumulate(out, batch)
        return out.loss

    def objective_step(self, batch: dict[str, torch.Tensor]) -> ObjectiveOutput:
        """The objective over the networks for one batch: eager, or the graph `compile_step` captured."""
        if self._compiled_step is None:
            return self.objective(Batch(**batch), self.nets)
        if self._cuda_graphs:
            # A new training step: the previous replay's outputs (loss, sums) have been used and may be overwritten.
            torch.compiler.cudagraph_mark_step_begin()
        return self._compiled_step(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])

    def _objective_forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           token_type_ids: torch.Tensor) -> ObjectiveOutput:
        return self.objective(Batch(input_ids, attention_mask, token_type_ids), self.nets)

    def compile_step(self, mode: str = "default") -> None:
        """runtime.compile=step: masking, the generator, sampling, the discriminator, both losses and the metric sums
        compiled as one graph, forward and backward (AOTAutograd), with fullgraph=True (a graph break is an error,
        not a silent fall back to Python) and static shapes (batches padded to one length: runtime.static_shapes).
        `mode` reduce-overhead replays the graphs as CUDA graphs on a GPU. The optimizer step stays torch's (fused
        AdamW on CUDA: a few multi-tensor kernels per step). Modules and state-dict keys are unchanged."""
        self._compiled_step = torch.compile(self._objective_forward, fullgraph=True, dynamic=False, mode=mode)
        self._cuda_graphs = mode == "reduce-overhead"

    # --- metrics ----------------------------------------------------------------------------------------
    def accumulate(self, out: ObjectiveOutput, batch: dict[str, torch.Tensor]) -> None:
        if self.device.type == "cpu":  # free on CPU (no device sync); GPUs check once per window
            value = float(out.loss.detach())
            if not np.isfinite(value):
                self.fail_non_finite(value, self.global_step + 1)  # the step being taken, 1-based as logged
            self.recent_losses.append((self.global_step + 1, value))
        for k, v in out.sums.items():
            # A fresh window keeps a copy: a CUDA-graph replay reuses its output memory at the next step.
            self._sums[k] = self._sums[k] + v if k in self._sums else v.clone()
        if out.disc_probs is not None and out.disc_probs.numel():
            self.auroc.update(out.disc_probs, out.disc_labels, out.disc_weights)
        self._tokens += batch["input_ids"].numel()

    def fail_non_finite(self, value: float, step: int | None = None) -> None:
        # Reference users hit NaN at Base size too (google-research/electra#36 and google-research/electra#70); the usual
        # causes, most likely first, each with the setting that changes it.
        recent = ", ".join(f"step {s}: {v:.4g}" for s, v in self.recent_losses) or "none logged yet"
        weights = {k: getattr(self.objective, k) for k in ("gen_weight", "disc_weight") if hasattr(self.objective, k)}
        precision = getattr(getattr(self, "_trainer", None), "precision", "?")
        ckpt = self.last_good_checkpoint() if self.last_good_checkpoint is not None else None
        raise TrainingError(
            f"the {self.objective.name} loss is {value} at step {self.global_step if step is None else step}: training diverged. Recent "
            f"train/loss values: {recent}. Likely causes: the learning rate (optim.lr={self.lr}, warmup "
            f"optim.warmup_steps={self.warmup_steps}; lower it, or clip harder with optim.max_grad_norm="
            f"{self.max_grad_norm}); a loss weight"
            + (f" ({', '.join(f'objective.{k}={v}' for k, v in weights.items())})" if weights else " (objective.*_weight)")
            + f"; precision ({precision}; runtime.precision=32-true rules it out). "
            + (f"The last good checkpoint is kept: {ckpt}." if ckpt else "No checkpoint was saved before this step.")
        )

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.maybe_log_window()

    def maybe_log_window(self) -> None:
        step = self.global_step
        if step % self.log_every_n_steps == 0 and step != self._last_logged and self._sums:
            self._last_logged = step
            self.log_window(step)

    def log_window(self, step: int) -> dict[str, float]:
        names = sorted(self._sums)
        stacked = torch.stack([self._sums[k] for k in names])  # (M, 2) [sum, count]
        tokens = self._tokens
        if self._trainer is not None and self.trainer.world_size > 1:
            # Every rank closes the same windows, so the sums of all ranks are added up (a collective) and
            # each logged value is the average over the global batch, as a single process would log it.
            both = torch.cat([stacked.flatten(), torch.tensor([float(tokens)], device=stacked.device)])
            both = self.trainer.strategy.reduce(both, reduce_op="sum")
            stacked, tokens = both[:-1].view(-1, 2), float(both[-1])
        values = (stacked[:, 0] / stacked[:, 1].clamp(min=1)).tolist()  # one device->host copy per window
        metrics = {f"train/{k}": v for k, v in zip(names, values)}
        if not np.isfinite(metrics.get("train/loss", 0.0)):
            self.fail_non_finite(metrics["train/loss"])
        if "train/loss" in metrics and self.device.type != "cpu":
            self.recent_losses.append((step, metrics["train/loss"]))
        if self.auroc.update_count:
            self._reduce_auc()
            metrics["train/disc_auc"] = float(self.auroc.compute())
            self.auroc.reset()
        now = time.perf_counter()
        elapsed = max(now - self._window_start, 1e-9)
        metrics["train/tokens_per_s"] = tokens / elapsed
        if self.peak is not None and self.flops_per_step:
            # Model FLOPs utilisation: the paper's FLOPs of the window's steps (global batch) per second, over the
            # peak of every device that trained them.
            done = self.flops_at(step) - self.flops_at(self._window_first_step)
            metrics["train/mfu"] = done / elapsed / (self.peak.flops * self._world_size())
        metrics.update(self.window_metrics(step))
        self._sums, self._tokens, self._window_start, self._window_first_step = {}, 0, now, step
        self.history.append((step, metrics))
        if self.metrics_sink is not None:
            self.metrics_sink(metrics, step)
        return metrics

    def _world_size(self) -> int:
        return self.trainer.world_size if self._trainer is not None else 1

    def _reduce_auc(self) -> None:
        """Under DDP, every rank's score histogram added up (a collective: every rank closes the same windows)."""
        if self._trainer is not None and self.trainer.world_size > 1:
            self.auroc.counts.copy_(self.trainer.strategy.reduce(self.auroc.counts, reduce_op="sum"))

    def window_metrics(self, step: int) -> dict[str, float]:
        """Values read once per window rather than averaged over its steps."""
        lr = self.optimizers().param_groups[0]["lr"] if self._trainer else self.lr
        return {"train/lr": lr, "train/flops": self.flops_at(step)}

    # --- exact resume -----------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Checkpoint callbacks run before this module's on_train_batch_end: close a finished window first so
        # the saved sums hold only what has not been logged.
        self.maybe_log_window()
        if self.metrics_flush is not None:
            self.metrics_flush()
        if self._sums and self.trainer.world_size > 1:  # every rank saves: gather the open window on the first
            names = sorted(self._sums)
            total = self.trainer.strategy.reduce(torch.stack([self._sums[k] for k in names]), reduce_op="sum")
            self._sums = {k: (total[i] if self.global_rank == 0 else torch.zeros_like(total[i])) for i, k in enumerate(names)}
        if self.auroc.update_count and self.trainer.world_size > 1:
            self._reduce_auc()
            if self.global_rank > 0:
                self.auroc.counts.zero_()
        # Masking, sampling and dropout draw from torch's generators only (the data order has its own seeded
        # permutation), so those are the states to carry; tensors keep the checkpoint loadable weights-only.
        checkpoint["rng"] = {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }
        checkpoint["metric_sums"] = {k: v.cpu() for k, v in self._sums.items()}
        checkpoint["auroc"] = {k: v.cpu() for k, v in self.auroc.metric_state.items() if torch.is_tensor(v)}
        checkpoint["auroc_updates"] = self.auroc.update_count

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._pending_rng = checkpoint.get("rng")
        self._sums = dict(checkpoint.get("metric_sums", {}))
        if self.global_rank > 0:
            # The saved window sums are every rank's (reduced in on_save_checkpoint): one copy, kept by the first
            # process; the others restart from zero with the same names, for the reduction at the window's end.
            self._sums = {k: torch.zeros_like(v) for k, v in self._sums.items()}
            return
        saved = checkpoint.get("auroc", {})
        if set(saved) == set(self.auroc.metric_state):  # a checkpoint of an older AUC metric starts a fresh window
            for k, v in saved.items():
                setattr(self.auroc, k, v)
            self.auroc._update_count = checkpoint.get("auroc_updates", 0)

    def on_train_start(self) -> None:
        # Restored here, after everything that draws random numbers at start-up, right before the next batch.
        self._sums = {k: v.to(self.device) for k, v in self._sums.items()}
        self.auroc.to(self.device)
        if self.peak is None and self._trainer is not None:
            self.peak = device_peak(self.device, str(self.trainer.precision))  # before the first window's clock
            log.info("train/mfu over a peak of %.3g FLOP/s per device (%s)", self.peak.flops, self.peak.source)
            sink = self.metrics_sink
            if sink is not None:
                sink({"runtime/peak_flops": self.peak.flops}, self.global_step)
        self._window_start = time.perf_counter()
        self._window_first_step = self.global_step
        if self._pending_rng is not None:
            rng, self._pending_rng = self._pending_rng, None
            torch.set_rng_state(rng["torch"])
            if rng["cuda"] is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(rng["cuda"])
        if self.global_rank > 0 and self.seed is not None:
            # Checkpoints carry the first process's generator state; the others must not repeat its masks.
            torch.manual_seed(int(np.random.SeedSequence([self.seed, self.global_rank, self.global_step]).generate_state(1)[0]))
