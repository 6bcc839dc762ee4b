"""A corpus of many files: files, folders and globs of plain text or JSON lines, optionally compressed.

The paper pre-trains on 3.3B tokens (Wikipedia + BooksCorpus; section 3.1), far more than one local file.
`data=text_files` reads `data.paths` (plain text or JSON lines, optionally .gz, .xz or .zst) as a stream of
document lines, in the order given, under the reference's line rules (`text.iter_corpus_lines`). The cache
keys hold a content hash of every file (SHA-256, remembered per path, size and modification time).
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import io
import json
import logging
import lzma
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from electra_ablate.common.io import write_text
from electra_ablate.data.errors import DataError

log = logging.getLogger(__name__)

COMPRESSED = (".gz", ".xz", ".zst")
JSON_LINES = (".jsonl", ".ndjson")


def _fix_paths() -> str:
    return ("Set data.paths to a list of files, folders or globs of plain text (a blank line between "
            "documents) or JSON lines (one document per line, the text under data.text_field), optionally "
            "compressed as .gz, .xz or .zst.")


# ---------------------------------------------------------------------------------------------------------
# Content hashes


def memo_path(path: Path, cache_dir: Path) -> Path:
    """Where `file_sha256` remembers the digest of `path` as it is now (its size and modification time)."""
    st = path.stat()
    return cache_dir / "hashes" / hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:24]


def file_sha256(path: Path, cache_dir: Path) -> str:
    """SHA-256 of a file's bytes, remembered under cache_dir/hashes per (path, size, mtime): hashed once."""
    memo = memo_path(path, cache_dir)
    if memo.is_file():
        return memo.read_text().strip()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(4 << 20), b""):
            h.update(block)
    digest = h.hexdigest()
    write_text(memo, digest)
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

    Plain text as text.iter_corpus_lines reads it (one paragraph per line, blank lines between documents;
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

        `universal`: also split at a lone "\r", as Python's universal newlines (and so text.iter_corpus_lines) do.
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
