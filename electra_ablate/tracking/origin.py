"""Runs imported from a results bundle answer to the MLflow run id they were made under.

A fine-tuning run's identity names its pre-training run by MLflow run id (`pretrained: <run id>` in its config
hash, `pretrain_run_id` in its tags), and MLflow's client gives every new run a fresh id, so a run copied into
another store could never be found by the sweep that made it. An import (electra_ablate.results) therefore tags
each run it writes with the id it had (`bundle.source_run`), and every client this package opens
(tracking/store.py) is an `OriginClient`: the runs it returns carry that id as `info.run_id`, and a call naming
the id reaches the run it was copied into. A store without imported runs reads exactly as MLflow's client
reads it; MLflow's own UI shows an imported run under its new id, with the old one in that tag.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from mlflow.entities import Run, RunInfo
from mlflow.exceptions import MlflowException
from mlflow.store.entities.paged_list import PagedList

TAG_SOURCE_RUN = "bundle.source_run"
# Client methods whose results are runs, and whose first argument (or `run_id`) names a run.
_RETURNS_RUNS = {"get_run", "search_runs", "get_parent_run"}
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")


def origin_id(run) -> str:
    """The id `run` is known by in run identities: its id in the store that made it."""
    return run.data.tags.get(TAG_SOURCE_RUN) or run.info.run_id


def is_imported(run) -> bool:
    """Whether `run` was written by an import from a results bundle."""
    return TAG_SOURCE_RUN in run.data.tags


def _as_origin(run: Run) -> Run:
    source = run.data.tags.get(TAG_SOURCE_RUN)
    if not source or source == run.info.run_id:
        return run
    proto = run.info.to_proto()
    proto.run_id, proto.run_uuid = source, source
    return Run(RunInfo.from_proto(proto), run.data, getattr(run, "inputs", None))


class OriginClient:
    """An MlflowClient in which imported runs go by their original ids (see the module's docstring)."""

    def __init__(self, client):
        self._client = client
        self._actual: dict[str, str] = {}  # original id -> the id MLflow gave the imported copy
        self._known: set[str] = set()  # ids MLflow has as they are (seen in a run, or found by get_run)

    @property
    def mlflow_client(self):
        """The wrapped MlflowClient: ids as MLflow has them (what an import writes with)."""
        return self._client

    def _seen(self, runs: Iterable[Run]) -> None:
        for r in runs:
            self._known.add(r.info.run_id)
            source = r.data.tags.get(TAG_SOURCE_RUN)
            if source and source != r.info.run_id:
                self._actual[source] = r.info.run_id

    def actual_id(self, run_id: str) -> str:
        """The id MLflow has for the run known as `run_id` (itself, unless it names an imported run)."""
        if run_id in self._actual:
            return self._actual[run_id]
        if run_id in self._known:
            return run_id
        try:
            self._client.get_run(run_id)
            self._known.add(run_id)
            return run_id
        except MlflowException:
            pass
        experiments = [e.experiment_id for e in self._client.search_experiments()]
        if experiments:
            found = self._client.search_runs(experiments, filter_string=f"tags.`{TAG_SOURCE_RUN}` = '{run_id}'",
                                             max_results=1)
            self._seen(found)
        return self._actual.get(run_id, run_id)

    def _mapped(self, name: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if "run_id" in kwargs and isinstance(kwargs["run_id"], str):
            kwargs = {**kwargs, "run_id": self.actual_id(kwargs["run_id"])}
        elif args and isinstance(args[0], str) and _RUN_ID.match(args[0]):
            args = (self.actual_id(args[0]), *args[1:])
        return args, kwargs

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            args, kwargs = self._mapped(name, args, kwargs)
            out = attr(*args, **kwargs)
            if isinstance(out, Run):  # create_run's too: a run made here is known as it is
                self._seen([out])
                return _as_origin(out) if name in _RETURNS_RUNS else out
            if name not in _RETURNS_RUNS or out is None:
                return out
            self._seen(out)
            runs = [_as_origin(r) for r in out]
            return PagedList(runs, out.token) if isinstance(out, PagedList) else runs

        return call
