"""DataLoader worker processes that start under every launcher (plain runs, Hydra's joblib launcher)."""

from __future__ import annotations

import multiprocessing


def worker_context(num_workers: int):
    """The multiprocessing context for DataLoader workers: the platform's default start method (fork on Linux).

    Inside a joblib worker (Hydra's joblib launcher) the process-wide default is loky's own start method,
    with which DataLoader workers fail to start (torch: "Got pickle error when attempting to start a worker
    Process"); naming the platform's method explicitly makes `runtime.num_workers` work under every launcher.
    """
    if num_workers == 0:
        return None
    return multiprocessing.get_context(multiprocessing.get_all_start_methods()[0])
