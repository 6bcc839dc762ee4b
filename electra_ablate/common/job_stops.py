"""A multirun's jobs stopped in processes of their own (joblib's loky workers, submitit's jobs, Ray's actors).

Such a job does not raise its stop: Hydra would hand the error back to the multirun's own process through the
job's `JobReturn`, whose `return_value` writes `Error executing job with overrides: [...]` and whose
`run_and_report` adds the HYDRA_FULL_ERROR hint around the stop's line. Instead the job writes what it stopped
into the multirun's folder (`<hydra.sweep.dir>/.stopped/`, on the shared file system the launcher already
needs) and returns. The multirun's own process collects those records when its launcher is done and ends with
one `stopped by <signal>: ...` line naming every stopped job, and the signal's exit status (common/cli.py).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from hydra.experimental.callback import Callback

from electra_ablate.common import stops

FOLDER = ".stopped"
_records: Path | None = None  # this multirun's folder of stop records (its own process only)


@dataclass(frozen=True)
class StoppedJob:
    """What a stopped job returns to its launcher: the signal and what it stopped."""

    signum: int
    what: str


class MultirunStops(Callback):
    """Hydra callback (conf/hydra/default.yaml): in a multirun's own process, names the folder its jobs record
    their stops in, emptied of an earlier multirun's records (the same `hydra.sweep.dir` run again)."""

    def on_multirun_start(self, config, **kwargs) -> None:
        global _records
        _records = Path(str(config.hydra.sweep.dir)).absolute() / FOLDER
        shutil.rmtree(_records, ignore_errors=True)


def record(signum: int) -> StoppedJob:
    """In a stopped job: write what it stopped for the multirun's own process (whole or not at all) and return
    the job's result."""
    from hydra.core.hydra_config import HydraConfig

    stopped = StoppedJob(int(signum), stops.what())
    hydra = HydraConfig.get()
    folder = Path(str(hydra.sweep.dir)).absolute() / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{hydra.job.num}.json"
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps({"signum": stopped.signum, "what": stopped.what, "job": hydra.job.num}))
    os.replace(partial, path)
    return stopped


def gather() -> int | None:
    """In a multirun's own process, once its launcher is done: report what each stopped job stopped (the
    command's one line carries it) and return the first job's signal, or None when no job was stopped. The
    records are removed."""
    global _records
    folder, _records = _records, None
    if folder is None or not folder.is_dir():
        return None
    found = []
    for path in folder.glob("*.json"):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # a record being written when its job was killed: the job's run says what happened
    shutil.rmtree(folder, ignore_errors=True)
    found.sort(key=lambda r: r["job"])
    counts: dict[str, int] = {}
    for job in found:
        counts[job["what"]] = counts.get(job["what"], 0) + 1
    for text, n in counts.items():  # "this job was not started ..." once for all queued jobs
        stops.report(text if n == 1 else f"{text} ({n} jobs)")
    return found[0]["signum"] if found else None


def end_multirun() -> None:
    """A multirun's own process once its launcher is done: when it or any of its jobs was stopped, the one line
    and the stop's status (128 + the signal)."""
    import sys

    gathered = gather()  # always: the records are what the line says, also when this process was signalled
    signum = stops.received() or gathered
    if signum is not None:
        print(stops.line(signum), file=sys.stderr, flush=True)
        sys.exit(stops.exit_status(signum))
