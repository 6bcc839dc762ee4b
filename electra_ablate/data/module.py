"""The Lightning data modules of conf/data: the pre-training corpus as endless, seeded, resumable batches.

The training loader walks a seeded permutation per data epoch forever (training runs by `max_steps`) and
restarts exactly at the next batch when Lightning resumes from a checkpoint. `PretrainDataModule` reads one
corpus file (`data=wiki_sample`, `data=wiki`); `TextFilesDataModule` and `HFDatasetDataModule` read a corpus
of many files or a Hugging Face dataset (`data=text_files`, `data=hf_dataset`) into the same cache entries.
"""

from __future__ import annotations

import functools
import json
import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, IterableDataset

from electra_ablate.common.loader import worker_context
from electra_ablate.common.tokens import SPECIAL_TOKENS, SpecialIds
from electra_ablate.data.cache import META_NAME, PretrainCache, build_or_load, examples_sha256, load_cache
from electra_ablate.data.corpus_build import Source, build_or_load_corpus
from electra_ablate.data.corpus_files import TextFiles
from electra_ablate.data.errors import DataError
from electra_ablate.data.examples import MIN_TARGET_LENGTH
from electra_ablate.data.hf_corpus import HFDataset


def collate(cache: PretrainCache, rows: np.ndarray, length: int | None = None) -> dict[str, torch.Tensor]:
    """Batch of `rows`, padded to the longest of them (or to `length`, the cache's max_seq_length, for shapes that
    never change: runtime.static_shapes): input_ids, attention_mask, token_type_ids (B, T) long."""
    lengths = cache.lengths[rows]  # (B,)
    longest = int(lengths.max()) if length is None else length
    # Reading sorted rows from the memory map is sequential on disk; the permutation order is restored after.
    order = np.argsort(rows, kind="stable")
    ids = np.empty((len(rows), longest), dtype=np.int64)
    ids[order] = cache.input_ids[rows[order], :longest]
    pos = np.arange(longest)[None, :]  # (1, T)
    real = pos < lengths[:, None]  # (B, T)
    # Reference: segment id 0 for [CLS] A [SEP] and padding, 1 for B [SEP].
    second = real & (pos >= cache.segment_a_end[rows][:, None])
    return {
        "input_ids": torch.from_numpy(ids),
        "attention_mask": torch.from_numpy(real.astype(np.int64)),
        "token_type_ids": torch.from_numpy(second.astype(np.int64)),
    }


@functools.lru_cache(maxsize=2)  # the current data epoch's, and the next one's at an epoch boundary
def epoch_permutation(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    # SeedSequence([seed, epoch]) rather than seed + epoch: seed 0's second epoch must not be seed 1's first.
    return np.random.default_rng([seed, epoch]).permutation(num_examples)


class PretrainBatches(IterableDataset):
    """An endless, seeded stream of batches starting at local batch `start` of this rank.

    Global batch g holds the rows perm_e[p*B:(p+1)*B] with e = g // batches_per_epoch, p = g % that, and
    perm_e a seeded permutation (the last N mod B rows of each permutation are skipped). Rank r of W takes
    the global batches s*W + r for its local steps s. DataLoader worker w of k takes the local steps
    start + w, start + w + k, ...; the DataLoader returns the workers' batches round-robin, so the order
    does not depend on the number of workers.
    """

    def __init__(self, directory: Path, num_examples: int, batch_size: int, seed: int, start: int = 0,
                 rank: int = 0, world_size: int = 1, length: int | None = None):
        assert num_examples >= batch_size, f"{num_examples} examples cannot fill a batch of {batch_size}"
        self.directory, self.num_examples, self.batch_size, self.seed = directory, num_examples, batch_size, seed
        self.start, self.rank, self.world_size = start, rank, world_size
        self.length = length  # every batch padded to this many positions (None: to its longest row)

    def rows(self, global_batch: int) -> np.ndarray:
        """(B,) row indices of global batch `global_batch`."""
        epoch, pos = divmod(global_batch, self.num_examples // self.batch_size)
        perm = epoch_permutation(self.num_examples, self.seed, epoch)
        return perm[pos * self.batch_size : (pos + 1) * self.batch_size]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        # Opened here, in each worker, so a spawned worker maps the file instead of unpickling a copy.
        cache = load_cache(self.directory)
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for step in itertools.count(self.start + worker, workers):
            yield collate(cache, self.rows(step * self.world_size + self.rank), self.length)


class PretrainDataModule(pl.LightningDataModule):
    """The pre-training corpus as endless shuffled batches {input_ids, attention_mask, token_type_ids}.

    Constructor arguments are the keys of conf/data plus where to cache and how to load. `prepare()` builds
    or loads the cache; the properties below are valid after it. The position in the stream is saved in
    Lightning checkpoints (`state_dict`) so a resumed run continues with exactly the next batch.
    """

    def __init__(
        self,
        *,
        corpus: str,
        vocab_file: str,
        cache_dir: str,
        train_vocab_size: int = 0,
        lowercase: bool = True,
        max_seq_length: int = 128,
        short_seq_prob: float = 0.05,
        max_docs: int | None = None,
        batch_size: int = 32,
        build_seed: int = 12345,
        seed: int = 0,
        num_workers: int = 0,
        pin_memory: bool = False,
        fixed_length: bool = False,
    ):
        super().__init__()
        problems = []
        if max_seq_length < MIN_TARGET_LENGTH:
            problems.append(f"data.max_seq_length={max_seq_length} must be at least {MIN_TARGET_LENGTH} "
                            "(the reference draws short targets from randint(5, max_seq_length))")
        if not 0.0 <= short_seq_prob <= 1.0:
            problems.append(f"data.short_seq_prob={short_seq_prob} must be a probability in [0, 1]")
        if batch_size < 1:
            problems.append(f"data.batch_size={batch_size} must be at least 1")
        if max_docs is not None and max_docs < 1:
            problems.append(f"data.max_docs={max_docs} must be null (whole corpus) or at least 1")
        if train_vocab_size < 0 or 0 < train_vocab_size < 2 * len(SPECIAL_TOKENS):
            problems.append(f"data.train_vocab_size={train_vocab_size} must be 0 (use data.vocab_file) or a "
                            "vocabulary size (e.g. 8000)")
        if num_workers < 0:
            problems.append(f"num_workers={num_workers} must be >= 0")
        if problems:
            raise DataError("Bad data config: " + "; ".join(problems) + ".")
        self.corpus, self.vocab_file, self.cache_dir = corpus, vocab_file, cache_dir
        self.train_vocab_size, self.lowercase = train_vocab_size, lowercase
        self.max_seq_length, self.short_seq_prob = max_seq_length, short_seq_prob
        self.max_docs, self.batch_size, self.build_seed = max_docs, batch_size, build_seed
        self.seed, self.num_workers, self.pin_memory = seed, num_workers, pin_memory
        # Speed only (runtime.static_shapes): every batch padded to max_seq_length, so a captured step never
        # meets a new shape. The masks then draw over B x max_seq_length positions: the same distribution.
        self.fixed_length = fixed_length
        self._cache: PretrainCache | None = None
        self._start = 0  # batches consumed before the current loader was made (this rank's local steps)
        self._loader_trainer: pl.Trainer | None = None  # the trainer the current loader feeds
        self._progress_at_start: int | None = None  # its batch counter when the loader was made

    # -- building ------------------------------------------------------------------------------------------

    def prepare(self) -> PretrainCache:
        """Build (first time) or load the cache. Idempotent; call it before training to fail early."""
        if self._cache is None:
            self._cache = self._build_cache()
            if self.num_examples < self.batch_size:
                raise DataError(
                    f"The corpus {self.corpus} gives {self.num_examples} examples, fewer than "
                    f"data.batch_size={self.batch_size}. Use a larger corpus or data.max_docs, or a smaller "
                    "batch size."
                )
        return self._cache

    def _build_cache(self) -> PretrainCache:
        """Build or load the token cache of this module's corpus (CorpusDataModule below reads other sources)."""
        return build_or_load(
            corpus=self.corpus, vocab_file=self.vocab_file, cache_dir=self.cache_dir,
            lowercase=self.lowercase, max_seq_length=self.max_seq_length,
            short_seq_prob=self.short_seq_prob, build_seed=self.build_seed, max_docs=self.max_docs,
            train_vocab_size=self.train_vocab_size,
        )

    def prepare_data(self) -> None:
        self.prepare()

    def setup(self, stage: str | None = None) -> None:
        self.prepare()

    @property
    def cache(self) -> PretrainCache:
        assert self._cache is not None, "call PretrainDataModule.prepare() first"
        return self._cache

    @property
    def vocab_size(self) -> int:
        return self.cache.meta["vocab_size"]

    @property
    def special(self) -> SpecialIds:
        return self.cache.special

    @property
    def vocab_path(self) -> Path:
        """The vocabulary that made the token ids (a copy inside the cache entry); ship it with checkpoints."""
        return self.cache.vocab_path

    @property
    def vocab_sha256(self) -> str:
        """sha256 of the vocabulary file that made the token ids (provenance: equal digests, equal ids)."""
        return self.cache.meta["vocab_sha256"]

    @property
    def examples_sha256(self) -> str:
        """sha256 of the packed pre-training examples (see `examples_sha256`)."""
        return examples_sha256(self.cache)

    @property
    def token_counts(self) -> torch.Tensor:
        """(V,) int64 word-piece frequencies over the corpus (unigram generator, paper Figure 3)."""
        return torch.from_numpy(np.array(self.cache.token_counts))

    @property
    def num_examples(self) -> int:
        return self.cache.meta["num_examples"]

    # -- loading and resuming ------------------------------------------------------------------------------

    @staticmethod
    def _trainer_batches(trainer: pl.Trainer | None) -> int | None:
        # Batches the fit loop has taken from the loader, whatever the optimisation (global_step counts
        # optimizer steps: twice per batch with two optimizers under manual optimisation). In
        # on_train_batch_end, where ModelCheckpoint saves, `processed` already counts the current batch and
        # `completed` does not; at the other save points (epoch or fit end) they are equal.
        if trainer is None:
            return None
        return trainer.fit_loop.epoch_loop.batch_progress.total.processed

    @property
    def batches_consumed(self) -> int:
        """Local batches this rank has trained on since the start of training (across resumes and fits)."""
        # Counted on the trainer that made the current loader: a later fit with a new trainer (e.g. a second
        # training stage) starts from where the previous one stopped.
        now = self._trainer_batches(self._loader_trainer)
        if now is None or self._progress_at_start is None:
            return self._start
        return self._start + now - self._progress_at_start

    def _rank_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def train_dataloader(self) -> DataLoader:
        self.prepare()
        self._start = self.batches_consumed
        self._loader_trainer = self.trainer
        self._progress_at_start = self._trainer_batches(self.trainer)
        rank, world_size = self._rank_world()
        batches = PretrainBatches(self.cache.directory, self.num_examples, self.batch_size, self.seed,
                                  self._start, rank, world_size, self.max_seq_length if self.fixed_length else None)
        # batch_size=None: the dataset yields whole batches; the sampler-free stream has no length, so
        # Lightning runs one endless epoch and stops at max_steps.
        return DataLoader(batches, batch_size=None, num_workers=self.num_workers, pin_memory=self.pin_memory,
                          multiprocessing_context=worker_context(self.num_workers))

    def _identity(self) -> dict:
        """What a checkpoint's position in the stream means: the examples (by content: a cache entry rebuilt from
        the same text, e.g. after the corpus file was copied anew and its modification time changed, is the same
        stream), the batch size, the shuffling seed and the number of ranks."""
        _, world_size = self._rank_world()
        return {"examples_sha256": self.examples_sha256, "cache": self.cache.directory.name,
                "batch_size": self.batch_size, "seed": self.seed, "world_size": world_size}

    def _saved_examples(self, state_dict: dict) -> str | None:
        """The examples digest a checkpoint was trained on. Checkpoints from before the digest was saved name
        only their cache entry: its digest is read from that entry when it is still in the cache."""
        if state_dict.get("examples_sha256"):
            return state_dict["examples_sha256"]
        name = state_dict.get("cache")
        if name == self.cache.directory.name:
            return self.examples_sha256
        meta = self.cache.directory.parent / str(name) / META_NAME
        try:
            return json.loads(meta.read_text()).get("examples_sha256")
        except (OSError, ValueError):
            return None

    def state_dict(self) -> dict:
        self.prepare()
        return {"batches_consumed": self.batches_consumed, **self._identity()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.prepare()
        ours = self._identity()
        stream = ("batch_size", "seed", "world_size")
        saved = {k: state_dict.get(k) for k in stream}
        problems = [f"{k} {saved[k]} (this run: {ours[k]})" for k in stream if saved[k] != ours[k]]
        if self._saved_examples(state_dict) != ours["examples_sha256"]:
            problems.append(f"examples of cache entry {state_dict.get('cache')} (this run: {ours['cache']}, other "
                            "examples)")
        if problems:
            raise DataError(
                f"The checkpoint's data stream differs from this run's: {'; '.join(problems)}, so the run cannot "
                "continue with the next batch. Resume with the same data config, seed and number of devices, or "
                "start a new run."
            )
        self._start = int(state_dict["batches_consumed"])
        self._loader_trainer = self._progress_at_start = None


# ---------------------------------------------------------------------------------------------------------
# Data modules (conf/data/text_files.yaml, conf/data/hf_dataset.yaml)


class CorpusDataModule(PretrainDataModule):
    """A PretrainDataModule whose corpus is a `TextFiles` or `HFDataset` source built by `build_or_load_corpus`.

    `build_workers`: tokenizer processes (0 = one per core). The other arguments are PretrainDataModule's.
    """

    def __init__(self, *, source: Source, build_workers: int = 0, train_vocab_size: int = 0, **data_args):
        if train_vocab_size:
            raise DataError(
                f"data.train_vocab_size={train_vocab_size}: training a vocabulary is done on a single-file "
                "corpus (data.corpus). For this corpus set data.train_vocab_size=0 and data.vocab_file to a "
                "WordPiece vocab.txt (the paper uses BERT's uncased vocabulary, section 3.1)."
            )
        if build_workers < 0:
            raise DataError(f"data.build_workers={build_workers} must be 0 (one per core) or a positive count.")
        self.source = source
        self.build_workers = build_workers
        super().__init__(corpus=source.describe(), **data_args)

    def _build_cache(self) -> PretrainCache:
        return build_or_load_corpus(
            self.source, vocab_file=self.vocab_file, cache_dir=self.cache_dir, lowercase=self.lowercase,
            max_seq_length=self.max_seq_length, short_seq_prob=self.short_seq_prob, build_seed=self.build_seed,
            max_docs=self.max_docs, workers=self.build_workers,
        )


class TextFilesDataModule(CorpusDataModule):
    def __init__(self, *, paths: Sequence[str], text_field: str = "text", build_workers: int = 0, **data_args):
        super().__init__(source=TextFiles(list(paths), text_field), build_workers=build_workers, **data_args)


class HFDatasetDataModule(CorpusDataModule):
    def __init__(self, *, name: str, config: str | None = None, split: str = "train", text_column: str = "text",
                 streaming: bool = False, revision: str | None = None, build_workers: int = 0, **data_args):
        source = HFDataset(name, config, split, text_column, streaming, revision)
        super().__init__(source=source, build_workers=build_workers, **data_args)

