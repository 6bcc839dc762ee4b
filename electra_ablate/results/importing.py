"""A results bundle into an MLflow store, through MLflow's client: the runs keep the ids they were made under
(tracking/origin.py), their tags, params, every metric point and their dev predictions.

Each run of the bundle is first matched against the store, with nothing written: a run already there under the
same id, or a finished run of the same kind and config hash (the same job run elsewhere), with the same results
(status, every metric's last value, the predictions' digest) is skipped; one with other results stops the whole
import, naming both. Then the new runs are written, each tagged `bundle.partial` until its last write, so the runs
of an import that died half-way are found and removed by the next one. An import takes the store's lock, and
refuses a store that a live process is writing (a RUNNING sweep record of a live pid, a RUNNING job whose
identity lock is held).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from mlflow.entities import Metric, Param, RunTag

from electra_ablate.report.predictions import PREDICTIONS_ARTIFACT
from electra_ablate.results.bundle import Bundle, BundleError
from electra_ablate.results.export import TAG_PARTIAL, every_run, run_predictions, read_predictions_tsv
from electra_ablate.sweep.provenance import process_gone
from electra_ablate.tracking import runs as tracking
from electra_ablate.tracking import store as tracking_store
from electra_ablate.tracking.origin import TAG_SOURCE_RUN
from electra_ablate.tracking.store import IdentityLock, RunBusyError

BATCH = 100  # MLflow's log_batch takes at most 100 params, 100 tags and 1,000 entries in all per call


@dataclass
class Imported:
    """What an import did: the runs written, the runs found already there, by the bundle's run id."""

    written: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _expand(value: str, paths: dict[str, str]) -> str:
    for name, path in paths.items():
        value = value.replace(name, path)
    return value


def _results_of_bundle(bundle: Bundle, run_id: str, metrics: pd.DataFrame, preds: pd.DataFrame) -> tuple:
    """(status, {metric: last value}, predictions digest) of a bundle run: what must agree with a run found."""
    status = bundle.table("runs").set_index("run_id").at[run_id, "status"]
    last = {}
    rows = metrics[metrics["run_id"] == run_id]
    if len(rows):
        order = rows.assign(s=rows["step"].astype(int), t=rows["timestamp"].astype(int)).sort_values(["s", "t"])
        last = {k: float(v) for k, v in order.groupby("key")["value"].last().items()}
    p = preds[preds["run_id"] == run_id]
    return status, last, _digest(p) if len(p) else None


def _results_of_store(client, run) -> tuple:
    found = run_predictions(client, run) if run.data.tags.get(tracking.TAG_KIND) == "finetune" else None
    return run.info.status, dict(run.data.metrics), _digest(found) if found is not None else None


def _digest(frame: pd.DataFrame) -> str:
    cols = ["split", "index", "label", "prediction"]
    return hashlib.sha256(frame[cols].to_csv(index=False, lineterminator="\n").encode()).hexdigest()


def _same(a: tuple, b: tuple) -> bool:
    (sa, ma, pa), (sb, mb, pb) = a, b
    close = ma.keys() == mb.keys() and all(ma[k] == mb[k] or (ma[k] != ma[k] and mb[k] != mb[k]) for k in ma)
    return sa == sb and close and pa == pb


def live_writers(client, experiment: str, output_root: Path) -> list[str]:
    """Runs of `experiment` that a live process is writing now, one line each."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    out = []
    running = client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'", max_results=10000)
    for r in running:
        kind, cfg_hash = r.data.tags.get(tracking.TAG_KIND), r.data.tags.get(tracking.TAG_CONFIG_HASH)
        if kind == "sweep" and r.data.tags.get("pid") and not process_gone(r.data.tags):
            if r.data.tags.get("host") and r.data.tags.get("boot_id"):
                out.append(f"sweep {r.data.tags.get('sweep')} (pid {r.data.tags.get('pid')}, MLflow run {r.info.run_id})")
            continue
        lock = output_root / str(kind) / experiment / str(cfg_hash) / "run.lock"
        if kind in ("pretrain", "finetune") and cfg_hash and lock.is_file():
            try:
                with IdentityLock(lock, f"{kind} run {r.info.run_id}"):
                    pass
            except RunBusyError:
                out.append(f"{kind} run {r.info.run_id} ({r.data.tags.get('variant', '')} "
                           f"{r.data.tags.get('task', '')} seed {r.data.tags.get('seed', '')})".replace("  ", " "))
    return out


def _plan(bundle: Bundle, client, experiment_id: str) -> tuple[dict[str, str], list[str]]:
    """{bundle run id: store run id} of the runs already there, and the new ones; raises on a conflict."""
    every = every_run(client, experiment_id)
    by_id = {r.info.run_id: r for r in every}  # OriginClient: an imported run under its original id
    finished = {}
    for r in every:
        key = (r.data.tags.get(tracking.TAG_KIND), r.data.tags.get(tracking.TAG_CONFIG_HASH))
        if r.info.status == "FINISHED" and key[1]:
            finished.setdefault(key, r)
    runs, tags = bundle.table("runs"), bundle.table("tags")
    hashes = tags[tags["key"] == tracking.TAG_CONFIG_HASH].set_index("run_id")["value"].to_dict()
    metrics, preds = bundle.table("metrics"), bundle.table("predictions")
    there, new = {}, []
    for rid, kind, status in zip(runs["run_id"], runs["kind"], runs["status"]):
        match = by_id.get(rid)
        if match is None and status == "FINISHED" and hashes.get(rid):
            match = finished.get((kind, hashes[rid]))
            if match is not None and kind != "finetune":  # fine-tuning runs name their pre-training run by its id
                raise BundleError(
                    f"run {rid} of the bundle and run {match.info.run_id} of the store are two finished {kind} runs "
                    f"of one job (config {hashes[rid]}): two networks, and the bundle's fine-tuning runs were made "
                    "from its own; nothing was imported. Import into a store without that run (a new "
                    "ELECTRA_ABLATE_HOME), or into the store the bundle came from")
        if match is None:
            new.append(rid)
            continue
        theirs, ours = _results_of_store(client, match), _results_of_bundle(bundle, rid, metrics, preds)
        if not _same(theirs, ours):
            raise BundleError(
                f"run {rid} of the bundle ({kind}, config {hashes.get(rid, '-')}) and run {match.info.run_id} of the "
                f"store are the same run with other results (status {ours[0]} / {theirs[0]}, metrics or predictions "
                "differ): nothing was imported. Keep one: import into another store, or delete one of the two runs")
        there[rid] = match.info.run_id
    return there, new


def _remove_partial(client, experiment_id: str) -> None:
    raw = getattr(client, "mlflow_client", client)
    for r in raw.search_runs([experiment_id], f"tags.`{TAG_PARTIAL}` = '1'", max_results=10000):
        raw.delete_run(r.info.run_id)


def _write_run(raw, experiment_id: str, rid: str, info: pd.Series, params, tags, metrics, preds,
               paths: dict[str, str]) -> str:
    """One run of the bundle into the store; returns its new MLflow id."""
    run = raw.create_run(experiment_id, start_time=int(info["start_time"]) if info["start_time"] else None,
                         tags={TAG_PARTIAL: "1", TAG_SOURCE_RUN: rid}, run_name=info["run_name"] or None)
    new = run.info.run_id
    p = [Param(k, _expand(v, paths)) for k, v in zip(params["key"], params["value"])]
    t = [RunTag(k, _expand(v, paths)) for k, v in zip(tags["key"], tags["value"])]
    m = [Metric(k, float(v), int(ts), int(s))
         for k, s, ts, v in zip(metrics["key"], metrics["step"], metrics["timestamp"], metrics["value"])]
    for i in range(0, len(p), BATCH):
        raw.log_batch(new, params=p[i:i + BATCH])
    for i in range(0, len(t), BATCH):
        raw.log_batch(new, tags=t[i:i + BATCH])
    for i in range(0, len(m), 1000):
        raw.log_batch(new, metrics=m[i:i + 1000])
    if len(preds):
        with tempfile.TemporaryDirectory(prefix="electra_ablate_import_") as tmp:
            path = Path(tmp) / Path(PREDICTIONS_ARTIFACT).name
            text = io.StringIO()
            writer = csv.writer(text, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\", lineterminator="\n")
            writer.writerow(["split", "index", "label", "prediction"])
            writer.writerows(preds[["split", "index", "label", "prediction"]].itertuples(index=False, name=None))
            path.write_text(text.getvalue())
            if _digest(read_predictions_tsv(path)) != _digest(preds):
                raise BundleError(f"run {rid}: its predictions do not survive being written as TSV; nothing more "
                                  "was imported (the runs written so far are removed by the next import)")
            raw.log_artifact(new, str(path), str(Path(PREDICTIONS_ARTIFACT).parent))
    raw.set_terminated(new, status=info["status"], end_time=int(info["end_time"]) if info["end_time"] else None)
    return new


def import_bundle(bundle: Bundle, client, experiment: str, output_root: Path, paths: dict[str, str]) -> Imported:
    """Merge `bundle` into `experiment` of `client`'s store; `paths` maps the bundle's placeholders to this
    machine's folders (results.export.placeholders, the other way)."""
    exp = client.get_experiment_by_name(experiment)
    experiment_id = exp.experiment_id
    lock = tracking_store.store_lock(client.tracking_uri)
    with lock if lock is not None else contextlib.nullcontext():
        busy = live_writers(client, experiment, output_root)
        if busy:
            raise BundleError(f"the store {client.tracking_uri} is being written by a running job: {busy[0]}"
                              + (f" and {len(busy) - 1} more" if len(busy) > 1 else "") + "; nothing was "
                              "imported. Import once it has stopped (or import into another store)")
        _remove_partial(client, experiment_id)
        there, new = _plan(bundle, client, experiment_id)
        raw = getattr(client, "mlflow_client", client)
        runs = bundle.table("runs").set_index("run_id")
        groups = {name: dict(tuple(bundle.table(name).groupby("run_id", sort=False)))
                  for name in ("params", "tags", "metrics", "predictions")}
        empty = {name: bundle.table(name).iloc[0:0] for name in groups}
        written = []
        for rid in new:
            parts = [groups[n].get(rid, empty[n]) for n in ("params", "tags", "metrics", "predictions")]
            written.append(_write_run(raw, experiment_id, rid, runs.loc[rid], *parts, paths))
        for new_id in written:  # whole: the marker goes last
            raw.delete_tag(new_id, TAG_PARTIAL)
    return Imported(new, list(there))
