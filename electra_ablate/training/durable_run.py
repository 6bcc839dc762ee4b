"""A pre-training run's resumable state kept in the durable store (`paths.durable_root`, tracking/durable.py) while
it trains, and brought back to a machine that has none of it.

Before anything is built, the store is checked (`checked`: a bad URL, missing credentials or a missing bucket end
the command with one line). While the run trains, the run's lease (tracking/lease.py) says it is this job's; every
checkpoint is uploaded after it is written whole on the local disk (training/build.py `AtomicCheckpointIO`) and
every exported network after it is saved. A job that starts on a machine without the run's folder (or with an
older checkpoint than the store's) downloads the newest complete checkpoint and the exported networks, checks their
hashes and resumes. Unset (the default), nothing here runs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytorch_lightning as pl
from omegaconf import DictConfig

from electra_ablate.tracking import durable
from electra_ablate.tracking.lease import Lease
from electra_ablate.training import run_folder

log = logging.getLogger(__name__)


def checked(cfg: DictConfig) -> durable.Settings | None:
    """The durable store's settings, once the store has taken and given back a probe object; None when unset."""
    settings = durable.Settings.of(cfg.paths)
    if settings is not None:
        durable.check(settings)
    return settings


def area_path(cfg: DictConfig, store: Path) -> str:
    """The run's area under the durable root: its folder's path under `paths.output_root` (a run folder elsewhere:
    its last three parts, `pretrain/<experiment>/<config hash>`)."""
    root = Path(cfg.paths.output_root).absolute()
    store = store.absolute()
    return (store.relative_to(root) if store.is_relative_to(root) else Path(*store.parts[-3:])).as_posix()


class DurableRun:
    """The durable side of one pre-training run: its area, its lease, and the hooks that upload its state."""

    def __init__(self, settings: durable.Settings, relative: str, what: str):
        self.area = durable.RunArea(settings, relative)
        self.lease = Lease(self.area, what)
        self.run_id: str | None = None  # the MLflow run, once it is open: recorded in each checkpoint's pointer

    def restore_exports(self, store: Path, complete: Callable[[Path], bool]) -> None:
        """The exported networks the store holds whole and the local folder does not, put back and listed."""
        restored = self.area.download_dirs(store / "pretrained", lambda name: not complete(store / "pretrained" / name))
        if restored:
            saved = run_folder.read_exports(store)
            saved.update({str(step): path for step, path in restored.values()})
            run_folder.write_exports(store, saved)

    def restore_checkpoint(self, checkpoints: Path) -> int | None:
        """Download the store's newest complete checkpoint to `checkpoints/last.ckpt` when it is newer than the local
        one (or there is none); its step, else None."""
        newest = run_folder.newest_checkpoint(checkpoints)
        local = run_folder.checkpoint_step(newest) if newest is not None else None
        step = self.area.download_checkpoint(checkpoints / run_folder.LAST, local)
        if step is not None:
            log.info("resuming from the checkpoint of step %d of %s (the local folder had %s)", step, self.area,
                     f"step {local}" if local is not None else "none")
        return step

    def checkpoint_saved(self, path: Path, step: int) -> None:
        self.lease.renew(force=True, after=durable.whole_locally(path, step))
        self.area.upload_checkpoint(path, step, self.run_id)

    def exported(self, path: Path, step: int) -> None:
        self.area.upload_dir(path, path.name, step)


def fetch_checkpoint(cfg: DictConfig, store: Path) -> None:
    """In a process of a multi-process (DDP) run other than the first: the durable store's newest checkpoint put
    where this process reads it, when it is newer than the local one, as the first process does (this process's
    machine may not be the first's)."""
    settings = durable.Settings.of(cfg.paths)
    if settings is not None:
        DurableRun(settings, area_path(cfg, store), "").restore_checkpoint(store / "checkpoints")


class RenewLease(pl.Callback):
    """Renews the run's lease at step ends, once a quarter of its lifetime has passed (tracking/lease.py); it reads
    no tensor and draws no random number."""

    def __init__(self, lease: Lease):
        self.lease = lease

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.lease.renew()


@contextlib.contextmanager
def owned(settings: durable.Settings | None, cfg: DictConfig, store: Path, what: str) -> Iterator[DurableRun | None]:
    """The run's DurableRun with its lease held (None when no durable store is set); the lease is released at the
    end, however the run ends (a SIGKILL leaves it to expire, or to the same machine's next job at once)."""
    if settings is None:
        yield None
        return
    run = DurableRun(settings, area_path(cfg, store), what)
    with run.lease:
        yield run
