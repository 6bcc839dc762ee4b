"""Pre-training data: WordPiece tokenizer, example building, a cached token array and the Lightning loader.

Examples are built as in google-research/electra `build_pretraining_dataset.py` (`ExampleBuilder`): the
lines of one document are tokenized and accumulated until a target length is reached (the full
`max_seq_length`, or with probability `short_seq_prob` a random one in [5, max_seq_length]); the lines are
then split into two segments `[CLS] A [SEP] B [SEP]` (with 10% chance a single segment, "as in
classification tasks"). The tokenized corpus is written once to a memory-mapped array under
`cache_dir/pretrain/<key>/`, keyed by everything that changes its content, so every run reuses it. The
training loader walks a seeded permutation per data epoch forever (training runs by `max_steps`) and
restarts exactly at the next batch when Lightning resumes from a checkpoint.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import lzma
import multiprocessing
import random
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytorch_lightning as pl
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from torch.utils.data import DataLoader, IterableDataset

from electra_ablate.data import wordpiece

# Bump when the example rule or the stored layout changes: old caches are then rebuilt, never misread.
FORMAT_VERSION = 1
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# Reference ExampleBuilder._create_example: "small chance to only have one segment as in classification tasks".
SINGLE_SEGMENT_PROB = 0.1
# Reference: random.randint(5, max_length) for a short target length.
MIN_TARGET_LENGTH = 5
# Reference tokenization.WordpieceTokenizer: words longer than this become [UNK] (tokenizers' default is 100).
MAX_INPUT_CHARS_PER_WORD = 200
# Bump when the vocabulary learner's output can change: vocabularies cached by an older learner (among them the
# process-dependent ones of tokenizers' WordPieceTrainer, version 1) are then rebuilt, never reused.
VOCAB_LEARNER_VERSION = 2
# Characters kept for the vocabulary's alphabet, as BERT's and tokenizers' BertWordPieceTokenizer default.
VOCAB_LIMIT_ALPHABET = 1000
VOCAB_NAME = "vocab.txt"
META_NAME = "meta.json"
_LINES_PER_ENCODE = 2048  # lines per encode_batch call: big enough for the Rust thread pool, small in memory
_ROWS_PER_FLUSH = 8192


class DataError(ValueError):
    """Bad data input (corpus, vocabulary, data config); the message names the problem and the fix."""


class SpecialTokens(NamedTuple):
    pad: int
    unk: int
    cls: int
    sep: int
    mask: int


# ---------------------------------------------------------------------------------------------------------
# Tokenizer


def read_vocab(vocab_file: str | Path) -> list[str]:
    """The tokens of a WordPiece vocab.txt in id order (line i = id i), validated for BERT's special tokens."""
    path = Path(vocab_file)
    fix = (
        "Set data.vocab_file to a WordPiece vocab.txt (one token per line, e.g. "
        "<paths.data_dir>/vocab/bert-base-uncased-vocab.txt), or set data.train_vocab_size > 0 to train one "
        "on the corpus."
    )
    if not path.is_file():
        raise DataError(f"Vocabulary file {path} does not exist. {fix}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"Vocabulary file {path} cannot be read as UTF-8 text ({err}). {fix}") from err
    # Reference tokenization.load_vocab: one token per line, surrounding whitespace stripped.
    tokens = [line.strip() for line in text.splitlines()]
    if not tokens:
        raise DataError(f"Vocabulary file {path} is empty. {fix}")
    missing = [t for t in SPECIAL_TOKENS if t not in tokens]
    if missing:
        raise DataError(
            f"Vocabulary file {path} lacks the special token(s) {' '.join(missing)}; ELECTRA needs all of "
            f"{' '.join(SPECIAL_TOKENS)}. Add them as lines of the file (BERT puts [PAD] on line 1 so its id "
            "is 0), or set data.train_vocab_size > 0 to train a vocabulary that has them."
        )
    seen: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if t in seen:
            raise DataError(
                f"Vocabulary file {path} lists {t!r} twice (lines {seen[t] + 1} and {i + 1}), so its id is "
                "ambiguous. Remove the duplicate line."
            )
        seen[t] = i
    return tokens


def _bert_tokenizer(model: models.Model, lowercase: bool) -> Tokenizer:
    tok = Tokenizer(model)
    # Reference BasicTokenizer: clean control chars, split CJK characters, lower-case and strip accents
    # together (strip_accents=None follows lowercase), then split on whitespace and punctuation.
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def load_tokenizer(vocab_file: str | Path, lowercase: bool = True) -> Tokenizer:
    """A BERT WordPiece tokenizer for `vocab_file`, equivalent to the reference's FullTokenizer.

    The special tokens are not registered as "added tokens", so literal text such as "[SEP]" in the corpus
    is split into "[", "sep", "]" as the reference does. `encode(a, b)` still adds [CLS]/[SEP] for pairs.
    """
    tokens = read_vocab(vocab_file)
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = _bert_tokenizer(
        models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD), lowercase
    )
    tok.post_processor = processors.BertProcessing(("[SEP]", vocab["[SEP]"]), ("[CLS]", vocab["[CLS]"]))
    return tok


def special_tokens(vocab_file: str | Path) -> SpecialTokens:
    vocab = {t: i for i, t in enumerate(read_vocab(vocab_file))}
    return SpecialTokens(*(vocab[t] for t in SPECIAL_TOKENS))


def _encode_lines(tokenizer: Tokenizer, lines: list[str]) -> list[list[int]]:
    """Token ids of each line, without [CLS]/[SEP]; one call into the Rust thread pool per batch of lines."""
    return [e.ids for e in tokenizer.encode_batch_fast(lines, add_special_tokens=False)]


# ---------------------------------------------------------------------------------------------------------
# Corpus


def _open_corpus(path: Path):
    if path.name.endswith(".xz"):
        return lzma.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _corpus_fix() -> str:
    return (
        "Point data.corpus at a plain-text corpus (.txt or .txt.xz: one paragraph per line, a blank line "
        "between documents), e.g. by setting paths.data_dir or the environment variable ELECTRA_ABLATE_DATA "
        "to the shared data folder."
    )


def worker_context(num_workers: int):
    """The multiprocessing context for DataLoader workers: the platform's default start method (fork on Linux).

    Inside a joblib worker (Hydra's joblib launcher) the process-wide default is loky's own start method,
    with which DataLoader workers fail to start (torch: "Got pickle error when attempting to start a worker
    Process"); naming the platform's method explicitly makes `runtime.num_workers` work under every launcher.
    """
    if num_workers == 0:
        return None
    return multiprocessing.get_context(multiprocessing.get_all_start_methods()[0])


def check_corpus(corpus: str | Path) -> Path:
    """The corpus path, if it is a readable non-empty file; DataError otherwise (before any compute)."""
    path = Path(corpus)
    if not path.is_file():
        raise DataError(f"Corpus {path} does not exist. {_corpus_fix()}")
    if path.stat().st_size == 0:
        raise DataError(f"Corpus {path} is empty. {_corpus_fix()}")
    try:
        with _open_corpus(path) as f:
            f.read(1)
    except (OSError, EOFError, lzma.LZMAError, UnicodeDecodeError) as err:
        raise DataError(f"Corpus {path} cannot be read ({err}). {_corpus_fix()}") from err
    return path


def iter_corpus_lines(corpus: str | Path, max_docs: int | None = None) -> Iterator[str]:
    """Stripped lines of the corpus, "" marking a document boundary, stopping after `max_docs` documents.

    `.xz` files are decompressed as a stream. Runs of blank lines yield a single "". Lines are read as bytes
    and decoded one by one, so a file that turns binary or is cut off part-way is reported at its line and
    byte offset in the file the user gave (decompressed, for .xz), not inside an internal read buffer.
    """
    path = Path(corpus)
    docs, in_doc = 0, False
    line_no, offset = 0, 0
    try:
        with lzma.open(path, "rb") if path.name.endswith(".xz") else open(path, "rb") as f:
            for data in f:
                line_no += 1
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise DataError(
                        f"Corpus {path}: line {line_no} (byte {offset + err.start}"
                        f"{' of the decompressed text' if path.name.endswith('.xz') else ''}) is not UTF-8 text "
                        f"({err.reason}); the file is binary or corrupt from there on. {_corpus_fix()}"
                    ) from None
                offset += len(data)
                # Reference ExampleBuilder.add_line: line.strip().replace("\n", " ").
                line = text.strip()
                if line:
                    in_doc = True
                    yield line
                elif in_doc:
                    in_doc = False
                    docs += 1
                    yield ""
                    if max_docs is not None and docs >= max_docs:
                        return
    except (OSError, EOFError, lzma.LZMAError) as err:
        raise DataError(
            f"Corpus {path} cannot be read after line {line_no} (byte {offset}): {err}; the file is truncated or "
            f"corrupt. {_corpus_fix()}"
        ) from err
    if in_doc:
        yield ""


def _encoded_chunks(tokenizer: Tokenizer, lines: Iterator[str]) -> Iterator[list[list[int]]]:
    """Token ids per line in corpus order ([] for a document boundary), a chunk of lines at a time."""
    for chunk in iter(lambda: list(itertools.islice(lines, _LINES_PER_ENCODE)), []):
        encoded = iter(_encode_lines(tokenizer, [line for line in chunk if line]))
        yield [next(encoded) if line else [] for line in chunk]


# ---------------------------------------------------------------------------------------------------------
# Examples


class Example(NamedTuple):
    input_ids: list[int]  # [CLS] A [SEP] (B [SEP]), unpadded, at most max_seq_length
    segment_a_end: int  # len([CLS] A [SEP]): token type 0 before it, 1 from it to the end
    target_length: int  # the length this example was accumulated towards (short with prob short_seq_prob)


class ExampleBuilder:
    """Turns a stream of tokenized lines into pre-training examples, as the reference's ExampleBuilder.

    `add_line(ids)` takes the token ids of one line (an empty list = document boundary) and returns an
    Example when one is complete; `flush()` returns the pending partial example at the end of the corpus.
    """

    def __init__(self, max_length: int, short_seq_prob: float, cls_id: int, sep_id: int, rng: random.Random):
        self.max_length = max_length
        self.short_seq_prob = short_seq_prob
        self.cls_id, self.sep_id = cls_id, sep_id
        self.rng = rng
        self._sentences: list[list[int]] = []
        self._length = 0
        # Reference: the first example always targets max_length; later ones are redrawn after each example.
        self._target_length = max_length

    def add_line(self, ids: Sequence[int]) -> Example | None:
        if not ids:
            # Reference: an empty line ends the document, and with it the pending example however short.
            return self.flush()
        self._sentences.append(list(ids))
        self._length += len(ids)
        if self._length >= self._target_length:
            return self._create_example()
        return None

    def flush(self) -> Example | None:
        return self._create_example() if self._length else None

    def _create_example(self) -> Example:
        rng = self.rng
        if rng.random() < SINGLE_SEGMENT_PROB:
            first_target = self.max_length * 1000  # never reached: every line goes to segment A
        else:
            # Reference: -3 for the [CLS]/[SEP]/[SEP] not yet in the text.
            first_target = (self._target_length - 3) // 2
        first: list[int] = []
        second: list[int] = []
        for sentence in self._sentences:
            # Reference: a line joins A if A is empty, if it keeps A under its target, or (while B is still
            # empty and A is under target) on a coin flip when it would push A over.
            if (
                not first
                or len(first) + len(sentence) < first_target
                or (not second and len(first) < first_target and rng.random() < 0.5)
            ):
                first += sentence
            else:
                second += sentence
        # Reference truncation: to max_length (not the target), leaving room for [CLS] and the [SEP]s.
        first = first[: self.max_length - 2]
        second = second[: max(0, self.max_length - len(first) - 3)]
        target_length = self._target_length

        self._sentences, self._length = [], 0
        # Reference: the next example gets a random shorter target with probability short_seq_prob.
        if rng.random() < self.short_seq_prob:
            self._target_length = rng.randint(MIN_TARGET_LENGTH, self.max_length)
        else:
            self._target_length = self.max_length

        ids = [self.cls_id, *first, self.sep_id]
        segment_a_end = len(ids)
        if second:
            ids += [*second, self.sep_id]
        return Example(ids, segment_a_end, target_length)


# ---------------------------------------------------------------------------------------------------------
# Cache


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _corpus_identity(corpus: Path) -> dict:
    st = corpus.stat()
    return {"corpus": str(corpus.resolve()), "corpus_size": st.st_size, "corpus_mtime_ns": st.st_mtime_ns}


def _hash(d: dict) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _key_inputs(
    corpus: Path,
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
        **_corpus_identity(corpus),
        "vocab_sha256": _sha256_file(vocab_file),
        "lowercase": bool(lowercase),
        "max_seq_length": int(max_seq_length),
        "short_seq_prob": float(short_seq_prob),
        "build_seed": int(build_seed),
        "max_docs": max_docs,
        "train_vocab_size": int(train_vocab_size),
    }


class _AtomicDir:
    """A temporary sibling directory renamed onto `target` on success and removed on any failure."""

    def __init__(self, target: Path):
        self.target = target

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.tmp-", dir=self.target.parent))
        self.tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared by every run and user
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        try:
            self.tmp.rename(self.target)
        except OSError:
            # Another process (a second DDP rank, a parallel sweep job) finished the same entry first; its
            # content is identical because the key names every input.
            shutil.rmtree(self.tmp, ignore_errors=True)
            if not self.target.is_dir():
                raise


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
    key = _hash({"format": FORMAT_VERSION, "learner": VOCAB_LEARNER_VERSION, **_corpus_identity(corpus),
                 "lowercase": bool(lowercase), "vocab_size": int(vocab_size), "max_docs": max_docs,
                 "special_tokens": list(SPECIAL_TOKENS), "limit_alphabet": VOCAB_LIMIT_ALPHABET,
                 "max_input_chars_per_word": MAX_INPUT_CHARS_PER_WORD})
    target = Path(cache_dir) / "vocab" / key
    if (target / VOCAB_NAME).is_file():
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
    with _AtomicDir(target) as tmp:
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
    def special(self) -> SpecialTokens:
        return SpecialTokens(**self.meta["special"])

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
_EXAMPLE_ARRAYS = ("input_ids", "lengths", "segment_a_end", "target_lengths")


def _examples_digest(directory: Path) -> str:
    h = hashlib.sha256()
    for name in _EXAMPLE_ARRAYS:
        h.update(_sha256_file(directory / f"{name}.npy").encode())
    return h.hexdigest()


def examples_sha256(cache: PretrainCache) -> str:
    """sha256 over the .npy files of the packed examples (each file's digest, in _EXAMPLE_ARRAYS order): equal
    digests mean byte-identical examples. Recorded at build time; computed for entries built before that."""
    return cache.meta.get("examples_sha256") or _examples_digest(cache.directory)


def _write_npy_from_raw(raw: Path, out: Path, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    """An .npy file from a headerless row-major dump, copied in blocks (the row count is known only now)."""
    with open(out, "wb") as dst, open(raw, "rb") as src:
        np.lib.format.write_array_header_1_0(
            dst, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
        )
        shutil.copyfileobj(src, dst, 16 << 20)
    raw.unlink()


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
    inputs = _key_inputs(corpus, vocab_file, lowercase, max_seq_length, short_seq_prob, build_seed, max_docs,
                         train_vocab_size)
    target = Path(cache_dir) / "pretrain" / _hash(inputs)
    if (target / META_NAME).is_file():
        return load_cache(target)

    started = time.perf_counter()
    tokenizer = load_tokenizer(vocab_file, lowercase)
    special = SpecialTokens(*(tokens.index(t) for t in SPECIAL_TOKENS))
    vocab_size = len(tokens)
    dtype = np.dtype(np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32)
    builder = ExampleBuilder(max_seq_length, short_seq_prob, special.cls, special.sep,
                             random.Random(build_seed))
    counts = np.zeros(vocab_size, dtype=np.int64)
    lengths: list[int] = []
    a_ends: list[int] = []
    targets: list[int] = []
    buf = np.full((_ROWS_PER_FLUSH, max_seq_length), special.pad, dtype=dtype)
    n_buf = num_docs = num_tokens = 0

    with _AtomicDir(target) as tmp:
        with open(tmp / "input_ids.raw", "wb") as raw:

            def add(example: Example | None) -> None:
                nonlocal n_buf
                if example is None:
                    return
                n = len(example.input_ids)
                buf[n_buf, :n] = example.input_ids
                lengths.append(n)
                a_ends.append(example.segment_a_end)
                targets.append(example.target_length)
                n_buf += 1
                if n_buf == _ROWS_PER_FLUSH:
                    raw.write(buf.tobytes())
                    buf.fill(special.pad)
                    n_buf = 0

            for chunk in _encoded_chunks(tokenizer, iter_corpus_lines(corpus, max_docs)):
                flat = np.fromiter(itertools.chain.from_iterable(chunk), dtype=np.int64)
                counts += np.bincount(flat, minlength=vocab_size)
                num_tokens += len(flat)
                for ids in chunk:
                    num_docs += not ids
                    add(builder.add_line(ids))
            add(builder.flush())
            raw.write(buf[:n_buf].tobytes())

        num_examples = len(lengths)
        if num_examples == 0:
            raise DataError(f"Corpus {corpus} holds no text that tokenizes to word pieces. {_corpus_fix()}")
        _write_npy_from_raw(tmp / "input_ids.raw", tmp / "input_ids.npy", dtype, (num_examples, max_seq_length))
        np.save(tmp / "lengths.npy", np.asarray(lengths, dtype=np.int32))
        np.save(tmp / "segment_a_end.npy", np.asarray(a_ends, dtype=np.int32))
        np.save(tmp / "target_lengths.npy", np.asarray(targets, dtype=np.int32))
        np.save(tmp / "token_counts.npy", counts)
        # A copy of the vocabulary that made these ids, so the entry is self-contained.
        shutil.copyfile(vocab_file, tmp / VOCAB_NAME)
        meta = {
            **inputs,
            "examples_sha256": _examples_digest(tmp),
            "vocab_file": str(vocab_file.resolve()),
            "vocab_size": vocab_size,
            "special": special._asdict(),
            "dtype": dtype.name,
            "num_examples": num_examples,
            "num_docs": num_docs,
            "num_tokens": num_tokens,
            "build_seconds": round(time.perf_counter() - started, 3),
        }
        (tmp / META_NAME).write_text(json.dumps(meta, indent=2, sort_keys=True))
    return load_cache(target)


# ---------------------------------------------------------------------------------------------------------
# Loading


def collate(cache: PretrainCache, rows: np.ndarray) -> dict[str, torch.Tensor]:
    """Batch of `rows`, padded to the longest of them: input_ids, attention_mask, token_type_ids (B, T) long."""
    lengths = cache.lengths[rows]  # (B,)
    longest = int(lengths.max())
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
                 rank: int = 0, world_size: int = 1):
        assert num_examples >= batch_size, f"{num_examples} examples cannot fill a batch of {batch_size}"
        self.directory, self.num_examples, self.batch_size, self.seed = directory, num_examples, batch_size, seed
        self.start, self.rank, self.world_size = start, rank, world_size

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
            yield collate(cache, self.rows(step * self.world_size + self.rank))


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
        """Build or load the token cache of this module's corpus (subclasses in corpus.py read other sources)."""
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
    def special(self) -> SpecialTokens:
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
                                  self._start, rank, world_size)
        # batch_size=None: the dataset yields whole batches; the sampler-free stream has no length, so
        # Lightning runs one endless epoch and stops at max_steps.
        return DataLoader(batches, batch_size=None, num_workers=self.num_workers, pin_memory=self.pin_memory,
                          multiprocessing_context=worker_context(self.num_workers))

    def _identity(self) -> dict:
        _, world_size = self._rank_world()
        return {"cache": self.cache.directory.name, "batch_size": self.batch_size, "seed": self.seed,
                "world_size": world_size}

    def state_dict(self) -> dict:
        self.prepare()
        return {"batches_consumed": self.batches_consumed, **self._identity()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.prepare()
        saved = {k: state_dict.get(k) for k in self._identity()}
        if saved != self._identity():
            raise DataError(
                f"The checkpoint's data stream {saved} differs from this run's {self._identity()}, so the "
                "run cannot continue with the next batch. Resume with the same data config, seed and number "
                "of devices, or start a new run."
            )
        self._start = int(state_dict["batches_consumed"])
        self._loader_trainer = self._progress_at_start = None
