"""MLflow plumbing shared by pre-training, fine-tuning, sweeps and the report.

One place decides where runs go (an embedded SQLite store under the outputs folder unless
`MLFLOW_TRACKING_URI` says otherwise), how the runs of an identity are found (`config_hash` and its legacy
spellings, tracking/identity.py), and how metrics are written (buffered and sent with `log_batch`: one SQLite
write costs ~8 ms).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from electra_ablate.common import stops
from electra_ablate.tracking import store
from electra_ablate.tracking.identity import (  # noqa: F401  (the run identity, re-exported where runs are found)
    DATA_DIR_SPELLING,
    IDENTITY_EXCLUDE,
    IDENTITY_TARGETS,
    NEW_KEY_DEFAULTS,
    TRAINER_IDENTITY_EXCLUDE,
    config_hash,
    identity,
    identity_hashes,
)

log = logging.getLogger(__name__)

# Tag names that the report and the sweep runner read.
TAG_KIND = "kind"  # pretrain | finetune
TAG_CONFIG_HASH = "config_hash"
TAG_SWEEP = "sweep"
TAG_VARIANT = "variant"
TAG_CHECKPOINT = "checkpoint_path"
TAG_PRETRAIN_RUN = "pretrain_run_id"
TAG_RANDOM_INIT = "random_init"  # "true" on fine-tuning runs from random weights shaped like a checkpoint

# Data provenance params (sha256 hex digests), logged beside the config but never part of its hash.
PARAM_VOCAB_SHA256 = "data.vocab_sha256"  # the vocab.txt that made the token ids (pre-training and fine-tuning)
PARAM_EXAMPLES_SHA256 = "data.examples_sha256"  # the packed pre-training examples
# The experiment kind MLflow 3.x records for classic model training (its UI's
# ExperimentKind.CUSTOM_MODEL_DEVELOPMENT): set on every experiment the harness creates. MLflow 3.17's UI picks
# the view from its global GenAI / Model training switch instead (GenAI by default), so links to the dashboard
# carry WORKFLOW_QUERY, which selects Model training and with it the runs table (docs/dashboard.md).
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
WORKFLOW_QUERY = "workflowType=machine_learning"


def dashboard_url(base: str, experiment_id: str, runs_view: bool = True) -> str:
    """The MLflow UI's page of an experiment (`base`: e.g. http://127.0.0.1:5000), on its runs table."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}" + (f"?{WORKFLOW_QUERY}" if runs_view else "")


def default_tracking_uri() -> str:
    """`MLFLOW_TRACKING_URI`, else the store of conf/paths/default.yaml: `$ELECTRA_ABLATE_HOME/mlflow.db`, else
    `<checkout>/outputs/mlflow.db`, whatever the working directory."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    root = Path(os.environ.get("ELECTRA_ABLATE_ROOT") or Path(__file__).resolve().parents[2])
    home = Path(os.environ.get("ELECTRA_ABLATE_HOME") or root / "outputs")
    return f"sqlite:///{home.expanduser().resolve()}/mlflow.db"


def resolve_tracking_uri(cfg_uri: str | None = None) -> str:
    """The config's value (whose default already reads `MLFLOW_TRACKING_URI`), else `default_tracking_uri()`;
    the parent folder of a SQLite file is created."""
    uri = cfg_uri or default_tracking_uri()
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///") :]).expanduser().parent.mkdir(parents=True, exist_ok=True)
    return uri


def artifact_root(uri: str) -> str | None:
    """Artifacts of an embedded SQLite store go beside the database, not into ./mlruns of the cwd."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///") :]).expanduser().resolve().parent / "mlartifacts").as_uri()
    return None  # a tracking server decides


class TrackingUnavailable(RuntimeError):
    """The MLflow tracking server stopped answering for longer than MLflow's own retries wait."""


def _unreachable(error: BaseException) -> bool:
    """Whether `error` is MLflow's HTTP client giving up on a server that does not answer (after its retries:
    MLFLOW_HTTP_REQUEST_MAX_RETRIES, 7 by default with backoff factor 2, about 4 minutes)."""
    text = str(getattr(error, "message", error))
    return isinstance(error, mlflow.exceptions.MlflowException) and text.startswith("API request to") and \
        " failed with " in text


def setup(tracking_uri: str | None, experiment: str) -> MlflowClient:
    # Never mlflow.set_tracking_uri(): it exports MLFLOW_TRACKING_URI, which would leak into later runs of
    # the same process (a multirun) that name another store.
    # A new SQLite store is created and migrated under a file lock, and a half-migrated one is refused (store.py).
    uri = resolve_tracking_uri(tracking_uri)
    client = store.open_client(uri)
    try:
        exists = client.get_experiment_by_name(experiment) is not None
    except mlflow.exceptions.MlflowException as error:
        if not _unreachable(error):
            raise
        raise TrackingUnavailable(
            f"the MLflow tracking server {uri} does not answer ({error}); nothing was run. Start it (or point "
            "MLFLOW_TRACKING_URI / logger.tracking_uri at one that answers) and run this again") from error
    if not exists:
        root = artifact_root(uri)
        lock = store.store_lock(uri)
        with lock if lock is not None else contextlib.nullcontext():
            try:
                client.create_experiment(experiment, artifact_location=f"{root}/{experiment}" if root else None,
                                         tags={TAG_EXPERIMENT_KIND: EXPERIMENT_KIND})
            except mlflow.exceptions.MlflowException:
                pass  # created concurrently by another job (a server store takes no lock)
    return client


def existing_client(tracking_uri: str | None, experiment: str) -> MlflowClient | None:
    """`setup`'s client when the store exists already (a tracking server's always does), else None: nothing is
    recorded there yet, and a SQLite store is not created only to find that out (a refused command leaves none)."""
    uri = tracking_uri or default_tracking_uri()
    path = store.sqlite_path(uri)
    if path is None:
        return setup(uri, experiment)  # a server that does not answer stops the command here, in one line
    return store.open_client(uri) if path.is_file() else None


def _search_hashes(client: MlflowClient, experiment: str, cfg_hash: str | Sequence[str], also: str = "",
                   max_results: int = 1000) -> list:
    """Runs tagged with any of the hashes (newest first); `also`: a filter every run must pass too. One search
    per hash: MLflow's filter has no IN for tags."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    runs = {}
    for h in [cfg_hash] if isinstance(cfg_hash, str) else cfg_hash:
        for r in client.search_runs([exp.experiment_id], filter_string=f"tags.{TAG_CONFIG_HASH} = '{h}'{also}",
                                    order_by=["attributes.start_time DESC"], max_results=max_results):
            runs[r.info.run_id] = r
    return sorted(runs.values(), key=lambda r: r.info.start_time or 0, reverse=True)[:max_results]


def find_finished_run(client: MlflowClient, experiment: str, cfg_hash: str | Sequence[str]):
    """The newest FINISHED run with this config hash (or any of these: `identity_hashes`), or None."""
    runs = _search_hashes(client, experiment, cfg_hash, " and attributes.status = 'FINISHED'", max_results=1)
    return runs[0] if runs else None


def flatten(d: Mapping, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = str(v)[:6000]  # MLflow's param value limit
    return out


def git_commit() -> str:
    try:
        root = Path(__file__).resolve().parents[2]
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def standard_tags(git: str | None = None) -> dict[str, str]:
    """MLflow's standard source tags, which its fluent API sets and `create_run` does not (the UI shows them): the
    commit, the entry point (relative to the checkout), the user."""
    entry, root = Path(sys.argv[0] if sys.argv and sys.argv[0] else "-").resolve(), Path(__file__).resolve().parents[2]
    return {"mlflow.source.git.commit": git or git_commit(), "mlflow.source.type": "LOCAL",
            "mlflow.source.name": entry.relative_to(root).as_posix() if entry.is_relative_to(root) else entry.name,
            "mlflow.user": os.environ.get("USER") or os.environ.get("LOGNAME") or str(os.getuid())}


TAG_ATTEMPTS = "attempts"  # how many processes have worked on this run (1 = it ran straight through)
TAG_RESTARTS = "restarts"  # JSON list: why and from which step each later attempt started
TAG_END_REASON = "end_reason"  # why a run ended other than FINISHED (signal, superseded, ...)


def next_attempt(run) -> int:
    """The number of the attempt that would take over `run` (an mlflow Run): its `attempts` tag plus one."""
    return int(run.data.tags.get(TAG_ATTEMPTS, "1")) + 1


class RunLogger:
    """One MLflow run: params and tags up front, metrics buffered and flushed in batches.

    A run taken over by a later process (`adopt`: a resume from a checkpoint, or a restart in place) keeps
    its metric history: each metric's newest logged step is read back, and the new process logs only later
    steps, so a resumed run records every step exactly once. A resumed run recomputes the steps after its
    checkpoint bit for bit (PretrainSystem carries the RNG and metric state), so the values it skips equal
    the ones already logged.
    """

    def __init__(self, client: MlflowClient, run_id: str, flush_every: int = 200,
                 logged_through: Mapping[str, int] | None = None):
        self.client = client
        self.run_id = run_id
        self.flush_every = flush_every
        self._buffer: list[Metric] = []
        self.logged_through = dict(logged_through or {})  # metric -> newest step already in the store
        self._unavailable: TrackingUnavailable | None = None  # set once the tracking server stopped answering
        self.finished = False  # its end (status) is written
        self.job_folder: Path | None = None  # this attempt's Hydra output folder: its log is recorded at the end
        self.attempt = 1

    @classmethod
    def start(
        cls,
        client: MlflowClient,
        experiment: str,
        run_name: str,
        tags: Mapping[str, str],
        params: Mapping[str, str] | None = None,
        parent_run_id: str | None = None,
    ) -> RunLogger:
        exp = client.get_experiment_by_name(experiment)
        all_tags = {**standard_tags(tags.get("git_commit")), **{k: str(v) for k, v in tags.items()}}
        all_tags["mlflow.runName"] = run_name
        all_tags[TAG_ATTEMPTS] = "1"
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = client.create_run(exp.experiment_id, run_name=run_name, tags=all_tags)
        logger = cls(client, run.info.run_id)
        if params:
            items = [Param(k, v) for k, v in params.items()]
            for i in range(0, len(items), 100):  # log_batch accepts at most 100 params per call
                client.log_batch(run.info.run_id, params=items[i : i + 100])
        return logger

    @classmethod
    def adopt(cls, client: MlflowClient, run, how: str, tags: Mapping[str, str] | None = None) -> RunLogger:
        """Continue `run` (an mlflow Run) in this process: mark it RUNNING, count the attempt and say `how`
        it goes on (e.g. "resumed from step 8", "restarted from step 0: no checkpoint")."""
        # RunData keeps the latest_metrics rows, whose step is each metric's newest step.
        logged = {m.key: int(m.step) for m in getattr(run.data, "_metric_objs", [])}
        attempts = next_attempt(run)
        restarts = json.loads(run.data.tags.get(TAG_RESTARTS, "[]"))
        restarts.append({"attempt": attempts, "how": how, "previous_status": run.info.status,
                         "at": time.strftime("%Y-%m-%d %H:%M:%S")})
        logger = cls(client, run.info.run_id, logged_through=logged)
        logger.attempt = attempts
        logger.set_tags({TAG_ATTEMPTS: attempts, TAG_RESTARTS: json.dumps(restarts), **(tags or {})})
        client.update_run(run.info.run_id, status="RUNNING")
        return logger

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        ts = int(time.time() * 1000)
        step = int(step)
        self._buffer.extend(Metric(k, float(v), ts, step) for k, v in metrics.items()
                            if step > self.logged_through.get(k, -1))
        if len(self._buffer) >= self.flush_every:
            self.flush()

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def record_job(self, folder: str | Path) -> None:
        """Keep this attempt's Hydra record with the run: `.hydra/` (the job's config, Hydra's, the overrides) now,
        its `*.log` files when the run ends, as artifacts under `job/attempt_<n>/` (a folder that does not exist,
        as in a test that composes its config, records nothing)."""
        folder = Path(folder)
        if not folder.is_dir():
            return
        self.job_folder = folder
        self.record_files(sorted((folder / ".hydra").glob("*.yaml")), f"job/attempt_{self.attempt}/.hydra")

    def record_files(self, paths: Sequence[Path], where: str) -> None:
        """Files (and folders, whole) as artifacts under `where`; one that cannot be recorded (a server away) is
        logged and left: a copy of the record never decides a run's outcome."""
        for path in paths:
            try:
                if path.is_dir():
                    self.client.log_artifacts(self.run_id, str(path), f"{where}/{path.name}")
                else:
                    self.client.log_artifact(self.run_id, str(path), where)
            except Exception as error:  # noqa: BLE001 - see above
                log.warning("run %s: %s was not recorded as an artifact (%s)", self.run_id, path, error)

    def flush(self) -> None:
        while self._buffer:
            chunk = self._buffer[:1000]
            try:
                self.client.log_batch(self.run_id, metrics=chunk)
            except mlflow.exceptions.MlflowException as error:
                if not _unreachable(error):
                    raise
                # A server away for longer than MLflow's retries: the run stops here rather than train on with
                # metrics it cannot record. The store holds every step up to the last checkpoint (flushed at
                # each one, and none is written after a failed flush), so a re-run resumes from it and logs
                # each later step once.
                steps = [m.step for m in self._buffer]
                self._unavailable = TrackingUnavailable(
                    f"the MLflow tracking server {self.client.tracking_uri} does not answer ({error}). Run "
                    f"{self.run_id} stops here with its metrics of steps {min(steps)}-{max(steps)} unsent; it stays "
                    "RUNNING in the store, its checkpoint is on disk. Once the server answers, run the same "
                    "command again: it resumes from the checkpoint and logs every later step once, with no gap")
                raise self._unavailable from error
            self._buffer = self._buffer[1000:]  # dropped only once written: a failed write is retried later

    def finish(self, status: str = "FINISHED", reason: str | None = None) -> None:
        if self._unavailable is not None:  # the server went away: nothing can end the run, the next attempt does
            raise self._unavailable
        try:
            self.flush()
        except TrackingUnavailable:
            raise
        except BaseException:
            self._end(status, reason)
            raise
        self._end(status, reason)

    def _end(self, status: str, reason: str | None) -> None:
        if self.job_folder is not None:
            self.record_files(sorted(self.job_folder.glob("*.log")), f"job/attempt_{self.attempt}")
        with stops.deferred():  # a stop arriving now waits until the status is written
            if reason:
                self.set_tags({TAG_END_REASON: reason[:5000]})
            self.client.set_terminated(self.run_id, status=status)
            self.finished = True


def end_status(error: BaseException) -> tuple[str, str]:
    """(MLflow status, reason) for a run stopped by `error`: a signal or Ctrl-C is KILLED, and so is any error
    after a stop signal (a DataLoader worker the same SIGTERM ended first); the rest FAILED."""
    signum = stops.received()
    if signum is not None:
        cause = error.__cause__ if isinstance(error, stops.Stopped) else error
        if cause is None or isinstance(cause, (KeyboardInterrupt, SystemExit)):
            return "KILLED", f"stopped by {stops.name(signum)}"
        first = (str(cause).strip().splitlines() or [""])[0]
        return "KILLED", f"stopped by {stops.name(signum)} (then {type(cause).__name__}: {first})"
    if isinstance(error, (KeyboardInterrupt, SystemExit)):
        return "KILLED", f"stopped by {type(error).__name__} (SIGINT/SIGTERM): {error}".rstrip(": ")
    return "FAILED", f"{type(error).__name__}: {error}"


def runs_of_identity(client: MlflowClient, experiment: str, cfg_hash: str | Sequence[str]) -> list:
    """Every run with this config hash (or any of these: `identity_hashes`), newest first."""
    return _search_hashes(client, experiment, cfg_hash)


def retire_stale(client: MlflowClient, runs, keep: str | None) -> list[str]:
    """Mark every RUNNING run of `runs` other than `keep` KILLED with a reason. Called under the identity
    lock, so no live process owns them: they are left over from a process that died."""
    retired = []
    for r in runs:
        if r.info.run_id != keep and r.info.status == "RUNNING":
            reason = (f"left RUNNING by a process that died; superseded by run {keep}" if keep
                      else "left RUNNING by a process that died")
            client.set_tag(r.info.run_id, TAG_END_REASON, reason)
            client.set_terminated(r.info.run_id, status="KILLED")
            retired.append(r.info.run_id)
    return retired


def runs_frame(client: MlflowClient, experiment: str, filter_string: str = "") -> pd.DataFrame:
    """All runs of an experiment as a pandas frame: run_id, experiment_id, status, start_time, end_time and
    `params.*`, `metrics.*` (latest value), `tags.*` columns."""
    exp = client.get_experiment_by_name(experiment)
    rows: list[dict] = []
    token = None
    while exp is not None:
        page = client.search_runs([exp.experiment_id], filter_string=filter_string, max_results=1000, page_token=token)
        for r in page:
            row = {"run_id": r.info.run_id, "experiment_id": r.info.experiment_id, "status": r.info.status,
                   "start_time": r.info.start_time, "end_time": r.info.end_time}
            row.update({f"params.{k}": v for k, v in r.data.params.items()})
            row.update({f"metrics.{k}": v for k, v in r.data.metrics.items()})
            row.update({f"tags.{k}": v for k, v in r.data.tags.items()})
            rows.append(row)
        token = page.token
        if not token:
            break
    return pd.DataFrame(rows)
