"""The parallel, resumable build of a large corpus (`TextFiles` or `HFDataset`) into a pre-training cache entry.

Its examples are those of the single-file build (`cache.build_or_load`): the reference
build_pretraining_dataset.py procedure (`examples.ExampleBuilder`, one seeded RNG over the whole corpus in
corpus order), in a cache entry that `cache.load_cache` reads like any other.

The build streams the corpus and never holds it. The main process reads the documents' lines in order and
cuts them into shards of about SHARD_CHARS characters; worker processes (one per core) tokenize the shards
with `tokenizers` and write each shard's word pieces atomically under `cache_dir/tokens/<key>/`; the main
process feeds the finished shards, in order, to the example builder and appends the examples to the new
cache entry, which is renamed into place when complete. A killed build resumes: shards already on disk are
read back instead of tokenized.
"""

from __future__ import annotations

import collections
import json
import logging
import multiprocessing
import os
import random
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from electra_ablate.common.io import atomic_dir, write_text
from electra_ablate.common.tokens import SpecialIds
from electra_ablate.data import wordpiece_shards as W
from electra_ablate.data.cache import FORMAT_VERSION, META_NAME, PretrainCache, _hash, finish_entry, load_cache
from electra_ablate.data.corpus_files import TextFiles, _fix_paths, file_sha256
from electra_ablate.data.errors import DataError
from electra_ablate.data.example_writer import ExampleWriter
from electra_ablate.data.examples import ExampleBuilder
from electra_ablate.data.hf_corpus import HFDataset
from electra_ablate.data.tokenizer import load_tokenizer, read_vocab

log = logging.getLogger(__name__)

# Bump when the shard layout or the line rules (here and in corpus_files.py) change: old token shards are then
# rebuilt, never misread.
TOKENS_FORMAT = 1
SHARD_CHARS = 16 << 20  # text per shard: ~3.5M word pieces, a few seconds of one core; bounds memory per worker
PROGRESS_SECONDS = 10.0


Source = TextFiles | HFDataset


def stream_lines(source: Source, max_docs: int | None) -> Iterator[str]:
    """The corpus's lines, "" after each document, stopping after `max_docs` documents."""
    docs = 0
    for line in source.lines():
        yield line
        if not line:
            docs += 1
            if max_docs is not None and docs >= max_docs:
                return


def shards(lines: Iterator[str], shard_chars: int) -> Iterator[list[str]]:
    """Consecutive runs of lines of about `shard_chars` characters, cut at line boundaries."""
    shard: list[str] = []
    size = 0
    for line in lines:
        shard.append(line)
        size += len(line) + 1
        if size >= shard_chars:
            yield shard
            shard, size = [], 0
    if shard:
        yield shard


# ---------------------------------------------------------------------------------------------------------
# The build


def _worker_count(requested: int) -> int:
    if requested > 0:
        return requested
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use (taskset, cgroups)
    except AttributeError:
        return os.cpu_count() or 1


def _start_pool(workers: int, tokenizer_json: str) -> ProcessPoolExecutor:
    """Tokenizer worker processes. Forked where the platform can (spawned workers would import the main
    module, torch and Lightning included, seconds per worker); tokenizers' own threads are off in them, and
    each dies with this process (`W.die_with_parent`). An executor rather than a `multiprocessing.Pool`: a
    worker that dies mid-shard (killed, out of memory) breaks it with an error instead of leaving the shard's
    result to be waited on for ever."""
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    # Set while forking, so tokenizers does not warn that a process using its thread pool was forked.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method),
                                   initializer=W.init_worker, initargs=(tokenizer_json, os.getpid()))
        # The executor starts its workers on demand; start them all now, while the variable above is set.
        for future in [pool.submit(os.getpid) for _ in range(workers)]:
            future.result()
        return pool
    finally:
        if previous is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


def _remove_stale_temporaries(directory: Path) -> None:
    """Temporary shard files of killed builds (their process is gone); a running build's are left alone."""
    for tmp in directory.glob(".shard_*.tmp-*"):
        pid = int(tmp.name.rsplit("-", 1)[1])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
        except PermissionError:
            pass


def _on_shard_done(index: int) -> None:
    """Called after each shard is assembled into examples (tests simulate a kill here)."""


class _Progress:
    def __init__(self, source: Source):
        self.source = source
        self.started = self.last = time.perf_counter()
        self.shards = self.read_back = self.tokens = 0
        self.total_bytes = source.total_bytes if isinstance(source, TextFiles) else None
        self.total_rows = source.total_rows if isinstance(source, HFDataset) else None

    def shard(self, tokens: int, read_back: bool) -> None:
        self.shards += 1
        self.read_back += read_back
        self.tokens += tokens
        if time.perf_counter() - self.last >= PROGRESS_SECONDS:
            self.report()

    def report(self) -> None:
        now = self.last = time.perf_counter()
        where = ""
        if self.total_bytes:
            where = f", {self.source.bytes_read / 1e6:.1f} of {self.total_bytes / 1e6:.1f} MB of files read"
        elif isinstance(self.source, HFDataset):
            of = f" of {self.total_rows}" if self.total_rows is not None else ""
            where = f", {self.source.rows_read}{of} rows read"
        log.info("corpus build: %d shards (%d read back from an earlier build), %.1fM word pieces, %.0f word "
                 "pieces/s%s", self.shards, self.read_back, self.tokens / 1e6, self.tokens / (now - self.started),
                 where)


def build_or_load_corpus(
    source: Source,
    *,
    vocab_file: str | Path,
    cache_dir: str | Path,
    lowercase: bool = True,
    max_seq_length: int = 128,
    short_seq_prob: float = 0.05,
    build_seed: int = 12345,
    max_docs: int | None = None,
    workers: int = 0,
    shard_chars: int = SHARD_CHARS,
) -> PretrainCache:
    """The cache entry of `source` at these settings, building it (in parallel, resumably) if it is missing.

    Its examples are those `cache.build_or_load` makes of the same text read as one file; `workers` (0 = one
    per core this process may use) only changes the speed.
    """
    cache_dir = Path(cache_dir)
    vocab_file = Path(vocab_file)
    tokens = read_vocab(vocab_file)  # validates before the key hashes the file
    token_inputs = {
        "tokens_format": TOKENS_FORMAT,
        "source": source.identity(cache_dir),
        "vocab_sha256": file_sha256(vocab_file, cache_dir),
        "lowercase": bool(lowercase),
        "max_docs": max_docs,
        "shard_chars": int(shard_chars),  # where shards are cut: which file holds which lines
    }
    inputs = {
        "format": FORMAT_VERSION,
        **token_inputs,
        "max_seq_length": int(max_seq_length),
        "short_seq_prob": float(short_seq_prob),
        "build_seed": int(build_seed),
    }
    target = cache_dir / "pretrain" / _hash(inputs)
    if (target / META_NAME).is_file():
        return load_cache(target)

    shard_dir = cache_dir / "tokens" / _hash(token_inputs)
    shard_dir.mkdir(parents=True, exist_ok=True)
    # What the shards are of, for whoever finds the folder.
    write_text(shard_dir / "inputs.json", json.dumps(token_inputs, indent=1, sort_keys=True))
    _remove_stale_temporaries(shard_dir)
    tokenizer = load_tokenizer(vocab_file, lowercase)
    special = SpecialIds.from_vocab(tokens)
    dtype = np.dtype(np.uint16 if len(tokens) <= np.iinfo(np.uint16).max + 1 else np.int32)
    workers = _worker_count(workers)
    log.info("building the pre-training examples of %s with %d tokenizer process(es) into %s", source.describe(),
             workers, target)
    started = time.perf_counter()
    with atomic_dir(target, replace=False) as tmp:
        build = _Assembly(tmp, shard_dir, source, special, len(tokens), dtype,
                          ExampleBuilder(max_seq_length, short_seq_prob, special.cls, special.sep,
                                         random.Random(build_seed)), max_seq_length)
        num_examples = build.run(shards(stream_lines(source, max_docs), shard_chars), tokenizer, workers)
        if num_examples == 0:
            raise DataError(f"The corpus {source.describe()} holds no text that tokenizes to word pieces. "
                            f"{_fix_paths()}")
        seconds = time.perf_counter() - started
        finish_entry(tmp, build.counts, vocab_file, {
            **inputs,
            "corpus": source.describe(),
            "vocab_size": len(tokens),
            "special": special._asdict(),
            "dtype": dtype.name,
            "num_examples": num_examples,
            "num_docs": build.num_docs,
            "num_tokens": build.num_tokens,
            "num_shards": build.progress.shards,
            "build_workers": workers,
            "build_seconds": round(seconds, 3),
        })
    build.progress.report()
    log.info("built %d examples from %.1fM word pieces in %.0f s (%.0f word pieces/s): %s", num_examples,
             build.num_tokens / 1e6, seconds, build.num_tokens / max(seconds, 1e-9), target)
    return load_cache(target)


class _Assembly:
    """Tokenizes the corpus's shards (in worker processes, or read back from an earlier build) and feeds them,
    in corpus order, to the example builder and the entry's writer, counting word pieces and documents."""

    def __init__(self, directory: Path, shard_dir: Path, source: Source, special: SpecialIds, vocab_size: int,
                 dtype: np.dtype, builder: ExampleBuilder, max_seq_length: int):
        self.shard_dir, self.dtype, self.builder, self.vocab_size = shard_dir, dtype, builder, vocab_size
        self.writer = ExampleWriter(directory, max_seq_length, dtype, special.pad)
        self.counts = np.zeros(vocab_size, dtype=np.int64)
        self.progress = _Progress(source)
        self.num_docs = self.num_tokens = 0

    def assemble(self, index: int, tokenized_now: bool) -> None:
        ids, line_lengths = W.read_shard(W.shard_path(self.shard_dir, index))
        self.counts[:] += np.bincount(ids, minlength=self.vocab_size)
        self.num_tokens += len(ids)
        self.num_docs += int((line_lengths == 0).sum())
        start = 0
        for end in np.cumsum(line_lengths).tolist():
            self.writer.add(self.builder.add_line(ids[start:end].tolist()))
            start = end
        self.progress.shard(len(ids), read_back=not tokenized_now)
        _on_shard_done(index)

    def run(self, corpus_shards: Iterator[list[str]], tokenizer, workers: int) -> int:
        """Every shard, in order, through the builder; returns the number of examples written."""
        pool = None
        try:
            if workers > 1:
                pool = _start_pool(workers, tokenizer.to_str())
            # Shards in corpus order: (index, pending result or None when the shard is already on disk).
            pending: collections.deque = collections.deque()
            limit = 2 * workers  # shards in flight: bounds the text held in memory

            def drain(until: int) -> None:
                while len(pending) > until:
                    index, result = pending.popleft()
                    if result is not None:
                        try:
                            result.result()
                        except BrokenProcessPool as e:
                            raise DataError(
                                f"A tokenizer process of the corpus build died while tokenizing shard {index} "
                                f"(killed, or out of memory?). Run again: the shards finished are kept and read back; "
                                f"+data.build_workers=1 uses less memory.") from e
                    self.assemble(index, tokenized_now=result is not None)

            for index, lines in enumerate(corpus_shards):
                if W.shard_path(self.shard_dir, index).is_file():
                    pending.append((index, None))
                elif pool is None:
                    W.tokenize_shard(index, lines, str(self.shard_dir), self.dtype.name, tokenizer)
                    pending.append((index, _Done()))
                else:
                    pending.append((index, pool.submit(W.tokenize_shard, index, lines, str(self.shard_dir),
                                                       self.dtype.name)))
                del lines
                drain(limit - 1)
            drain(0)
            self.writer.add(self.builder.flush())
            return self.writer.close()
        except BaseException:
            self.writer.abort()
            raise
        finally:
            if pool is not None:  # shards being tokenized finish (a few seconds each) and are kept for a resume
                pool.shutdown(wait=True, cancel_futures=True)


class _Done:
    """A result already computed in this process (no worker pool)."""

    def result(self) -> None:
        return None

