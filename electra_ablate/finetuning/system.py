"""The Lightning system that fine-tunes one encoder on one GLUE task: its classifier, pooling, layer-wise
learning rates and optimizer.

The classifier is the reference's (google-research/electra finetune/classification/classification_tasks.py):
dropout (rate 0.1) and one linear layer on the final hidden state of [CLS], with no pooler layer (ELECTRA's
`get_pooled_output` is `sequence_output[:, 0]`); STS-B gets a one-output regression head trained with squared
error on the score divided by 5, as the reference normalises it. Optimisation follows paper Table 7 and the
reference `model/optimization.py`: Adam (eps 1e-6) with layer-wise learning-rate decay, 10% linear warmup,
linear decay, gradient clipping at 1.0; by default the reference's update (no bias correction) on the
per-example losses summed over the batch, as reference run_finetuning.py builds its loss. Its batches come from
finetuning/data.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn

from electra_ablate.glue.metrics import compute_metrics
from electra_ablate.glue.tasks import TaskSpec
from electra_ablate.models.encoder import ElectraModel
from electra_ablate.optim.adam import adam
from electra_ablate.optim.clipping import FusedClipping
from electra_ablate.optim.groups import no_decay
from electra_ablate.optim.schedule import linear_warmup_decay

# --- layer-wise learning rates -------------------------------------------------------------------------

_LAYER = re.compile(r"^encoder\.encoder\.layer\.(\d+)\.")


def layer_depth(name: str, n_layers: int, reference_off_by_one: bool) -> int:
    """Depth of a parameter of `FinetuneSystem` for layer-wise decay (reference `_get_layer_lrs`).

    Embeddings (and their projection) are depth 0 and layer i is depth i + 1 (a pre-LN encoder's final
    LayerNorm goes with the top layer). The reference puts the task
    head at depth n_layers + 2, one more than the top layer + 1, so the top layer gets decay**2 and depth
    n_layers + 1 is never used; `reference_off_by_one=False` puts the head at n_layers + 1 instead.
    """
    if name.startswith("encoder.embeddings"):  # embeddings.* and embeddings_project.*
        return 0
    m = _LAYER.match(name)
    if m:
        return int(m.group(1)) + 1
    if name.startswith("encoder.encoder.LayerNorm."):  # pre-LN's final LayerNorm: part of the top layer's output
        return n_layers
    if name.startswith("head."):
        return n_layers + 2 if reference_off_by_one else n_layers + 1
    raise ValueError(f"no layer-wise learning-rate depth for parameter {name!r}")


def layerwise_param_groups(
    named_params: Sequence[tuple[str, nn.Parameter]],
    lr: float,
    decay: float,
    n_layers: int,
    reference_off_by_one: bool,
    weight_decay: float,
) -> list[dict]:
    """Optimizer groups with lr * decay**(head_depth - depth); no weight decay on LayerNorm and bias."""
    head_depth = n_layers + 2 if reference_off_by_one else n_layers + 1
    groups: dict[tuple[int, bool], dict] = {}
    for name, p in named_params:
        depth = layer_depth(name, n_layers, reference_off_by_one)
        skip_wd = no_decay(name)
        group = groups.setdefault(
            (depth, skip_wd),
            {
                "params": [],
                "names": [],
                "lr": lr * decay ** (head_depth - depth),
                "weight_decay": 0.0 if skip_wd else weight_decay,
                "depth": depth,
            },
        )
        group["params"].append(p)
        group["names"].append(name)
    return [groups[k] for k in sorted(groups)]


class OptimSettings(NamedTuple):
    lr: float
    layerwise_lr_decay: float
    reference_off_by_one: bool
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    warmup_fraction: float
    fused: bool | None = None
    # The reference's update (model/optimization.py AdamWeightDecayOptimizer has no bias correction) and loss
    # (run_finetuning.py sums the per-example losses over the batch); True and "mean" are torch's AdamW on the
    # batch-mean loss.
    bias_correction: bool = False
    loss_reduction: str = "sum"  # sum | mean


# --- the system ----------------------------------------------------------------------------------------


POOLINGS = ("cls", "mean")  # the `pooling` option: what the classifier reads


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """(B, H) sentence states from (B, T, H): the [CLS] state (the reference's `get_pooled_output`), or the mean
    over the example's tokens ([CLS] and [SEP] included, padding left out)."""
    if pooling == "cls":
        return hidden[:, 0]
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)


class ClassificationHead(nn.Module):
    """Dropout + one linear layer on the [CLS] state (reference `get_prediction_module`)."""

    def __init__(self, hidden_size: int, num_outputs: int, dropout: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.dense = nn.Linear(hidden_size, num_outputs)
        # tf.layers.dense defaults, as in the reference: Glorot-uniform kernel, zero bias.
        nn.init.xavier_uniform_(self.dense.weight)
        nn.init.zeros_(self.dense.bias)

    def forward(self, cls: torch.Tensor) -> torch.Tensor:
        # In fp32 under bf16-mixed too: a bf16 output keeps ~3 significant digits, which ties nearby STS-B
        # scores (Spearman counts ties) and can make every prediction of a barely trained model equal.
        with torch.autocast(cls.device.type, enabled=False):
            return self.dense(self.dropout(cls.float()))  # (B, num_outputs)


class FinetuneSystem(FusedClipping, pl.LightningModule):
    def __init__(
        self,
        encoder: ElectraModel,
        task: TaskSpec,
        optim: OptimSettings,
        dev_labels: dict[str, np.ndarray],
        classifier_dropout: float = 0.1,
        log_every_n_steps: int = 50,
        pooling: str = "cls",
    ):
        super().__init__()
        self.encoder = encoder
        self.task = task
        self.dev_labels = dev_labels  # {dev split: (N,) labels in dataset order}
        self.head = ClassificationHead(encoder.config.hidden_size, task.num_labels, classifier_dropout)
        self.optim = optim
        self.pooling = pooling
        self.log_every_n_steps = log_every_n_steps
        self.dev_names = [s.name for s in task.dev_splits]
        # Where metrics go: (metrics, step) -> None, set by the entry point (MLflow). Train metrics use the
        # optimizer step, dev metrics the epoch (1-based).
        self.metrics_sink: Callable[[dict[str, float], int], None] | None = None
        # Called after each epoch's dev metrics: sends what is buffered to the store (RunLogger.flush).
        self.metrics_flush: Callable[[], None] | None = None
        self.history: list[dict[str, float]] = []  # dev metrics after each epoch
        self.evaluated_at_step = -1  # optimizer step of the last dev evaluation
        self.predictions: dict[str, np.ndarray] = {}  # last epoch's dev predictions, in dataset order
        self._val_outputs: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._loss_sum = torch.zeros(())
        self._loss_count = 0

    # Regression targets are score / max (reference RegressionTask: (label - min) / max with min = 0).
    @property
    def _score_scale(self) -> float:
        return self.task.label_range[1] if self.task.is_regression else 1.0

    def forward(self, input_ids, attention_mask, token_type_ids) -> torch.Tensor:
        hidden = self.encoder(input_ids, attention_mask, token_type_ids)  # (B, T, H)
        out = self.head(pool(hidden, attention_mask, self.pooling))  # (B, C)
        return out.squeeze(-1) if self.task.is_regression else out  # (B,) for regression

    def example_losses(self, out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """(B,) per-example losses: cross-entropy, or squared error on the scaled score."""
        if self.task.is_regression:
            return F.mse_loss(out.float(), labels / self._score_scale, reduction="none")
        return F.cross_entropy(out.float(), labels, reduction="none")

    def reduce(self, losses: torch.Tensor) -> torch.Tensor:
        # "sum": the reference's loss, whose gradient is batch size times the mean's; clipping at
        # max_grad_norm then acts on that summed gradient, as the reference clips after the reduction.
        return losses.sum() if self.optim.loss_reduction == "sum" else losses.mean()

    def loss(self, out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The training loss of a batch (finetune_optim.loss_reduction)."""
        return self.reduce(self.example_losses(out, labels))

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        out = self(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        losses = self.example_losses(out, batch["labels"])  # (B,)
        # train/loss is the per-example mean whatever the reduction, so it reads the same across settings.
        self._loss_sum = self._loss_sum.to(losses.device) + losses.detach().mean()
        self._loss_count += 1
        return self.reduce(losses)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        step = self.global_step
        if self._loss_count and (step % self.log_every_n_steps == 0 or self.trainer.is_last_batch):
            metrics = {
                "train/loss": float(self._loss_sum) / self._loss_count,  # one host sync per window
                "train/lr": self.optimizers().param_groups[-1]["lr"],  # the head's (largest) lr
            }
            self._loss_sum, self._loss_count = torch.zeros((), device=self.device), 0
            if not np.isfinite(metrics["train/loss"]):
                raise FloatingPointError(
                    f"{self.task.name}: training loss is {metrics['train/loss']} at step {step}; lower "
                    "finetune_optim.lr or train in fp32 (runtime.precision=32-true)"
                )
            if self.metrics_sink is not None:
                self.metrics_sink(metrics, step)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        out = self(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        preds = out.float() * self._score_scale if self.task.is_regression else out.argmax(-1)
        self._val_outputs.setdefault(dataloader_idx, []).append((batch["position"], preds))

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking:
            self._val_outputs.clear()
            return
        predictions, pairs = {}, {}
        for i, name in enumerate(self.dev_names):
            positions = torch.cat([p for p, _ in self._val_outputs[i]]).cpu().numpy()
            preds = torch.cat([y for _, y in self._val_outputs[i]]).cpu().numpy()
            ordered = np.empty_like(preds)
            ordered[positions] = preds  # back to dataset order
            predictions[name] = ordered
            pairs[name] = (ordered, self.dev_labels[name])
        self._val_outputs.clear()
        metrics = compute_metrics(self.task, pairs)
        self.predictions = predictions
        self.history.append(metrics)
        self.evaluated_at_step = self.global_step
        if self.metrics_sink is not None:
            self.metrics_sink({f"dev/{k}": v for k, v in metrics.items()}, len(self.history))
        if self.metrics_flush is not None:
            self.metrics_flush()

    def configure_optimizers(self):
        o = self.optim
        groups = layerwise_param_groups(
            [(n, p) for n, p in self.named_parameters() if p.requires_grad],
            o.lr,
            o.layerwise_lr_decay,
            self.encoder.config.num_hidden_layers,
            o.reference_off_by_one,
            o.weight_decay,
        )
        fused = o.fused if o.fused is not None else self.device.type == "cuda"
        optimizer = adam(groups, o.lr, o.betas, o.eps, fused=fused, bias_correction=o.bias_correction)
        total = int(self.trainer.estimated_stepping_batches)
        warmup = int(round(o.warmup_fraction * total))  # paper Table 7: warmup fraction 0.1
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_warmup_decay(warmup, total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
