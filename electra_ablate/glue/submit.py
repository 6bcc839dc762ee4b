"""GLUE test-set predictions and the submission the GLUE server expects: `python -m electra_ablate.submit`.

The test splits have no labels, so they are predicted at the end of a fine-tuning run (finetuning/run.py,
`glue_data.predict_test=true`, as the reference run_finetuning.py's `do_test`) and kept as the run's
`predictions/test_predictions.tsv` artifact (split, index, prediction): every task's test split, MNLI's
matched and mismatched ones, and the AX diagnostic, which GLUE scores with the MNLI model. Test examples come
from the GLUE TSV layouts (a header, an index column, no label column: the official download script's files,
read as BERT's run_classifier.py processors read them) or from `datasets` (`nyu-mll/glue`, where test rows are
labelled -1 and AX is the `ax` configuration).

The command picks one fine-tuning run per task from a sweep's MLflow experiment (the median-dev-score or the
best-dev-score run of a variant) and writes CoLA.tsv ... AX.tsv (`index<TAB>prediction`, the label strings of
GLUE's files, STS-B clipped to [0, 5]) into a zip to upload at gluebenchmark.com:

    python -m electra_ablate.submit --store sqlite:///outputs/mlflow.db --experiment table5_efficiency \
        --variant electra --pick median --out submissions/electra.zip
"""

from __future__ import annotations

import argparse
import csv
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote, urlparse

import numpy as np

from electra_ablate.common import cli
from electra_ablate.common.io import atomic_file
from electra_ablate.glue import tasks as glue

TEST_ARTIFACT = "predictions/test_predictions.tsv"


class TestSplit(NamedTuple):
    """One unlabelled split a task's model predicts, and where its submission goes."""

    name: str  # split name in the predictions artifact
    file: str  # path under the GLUE directory (official download script layout)
    index: str  # index column of the TSV
    text_a: str  # text columns of the TSV
    text_b: str | None
    hf: tuple[str, str]  # (datasets configuration, split) in nyu-mll/glue
    submission: str  # file name the GLUE server expects


# Layouts of the GLUE download script's test files (BERT run_classifier.py: CoLA/SST-2 test read line[1] after
# the header, MRPC line[3], line[4], MNLI line[8], line[9]; QQP's index column is `id`). Submission names and
# the AX-with-MNLI convention: gluebenchmark.com's submission instructions (and the jiant/BERT submit scripts).
TEST_SPLITS: dict[str, tuple[TestSplit, ...]] = {
    "cola": (TestSplit("test", "CoLA/test.tsv", "index", "sentence", None, ("cola", "test"), "CoLA.tsv"),),
    "sst2": (TestSplit("test", "SST-2/test.tsv", "index", "sentence", None, ("sst2", "test"), "SST-2.tsv"),),
    "mrpc": (TestSplit("test", "MRPC/test.tsv", "index", "#1 String", "#2 String", ("mrpc", "test"), "MRPC.tsv"),),
    "stsb": (TestSplit("test", "STS-B/test.tsv", "index", "sentence1", "sentence2", ("stsb", "test"), "STS-B.tsv"),),
    "qqp": (TestSplit("test", "QQP/test.tsv", "id", "question1", "question2", ("qqp", "test"), "QQP.tsv"),),
    "mnli": (
        TestSplit("test_matched", "MNLI/test_matched.tsv", "index", "sentence1", "sentence2", ("mnli", "test_matched"),
                  "MNLI-m.tsv"),
        TestSplit("test_mismatched", "MNLI/test_mismatched.tsv", "index", "sentence1", "sentence2",
                  ("mnli", "test_mismatched"), "MNLI-mm.tsv"),
        TestSplit("ax", "diagnostic/diagnostic.tsv", "index", "sentence1", "sentence2", ("ax", "test"), "AX.tsv"),
    ),
    "qnli": (TestSplit("test", "QNLI/test.tsv", "index", "question", "sentence", ("qnli", "test"), "QNLI.tsv"),),
    "rte": (TestSplit("test", "RTE/test.tsv", "index", "sentence1", "sentence2", ("rte", "test"), "RTE.tsv"),),
    "wnli": (TestSplit("test", "WNLI/test.tsv", "index", "sentence1", "sentence2", ("wnli", "test"), "WNLI.tsv"),),
}
# The server's files in its listing order (AX, predicted with the MNLI model, last).
SUBMISSION_FILES = ["CoLA.tsv", "SST-2.tsv", "MRPC.tsv", "STS-B.tsv", "QQP.tsv", "MNLI-m.tsv", "MNLI-mm.tsv", "QNLI.tsv",
                    "RTE.tsv", "WNLI.tsv", "AX.tsv"]
assert sorted(SUBMISSION_FILES) == sorted(s.submission for splits in TEST_SPLITS.values() for s in splits)


class SubmitError(ValueError):
    """A submission that cannot be made (missing runs, artifacts or settings)."""


# --- reading the test splits ------------------------------------------------------------------------------


def read_test_tsv(task: glue.TaskSpec, split: TestSplit, glue_dir: str | Path) -> list[glue.Example]:
    """An unlabelled GLUE test file; each example's idx is the file's index column (what the server wants
    back), its label a placeholder 0."""
    path = Path(glue_dir) / split.file
    if not path.is_file():
        raise glue.GlueDataError(
            f"{path} not found: glue_data.predict_test=true needs the {task.name} test file(s) "
            f"{', '.join(s.file for s in TEST_SPLITS[task.name])} under glue_data.dir={glue_dir} (official GLUE "
            "download layout), or glue_data.source=hf"
        )
    with path.open(encoding="utf-8-sig", newline="") as f:  # -sig: a byte-order mark is dropped if present
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    needed = [c for c in (split.index, split.text_a, split.text_b) if c is not None]
    header = rows[0] if rows else []
    missing = [c for c in needed if c not in header]
    if missing:
        raise glue.GlueDataError(f"{path}: header {header} lacks column(s) {missing}; a {task.name} {split.name} "
                                 f"file needs columns {needed} (GLUE test layout: header, index column, no labels)")
    cols = {c: header.index(c) for c in needed}
    zero = 0.0 if task.is_regression else 0
    examples = []
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise glue.GlueDataError(f"{path} line {line}: {len(row)} tab-separated fields, expected {len(header)} "
                                     f"(columns {header})")
        try:
            idx = int(row[cols[split.index]])
        except ValueError:
            raise glue.GlueDataError(f"{path} line {line}: index {row[cols[split.index]]!r} is not an integer") from None
        examples.append(glue.Example(idx, row[cols[split.text_a]],
                                     None if split.text_b is None else row[cols[split.text_b]], zero))
    return examples


def examples_from_hf_test(task: glue.TaskSpec, dataset) -> list[glue.Example]:
    """Unlabelled examples from a `datasets` GLUE test split, whose label column is -1 on every row."""
    a, b = task.hf_text
    needed = [c for c in (a, b, "idx") if c is not None]
    missing = [c for c in needed if c not in dataset.column_names]
    if missing:
        raise glue.GlueDataError(f"Hugging Face {task.name} test split lacks column(s) {missing}; expected {needed}, "
                                 f"got {dataset.column_names}")
    if "label" in dataset.column_names:
        labels = np.asarray(dataset["label"], dtype=float)
        if len(labels) and not np.all(labels == -1):
            raise glue.GlueDataError(f"Hugging Face {task.name}: a test split has labels -1; this one has "
                                     f"{sorted(set(labels.tolist()) - {-1.0})[:5]}: is it a dev split?")
    zero = 0.0 if task.is_regression else 0
    texts_b = [None] * len(dataset) if b is None else list(dataset[b])
    return [glue.Example(int(i), x, y, zero) for i, x, y in zip(dataset["idx"], dataset[a], texts_b)]


def load_test_splits(task: glue.TaskSpec, source: str, glue_dir: str | Path,
                     hf_path: str = "nyu-mll/glue") -> dict[str, list[glue.Example]]:
    """{split name: examples} of every test split the task's model predicts (MNLI: matched, mismatched, AX)."""
    out = {}
    for split in TEST_SPLITS[task.name]:
        if source == "tsv":
            out[split.name] = read_test_tsv(task, split, glue_dir)
        elif source == "hf":
            try:
                import datasets
            except ImportError as e:
                raise glue.GlueDataError("glue_data.source=hf needs `datasets`: pip install 'electra-ablate[hf]'") from e
            out[split.name] = examples_from_hf_test(task, datasets.load_dataset(hf_path, split.hf[0], split=split.hf[1]))
        else:
            raise glue.GlueDataError(f"unknown glue_data.source={source!r}; valid: tsv, hf")
        if not out[split.name]:
            raise glue.GlueDataError(f"task {task.name}: test split {split.name} has no examples")
    return out


# --- the artifact ------------------------------------------------------------------------------------------


def label_string(task: glue.TaskSpec, value) -> str:
    return f"{float(value):.6g}" if task.is_regression else task.tsv_labels[int(value)]


def write_test_predictions(path: Path, task: glue.TaskSpec, examples: dict[str, Sequence[glue.Example]],
                           predictions: dict[str, np.ndarray]) -> Path:
    """The run's test-predictions TSV (split, index, prediction), written to a temp name and renamed."""
    with atomic_file(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\", lineterminator="\n")
        writer.writerow(["split", "index", "prediction"])
        for split, exs in examples.items():
            writer.writerows([split, e.idx, label_string(task, p)] for e, p in zip(exs, predictions[split]))
    return path


def read_test_predictions(path: str | Path) -> dict[str, list[tuple[int, str]]]:
    out: dict[str, list[tuple[int, str]]] = {}
    with open(path, newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\")
        if next(reader, None) != ["split", "index", "prediction"]:
            raise SubmitError(f"{path}: not a test-predictions file")
        for split, index, prediction in reader:
            out.setdefault(split, []).append((int(index), prediction))
    return out


# --- the submission -----------------------------------------------------------------------------------------


def submission_rows(task: glue.TaskSpec, rows: Sequence[tuple[int, str]]) -> list[tuple[int, str]]:
    """`index, prediction` rows in index order; STS-B clipped to [0, 5] (the server's range)."""
    if task.is_regression:
        lo, hi = task.label_range
        rows = [(i, f"{min(max(float(p), lo), hi):.3f}") for i, p in rows]
    return sorted(rows)


def write_submission(predictions: dict[str, dict[str, list[tuple[int, str]]]], out: str | Path,
                     partial: bool = False) -> tuple[Path, list[str]]:
    """{task: {split: rows}} -> a zip of the GLUE server's files; returns (zip, files written). Every file is
    needed unless `partial`."""
    files: dict[str, str] = {}
    for task_name, splits in TEST_SPLITS.items():
        for split in splits:
            rows = predictions.get(task_name, {}).get(split.name)
            if rows is None:
                continue
            body = "".join(f"{i}\t{p}\n" for i, p in submission_rows(glue.get_task(task_name), rows))
            files[split.submission] = "index\tprediction\n" + body
    missing = [f for f in SUBMISSION_FILES if f not in files]
    if missing and not partial:
        raise SubmitError(f"no predictions for {', '.join(missing)}; the GLUE server needs all of "
                          f"{', '.join(SUBMISSION_FILES)} (pass --partial to write the others anyway)")
    out = Path(out)
    with atomic_file(out) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name in SUBMISSION_FILES:
            if name in files:
                z.writestr(name, files[name])
    return out, [f for f in SUBMISSION_FILES if f in files]


def pick_run(runs: Sequence, how: str):
    """The run with the median dev score (the lower middle one for an even count) or the best one."""
    ranked = sorted(runs, key=lambda r: (r.data.metrics["final/score"], int(r.data.tags.get("seed", 0))))
    if how == "best":
        return ranked[-1]
    if how == "median":
        return ranked[(len(ranked) - 1) // 2]
    raise SubmitError(f"--pick {how!r}: expected median or best")


def _artifact(client, run, tmp: str) -> Path | None:
    uri = urlparse(run.info.artifact_uri)
    if uri.scheme in ("", "file"):
        path = Path(unquote(uri.path)) / TEST_ARTIFACT
        return path if path.is_file() else None
    try:
        return Path(client.download_artifacts(run.info.run_id, TEST_ARTIFACT, tmp))
    except Exception:  # MlflowException: the run kept no test predictions
        return None


def has_test_predictions(client, run) -> bool:
    with tempfile.TemporaryDirectory(prefix="electra_ablate_submit_") as tmp:
        return _artifact(client, run, tmp) is not None


def collect_predictions(client, experiment: str, variant: str, how: str, step: int | None = None):
    """{task: {split: rows}} from the picked finished fine-tuning run of each task; and {task: run}."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise SubmitError(f"--experiment {experiment!r}: no such experiment in {client.tracking_uri}")
    runs = client.search_runs([exp.experiment_id], f"tags.kind = 'finetune' and tags.variant = '{variant}' and "
                              "attributes.status = 'FINISHED'", max_results=50000)
    if not runs:
        variants = {r.data.tags.get("variant") for r in client.search_runs(
            [exp.experiment_id], "tags.kind = 'finetune'", max_results=50000)}
        raise SubmitError(f"no FINISHED fine-tuning run of variant {variant!r} in experiment {experiment!r}; variants "
                          f"there: {', '.join(sorted(v for v in variants if v)) or 'none'}")
    predictions, picked = {}, {}
    with tempfile.TemporaryDirectory(prefix="electra_ablate_submit_") as tmp:
        for task_name in TEST_SPLITS:
            candidates = [r for r in runs if r.data.tags.get("task") == task_name and "final/score" in r.data.metrics]
            steps = {int(r.data.tags.get("pretrained_step", 0)) for r in candidates
                     if str(r.data.tags.get("pretrained_step", "0")).isdigit()}
            wanted = step if step is not None else max(steps, default=None)  # the final checkpoint by default
            candidates = [r for r in candidates if wanted is None or str(r.data.tags.get("pretrained_step")) == str(wanted)]
            with_test = [(r, p) for r in candidates if (p := _artifact(client, r, tmp)) is not None]
            if candidates and not with_test:
                raise SubmitError(f"{task_name}: none of the {len(candidates)} finished runs of variant {variant} kept "
                                  "test predictions; fine-tune with glue_data.predict_test=true")
            if not with_test:
                continue
            run = pick_run([r for r, _ in with_test], how)
            predictions[task_name] = read_test_predictions(dict((r.info.run_id, p) for r, p in with_test)[run.info.run_id])
            picked[task_name] = run
    return predictions, picked


@cli.one_line_errors
def main(argv: Sequence[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(
        prog="python -m electra_ablate.submit", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write the zip of GLUE test-set predictions the GLUE server expects (CoLA.tsv ... AX.tsv),\n"
        "from one fine-tuning run per task of a sweep's variant; the runs must have kept their test\n"
        "predictions (glue_data.predict_test=true).",
        epilog="example:\n  python -m electra_ablate.submit --experiment table5_efficiency --variant electra "
        "--pick median --out submissions/electra.zip")
    parser.add_argument("--store", default=None, help="tracking URI (default: $MLFLOW_TRACKING_URI, else "
                        "$ELECTRA_ABLATE_HOME/mlflow.db, else <checkout>/outputs/mlflow.db)")
    parser.add_argument("--experiment", required=True, help="the sweep's MLflow experiment (its name)")
    parser.add_argument("--variant", required=True, help="variant label whose runs are submitted")
    parser.add_argument("--pick", default="median", choices=("median", "best"), help="which run per task (dev score)")
    parser.add_argument("--step", type=int, default=None, help="pre-training step of the checkpoint (default: final)")
    parser.add_argument("--out", required=True, help="zip file to write")
    parser.add_argument("--partial", action="store_true", help="write the files there are predictions for")
    args = parser.parse_args(argv)
    from mlflow.tracking import MlflowClient

    from electra_ablate.tracking import runs as tracking

    client = MlflowClient(tracking.resolve_tracking_uri(args.store))
    predictions, picked = collect_predictions(client, args.experiment, args.variant, args.pick, args.step)
    path, written = write_submission(predictions, args.out, args.partial)
    for task_name, run in picked.items():
        print(f"{task_name}: run {run.info.run_id} (seed {run.data.tags.get('seed')}, dev score "
              f"{run.data.metrics['final/score']:.2f}, {args.pick})")
    print(f"wrote {path} with {', '.join(written)}")
    return path


if __name__ == "__main__":
    main()
