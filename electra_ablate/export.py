"""Command line: export a pre-training run (or a pre-trained directory) as Hugging Face transformers models.

    python -m electra_ablate.export <MLflow run id | pre-trained dir> <out dir> [--step N] [--overwrite]
        [--tracking-uri URI]

A run id is resolved through MLflow: the run's `checkpoint_path` tag (its final checkpoint) or, with
`--step`, the directory its `checkpoints` tag lists for that step. The store is `--tracking-uri`, else
`MLFLOW_TRACKING_URI`, else the configs' default store (`$ELECTRA_ABLATE_HOME/mlflow.db`, else
`<checkout>/outputs/mlflow.db`). What gets written is decided in
`electra_ablate.hf.exporting.export_pretrained`: `discriminator/` or `mlm/` (plus `copy_gate/` for All-Tokens MLM)
and `generator/`, each loadable with `from_pretrained(dir)` and `AutoTokenizer.from_pretrained(dir)`.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from electra_ablate.common import cli, stops
from electra_ablate.hf.convert import HFInteropError
from electra_ablate.hf.exporting import export_pretrained
from electra_ablate.tracking import store
from electra_ablate.tracking.runs import TAG_CHECKPOINT, TAG_KIND, TAG_PRETRAIN_RUN, default_tracking_uri
TAG_CHECKPOINTS = "checkpoints"  # JSON {step: dir}, written by pre-training
RUN_ID = re.compile(r"[0-9a-f]{32}")


def checkpoint_of_run(run_id: str, tracking_uri: str | None = None, step: int | None = None) -> Path:
    """The pre-trained directory an MLflow pre-training run recorded (final, or the one at `step`)."""
    from mlflow.exceptions import MlflowException

    uri = tracking_uri or default_tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).expanduser().is_file():
        raise HFInteropError(f"no MLflow store at {uri}; pass --tracking-uri or set MLFLOW_TRACKING_URI")
    try:
        tags = store.open_client(uri).get_run(run_id).data.tags  # a half-migrated store is refused
    except MlflowException as e:
        raise HFInteropError(f"MLflow run {run_id} not found in {uri}; check the id or --tracking-uri") from e
    if tags.get(TAG_KIND) == "finetune":
        raise HFInteropError(
            f"run {run_id} is a fine-tuning run; export its pre-training run {tags.get(TAG_PRETRAIN_RUN, '(unknown)')}"
        )
    if step is None:
        path = tags.get(TAG_CHECKPOINT)
        if not path:
            raise HFInteropError(
                f"run {run_id} has no {TAG_CHECKPOINT!r} tag: it is not a finished pre-training run "
                "(pass a pre-trained directory instead, e.g. <run dir>/pretrained/step_<N>)"
            )
        return Path(path)
    checkpoints = json.loads(tags.get(TAG_CHECKPOINTS, "{}"))
    if str(step) not in checkpoints:
        raise HFInteropError(
            f"run {run_id} has no checkpoint at step {step}; its steps: {sorted(map(int, checkpoints))}"
        )
    return Path(checkpoints[str(step)])


def resolve_source(source: str, tracking_uri: str | None = None, step: int | None = None) -> Path:
    """A pre-trained directory as given, or the one an MLflow run id points to."""
    path = Path(source).expanduser()
    if path.exists():
        if step is not None:
            raise HFInteropError(
                "--step picks a checkpoint of an MLflow run; for a directory, pass that checkpoint's directory"
            )
        return path
    if not RUN_ID.fullmatch(source):
        raise HFInteropError(
            f"{source!r} is neither an existing pre-trained directory nor an MLflow run id (32 hex characters)"
        )
    return checkpoint_of_run(source, tracking_uri, step)


def main(argv: list[str] | None = None) -> dict[str, Path]:
    parser = argparse.ArgumentParser(
        prog="python -m electra_ablate.export",
        description="Export a pre-training run (or a pre-trained directory) as Hugging Face transformers models:\n"
        "discriminator/ (or mlm/, plus copy_gate/ for All-Tokens MLM) and generator/, each loadable with\n"
        "from_pretrained(dir) and AutoTokenizer.from_pretrained(dir).",
        epilog="examples:\n  python -m electra_ablate.export <pre-training run id> exported/\n"
        "  python -m electra_ablate.export <run id> exported_50k/ --step 50000\n"
        "  python -m electra_ablate.export outputs/pretrain/<experiment>/<hash>/pretrained/final exported/",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", help="MLflow pre-training run id, or a pre-trained directory (<run>/pretrained/...)")
    parser.add_argument("out", type=Path, help="output directory (one sub-directory per exported network)")
    parser.add_argument(
        "--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI, else $ELECTRA_ABLATE_HOME/mlflow.db, "
        "else <checkout>/outputs/mlflow.db)"
    )
    parser.add_argument("--step", type=int, help="export the run's checkpoint at this step instead of the final one")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
    args = parser.parse_args(argv)
    directory = resolve_source(args.source, args.tracking_uri, args.step)
    try:
        written = export_pretrained(directory, args.out, overwrite=args.overwrite)
    except stops.Stopped:
        stops.report(f"the export of {directory} to {args.out} wrote nothing (it has no MLflow run); the same "
                     "command exports it")
        raise
    for name, path in written.items():
        print(f"{name}: {path}")
    return written


@cli.one_line_errors
def cli_main() -> None:
    """Console entry: a refused source or output ends in one line, and so does a stop (common/cli.py)."""
    main()


if __name__ == "__main__":
    cli_main()
