"""Fine-tuning's data plumbing: GLUE features as a dataset, batches padded to their longest sequence (or as
runtime.finetune_padding says), optionally drawn from length buckets; evaluation batches sorted by length and
predictions put back in row order, for the dev splits during training and for the test splits after it
(`predict`, whose predictions glue/submit.py turns into a GLUE submission).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from electra_ablate.common.loader import worker_context
from electra_ablate.glue.features import Features



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


@torch.no_grad()
def predict(system, features: Features, batch_size: int, pad_id: int, autocast: str | None = None) -> np.ndarray:
    """Class ids (or STS-B scores) of a fine-tuned FinetuneSystem on tokenized examples, in their order."""
    was_training = system.training
    system.eval()
    dataset = FeaturesDataset(features)
    out = np.empty(len(features), dtype=np.float64 if system.task.is_regression else np.int64)
    device = next(system.parameters()).device
    for rows in sorted_batches(features.lengths, batch_size):
        batch = {k: v.to(device) for k, v in collate([dataset[i] for i in rows], pad_id).items()}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast == "bf16-mixed"):
            logits = system(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        preds = logits.float() * system._score_scale if system.task.is_regression else logits.argmax(-1)
        out[rows] = preds.cpu().numpy()
    system.train(was_training)
    return out
