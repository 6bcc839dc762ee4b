"""A sweep's runs out of its MLflow store into a results bundle (results/bundle.py): everything its report reads.

The runs are the sweep's grid, as the report finds it (sweep/plan.py): every run of each pre-training job's
identity and of each fine-tuning job's config hashes, under each of the sweep's recipes, whatever its status,
and the sweep records (`kind=sweep`) of the sweep at its scale and those the runs name as their parent (a second
look such as `cpu_long_protocol` reads its base sweep's runs, and they come with it). Runs still RUNNING are left
out: a bundle holds what is done, and the manifest counts what it left out. Each run keeps its MLflow run id; a
run imported from a bundle is written back under the id it had there (the `bundle.source_run` tag), so a store
exported, imported and exported again gives the same bytes.
"""

from __future__ import annotations

import csv
import json
import re
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import unquote, urlparse

import pandas as pd

from electra_ablate.report.predictions import PREDICTIONS_ARTIFACT
from electra_ablate.results.bundle import COLUMNS, Bundle
from electra_ablate.sweep.compose import SweepContext, compose_session
from electra_ablate.sweep.plan import (checkpoints_of, finetune_hashes, pretrain_states, random_init_checkpoints,
                                       under_recipes)
from electra_ablate.sweep.spec import REPO_ROOT
from electra_ablate.tracking import runs as tracking

TAG_SOURCE_RUN = "bundle.source_run"  # on an imported run: its run id in the bundle (and the store it came from)
TAG_PARTIAL = "bundle.partial"  # on a run an import is still writing: removed last, so a dead import's runs are found
TAG_PARENT = "mlflow.parentRunId"
OWN_TAGS = (TAG_SOURCE_RUN, TAG_PARTIAL)
RUN_ID = re.compile(r"\b[0-9a-f]{32}\b")
# How a bundle writes the folders a store records, by the variables that set them (conf/paths/default.yaml).
STORE, CHECKOUT, DATA = "$ELECTRA_ABLATE_HOME", "$ELECTRA_ABLATE_ROOT", "$ELECTRA_ABLATE_DATA"


def placeholders(ctx: SweepContext, data_dir: str | None = None) -> dict[str, str]:
    """Absolute paths a store records -> the names a bundle writes instead (the longest first when applied)."""
    out = {}
    for name, path in ((STORE, ctx.output_root), (CHECKOUT, REPO_ROOT), (DATA, data_dir)):
        if path:
            for form in {str(Path(path)), str(Path(path).resolve())}:
                out[form] = name
    return out


def portable_text(value: str, paths: Mapping[str, str], ids: Mapping[str, str]) -> str:
    """`value` with the store's paths as placeholders and run ids as the bundle knows them."""
    for path in sorted(paths, key=len, reverse=True):
        value = value.replace(path, paths[path])
    return RUN_ID.sub(lambda m: ids.get(m.group(0), m.group(0)), value) if ids else value


def sweep_runs(ctx: SweepContext, client) -> list:
    """The runs of the sweep's grid (every status but RUNNING), its sweep records and the records they name."""
    exp = client.get_experiment_by_name(ctx.experiment)
    if exp is None:
        return []
    every = every_run(client, exp.experiment_id)
    wanted = _grid_hashes(ctx, client)
    keep = {r.info.run_id: r for r in every if r.data.tags.get(tracking.TAG_CONFIG_HASH) in wanted}
    records = {r.info.run_id: r for r in every if r.data.tags.get(tracking.TAG_KIND) == "sweep"}
    for r in records.values():
        if r.data.tags.get(tracking.TAG_SWEEP) == ctx.spec.name and r.data.tags.get("scale") == ctx.spec.scale_name:
            keep[r.info.run_id] = r
    for r in list(keep.values()):
        parent = r.data.tags.get(TAG_PARENT)
        if parent in records:
            keep[parent] = records[parent]
    return [r for r in keep.values() if r.info.status != "RUNNING"]


def running_left_out(ctx: SweepContext, client) -> int:
    exp = client.get_experiment_by_name(ctx.experiment)
    if exp is None:
        return 0
    wanted = _grid_hashes(ctx, client)
    return sum(r.info.status == "RUNNING" and r.data.tags.get(tracking.TAG_CONFIG_HASH) in wanted
               for r in every_run(client, exp.experiment_id))


def every_run(client, experiment_id: str) -> list:
    """Every active run of an experiment, page by page."""
    out, token = [], None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token)
        out += list(page)
        token = page.token
        if not token:
            return out


_HASHES: dict[tuple, set[str]] = {}


def _grid_hashes(ctx: SweepContext, client) -> set[str]:
    """Every config hash a job of the grid may carry: pre-training jobs' identities and each checkpoint's
    fine-tuning jobs under every recipe (current and legacy spellings)."""
    key = (str(ctx.spec.path), ctx.spec.scale_name, ctx.tracking_uri)
    if key in _HASHES:
        return _HASHES[key]
    states = pretrain_states(ctx, client)
    hashes: set[str] = set()
    with compose_session():
        for s in states:
            hashes.update(tracking.identity_hashes(ctx.compose_pretrain(s.job)))
    found = []
    for s in states:
        if s.run is not None:
            found += checkpoints_of(s, ctx.spec.checkpoints)[0]
    checkpoints = under_recipes(ctx.spec, found + random_init_checkpoints(ctx.spec, found))
    if checkpoints and ctx.spec.tasks and ctx.spec.seeds:
        for values in finetune_hashes(ctx, checkpoints).values():
            hashes.update(values)
    _HASHES[key] = hashes
    return hashes


def _history(client, run) -> Iterable[tuple]:
    for key in sorted(run.data.metrics):
        for m in client.get_metric_history(run.info.run_id, key):
            yield key, str(int(m.step)), str(int(m.timestamp)), repr(float(m.value))


def run_predictions(client, run) -> pd.DataFrame | None:
    """The run's dev predictions artifact as logged (every cell text), or None."""
    uri = urlparse(run.info.artifact_uri or "")
    if uri.scheme in ("", "file"):
        path = Path(unquote(uri.path)) / PREDICTIONS_ARTIFACT
        if not path.is_file():
            return None
    else:
        with tempfile.TemporaryDirectory(prefix="electra_ablate_bundle_") as tmp:
            try:
                path = Path(client.download_artifacts(run.info.run_id, PREDICTIONS_ARTIFACT, tmp))
            except Exception:  # MlflowException / OSError: no artifact
                return None
            return read_predictions_tsv(path)
    return read_predictions_tsv(path)


def read_predictions_tsv(path: Path) -> pd.DataFrame:
    with open(path, newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\"))
    return pd.DataFrame(rows[1:], columns=rows[0])


def export(ctx: SweepContext, client, data_dir: str | None = None) -> Bundle:
    """The sweep's runs as a bundle (not yet written: results.bundle.write)."""
    runs = sorted(sweep_runs(ctx, client), key=lambda r: r.info.run_id)
    ids = {r.info.run_id: r.data.tags[TAG_SOURCE_RUN] for r in runs if TAG_SOURCE_RUN in r.data.tags}
    paths = placeholders(ctx, data_dir)
    rows: dict[str, list] = {"runs": [], "params": [], "tags": [], "metrics": [], "predictions": []}
    for run in runs:
        rid = ids.get(run.info.run_id, run.info.run_id)
        tags = run.data.tags
        rows["runs"].append((rid, tags.get(tracking.TAG_KIND, ""), run.info.status, str(run.info.start_time or ""),
                             str(run.info.end_time or ""), run.info.run_name or ""))
        rows["params"] += [(rid, k, portable_text(v, paths, ids)) for k, v in run.data.params.items()]
        rows["tags"] += [(rid, k, portable_text(v, paths, ids)) for k, v in tags.items() if k not in OWN_TAGS]
        rows["metrics"] += [(rid, *point) for point in _history(client, run)]
        preds = run_predictions(client, run) if tags.get(tracking.TAG_KIND) == "finetune" else None
        if preds is not None:
            rows["predictions"] += [(rid, *row) for row in preds[["split", "index", "label", "prediction"]]
                                    .itertuples(index=False, name=None)]
    tables = {name: pd.DataFrame(values, columns=COLUMNS[name]) for name, values in rows.items()}
    return Bundle(manifest(ctx, runs, tables, ids, running_left_out(ctx, client)), tables)


def manifest(ctx: SweepContext, runs: list, tables: dict[str, pd.DataFrame], ids: Mapping[str, str],
             running: int) -> dict:
    """What the bundle is: the sweep, scale, experiment, recipes, code, the runs by kind and status, exports."""
    spec = ctx.spec
    counts: dict[str, dict[str, int]] = {}
    for r in runs:
        kind = counts.setdefault(r.data.tags.get(tracking.TAG_KIND, "other"), {})
        kind[r.info.status] = kind.get(r.info.status, 0) + 1
    exports = {}
    for r in runs:
        if r.data.tags.get(tracking.TAG_KIND) == "pretrain" and r.info.status == "FINISHED":
            saved = tables["tags"]
            row = saved[(saved["run_id"] == ids.get(r.info.run_id, r.info.run_id)) & (saved["key"] == "checkpoints")]
            if len(row):
                exports[ids.get(r.info.run_id, r.info.run_id)] = json.loads(row["value"].iloc[0])
    commits = sorted({r.data.tags.get("git_commit", "") for r in runs} - {""})
    return {"sweep": spec.name, "scale": spec.scale_name, "experiment": ctx.experiment, "report": spec.report_name,
            "sweep_file": f"sweeps/{spec.path.name}", "recipes": list(spec.recipes), "runs": counts,
            "run_commits": commits, "code_commit": tracking.git_commit(), "exports": exports,
            "running_left_out": running}
