"""The GLUE tasks of the ELECTRA paper: one `TaskSpec` row per task in `TASKS` and where its files live.

Every task is one row (columns, label set, dev splits, metrics); nothing branches on a task name. Label ids
are the Hugging Face `ClassLabel` ids (MNLI entailment=0, neutral=1, contradiction=2; RTE/QNLI
entailment=0; WNLI entailment=1); the readers (glue/readers.py) map both sources onto them, metrics live in
glue/metrics.py and tokenized features in glue/features.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple


class GlueDataError(ValueError):
    """A GLUE file or directory that is missing or not in the expected layout."""


# --- task definitions ---------------------------------------------------------------------------------


class DevSplit(NamedTuple):
    name: str  # our split name: "dev", or MNLI's "dev_matched" / "dev_mismatched"
    hf_split: str  # the Hugging Face split it corresponds to
    metric_prefix: str  # prefix of this split's metric names ("" for the split the paper reports)


@dataclass(frozen=True)
class TaskSpec:
    """One GLUE task. Columns are header names, or 0-based indices for the headerless CoLA files."""

    name: str
    dir_name: str  # folder in the GLUE download (CoLA, SST-2, ...)
    text_a: str | int
    text_b: str | int | None
    label: str | int
    # Label strings as they appear in the TSVs, in id order (the HF ClassLabel order); None = regression.
    tsv_labels: tuple[str, ...] | None
    # HF ClassLabel names, in id order (checked when loading from `datasets`).
    hf_labels: tuple[str, ...] | None
    hf_text: tuple[str, str | None]  # HF column names of the first and second sentence
    metrics: tuple[str, ...]  # metric names (keys of METRICS); the first is the paper's
    header: bool = True
    n_columns: int | None = None  # fixed field count of a headerless file
    dev_splits: tuple[DevSplit, ...] = (DevSplit("dev", "validation", ""),)
    encoding: str = "utf-8"
    # The sentence order carries no meaning: the reference's `double_unordered` trains on both orders.
    unordered: bool = False
    label_range: tuple[float, float] | None = None  # regression targets (STS-B: 0-5)

    @property
    def is_regression(self) -> bool:
        return self.tsv_labels is None

    @property
    def num_labels(self) -> int:
        return 1 if self.tsv_labels is None else len(self.tsv_labels)

    @property
    def paper_metric(self) -> str:
        return self.metrics[0]

    @property
    def splits(self) -> tuple[str, ...]:
        return ("train",) + tuple(s.name for s in self.dev_splits)

    @property
    def hf_name(self) -> str:
        return self.name

    def hf_split(self, split: str) -> str:
        if split == "train":
            return "train"
        for s in self.dev_splits:
            if s.name == split:
                return s.hf_split
        raise GlueDataError(f"task {self.name} has no split {split!r}; its splits are {', '.join(self.splits)}")


_BINARY = ("0", "1")
_NLI2 = ("entailment", "not_entailment")

# Columns and label sets: official GLUE layouts (../shared/data/README.md) and the reference's
# finetune/classification/classification_tasks.py; HF names from the `nyu-mll/glue` dataset card.
TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in (
        TaskSpec("cola", "CoLA", 3, None, 1, _BINARY, ("unacceptable", "acceptable"), ("sentence", None),
                 ("mcc", "accuracy"), header=False, n_columns=4),
        TaskSpec("sst2", "SST-2", "sentence", None, "label", _BINARY, ("negative", "positive"), ("sentence", None),
                 ("accuracy",)),
        TaskSpec("mrpc", "MRPC", "#1 String", "#2 String", "Quality", _BINARY, ("not_equivalent", "equivalent"),
                 ("sentence1", "sentence2"), ("accuracy", "f1"), encoding="utf-8-sig", unordered=True),
        TaskSpec("stsb", "STS-B", "sentence1", "sentence2", "score", None, None, ("sentence1", "sentence2"),
                 ("spearman", "pearson"), unordered=True, label_range=(0.0, 5.0)),
        TaskSpec("qqp", "QQP", "question1", "question2", "is_duplicate", _BINARY, ("not_duplicate", "duplicate"),
                 ("question1", "question2"), ("accuracy", "f1")),
        TaskSpec("mnli", "MNLI", "sentence1", "sentence2", "gold_label", ("entailment", "neutral", "contradiction"),
                 ("entailment", "neutral", "contradiction"), ("premise", "hypothesis"), ("accuracy",),
                 dev_splits=(DevSplit("dev_matched", "validation_matched", ""),
                             DevSplit("dev_mismatched", "validation_mismatched", "mismatched_"))),
        TaskSpec("qnli", "QNLI", "question", "sentence", "label", _NLI2, _NLI2, ("question", "sentence"),
                 ("accuracy",)),
        TaskSpec("rte", "RTE", "sentence1", "sentence2", "label", _NLI2, _NLI2, ("sentence1", "sentence2"),
                 ("accuracy",)),
        # WNLI's TSV labels are 0/1 with 1 = entailment, the HF order.
        TaskSpec("wnli", "WNLI", "sentence1", "sentence2", "label", _BINARY, ("not_entailment", "entailment"),
                 ("sentence1", "sentence2"), ("accuracy",)),
    )
}


def get_task(name: str) -> TaskSpec:
    try:
        return TASKS[name]
    except KeyError:
        raise GlueDataError(f"unknown GLUE task {name!r}; valid: {', '.join(TASKS)}") from None


class Example(NamedTuple):
    idx: int  # row number within its split (0-based, header excluded)
    text_a: str
    text_b: str | None
    label: int | float


def task_dir(task: TaskSpec, glue_dir: str | Path) -> Path:
    return Path(glue_dir) / task.dir_name


def split_path(task: TaskSpec, glue_dir: str | Path, split: str) -> Path:
    return task_dir(task, glue_dir) / f"{split}.tsv"


def available_tasks(glue_dir: str | Path) -> list[str]:
    """Tasks whose train and dev files all exist under `glue_dir`, in GLUE order."""
    return [n for n, t in TASKS.items() if all(split_path(t, glue_dir, s).is_file() for s in t.splits)]
