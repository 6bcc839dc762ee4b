"""The Lightning system that fine-tunes one encoder on one GLUE task, and its data plumbing.

The classifier is the reference's (google-research/electra finetune/classification/classification_tasks.py):
dropout (rate 0.1) and one linear layer on the final hidden state of [CLS], with no pooler layer (ELECTRA's
`get_pooled_output` is `sequence_output[:, 0]`); STS-B gets a one-output regression head trained with squared
error on the score divided by 5, as the reference normalises it. Optimisation follows paper Table 7 and the
reference `model/optimization.py`: Adam (eps 1e-6) with layer-wise learning-rate decay, 10% linear warmup,
linear decay, gradient clipping at 1.0; by default the reference's update (no bias correction) on the
per-example losses summed over the batch, as reference run_finetuning.py builds its loss. Batches are padded to their longest sequence, optionally drawn from
length buckets; evaluation batches are sorted by length and predictions put back in row order.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from electra_ablate.common.loader import worker_context
from electra_ablate.glue.features import Features
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


# --- data ----------------------------------------------------------------------------------------------


class FeaturesDataset(Dataset):
    def __init__(self, features: Features):
        self.f = features

    def __len__(self) -> int:
        return len(self.f)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray, float, int]:
        a, b = self.f.offsets[i], self.f.offsets[i + 1]
        return self.f.input_ids[a:b], self.f.token_type_ids[a:b], self.f.labels[i], i


# runtime.finetune_padding: how long a fine-tuning batch is. dynamic: its longest row (least work); bucket: that
# rounded up to a multiple of PAD_BUCKET (at most max_seq_length / 32 shapes); max: glue_data.max_seq_length (one
# shape). Padded positions are masked out of attention, pooling and the loss, so the results are the same up to
# rounding (and, with dropout, the draws over the longer tensors); fixed shapes let a compiled network on a GPU
# (runtime.compile) keep one graph, or a few, instead of one per length.
FINETUNE_PADDING = ("dynamic", "bucket", "max")
PAD_BUCKET = 32


def padded_length(longest: int, padding: str = "dynamic", max_len: int = 0) -> int:
    """The length a batch whose longest row has `longest` tokens is padded to (FINETUNE_PADDING)."""
    if padding == "max":
        return max(max_len, longest)
    if padding == "bucket":
        return min(max(max_len, longest), -(-longest // PAD_BUCKET) * PAD_BUCKET)
    return longest


def collate(items: Sequence[tuple[np.ndarray, np.ndarray, float, int]], pad_id: int = 0, padding: str = "dynamic",
            max_len: int = 0) -> dict[str, torch.Tensor]:
    """Pad to the longest sequence in the batch (not to max_seq_length), or as `padding` says (`padded_length`)."""
    T = padded_length(max(len(ids) for ids, _, _, _ in items), padding, max_len)
    B = len(items)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    token_type_ids = torch.zeros((B, T), dtype=torch.long)
    attention_mask = torch.zeros((B, T), dtype=torch.long)
    for r, (ids, types, _, _) in enumerate(items):
        n = len(ids)
        input_ids[r, :n] = torch.from_numpy(ids.astype(np.int64))
        token_type_ids[r, :n] = torch.from_numpy(types.astype(np.int64))
        attention_mask[r, :n] = 1
    labels = np.array([y for _, _, y, _ in items])
    return {
        "input_ids": input_ids,  # (B, T)
        "token_type_ids": token_type_ids,  # (B, T)
        "attention_mask": attention_mask,  # (B, T)
        "labels": torch.from_numpy(labels),  # (B,) int64, or float32 for regression
        "position": torch.tensor([i for _, _, _, i in items], dtype=torch.long),  # (B,) index in the split
    }


class LengthBucketBatchSampler(Sampler[list[int]]):
    """Shuffled batches of similar length: shuffle, cut into pools of `pool_batches` batches, sort each pool
    by length, batch it, and shuffle the batches. Less padding, still a random order each epoch."""

    def __init__(self, lengths: np.ndarray, batch_size: int, seed: int, pool_batches: int = 50):
        self.lengths = np.asarray(lengths)
        self.batch_size = batch_size
        self.seed = seed
        self.pool = batch_size * pool_batches
        self.epoch = 0

    def __len__(self) -> int:
        return -(-len(self.lengths) // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        self.epoch += 1
        order = rng.permutation(len(self.lengths))
        batches = []
        for start in range(0, len(order), self.pool):
            pool = order[start : start + self.pool]
            pool = pool[np.argsort(self.lengths[pool], kind="stable")]
            batches.extend(pool[i : i + self.batch_size].tolist() for i in range(0, len(pool), self.batch_size))
        for j in rng.permutation(len(batches)):
            yield batches[j]


def sorted_batches(lengths: np.ndarray, batch_size: int) -> list[list[int]]:
    """Evaluation batches in length order (least padding); predictions are put back by position."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    return [order[i : i + batch_size].tolist() for i in range(0, len(order), batch_size)]


class GlueDataModule(pl.LightningDataModule):
    def __init__(
        self,
        train: Features,
        dev: dict[str, Features],
        batch_size: int,
        eval_batch_size: int,
        seed: int,
        length_buckets: bool = False,
        num_workers: int = 0,
        pin_memory: bool = False,
        pad_id: int = 0,
        padding: str = "dynamic",
        max_len: int = 0,
    ):
        super().__init__()
        self.padding, self.max_len = padding, max_len
        self.train, self.dev = train, dev
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.seed, self.length_buckets = seed, length_buckets
        self.num_workers, self.pin_memory, self.pad_id = num_workers, pin_memory, pad_id

    def _loader(self, features: Features, **kwargs) -> DataLoader:
        return DataLoader(
            FeaturesDataset(features),
            collate_fn=functools.partial(collate, pad_id=self.pad_id, padding=self.padding, max_len=self.max_len),
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
            multiprocessing_context=worker_context(self.num_workers),  # joblib launcher: data.worker_context
            **kwargs,
        )

    def train_dataloader(self) -> DataLoader:
        if self.length_buckets:
            sampler = LengthBucketBatchSampler(self.train.lengths, self.batch_size, self.seed)
            return self._loader(self.train, batch_sampler=sampler)
        generator = torch.Generator().manual_seed(self.seed)
        return self._loader(self.train, batch_size=self.batch_size, shuffle=True, generator=generator)

    def val_dataloader(self) -> list[DataLoader]:
        return [
            self._loader(f, batch_sampler=sorted_batches(f.lengths, self.eval_batch_size)) for f in self.dev.values()
        ]
