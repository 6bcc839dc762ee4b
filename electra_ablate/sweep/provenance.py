"""Provenance of a sweep: package versions, hardware and platform of the machine that ran it (recorded on the
sweep's MLflow run, printed in the report)."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from importlib import metadata

PACKAGES = ("torch", "pytorch-lightning", "hydra-core", "omegaconf", "mlflow", "numpy", "pandas", "scipy",
            "tokenizers", "transformers")


def environment() -> dict[str, str]:
    """Package versions, hardware and platform of this process's machine."""
    versions = {}
    for name in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    gpus = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.strip().replace("\n", ", ")
    return {
        "python": platform.python_version(),
        "packages": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "hardware": f"{os.cpu_count()} CPU cores ({platform.machine()}); GPUs: {gpus or 'none'}",
        "platform": platform.platform(),
        "host": platform.node(),
    }
