"""Pre-training corpora of the paper's size: many text or JSON-lines files, or a Hugging Face dataset.

The paper pre-trains on 3.3B tokens (Wikipedia + BooksCorpus; section 3.1), far more than one local file.
`data=text_files` reads `data.paths` (files, folders, globs; plain text or JSON lines, optionally .gz, .xz
or .zst) and `data=hf_dataset` reads a `datasets` dataset (from the hub, streamed or not, or a folder written
by `save_to_disk`). Both become the same packed examples as the single-file build in data.py: the reference
build_pretraining_dataset.py procedure (`data.ExampleBuilder`, one seeded RNG over the whole corpus in
corpus order), in a cache entry that `data.load_cache` reads like any other.

The build streams the corpus and never holds it. The main process reads the documents' lines in order and
cuts them into shards of about SHARD_CHARS characters; worker processes (one per core) tokenize the shards
with `tokenizers` and write each shard's word pieces atomically under `cache_dir/tokens/<key>/`; the main
process feeds the finished shards, in order, to the example builder and appends the examples to the new
cache entry, which is renamed into place when complete. A killed build resumes: shards already on disk are
read back instead of tokenized. The cache keys hold a content hash of the inputs (SHA-256 of every file,
remembered per path, size and modification time; a dataset's fingerprint or revision).
"""

from __future__ import annotations

import collections
import glob
import gzip
import hashlib
import io
import json
import logging
import lzma
import multiprocessing
import os
import random
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from electra_ablate.data import pretraining as D
from electra_ablate.data import wordpiece_shards as W
from electra_ablate.data.pretraining import DataError, ExampleBuilder, PretrainDataModule, SpecialTokens

log = logging.getLogger(__name__)

# Bump when the shard layout or the line rules below change: old token shards are then rebuilt, never misread.
TOKENS_FORMAT = 1
SHARD_CHARS = 16 << 20  # text per shard: ~3.5M word pieces, a few seconds of one core; bounds memory per worker
PROGRESS_SECONDS = 10.0
COMPRESSED = (".gz", ".xz", ".zst")
JSON_LINES = (".jsonl", ".ndjson")
# The paper's passes over its 3.3B-token corpus: ELECTRA-Small 1M steps x 128 x 128 = 16.4B tokens (~5
# passes), ELECTRA-Base 766k x 256 x 512 = 100B (~30) (Table 6). Far above that, examples repeat so often that
# results stop reflecting the paper's regime.
PAPER_PASSES = {"ELECTRA-Small": 5, "ELECTRA-Base": 30}
PASSES_WARNING = 50.0


def _fix_paths() -> str:
    return ("Set data.paths to a list of files, folders or globs of plain text (a blank line between "
            "documents) or JSON lines (one document per line, the text under data.text_field), optionally "
            "compressed as .gz, .xz or .zst.")


# ---------------------------------------------------------------------------------------------------------
# Content hashes


def file_sha256(path: Path, cache_dir: Path) -> str:
    """SHA-256 of a file's bytes, remembered under cache_dir/hashes per (path, size, mtime): hashed once."""
    st = path.stat()
    stamp = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:24]
    memo = cache_dir / "hashes" / stamp
    if memo.is_file():
        return memo.read_text().strip()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(4 << 20), b""):
            h.update(block)
    digest = h.hexdigest()
    memo.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo.with_name(f".{stamp}.tmp-{os.getpid()}")
    tmp.write_text(digest)
    os.replace(tmp, memo)
    return digest


# ---------------------------------------------------------------------------------------------------------
# Documents as lines


def document_lines(text: str) -> Iterator[str]:
    """The stripped non-empty lines of one document's text, then "" (nothing for a document without text)."""
    any_line = False
    # Universal newlines, as a text file is read; reference ExampleBuilder.add_line strips each line.
    for raw in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        line = raw.strip()
        if line:
            any_line = True
            yield line
    if any_line:
        yield ""


class _Counted(io.RawIOBase):
    """A binary file that counts the bytes read from it (compressed bytes, for progress)."""

    def __init__(self, f):
        self.f, self.bytes_read = f, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self.f.readinto(b)
        self.bytes_read += n or 0
        return n

    def close(self) -> None:
        self.f.close()
        super().close()


def _open_binary(path: Path, counter: _Counted) -> io.IOBase:
    """The file's bytes, decompressed by its suffix (.gz, .xz, .zst) as a stream."""
    name = path.name
    if name.endswith(".gz"):
        return gzip.GzipFile(fileobj=counter, mode="rb")
    if name.endswith(".xz"):
        return lzma.LZMAFile(counter, mode="rb")
    if name.endswith(".zst"):
        import zstandard  # only needed for .zst corpora

        # read_across_frames: zstd's multi-threaded mode writes one frame per block.
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(counter, read_across_frames=True))
    return io.BufferedReader(counter)


def _read_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [OSError, EOFError, lzma.LZMAError, UnicodeDecodeError, ValueError]
    try:
        import zstandard

        errors.append(zstandard.ZstdError)
    except ImportError:
        pass
    return tuple(errors)


def is_json_lines(path: Path) -> bool:
    name = path.name
    for suffix in COMPRESSED:
        name = name.removesuffix(suffix)
    return name.endswith(JSON_LINES)


class TextFiles:
    """Files, folders (every non-hidden file below, sorted) and globs, read in the order given.

    Plain text as data.iter_corpus_lines reads it (one paragraph per line, blank lines between documents;
    the end of a file ends its last document); `.jsonl`/`.ndjson` files hold one JSON object per line, one
    document each, its text under `text_field`. Any of them may be compressed (.gz, .xz, .zst).
    """

    def __init__(self, paths: Sequence[str | Path], text_field: str = "text"):
        if isinstance(paths, (str, Path)) or not paths:
            raise DataError(f"data.paths={paths!r} must be a non-empty list. {_fix_paths()}")
        self.entries = [str(p) for p in paths]
        self.text_field = text_field
        self.files = self._expand()
        self.bytes_read = self._base = 0

    def _expand(self) -> list[Path]:
        files: list[Path] = []
        for entry in self.entries:
            path = Path(entry).expanduser()
            if path.is_dir():
                found = sorted(p for p in path.rglob("*")
                               if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts))
            elif path.is_file():
                found = [path]
            else:
                found = [Path(p) for p in sorted(glob.glob(str(path), recursive=True)) if Path(p).is_file()]
            if not found:
                raise DataError(f"data.paths entry {entry!r} matches no file. {_fix_paths()}")
            files += found
        seen: set[Path] = set()
        unique = []
        for f in files:
            if f.resolve() not in seen:  # a file named by two entries (a folder and a glob) is read once
                seen.add(f.resolve())
                unique.append(f)
        empty = [str(f) for f in unique if f.stat().st_size == 0]
        if empty:
            raise DataError(f"Corpus file(s) {', '.join(empty[:5])} are empty. Remove them from data.paths.")
        return unique

    @property
    def total_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.files)

    def describe(self) -> str:
        shown = ", ".join(str(f) for f in self.files[:3]) + (f", ... ({len(self.files)} files)" if len(self.files) > 3 else "")
        return f"text files [{shown}]"

    def identity(self, cache_dir: Path) -> dict:
        started = time.perf_counter()
        hashes = [file_sha256(f, cache_dir) for f in self.files]
        if time.perf_counter() - started > 5:
            log.info("hashed %d corpus files (%.1f GB) in %.0f s for the cache key", len(self.files),
                     self.total_bytes / 1e9, time.perf_counter() - started)
        # Names are kept for the record; the content hashes alone decide (a renamed file is the same text).
        identity = {"kind": "text_files", "sha256": hashes}
        if any(is_json_lines(f) for f in self.files):
            identity["text_field"] = self.text_field
        return identity

    def lines(self) -> Iterator[str]:
        done = 0
        for path in self.files:
            self._base = done
            reader = self._json_lines if is_json_lines(path) else self._text_lines
            counter = _Counted(open(path, "rb"))
            try:
                yield from reader(path, counter)
            finally:
                counter.close()
                done += path.stat().st_size
                self.bytes_read = done

    def _file_lines(self, path: Path, counter: _Counted, universal: bool) -> Iterator[tuple[int, str]]:
        """(line number, text) of each line of the file, decoded one line at a time so that an error names it.

        `universal`: also split at a lone "\r", as Python's universal newlines (and so data.iter_corpus_lines) do.
        """
        lineno = 0
        try:
            with _open_binary(path, counter) as f:
                for lineno, raw in enumerate(f, 1):
                    try:
                        text = raw.decode("utf-8")
                    except UnicodeDecodeError as err:
                        raise DataError(
                            f"Corpus file {path} line {lineno} is not UTF-8 text (byte {err.start + 1} of the "
                            f"line: {err.reason}). Fix or remove that file from data.paths.") from err
                    if universal and "\r" in text:
                        for part in text.replace("\r\n", "\n").split("\r"):
                            yield lineno, part
                    else:
                        yield lineno, text
                    if not lineno & 1023:
                        self.bytes_read = self._base + counter.bytes_read
        except DataError:
            raise
        except _read_errors() as err:
            # Decompression reads ahead, so the damage is somewhere after the last complete line.
            where = f"after line {lineno}" if lineno else "from its start"
            raise DataError(f"Corpus file {path} cannot be read {where} ({type(err).__name__}: {err}). Fix or "
                            "remove that file from data.paths.") from err

    def _text_lines(self, path: Path, counter: _Counted) -> Iterator[str]:
        in_doc = False
        for _, raw in self._file_lines(path, counter, universal=True):
            # Reference ExampleBuilder.add_line: line.strip(); runs of blank lines end one document.
            line = raw.strip()
            if line:
                in_doc = True
                yield line
            elif in_doc:
                in_doc = False
                yield ""
        if in_doc:
            yield ""

    def _json_lines(self, path: Path, counter: _Counted) -> Iterator[str]:
        for lineno, raw in self._file_lines(path, counter, universal=False):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except json.JSONDecodeError as err:
                raise DataError(
                    f"Corpus file {path} line {lineno} is not JSON ({err.msg}, column {err.colno}). A JSON-lines "
                    "file holds one JSON object per line; fix the line or remove the file from data.paths."
                ) from err
            text = record.get(self.text_field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                fields = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise DataError(
                    f"Corpus file {path} line {lineno} has no text field {self.text_field!r} (it has {fields}). "
                    "Set data.text_field to the field that holds the document's text.")
            yield from document_lines(text)


class HFDataset:
    """A Hugging Face `datasets` dataset: one document per row, its text under `text_column`.

    `name` is a hub dataset (loaded with `datasets.load_dataset(name, config, split=..., streaming=...,
    revision=...)`) or a local folder written by `save_to_disk`. Streaming reads the rows as they come, never
    the whole dataset; without streaming `datasets` first downloads and prepares the split (memory-mapped).
    """

    ROWS_PER_BATCH = 1000

    def __init__(self, name: str, config: str | None = None, split: str = "train", text_column: str = "text",
                 streaming: bool = False, revision: str | None = None):
        if not name:
            raise DataError("data.name is empty. Set it to a Hugging Face dataset (e.g. Skylion007/openwebtext) "
                            "or to a folder written by Dataset.save_to_disk.")
        self.name, self.config, self.split, self.text_column = name, config, split, text_column
        self.streaming, self.revision = bool(streaming), revision
        self.bytes_read = 0
        self.rows_read = 0
        self._dataset = None

    def _where(self) -> str:
        return f"Hugging Face dataset {self.name!r} (config {self.config!r}, split {self.split!r})"

    @property
    def local(self) -> Path | None:
        path = Path(self.name).expanduser()
        return path if path.is_dir() else None

    @property
    def dataset(self):
        if self._dataset is None:
            self._dataset = self._load()
        return self._dataset

    def _load(self):
        try:
            import datasets
        except ImportError as err:
            raise DataError("data=hf_dataset needs the `datasets` package: pip install 'electra-ablate[hf]'.") from err
        try:
            if self.local is not None:
                ds = datasets.load_from_disk(str(self.local))
                if isinstance(ds, datasets.DatasetDict):
                    if self.split not in ds:
                        raise DataError(f"{self._where()} has no split {self.split!r} (it has {sorted(ds)}). "
                                        "Set data.split to one of them.")
                    ds = ds[self.split]
            else:
                ds = datasets.load_dataset(self.name, self.config, split=self.split, streaming=self.streaming,
                                           revision=self.revision)
        except DataError:
            raise
        except Exception as err:  # datasets raises many types (FileNotFoundError, ConnectionError, ValueError...)
            raise DataError(
                f"{self._where()} cannot be loaded ({type(err).__name__}: {err}). Check data.name, data.config "
                "and data.split, and the network (or set data.name to a local folder written by save_to_disk)."
            ) from err
        columns = ds.column_names
        if columns is not None and self.text_column not in columns:
            raise DataError(f"{self._where()} has no column {self.text_column!r} (it has {columns}). Set "
                            "data.text_column to the column that holds the text.")
        return ds

    def describe(self) -> str:
        return self._where()

    def identity(self, cache_dir: Path) -> dict:
        ds = self.dataset
        base = {"kind": "hf_dataset", "split": self.split, "text_column": self.text_column}
        if self.local is not None:
            # The Arrow files are the content; their SHA-256 is remembered like a text file's.
            files = sorted(p for p in self.local.rglob("*.arrow"))
            split_files = [f for f in files if f.parent.name == self.split] or files
            return {**base, "arrow_sha256": [file_sha256(f, cache_dir) for f in split_files]}
        base |= {"name": self.name, "config": self.config, "revision": self.revision}
        if not self.streaming:
            # datasets' fingerprint of a prepared split is derived from its builder config and data files.
            return {**base, "fingerprint": ds._fingerprint}
        # A streamed dataset cannot be hashed before it is read: its name, revision and published sizes stand in
        # (set data.revision to a commit to pin the content).
        info = ds.info
        split_info = (info.splits or {}).get(self.split) if info is not None else None
        return {**base, "version": str(getattr(info, "version", None)),
                "num_examples": getattr(split_info, "num_examples", None),
                "num_bytes": getattr(split_info, "num_bytes", None)}

    @property
    def total_rows(self) -> int | None:
        try:
            return len(self.dataset)
        except TypeError:  # an IterableDataset has no length
            return None

    def lines(self) -> Iterator[str]:
        ds = self.dataset
        if self.streaming and self.local is not None:
            ds = ds.to_iterable_dataset()  # a saved dataset read as a stream, as a hub one would be
        ds = ds.select_columns([self.text_column])
        row = 0
        for batch in ds.iter(batch_size=self.ROWS_PER_BATCH):
            texts = batch.get(self.text_column)
            if texts is None:
                raise DataError(f"{self._where()} rows have no column {self.text_column!r}. Set data.text_column "
                                "to the column that holds the text.")
            for text in texts:
                if text is not None and not isinstance(text, str):
                    raise DataError(f"{self._where()} row {row}: column {self.text_column!r} holds "
                                    f"{type(text).__name__}, not text. Set data.text_column to a text column.")
                row += 1
                if text:
                    yield from document_lines(text)
            self.rows_read = row


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


class _ExampleWriter:
    """Appends examples to headerless arrays on disk in blocks, then writes the .npy files of a cache entry."""

    def __init__(self, directory: Path, max_length: int, dtype: np.dtype, pad: int):
        self.directory, self.max_length, self.dtype, self.pad = directory, max_length, dtype, pad
        n = D._ROWS_PER_FLUSH
        self.ids = np.full((n, max_length), pad, dtype=dtype)
        self.meta = np.zeros((3, n), dtype=np.int32)  # lengths, segment_a_end, target_lengths
        self.fill = self.rows = 0
        self.files = {name: open(directory / f"{name}.raw", "wb")
                      for name in ("input_ids", "lengths", "segment_a_end", "target_lengths")}

    def add(self, example: D.Example | None) -> None:
        if example is None:
            return
        n = len(example.input_ids)
        self.ids[self.fill, :n] = example.input_ids
        self.meta[:, self.fill] = (n, example.segment_a_end, example.target_length)
        self.fill += 1
        if self.fill == len(self.ids):
            self._flush()

    def _flush(self) -> None:
        self.files["input_ids"].write(self.ids[: self.fill].tobytes())
        for i, name in enumerate(("lengths", "segment_a_end", "target_lengths")):
            self.files[name].write(self.meta[i, : self.fill].tobytes())
        self.rows += self.fill
        self.ids.fill(self.pad)
        self.fill = 0

    def close(self) -> int:
        self._flush()
        for f in self.files.values():
            f.close()
        D._write_npy_from_raw(self.directory / "input_ids.raw", self.directory / "input_ids.npy", self.dtype,
                              (self.rows, self.max_length))
        for name in ("lengths", "segment_a_end", "target_lengths"):
            D._write_npy_from_raw(self.directory / f"{name}.raw", self.directory / f"{name}.npy",
                                  np.dtype(np.int32), (self.rows,))
        return self.rows

    def abort(self) -> None:
        for f in self.files.values():
            f.close()


def _worker_count(requested: int) -> int:
    if requested > 0:
        return requested
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use (taskset, cgroups)
    except AttributeError:
        return os.cpu_count() or 1


def _start_pool(workers: int, tokenizer_json: str):
    """Tokenizer worker processes. Forked where the platform can (spawned workers would import the main
    module, torch and Lightning included, seconds per worker); tokenizers' own threads are off in them."""
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    # Set while forking, so tokenizers does not warn that a process using its thread pool was forked.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        return multiprocessing.get_context(method).Pool(workers, initializer=W.init_worker,
                                                        initargs=(tokenizer_json,))
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
) -> D.PretrainCache:
    """The cache entry of `source` at these settings, building it (in parallel, resumably) if it is missing.

    Its examples are those `data.build_or_load` makes of the same text read as one file; `workers` (0 = one
    per core this process may use) only changes the speed.
    """
    cache_dir = Path(cache_dir)
    vocab_file = Path(vocab_file)
    tokens = D.read_vocab(vocab_file)  # validates before the key hashes the file
    token_inputs = {
        "tokens_format": TOKENS_FORMAT,
        "source": source.identity(cache_dir),
        "vocab_sha256": file_sha256(vocab_file, cache_dir),
        "lowercase": bool(lowercase),
        "max_docs": max_docs,
        "shard_chars": int(shard_chars),  # where shards are cut: which file holds which lines
    }
    inputs = {
        "format": D.FORMAT_VERSION,
        **token_inputs,
        "max_seq_length": int(max_seq_length),
        "short_seq_prob": float(short_seq_prob),
        "build_seed": int(build_seed),
    }
    target = cache_dir / "pretrain" / D._hash(inputs)
    if (target / D.META_NAME).is_file():
        return D.load_cache(target)

    shard_dir = cache_dir / "tokens" / D._hash(token_inputs)
    shard_dir.mkdir(parents=True, exist_ok=True)
    record = shard_dir / f".inputs.json.tmp-{os.getpid()}"  # what the shards are of, for whoever finds the folder
    record.write_text(json.dumps(token_inputs, indent=1, sort_keys=True))
    os.replace(record, shard_dir / "inputs.json")
    _remove_stale_temporaries(shard_dir)
    tokenizer = D.load_tokenizer(vocab_file, lowercase)
    special = SpecialTokens(*(tokens.index(t) for t in D.SPECIAL_TOKENS))
    vocab_size = len(tokens)
    dtype = np.dtype(np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32)
    builder = ExampleBuilder(max_seq_length, short_seq_prob, special.cls, special.sep, random.Random(build_seed))
    counts = np.zeros(vocab_size, dtype=np.int64)
    workers = _worker_count(workers)
    progress = _Progress(source)
    num_docs = num_tokens = 0
    log.info("building the pre-training examples of %s with %d tokenizer process(es) into %s", source.describe(),
             workers, target)

    def assemble(index: int, tokenized_now: bool) -> None:
        nonlocal num_docs, num_tokens
        ids, line_lengths = W.read_shard(W.shard_path(shard_dir, index))
        counts[:] += np.bincount(ids, minlength=vocab_size)
        num_tokens += len(ids)
        num_docs += int((line_lengths == 0).sum())
        ends = np.cumsum(line_lengths).tolist()
        start = 0
        for end in ends:
            writer.add(builder.add_line(ids[start:end].tolist()))
            start = end
        progress.shard(len(ids), read_back=not tokenized_now)
        _on_shard_done(index)

    started = time.perf_counter()
    with D._AtomicDir(target) as tmp:
        writer = _ExampleWriter(tmp, max_seq_length, dtype, special.pad)
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
                        result.get()
                    assemble(index, tokenized_now=result is not None)

            for index, lines in enumerate(shards(stream_lines(source, max_docs), shard_chars)):
                if W.shard_path(shard_dir, index).is_file():
                    pending.append((index, None))
                elif pool is None:
                    W.tokenize_shard(index, lines, str(shard_dir), dtype.name, tokenizer)
                    pending.append((index, _Done()))
                else:
                    pending.append((index, pool.apply_async(W.tokenize_shard, (index, lines, str(shard_dir),
                                                                                dtype.name))))
                del lines
                drain(limit - 1)
            drain(0)
            writer.add(builder.flush())
            num_examples = writer.close()
        except BaseException:
            writer.abort()
            raise
        finally:
            if pool is not None:
                pool.terminate()
                pool.join()
        if num_examples == 0:
            raise DataError(f"The corpus {source.describe()} holds no text that tokenizes to word pieces. "
                            f"{_fix_paths()}")
        np.save(tmp / "token_counts.npy", counts)
        shutil.copyfile(vocab_file, tmp / D.VOCAB_NAME)
        seconds = time.perf_counter() - started
        meta = {
            **inputs,
            "corpus": source.describe(),
            "vocab_file": str(vocab_file.resolve()),
            "vocab_size": vocab_size,
            "special": special._asdict(),
            "dtype": dtype.name,
            "num_examples": num_examples,
            "num_docs": num_docs,
            "num_tokens": num_tokens,
            "num_shards": progress.shards,
            "build_workers": workers,
            "build_seconds": round(seconds, 3),
        }
        (tmp / D.META_NAME).write_text(json.dumps(meta, indent=2, sort_keys=True))
    progress.report()
    log.info("built %d examples from %.1fM word pieces in %.0f s (%.0f word pieces/s): %s", num_examples,
             num_tokens / 1e6, seconds, num_tokens / max(seconds, 1e-9), target)
    return D.load_cache(target)


class _Done:
    """A result already computed in this process (no worker pool)."""

    def get(self) -> None:
        return None


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

    def _build_cache(self) -> D.PretrainCache:
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


# ---------------------------------------------------------------------------------------------------------
# What a run will see of its corpus


def corpus_budget(corpus_tokens: int, num_examples: int, max_steps: int, global_batch: int,
                  max_seq_length: int) -> dict[str, float]:
    """The corpus's size and how often a run of `max_steps` steps of `global_batch` sequences goes over it.

    Tokens seen = steps x global batch x sequence length, the paper's accounting (padding included);
    `corpus/passes` divides it by the corpus's word pieces; `corpus/example_epochs` counts the permutations of
    the examples the loader walks through.
    """
    seen = max_steps * global_batch * max_seq_length
    return {
        "corpus/tokens": corpus_tokens,
        "corpus/examples": num_examples,
        "corpus/tokens_to_see": seen,
        "corpus/passes": seen / max(corpus_tokens, 1),
        "corpus/example_epochs": max_steps * global_batch / max(num_examples, 1),
    }


def passes_warning(budget: dict[str, float]) -> str | None:
    """A warning when the run would pass over its corpus far more often than the paper did, else None."""
    passes = budget["corpus/passes"]
    if passes <= PASSES_WARNING:
        return None
    paper = ", ".join(f"~{v} for {k}" for k, v in PAPER_PASSES.items())
    return (
        f"this run sees {budget['corpus/tokens_to_see'] / 1e9:.2f}B tokens of a {budget['corpus/tokens'] / 1e6:.1f}M-"
        f"token corpus: {passes:.0f} passes over it, against the paper's {paper} over 3.3B tokens (section 3.1). "
        "Examples repeat that often, so results may not reflect the paper's. Use a larger corpus "
        "(data=text_files data.paths=[...] or data=hf_dataset data.name=...), or fewer trainer.max_steps."
    )

