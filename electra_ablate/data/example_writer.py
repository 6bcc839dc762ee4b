"""The one writer of a pre-training cache entry's examples, used by the single-file build (`cache.py`) and the
parallel corpus build (`corpus_build.py`): examples are appended to headerless arrays on disk in blocks of
ROWS_PER_FLUSH, and turned into .npy files once their number is known, so no build holds its examples."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from electra_ablate.data.examples import Example

ROWS_PER_FLUSH = 8192
# The arrays of the packed examples, in the order their digest (`cache.examples_sha256`) reads them.
EXAMPLE_ARRAYS = ("input_ids", "lengths", "segment_a_end", "target_lengths")


def write_npy_from_raw(raw: Path, out: Path, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    """An .npy file from a headerless row-major dump, copied in blocks (the row count is known only now)."""
    with open(out, "wb") as dst, open(raw, "rb") as src:
        np.lib.format.write_array_header_1_0(
            dst, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
        )
        shutil.copyfileobj(src, dst, 16 << 20)
    raw.unlink()


class ExampleWriter:
    """Appends examples to `directory`; `close()` writes input_ids.npy (rows x max_length, padded) and the
    int32 lengths, segment_a_end and target_lengths, and returns the number of examples."""

    def __init__(self, directory: Path, max_length: int, dtype: np.dtype, pad: int):
        self.directory, self.max_length, self.dtype, self.pad = directory, max_length, dtype, pad
        self.ids = np.full((ROWS_PER_FLUSH, max_length), pad, dtype=dtype)
        self.meta = np.zeros((3, ROWS_PER_FLUSH), dtype=np.int32)  # lengths, segment_a_end, target_lengths
        self.fill = self.rows = 0
        self.files = {name: open(directory / f"{name}.raw", "wb") for name in EXAMPLE_ARRAYS}

    def add(self, example: Example | None) -> None:
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
        for i, name in enumerate(EXAMPLE_ARRAYS[1:]):
            self.files[name].write(self.meta[i, : self.fill].tobytes())
        self.rows += self.fill
        self.ids.fill(self.pad)
        self.fill = 0

    def close(self) -> int:
        self._flush()
        for f in self.files.values():
            f.close()
        write_npy_from_raw(self.directory / "input_ids.raw", self.directory / "input_ids.npy", self.dtype,
                           (self.rows, self.max_length))
        for name in EXAMPLE_ARRAYS[1:]:
            write_npy_from_raw(self.directory / f"{name}.raw", self.directory / f"{name}.npy", np.dtype(np.int32),
                               (self.rows,))
        return self.rows

    def abort(self) -> None:
        for f in self.files.values():
            f.close()
