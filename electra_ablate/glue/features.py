"""Tokenized GLUE splits: `[CLS] a [SEP] (b [SEP])` features truncated like the reference, cached on disk
under a hash of everything that determines them, and the rows of the dev-predictions TSV.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from electra_ablate.common.io import atomic_file, sha256_file
from electra_ablate.glue.tasks import Example, TaskSpec


class Features(NamedTuple):
    """A tokenized split in flat arrays: example i is input_ids[offsets[i]:offsets[i+1]]."""

    input_ids: np.ndarray  # (N_tokens,) int32
    token_type_ids: np.ndarray  # (N_tokens,) int8
    offsets: np.ndarray  # (N + 1,) int64
    labels: np.ndarray  # (N,) int64, or float32 for regression
    idx: np.ndarray  # (N,) int64, the examples' row numbers

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def truncate_pair(a: list[int], b: list[int], max_tokens: int) -> None:
    """Drop the last token of the longer sentence (b on ties) until both fit: the reference's
    `_truncate_seq_pair`, in place. (tokenizers' longest_first gives the spare token to b instead.)"""
    while len(a) + len(b) > max_tokens:
        (a if len(a) > len(b) else b).pop()


def featurize(examples: Sequence[Example], tokenizer, max_seq_length: int, regression: bool) -> Features:
    """[CLS] a [SEP] (b [SEP]) with token types 0 for a and 1 for b, truncated like the reference.

    `tokenizer` is a `tokenizers.Tokenizer` for the checkpoint's vocabulary (`data.load_tokenizer`: the
    reference's FullTokenizer); only its wordpieces are used, the special tokens are placed here.
    """
    tokenizer.no_truncation()
    tokenizer.no_padding()
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    first = tokenizer.encode_batch([e.text_a for e in examples], add_special_tokens=False) if examples else []
    pairs = [e.text_b for e in examples if e.text_b is not None]
    second = iter(tokenizer.encode_batch(pairs, add_special_tokens=False) if pairs else [])
    ids, types, lengths = [], [], []
    for e, enc_a in zip(examples, first):
        a = list(enc_a.ids)
        if e.text_b is None:
            del a[max_seq_length - 2 :]
            seq, n_a = [cls, *a, sep], len(a) + 2
        else:
            b = list(next(second).ids)
            truncate_pair(a, b, max_seq_length - 3)
            seq, n_a = [cls, *a, sep, *b, sep], len(a) + 2
        ids.extend(seq)
        types.extend([0] * n_a + [1] * (len(seq) - n_a))
        lengths.append(len(seq))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return Features(
        input_ids=np.array(ids, dtype=np.int32),
        token_type_ids=np.array(types, dtype=np.int8),
        offsets=offsets,
        labels=np.array([e.label for e in examples], dtype=np.float32 if regression else np.int64),
        idx=np.array([e.idx for e in examples], dtype=np.int64),
    )


def _digest(parts: Iterable[str]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()


file_digest = sha256_file  # a vocabulary file's digest, in the features' cache key


FEATURES_VERSION = 2


def features_key(
    examples: Sequence[Example], vocab_digest: str, lowercase: bool, max_seq_length: int, regression: bool
) -> str:
    """Hash of everything that determines a tokenized split: the examples themselves (so the TSV and HF
    sources share a cache entry when they agree), the vocabulary, casing and length."""
    meta = json.dumps([FEATURES_VERSION, vocab_digest, lowercase, max_seq_length, regression])
    rows = (f"{e.idx}\t{e.text_a}\t{e.text_b}\t{e.label!r}" for e in examples)
    return _digest([meta, *rows])[:24]


def cached_features(
    examples: Sequence[Example],
    tokenizer,
    vocab_digest: str,
    lowercase: bool,
    max_seq_length: int,
    regression: bool,
    cache_dir: str | Path | None,
) -> Features:
    """`featurize`, memoised on disk as <cache_dir>/glue/<hash>.npz (written to a temp name, then renamed)."""
    if cache_dir is None:
        return featurize(examples, tokenizer, max_seq_length, regression)
    key = features_key(examples, vocab_digest, lowercase, max_seq_length, regression)
    path = Path(cache_dir) / "glue" / f"{key}.npz"
    if path.is_file():
        with np.load(path) as z:
            return Features(**{k: z[k] for k in Features._fields})
    features = featurize(examples, tokenizer, max_seq_length, regression)
    # An open file, not a path: np.savez would append ".npz" to the temporary's name.
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **features._asdict())
    return features


def prediction_rows(task: TaskSpec, split: str, features: Features, predictions: np.ndarray) -> list[list[str]]:
    """Rows of the dev-predictions TSV: split, row index, gold label, prediction (labels as in the TSVs)."""

    def fmt(v) -> str:
        return f"{float(v):.6g}" if task.is_regression else task.tsv_labels[int(v)]

    return [[split, str(int(i)), fmt(y), fmt(p)] for i, y, p in zip(features.idx, features.labels, predictions)]
