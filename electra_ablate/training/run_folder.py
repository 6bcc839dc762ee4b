"""The files of a pre-training run's folder (`<output_root>/pretrain/<experiment>/<config hash>/`) that a resume
reads: Lightning's checkpoints.

Every checkpoint (periodic, or a stop's) is written to `checkpoints/last.ckpt`, over the previous one and whole or
not at all (training/build.py). Folders written before kept a stopped run's `last.ckpt` and put the resumed
process's periodic saves beside it (`last-v1.ckpt`, `last-v2.ckpt`, ...: ModelCheckpoint's version counter), so a
resume reads the checkpoint of the highest global step of them all, not `last.ckpt` by its name.
"""

from __future__ import annotations

import re
from pathlib import Path

LAST = "last.ckpt"  # where every checkpoint of a run is written
_LAST_NAMES = re.compile(r"last(?:-v(\d+))?\.ckpt")


def checkpoint_step(path: Path) -> int | None:
    """The global step of a Lightning checkpoint, or None when there is none (absent, or not whole)."""
    if not path.is_file():
        return None
    import torch

    try:
        return int(torch.load(path, map_location="cpu", weights_only=False, mmap=True)["global_step"])
    except Exception:  # noqa: BLE001 - unreadable: no step to name
        return None


def newest_checkpoint(folder: Path) -> Path | None:
    """The checkpoint a resume reads: of `last.ckpt` and the `last-v<N>.ckpt` of folders written before, the readable
    one of the highest global step (`last.ckpt` on a tie); None when there is none."""
    found = []
    for path in folder.glob("last*.ckpt") if folder.is_dir() else ():
        name = _LAST_NAMES.fullmatch(path.name)
        step = checkpoint_step(path) if name else None
        if step is not None:
            version = int(name.group(1)) if name.group(1) else -1
            found.append(((step, version == -1, version), path))
    return max(found, key=lambda item: item[0])[1] if found else None
