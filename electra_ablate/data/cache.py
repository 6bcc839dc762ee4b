"""The tokenized corpus as a cache entry: memory-mapped arrays under `cache_dir/pretrain/<key>/`.

The key hashes everything that changes the content (the corpus's bytes, the vocabulary, example settings,
format), and nothing else: a copy of the data folder, or the same file given a new modification time, finds
the entry built from the original. Every run with the same inputs reuses one entry, and an entry is put in
place whole (written to a temporary folder, then renamed). A vocabulary trained on the corpus is cached the
same way under `cache_dir/vocab/<key>/`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
from tokenizers import models

from electra_ablate.common.io import atomic_dir, sha256_file
from electra_ablate.common.tokens import SPECIAL_TOKENS, SpecialIds
from electra_ablate.data import wordpiece
from electra_ablate.data.corpus_files import file_sha256, memo_path
from electra_ablate.data.errors import DataError
from electra_ablate.data.example_writer import EXAMPLE_ARRAYS, ExampleWriter
from electra_ablate.data.examples import ExampleBuilder
from electra_ablate.data.text import _corpus_fix, check_corpus, iter_corpus_lines
from electra_ablate.data.tokenizer import (
    MAX_INPUT_CHARS_PER_WORD,
    _bert_tokenizer,
    _encoded_chunks,
    load_tokenizer,
    read_vocab,
)

# Bump when the example rule or the stored layout changes: old caches are then rebuilt, never misread.
FORMAT_VERSION = 1
# Bump when the vocabulary learner's output can change: vocabularies cached by an older learner (among them the
# process-dependent ones of tokenizers' WordPieceTrainer, version 1) are then rebuilt, never reused.
VOCAB_LEARNER_VERSION = 2
# Characters kept for the vocabulary's alphabet, as BERT's and tokenizers' BertWordPieceTokenizer default.
VOCAB_LIMIT_ALPHABET = 1000
VOCAB_NAME = "vocab.txt"
META_NAME = "meta.json"


def _corpus_identity(corpus: Path, cache_dir: str | Path) -> dict:
    """The corpus in a cache key: the SHA-256 of its bytes (remembered per path, size and modification time, so
    a file is read for it once), never where it is or when it was written."""
    return {"corpus_sha256": file_sha256(corpus, Path(cache_dir))}


def _legacy_corpus_identity(corpus: Path) -> dict:
    """The corpus in the keys of entries built before the key held its content: its path, size and
    modification time. Such an entry is still used while the file is the one it was built from."""
    st = corpus.stat()
    return {"corpus": str(corpus.resolve()), "corpus_size": st.st_size, "corpus_mtime_ns": st.st_mtime_ns}


def _entry(root: Path, keys: list[dict], marker: str) -> tuple[Path, bool]:
    """(the folder of the first of `keys` whose entry exists, True), else (the first key's folder, False)."""
    folders = [root / _hash(k) for k in keys]
    found = next((f for f in folders if (f / marker).is_file()), None)
    return (found, True) if found is not None else (folders[0], False)


def _hash(d: dict) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _key_inputs(
    corpus_identity: dict,
    vocab_file: Path,
    lowercase: bool,
    max_seq_length: int,
    short_seq_prob: float,
    build_seed: int,
    max_docs: int | None,
    train_vocab_size: int,
) -> dict:
    """Everything that changes the token array; its hash names the cache entry."""
    return {
        "format": FORMAT_VERSION,
        **corpus_identity,
        "vocab_sha256": sha256_file(vocab_file),
        "lowercase": bool(lowercase),
        "max_seq_length": int(max_seq_length),
        "short_seq_prob": float(short_seq_prob),
        "build_seed": int(build_seed),
        "max_docs": max_docs,
        "train_vocab_size": int(train_vocab_size),
    }



def train_vocab(
    corpus: str | Path,
    cache_dir: str | Path,
    vocab_size: int,
    lowercase: bool = True,
    max_docs: int | None = None,
) -> Path:
    """Train a WordPiece vocabulary of `vocab_size` on the corpus (cached); returns its vocab.txt.

    BERT's special tokens come first, so [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4. The file is the same
    byte for byte in every process and on every machine (wordpiece.py says how and why `tokenizers`'
    WordPieceTrainer is not used), so the cache key names every input of the learner.
    """
    corpus = check_corpus(corpus)
    settings = {"format": FORMAT_VERSION, "learner": VOCAB_LEARNER_VERSION, "lowercase": bool(lowercase),
                "vocab_size": int(vocab_size), "max_docs": max_docs, "special_tokens": list(SPECIAL_TOKENS),
                "limit_alphabet": VOCAB_LIMIT_ALPHABET, "max_input_chars_per_word": MAX_INPUT_CHARS_PER_WORD}
    target, found = _entry(Path(cache_dir) / "vocab", [{**settings, **_corpus_identity(corpus, cache_dir)},
                                                       {**settings, **_legacy_corpus_identity(corpus)}], VOCAB_NAME)
    if found:
        return target / VOCAB_NAME
    started = time.perf_counter()
    # Words as the encoder will see them: the normalizer and pre-tokenizer of load_tokenizer.
    words = _bert_tokenizer(models.WordPiece(unk_token="[UNK]"), lowercase)
    counts = wordpiece.count_words((line for line in iter_corpus_lines(corpus, max_docs) if line),
                                   words.normalizer, words.pre_tokenizer)
    try:
        tokens = wordpiece.learn_vocab(counts, vocab_size, SPECIAL_TOKENS, limit_alphabet=VOCAB_LIMIT_ALPHABET,
                                       max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD)
    except wordpiece.VocabTooSmall as err:
        raise DataError(f"data.train_vocab_size={vocab_size} is too small for {corpus}: {err}. Raise "
                        "data.train_vocab_size.") from err
    text = "".join(t + "\n" for t in tokens).encode("utf-8")
    with atomic_dir(target, replace=False) as tmp:
        (tmp / VOCAB_NAME).write_bytes(text)
        (tmp / META_NAME).write_text(json.dumps({
            "vocab_size": len(tokens), "requested": vocab_size, "corpus": str(corpus.resolve()),
            "max_docs": max_docs, "learner": VOCAB_LEARNER_VERSION, "vocab_sha256": hashlib.sha256(text).hexdigest(),
            "num_words": sum(counts.values()), "num_distinct_words": len(counts),
            "build_seconds": round(time.perf_counter() - started, 3),
        }, indent=2, sort_keys=True))
    return target / VOCAB_NAME


class PretrainCache(NamedTuple):
    """One built cache entry; the arrays are memory-mapped (read-only)."""

    directory: Path
    meta: dict
    input_ids: np.ndarray  # (N, max_seq_length) uint16 or int32, [PAD] after `lengths`
    lengths: np.ndarray  # (N,) int32: real tokens per row
    segment_a_end: np.ndarray  # (N,) int32: len([CLS] A [SEP])
    target_lengths: np.ndarray  # (N,) int32: the builder's target (short with prob short_seq_prob)
    token_counts: np.ndarray  # (V,) int64: word-piece frequencies over the corpus text

    @property
    def special(self) -> SpecialIds:
        return SpecialIds(**self.meta["special"])

    @property
    def vocab_path(self) -> Path:
        return self.directory / VOCAB_NAME


_ARRAYS = ("input_ids", "lengths", "segment_a_end", "target_lengths", "token_counts")


def load_cache(directory: str | Path) -> PretrainCache:
    directory = Path(directory)
    try:
        meta = json.loads((directory / META_NAME).read_text())
        arrays = {n: np.load(directory / f"{n}.npy", mmap_mode="r") for n in _ARRAYS}
    except (OSError, ValueError) as err:
        raise DataError(
            f"Pre-training cache {directory} is unreadable ({err}). Delete that folder; it is rebuilt on the "
            "next run."
        ) from err
    if meta.get("format") != FORMAT_VERSION or arrays["input_ids"].shape[0] != meta["num_examples"]:
        raise DataError(
            f"Pre-training cache {directory} does not match this code (format {meta.get('format')}, expected "
            f"{FORMAT_VERSION}). Delete that folder; it is rebuilt on the next run."
        )
    return PretrainCache(directory, meta, **arrays)


# The arrays that make the packed examples (token_counts is derived from them), hashed in this order.


def _examples_digest(directory: Path) -> str:
    h = hashlib.sha256()
    for name in EXAMPLE_ARRAYS:
        h.update(sha256_file(directory / f"{name}.npy").encode())
    return h.hexdigest()


def examples_sha256(cache: PretrainCache) -> str:
    """sha256 over the .npy files of the packed examples (each file's digest, in EXAMPLE_ARRAYS order): equal
    digests mean byte-identical examples. Recorded at build time; computed for entries built before that."""
    return cache.meta.get("examples_sha256") or _examples_digest(cache.directory)


def finish_entry(directory: Path, token_counts: np.ndarray, vocab_file: Path, meta: dict) -> None:
    """Complete a cache entry whose examples are written (example_writer.py): the token counts, a copy of the
    vocabulary that made the ids (so the entry is self-contained), and meta.json with the examples' digest."""
    np.save(directory / "token_counts.npy", token_counts)
    shutil.copyfile(vocab_file, directory / VOCAB_NAME)
    meta = {**meta, "examples_sha256": _examples_digest(directory), "vocab_file": str(Path(vocab_file).resolve())}
    (directory / META_NAME).write_text(json.dumps(meta, indent=2, sort_keys=True))


@contextlib.contextmanager
def _nothing_left_if_refused(corpus: Path, cache_dir: Path) -> Iterator[None]:
    """A corpus refused while it is read (binary part-way, truncated: DataError) leaves the cache folder as it
    was: the digest this build remembered for it and the folders it made are removed (not other entries)."""
    folders = [cache_dir / "hashes", cache_dir / "pretrain", cache_dir / "vocab", cache_dir]
    made = [f for f in folders if not f.exists()]
    memo = memo_path(corpus, cache_dir) if corpus.is_file() else None
    remembered = memo is not None and memo.is_file()
    try:
        yield
    except DataError:
        if memo is not None and not remembered:
            memo.unlink(missing_ok=True)
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty
        raise


def _leaves_nothing_if_refused(build):
    @functools.wraps(build)
    def run(*, corpus: str | Path, cache_dir: str | Path, **kwargs):
        with _nothing_left_if_refused(Path(corpus), Path(cache_dir)):
            return build(corpus=corpus, cache_dir=cache_dir, **kwargs)

    return run


@_leaves_nothing_if_refused
def build_or_load(
    *,
    corpus: str | Path,
    vocab_file: str | Path,
    cache_dir: str | Path,
    lowercase: bool = True,
    max_seq_length: int = 128,
    short_seq_prob: float = 0.05,
    build_seed: int = 12345,
    max_docs: int | None = None,
    train_vocab_size: int = 0,
) -> PretrainCache:
    """The cache entry for these inputs, building it first if it does not exist yet."""
    corpus = check_corpus(corpus)
    if train_vocab_size > 0:
        vocab_file = train_vocab(corpus, cache_dir, train_vocab_size, lowercase, max_docs)
    vocab_file = Path(vocab_file)
    tokens = read_vocab(vocab_file)  # validates before the key hashes the file
    inputs, legacy = (_key_inputs(identity, vocab_file, lowercase, max_seq_length, short_seq_prob, build_seed,
                                  max_docs, train_vocab_size)
                      for identity in (_corpus_identity(corpus, cache_dir), _legacy_corpus_identity(corpus)))
    target, found = _entry(Path(cache_dir) / "pretrain", [inputs, legacy], META_NAME)
    if found:
        return load_cache(target)

    started = time.perf_counter()
    tokenizer = load_tokenizer(vocab_file, lowercase)
    special = SpecialIds.from_vocab(tokens)
    vocab_size = len(tokens)
    dtype = np.dtype(np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32)
    builder = ExampleBuilder(max_seq_length, short_seq_prob, special.cls, special.sep,
                             random.Random(build_seed))
    counts = np.zeros(vocab_size, dtype=np.int64)
    num_docs = num_tokens = 0

    with atomic_dir(target, replace=False) as tmp:
        writer = ExampleWriter(tmp, max_seq_length, dtype, special.pad)
        try:
            for chunk in _encoded_chunks(tokenizer, iter_corpus_lines(corpus, max_docs)):
                flat = np.fromiter(itertools.chain.from_iterable(chunk), dtype=np.int64)
                counts += np.bincount(flat, minlength=vocab_size)
                num_tokens += len(flat)
                for ids in chunk:
                    num_docs += not ids
                    writer.add(builder.add_line(ids))
            writer.add(builder.flush())
            num_examples = writer.close()
        except BaseException:
            writer.abort()
            raise
        if num_examples == 0:
            raise DataError(f"Corpus {corpus} holds no text that tokenizes to word pieces. {_corpus_fix()}")
        finish_entry(tmp, counts, vocab_file, {
            **inputs,
            "vocab_size": vocab_size,
            "special": special._asdict(),
            "dtype": dtype.name,
            "num_examples": num_examples,
            "num_docs": num_docs,
            "num_tokens": num_tokens,
            "corpus": str(corpus.resolve()),  # where it was built from: a record, not part of the key
            "build_seconds": round(time.perf_counter() - started, 3),
        })
    return load_cache(target)
