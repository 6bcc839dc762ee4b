"""The GLUE tasks of the ELECTRA paper: task definitions, the two data sources, features and metrics.

Every task is one `TaskSpec` row in `TASKS` (columns, label set, dev splits, metrics); nothing branches on a
task name. Examples come from either the original GLUE TSV layout (as written by the official download
script, read like the reference's `read_tsv`: tab-separated, quoting off because some sentences hold an
unbalanced `"`, MRPC with its byte-order mark) or the Hugging Face `datasets` GLUE loader. Label ids are the
Hugging Face `ClassLabel` ids (MNLI entailment=0, neutral=1, contradiction=2; RTE/QNLI entailment=0; WNLI
entailment=1); the TSV loader maps the files' label strings onto them, so both sources give the same
examples and ids. Metrics are the paper's (Clark et al. 2020, section 3.1: CoLA Matthews correlation,
STS-B Spearman, accuracy elsewhere) plus GLUE's secondary ones (MRPC/QQP F1, STS-B Pearson, MNLI
mismatched accuracy), computed with scikit-learn and scipy. Tokenized splits are cached on disk under a
hash of everything that determines them.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
from scipy import stats
from sklearn import metrics as skm

csv.field_size_limit(2**31 - 1)  # a few GLUE fields are longer than csv's 128 KiB default


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


# --- examples -----------------------------------------------------------------------------------------


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


# --- metrics ------------------------------------------------------------------------------------------


def _accuracy(preds, labels) -> float:
    return float(skm.accuracy_score(labels, preds))


def _f1(preds, labels) -> float:
    return float(skm.f1_score(labels, preds, pos_label=1, zero_division=0.0))


def _mcc(preds, labels) -> float:
    return float(skm.matthews_corrcoef(labels, preds))


def _spearman(preds, labels) -> float:
    return float(stats.spearmanr(preds, labels).statistic)


def _pearson(preds, labels) -> float:
    return float(stats.pearsonr(preds, labels).statistic)


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": _accuracy,
    "f1": _f1,
    "mcc": _mcc,
    "spearman": _spearman,
    "pearson": _pearson,
}


def compute_metrics(task: TaskSpec, predictions: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, float]:
    """{dev split: (predictions, labels)} -> {metric name: value}; MNLI mismatched gets a name prefix.

    Predictions are class ids, or scores for STS-B.
    """
    out = {}
    for split in task.dev_splits:
        preds, labels = (np.asarray(x) for x in predictions[split.name])
        for m in task.metrics:
            out[split.metric_prefix + m] = METRICS[m](preds, labels)
    return out


def task_score(task: TaskSpec, metrics: Mapping[str, float]) -> float:
    """The paper's number for a task (CoLA MCC, STS-B Spearman, else accuracy; MNLI matched) x 100."""
    return 100.0 * metrics[task.paper_metric]


class GlueScore(NamedTuple):
    score: float
    tasks: tuple[str, ...]


def glue_score(per_task: Mapping[str, float], include_wnli: bool = False) -> GlueScore:
    """Mean of per-task scores over the tasks present, with the tasks it covers (GLUE order).

    The paper's GLUE score averages the eight tasks without WNLI (Clark et al. 2020, section 3.1), so WNLI
    is left out unless `include_wnli`.
    """
    unknown = sorted(set(per_task) - set(TASKS))
    if unknown:
        raise GlueDataError(f"glue_score: unknown task(s) {unknown}; valid: {', '.join(TASKS)}")
    tasks = tuple(t for t in TASKS if t in per_task and (include_wnli or t != "wnli"))
    if not tasks:
        raise GlueDataError(f"glue_score: no task to average in {sorted(per_task)} (WNLI alone is not a GLUE score)")
    return GlueScore(float(np.mean([per_task[t] for t in tasks])), tasks)


# --- tokenization and the feature cache ----------------------------------------------------------------


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


def file_digest(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key}.", suffix=".npz.tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **features._asdict())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return features


def prediction_rows(task: TaskSpec, split: str, features: Features, predictions: np.ndarray) -> list[list[str]]:
    """Rows of the dev-predictions TSV: split, row index, gold label, prediction (labels as in the TSVs)."""

    def fmt(v) -> str:
        return f"{float(v):.6g}" if task.is_regression else task.tsv_labels[int(v)]

    return [[split, str(int(i)), fmt(y), fmt(p)] for i, y, p in zip(features.idx, features.labels, predictions)]
