"""GLUE examples from either data source: the original TSV layout or the Hugging Face `datasets` loader.

The TSV layout is the one the official download script writes, read like the reference's `read_tsv`:
tab-separated, quoting off because some sentences hold an unbalanced `"`, MRPC with its byte-order mark.
The TSV reader maps the files' label strings onto the Hugging Face `ClassLabel` ids (glue/tasks.py), so
both sources give the same examples and ids.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from pathlib import Path

from electra_ablate.glue.tasks import Example, GlueDataError, TaskSpec, split_path, task_dir

csv.field_size_limit(2**31 - 1)  # a few GLUE fields are longer than csv's 128 KiB default


def _parse_label(task: TaskSpec, raw: str, where: str, column: str | int) -> int | float:
    if task.tsv_labels is not None:
        try:
            return task.tsv_labels.index(raw)
        except ValueError:
            raise GlueDataError(
                f"{where}: label {raw!r} in field {column!r} is not one of the {task.name} labels "
                f"{list(task.tsv_labels)}"
            ) from None
    lo, hi = task.label_range
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not lo <= value <= hi:  # also rejects NaN
        raise GlueDataError(f"{where}: score {raw!r} in field {column!r} is not a number in [{lo}, {hi}]")
    return value


def read_tsv(task: TaskSpec, glue_dir: str | Path, split: str) -> list[Example]:
    """One split of a task from the original GLUE TSV layout."""
    if split not in task.splits:
        raise GlueDataError(f"task {task.name} has no split {split!r}; its splits are {', '.join(task.splits)}")
    folder = task_dir(task, glue_dir)
    if not folder.is_dir():
        raise GlueDataError(
            f"GLUE task directory {folder} not found: task {task.name} expects {task.dir_name}/"
            f"{{{','.join(task.splits)}}}.tsv in the original GLUE layout under {glue_dir}. Download GLUE with "
            "the official script and point glue_data.dir (or paths.data_dir) at it, or use glue_data.source=hf"
        )
    path = split_path(task, glue_dir, split)
    if not path.is_file():
        raise GlueDataError(f"{path} not found: task {task.name} needs {', '.join(s + '.tsv' for s in task.splits)}")
    raw = path.read_bytes()
    try:
        text = raw.decode(task.encoding)
    except UnicodeDecodeError as err:  # named at its line and byte in the user's file, not in a read buffer
        line = raw.count(b"\n", 0, err.start) + 1
        raise GlueDataError(
            f"{path} line {line} (byte {err.start}) is not {task.encoding} text "
            f"({err.reason}): the file is binary or corrupt; download the task again with the official GLUE script"
        ) from None
    rows = list(csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE))
    if task.header:
        if not rows:
            raise GlueDataError(f"{path} is empty; expected a header with columns {_needed(task)}")
        header, rows, first_line = rows[0], rows[1:], 2
        missing = [c for c in _needed(task) if c not in header]
        if missing:
            raise GlueDataError(
                f"{path}: header {header} lacks column(s) {missing}; a {task.name} file needs columns "
                f"{_needed(task)} (original GLUE layout, tab-separated)"
            )
        width = len(header)
        cols = {c: header.index(c) for c in _needed(task)}
    else:
        first_line, width = 1, task.n_columns
        cols = {c: c for c in _needed(task)}
    examples = []
    for i, row in enumerate(rows):
        where = f"{path} line {first_line + i}"
        if len(row) != width:
            layout = f"columns {header}" if task.header else f"{task.name} files have no header"
            raise GlueDataError(
                f"{where}: {len(row)} tab-separated fields, expected {width} ({layout}); the file is corrupt or "
                "from an old GLUE release (early QQP files had broken lines): download the task again with the "
                "official GLUE script"
            )
        examples.append(
            Example(
                idx=i,
                text_a=row[cols[task.text_a]],
                text_b=None if task.text_b is None else row[cols[task.text_b]],
                label=_parse_label(task, row[cols[task.label]], where, task.label),
            )
        )
    return examples


def _needed(task: TaskSpec) -> list[str | int]:
    return [c for c in (task.text_a, task.text_b, task.label) if c is not None]


def examples_from_hf(task: TaskSpec, dataset) -> list[Example]:
    """Examples from one split of the Hugging Face GLUE dataset (a `datasets.Dataset`)."""
    a, b = task.hf_text
    needed = [c for c in (a, b, "label", "idx") if c is not None]
    missing = [c for c in needed if c not in dataset.column_names]
    if missing:
        raise GlueDataError(
            f"Hugging Face dataset for {task.name} lacks column(s) {missing}; expected {needed}, got "
            f"{dataset.column_names}"
        )
    feature = dataset.features["label"]
    if task.hf_labels is not None and getattr(feature, "names", None) not in (None, list(task.hf_labels)):
        raise GlueDataError(
            f"Hugging Face {task.name} labels are {feature.names}, expected {list(task.hf_labels)}: the label "
            "ids would not match the TSV loader's"
        )
    # Whole columns at once (Arrow -> Python lists): row-by-row access is ~10x slower on MNLI's 393k rows.
    texts_a, labels, idxs = list(dataset[a]), list(dataset["label"]), list(dataset["idx"])
    texts_b = [None] * len(texts_a) if b is None else list(dataset[b])
    out = []
    for idx, text_a, text_b, label in zip(idxs, texts_a, texts_b, labels):
        if task.is_regression:
            label = float(label)
        elif not 0 <= label < task.num_labels:  # the test splits carry -1
            raise GlueDataError(
                f"Hugging Face {task.name} row idx={idx}: label {label} outside 0..{task.num_labels - 1}"
            )
        out.append(Example(int(idx), text_a, text_b, label))
    return out


def read_hf(task: TaskSpec, split: str, hf_path: str = "nyu-mll/glue") -> list[Example]:
    """One split from the Hugging Face hub (downloads on first use; needs the `hf` extra)."""
    try:
        import datasets
    except ImportError as e:
        raise GlueDataError(
            "glue_data.source=hf needs the Hugging Face `datasets` package: pip install 'electra-ablate[hf]'"
        ) from e
    return examples_from_hf(task, datasets.load_dataset(hf_path, task.hf_name, split=task.hf_split(split)))


def load_split(
    task: TaskSpec, split: str, source: str, glue_dir: str | Path, hf_path: str = "nyu-mll/glue"
) -> list[Example]:
    """One split from the chosen source: "tsv" (the GLUE directory) or "hf" (`datasets`)."""
    loaders: dict[str, Callable[[], list[Example]]] = {
        "tsv": lambda: read_tsv(task, glue_dir, split),
        "hf": lambda: read_hf(task, split, hf_path),
    }
    if source not in loaders:
        raise GlueDataError(f"unknown glue_data.source={source!r}; valid: {', '.join(loaders)}")
    return loaders[source]()


def double_unordered(examples: Sequence[Example]) -> list[Example]:
    """Append every pair with its sentences swapped (reference `double_unordered`, MRPC and STS-B train)."""
    return list(examples) + [e._replace(text_a=e.text_b, text_b=e.text_a) for e in examples]
