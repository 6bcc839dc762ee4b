"""Write-then-rename: a reader (another job, a later run, a user) sees the old file or the new one, never half of
one, and a crash leaves only a hidden temporary behind, which the next write replaces or ignores.

`atomic_file` and `atomic_dir` hand out a temporary sibling of the target (same folder, so the final rename
stays on one file system) and put it in place only when the `with` block ends without an error. A temporary
file's name ends in `.tmp-<pid>` of its writer, so a cleanup can tell a killed writer's leftover (its process
is gone) from a file being written right now."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from electra_ablate.common import stops


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yields a temporary path to write; on success it replaces `path`, on failure it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp-{os.getpid()}")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; stores and caches are shared by every run and user
        with stops.deferred():  # a stop (SIGTERM) arriving now waits until the file is in place
            os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sha256_file(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (hex), read a MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding=encoding)
    return Path(path)


def write_bytes(path: str | Path, data: bytes) -> Path:
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


@contextlib.contextmanager
def atomic_dir(target: str | Path, replace: bool = True) -> Iterator[Path]:
    """Yields a temporary directory to fill; on success it becomes `target`, on failure it is removed.

    replace=True swaps out an existing `target` (a re-export, a re-rendered report). replace=False is for
    content-addressed caches: when another process (a second DDP rank, a parallel sweep job) put the same
    entry in place first, its copy is kept and ours dropped; the key names every input, so they are equal."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    tmp.chmod(0o755)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not replace:
        try:
            tmp.rename(target)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not target.is_dir():
                raise
        return
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    with stops.deferred():  # never stopped between moving the old one aside and putting the new one in place
        if target.exists():
            target.rename(old)
        tmp.rename(target)
    if old.is_dir():
        shutil.rmtree(old, ignore_errors=True)
    elif old.exists():
        old.unlink()
