"""Provenance of a sweep: package versions, hardware and platform of the machine that ran it (recorded on the
sweep's MLflow run, printed in the report), and the process that runs it, so that a record left RUNNING by a
process that died (killed, or its machine's session ended) can be told from one still running."""

from __future__ import annotations

import contextlib
import os
import platform
from importlib import metadata

from electra_ablate.common import precision
from electra_ablate.tracking import attempts

PACKAGES = ("torch", "pytorch-lightning", "hydra-core", "omegaconf", "mlflow", "numpy", "pandas", "scipy",
            "tokenizers", "transformers")


def environment() -> dict[str, str]:
    """Package versions, hardware and platform of this process's machine."""
    versions = {}
    for name in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return {
        "python": platform.python_version(),
        "packages": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "hardware": f"{precision.describe_cpu()}, {os.cpu_count()} CPU cores ({platform.machine()}); "
                    f"GPUs: {attempts.gpu_names()}",
        "platform": platform.platform(),
        "host": platform.node(),
    }


BOOT_ID = "/proc/sys/kernel/random/boot_id"  # Linux: one value per boot of the machine


def _boot_id() -> str:
    """Linux's boot id; elsewhere (macOS) the boot's time, which psutil reads from the kernel."""
    try:
        return open(BOOT_ID).read().strip()
    except OSError:
        pass
    import psutil

    try:
        return f"booted-{psutil.boot_time():.0f}"
    except Exception:  # noqa: BLE001 - no boot to name: such records are never called gone
        return ""


def process() -> dict[str, str]:
    """Tags naming this process: its pid, the machine and the machine's boot (a pid is unique only within one)."""
    return {"pid": str(os.getpid()), "host": platform.node(), "boot_id": _boot_id()}


def process_gone(tags: dict) -> bool:
    """True only when the process that `tags` name (process()) is known to have ended: it ran on this machine
    in this boot and no process has its pid now. A record from another machine, another boot or with no pid
    is never called gone (a reused pid reads as alive, the safe side)."""
    pid, boot = tags.get("pid"), _boot_id()
    if not pid or not str(pid).isdigit() or not boot or tags.get("boot_id") != boot or tags.get("host") != platform.node():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, owned by another user
        return False
    return False
