"""GPU placement of a local parallel multirun (hydra/launcher=joblib_gpu): the GpuSlot Hydra callback gives each
job a GPU of its own through lock files. It imports nothing of the sweep, so a job process loads it cheaply."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


def visible_gpus(cuda_visible_devices: str | None, nvidia_smi_indices: str | None) -> list[str]:
    """GPUs this machine lets jobs use: CUDA_VISIBLE_DEVICES when set, else nvidia-smi's indices."""
    if cuda_visible_devices is not None:
        return [g.strip() for g in cuda_visible_devices.split(",") if g.strip() and g.strip() != "-1"]
    if not nvidia_smi_indices:
        return []
    return [line.strip() for line in nvidia_smi_indices.splitlines() if line.strip()]


def gpu_candidates(visible: Sequence[str], job_num: int, bound: str | None) -> list[str]:
    """The GPUs a job may take, in the order to try them.

    A process that already ran a job on a GPU stays on it (its CUDA context is bound to that device and a
    new CUDA_VISIBLE_DEVICES would be ignored); otherwise job k tries GPU k mod n first, so concurrent jobs
    start on different GPUs, then any other: a GPU is only taken when its lock is free, so two jobs never
    share one even when jobs finish out of order (job number modulo n alone would collide then).
    """
    if not visible:
        return []
    if bound is not None:
        if bound not in visible:
            raise RuntimeError(f"this process is bound to GPU {bound}, which is not among the visible GPUs {list(visible)}")
        return [bound]
    start = job_num % len(visible)
    return list(visible[start:]) + list(visible[:start])


_BOUND_GPU: str | None = None  # the GPU this worker process was given by its first job
_ALL_GPUS_ENV = "ELECTRA_ABLATE_ALL_GPUS"  # the visible GPUs before a job narrowed CUDA_VISIBLE_DEVICES


class GpuSlot(Callback):
    """Hydra callback (hydra/launcher=joblib_gpu): each job of a local parallel multirun gets a GPU of its own.

    On job start the job takes the lock file of a free GPU (fcntl, released when the job ends or its process
    dies) and sets CUDA_VISIBLE_DEVICES to it before any CUDA call; a job finding every GPU busy waits. On a
    machine without GPUs it does nothing. SLURM (submitit) and Ray place jobs on GPUs themselves.
    """

    def __init__(self, lock_dir: str | None = None, poll_s: float = 2.0, gpus: str | None = None):
        self.lock_dir = Path(lock_dir or Path(tempfile.gettempdir()) / f"electra_ablate_gpus_{os.getuid()}")
        self.poll_s = poll_s
        self.gpus = gpus
        self._lock = None

    def _visible(self) -> list[str]:
        if self.gpus is not None:
            return visible_gpus(str(self.gpus), None)
        if _ALL_GPUS_ENV in os.environ:
            return visible_gpus(os.environ[_ALL_GPUS_ENV], None)
        smi = None
        if "CUDA_VISIBLE_DEVICES" not in os.environ:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                smi = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=30).stdout
        return visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), smi)

    def acquire(self, job_num: int) -> str | None:
        global _BOUND_GPU
        visible = self._visible()
        candidates = gpu_candidates(visible, job_num, _BOUND_GPU)
        if not candidates:
            return None
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        while True:
            for gpu in candidates:
                handle = open(self.lock_dir / f"gpu{gpu}.lock", "a+")
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    handle.close()
                    continue
                self._lock = handle
                os.environ.setdefault(_ALL_GPUS_ENV, ",".join(visible))
                os.environ["CUDA_VISIBLE_DEVICES"] = gpu
                _BOUND_GPU = gpu
                return gpu
            time.sleep(self.poll_s)

    def release(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        gpu = self.acquire(int(config.hydra.job.get("num") or 0))
        if gpu is not None:
            log.info("job %s runs on GPU %s", config.hydra.job.get("num"), gpu)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        self.release()
