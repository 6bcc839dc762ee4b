"""A corpus from a Hugging Face `datasets` dataset (`data=hf_dataset`): one document per row.

The dataset comes from the hub (streamed or not) or from a folder written by `save_to_disk`; its cache key
holds the Arrow files' SHA-256, the prepared split's fingerprint, or for a stream its name, revision and
published sizes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from electra_ablate.data.corpus_files import document_lines, file_sha256
from electra_ablate.data.errors import DataError


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
