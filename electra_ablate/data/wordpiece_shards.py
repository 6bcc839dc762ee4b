"""Tokenizing one shard of a corpus into word-piece ids on disk: the work of a corpus build's worker processes.

Kept apart from the rest of the data package so that a worker process imports only `tokenizers` and numpy (no
torch), and starts in a fraction of a second. A shard file holds the word-piece ids of its lines end to end
(`ids`) and the number of ids of each line (`line_lengths`, 0 for a document boundary or a line that tokenizes
to nothing: the example builder treats both as the end of a document, as cache.build_or_load does). It is
written to a temporary name and renamed, so a shard file that exists is complete.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import signal
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
from tokenizers import Tokenizer

from electra_ablate.common.io import atomic_file

LINES_PER_ENCODE = 2048  # lines per encode_batch call: bounds the memory of the Encoding objects
_tokenizer: Tokenizer | None = None


class ShardResult(NamedTuple):
    index: int
    num_lines: int
    num_tokens: int


def shard_path(directory: Path, index: int) -> Path:
    return directory / f"shard_{index:07d}.npz"


def init_worker(tokenizer_json: str, parent_pid: int) -> None:
    """Pool initializer: one tokenizer per worker process, single-threaded (the processes are the parallelism).
    A worker dies with the process that started it, however that one ends (see `die_with_parent`)."""
    global _tokenizer
    die_with_parent(parent_pid)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _tokenizer = Tokenizer.from_str(tokenizer_json)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int) -> None:
    """On Linux, ask the kernel to send this process SIGTERM when its parent dies. The parent shuts its workers
    down only when it unwinds; a parent killed outright (SIGKILL, an out-of-memory kill, a crash) would otherwise
    leave them waiting on their task queue for as long as any other process holds it open. Elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return  # not permitted here (some sandboxes): the parent's shutdown still covers an orderly exit
    if os.getppid() != parent_pid:  # the parent died before the request took hold
        os._exit(1)


def encode_lines(tokenizer: Tokenizer, lines: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(ids, line_lengths) of `lines` ("" = document boundary), without [CLS]/[SEP]; ids as int64."""
    lengths = np.zeros(len(lines), dtype=np.int64)
    pieces: list[np.ndarray] = []
    for start in range(0, len(lines), LINES_PER_ENCODE):
        chunk = lines[start : start + LINES_PER_ENCODE]
        where = [i for i, line in enumerate(chunk) if line]
        encoded = [e.ids for e in tokenizer.encode_batch_fast([chunk[i] for i in where], add_special_tokens=False)]
        counts = [len(ids) for ids in encoded]
        lengths[[start + i for i in where]] = counts
        pieces.append(np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int64, count=sum(counts)))
    ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    return ids, lengths


def write_shard(path: Path, ids: np.ndarray, line_lengths: np.ndarray, dtype: str) -> None:
    with atomic_file(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, ids=ids.astype(dtype), line_lengths=line_lengths.astype(np.int32))


def tokenize_shard(index: int, lines: list[str], directory: str, dtype: str,
                   tokenizer: Tokenizer | None = None) -> ShardResult:
    """Tokenize shard `index` and write it under `directory`; `tokenizer` defaults to the worker's."""
    tok = tokenizer if tokenizer is not None else _tokenizer
    assert tok is not None, "init_worker was not called in this process"
    ids, lengths = encode_lines(tok, lines)
    write_shard(shard_path(Path(directory), index), ids, lengths, dtype)
    return ShardResult(index, len(lines), len(ids))


def read_shard(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path) as z:
        return z["ids"], z["line_lengths"]
