"""A results bundle on disk: a sweep's MLflow runs as plain, gzip-compressed CSV tables that pandas (or any CSV
reader) opens without this package, and a manifest that names the sweep, its scale and recipes, the code, the
exports the runs came from and the SHA-256 of every table.

    manifest.json      schema, sweep, scale, MLflow experiment, report, recipes, code commit, counts, exports, files
    runs.csv.gz        run_id, kind, status, start_time, end_time (epoch ms), run_name
    params.csv.gz      run_id, key, value
    tags.csv.gz        run_id, key, value (MLflow's own `mlflow.*` tags included)
    metrics.csv.gz     run_id, key, step, timestamp, value: every logged point, not only the last
    predictions.csv.gz run_id, split, index, label, prediction: each fine-tuning run's dev predictions as logged

Every value is kept as the text MLflow holds (floats as Python's shortest round-trip repr), so a table read back
gives the same numbers to the bit. Paths below the store, the checkout and the data folder are written as
`$ELECTRA_ABLATE_HOME`, `$ELECTRA_ABLATE_ROOT` and `$ELECTRA_ABLATE_DATA`, so a bundle does not depend on where its
store lay. Rows are sorted and the gzip streams carry no
name or time: the same runs give the same bytes. No weights: the manifest lists the exported networks the runs
were fine-tuned from, relative to their store.

CSV rather than Parquet: the project has no Parquet engine among its dependencies (pyarrow is ~40 MB more to
install), the tables are a few MiB compressed, and a reviewer can read them with zcat.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from electra_ablate.common.io import atomic_dir

SCHEMA = 1
MANIFEST = "manifest.json"
COLUMNS = {
    "runs": ["run_id", "kind", "status", "start_time", "end_time", "run_name"],
    "params": ["run_id", "key", "value"],
    "tags": ["run_id", "key", "value"],
    "metrics": ["run_id", "key", "step", "timestamp", "value"],
    "predictions": ["run_id", "split", "index", "label", "prediction"],
}
SORT = {"runs": ["run_id"], "params": ["run_id", "key"], "tags": ["run_id", "key"],
        "metrics": ["run_id", "key", "step", "timestamp"], "predictions": ["run_id", "row"]}


class BundleError(RuntimeError):
    """A bundle that cannot be read or used as asked; the message names the file and the fix."""


@dataclass
class Bundle:
    """A sweep's runs as tables (every cell text) and what the manifest says of them."""

    manifest: dict
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)

    def table(self, name: str) -> pd.DataFrame:
        return self.tables.get(name, pd.DataFrame(columns=COLUMNS[name]))

    @property
    def run_ids(self) -> list[str]:
        return list(self.table("runs")["run_id"])


def _csv_bytes(frame: pd.DataFrame, name: str) -> bytes:
    """The table as CSV text, rows sorted, gzip'ed with no file name or time in its header."""
    frame = frame.copy()
    if name == "predictions":  # rows in their logged order within each run
        frame["row"] = frame.groupby("run_id", sort=False).cumcount()
    for col in ("step", "timestamp", "start_time", "end_time"):
        if col in frame:
            frame[col + "_n"] = pd.to_numeric(frame[col], errors="coerce")
    keys = [k + "_n" if k + "_n" in frame else k for k in SORT[name]]
    frame = frame.sort_values(keys, kind="stable")[COLUMNS[name]]
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(COLUMNS[name])
    writer.writerows(frame.astype(str).itertuples(index=False, name=None))
    return gzip.compress(text.getvalue().encode("utf-8"), compresslevel=9, mtime=0)


def write(bundle: Bundle, folder: str | Path) -> Path:
    """Write the bundle into `folder` (replaced whole, never half-written); the manifest gets each file's hash."""
    folder = Path(folder)
    files = {}
    blobs = {f"{name}.csv.gz": _csv_bytes(bundle.table(name), name) for name in COLUMNS}
    for fname, data in blobs.items():
        files[fname] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    manifest = {**bundle.manifest, "schema": SCHEMA, "files": files}
    with atomic_dir(folder) as staging:
        for fname, data in blobs.items():
            (staging / fname).write_bytes(data)
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    bundle.manifest = manifest
    return folder


def read(folder: str | Path) -> Bundle:
    """The bundle in `folder`, every file checked against its manifest's hash and schema."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise BundleError(f"{folder} is not a results bundle: it has no {MANIFEST}. Give the folder that "
                          "`python -m electra_ablate.results export` wrote (reports/<report>/runs)")
    try:
        manifest = json.loads(path.read_text())
    except ValueError as e:
        raise BundleError(f"{path} is not valid JSON ({e}): the bundle is damaged; export it again or take it "
                          "from git (git checkout -- <folder>)") from None
    if manifest.get("schema") != SCHEMA:
        raise BundleError(f"{path}: schema version {manifest.get('schema')!r}, this code reads version {SCHEMA}; "
                          "use the project's version that wrote it, or export the bundle again with this one")
    tables = {}
    for name in COLUMNS:
        fname = f"{name}.csv.gz"
        want = manifest.get("files", {}).get(fname, {}).get("sha256")
        file = folder / fname
        if want is None or not file.is_file():
            raise BundleError(f"{file} is missing or not in {path}: the bundle is incomplete; export it again or "
                              "take it from git")
        data = file.read_bytes()
        if hashlib.sha256(data).hexdigest() != want:
            raise BundleError(f"{file} does not match its SHA-256 in {path} (truncated or altered): export the "
                              "bundle again, or take it from git (git checkout -- <folder>)")
        tables[name] = pd.read_csv(io.BytesIO(gzip.decompress(data)), dtype=str, keep_default_na=False)
    return Bundle(manifest, tables)
