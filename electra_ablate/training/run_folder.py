"""The files of a pre-training run's folder (`<output_root>/pretrain/<experiment>/<config hash>/`) that a resume
reads: Lightning's checkpoints and the listing of the pre-trained exports.

Every checkpoint (periodic, or a stop's) is written to `checkpoints/last.ckpt`, over the previous one and whole or
not at all (training/build.py). Folders written before kept a stopped run's `last.ckpt` and put the resumed
process's periodic saves beside it (`last-v1.ckpt`, `last-v2.ckpt`, ...: ModelCheckpoint's version counter), so a
resume reads the checkpoint of the highest global step of them all, not `last.ckpt` by its name.

`checkpoints.json` maps an export's step to its directory relative to the run's folder, so the folder (or the
outputs folder holding it) can move. Listings written before named absolute paths: such a path is used where it
exists, else its tail under the run's folder.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from electra_ablate.common import io

LAST = "last.ckpt"  # where every checkpoint of a run is written
LISTING = "checkpoints.json"  # step -> pre-trained directory
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


def located(folder: Path, recorded: str) -> Path:
    """Where a directory that a listing of `folder` records is now: a relative path under `folder`; an absolute one
    (listings written before) as it is where it exists, else the longest tail of it that exists under `folder`
    (the folder moved), else as it is."""
    path = Path(recorded)
    if not path.is_absolute():
        return folder / path
    if path.exists():
        return path
    for start in range(1, len(path.parts)):
        moved = folder.joinpath(*path.parts[start:])
        if moved.exists():
            return moved
    return path


def read_exports(folder: Path) -> dict[str, Path]:
    """The run's exports so far (step -> directory), where they are now."""
    listing = folder / LISTING
    recorded = json.loads(listing.read_text()) if listing.is_file() else {}
    return {step: located(folder, path) for step, path in recorded.items()}


def write_exports(folder: Path, saved: dict[str, Path]) -> None:
    """Write the listing, each directory under `folder` relative to it (the others as they are)."""
    relative = {}
    for step, path in saved.items():
        path = Path(path)
        relative[step] = path.relative_to(folder).as_posix() if path.is_relative_to(folder) else str(path)
    io.write_text(folder / LISTING, json.dumps(relative, indent=1, sort_keys=True))
