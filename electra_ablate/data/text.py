"""A single-file corpus read as lines: checks that fail before any compute, and the reference's line rules.

A corpus is plain text (or .xz-compressed), one paragraph per line, a blank line between documents, as
google-research/electra `build_pretraining_dataset.py` reads it.
"""

from __future__ import annotations

import lzma
from collections.abc import Iterator
from pathlib import Path

from electra_ablate.data.errors import DataError


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
