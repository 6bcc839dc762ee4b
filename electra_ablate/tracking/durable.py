"""A run's resumable state on durable storage (`paths.durable_root`: any fsspec URL, e.g. s3://bucket/prefix),
so that a run outlives the machine it started on.

Each run has an area under the root, at the same relative path as its local folder (`pretrain/<experiment>/<config
hash>/`). Its checkpoints are step-named objects (`checkpoints/step-0000000400.ckpt`), each with a `.sha256`
sidecar, and `checkpoints/latest.json` (step, object, SHA-256, MLflow run id) is written only once the object and
its sidecar are whole, in one PUT (S3), or by a rename (a local or mounted file system): a process killed during an
upload leaves the pointer on the previous complete checkpoint. The newest `keep` checkpoints at or below the pointer
are kept; the rest, and leftovers above it of an upload that never finished, are removed after each new pointer. An
exported directory is uploaded file by file and its manifest (`pretrained/<name>.json`, each file's SHA-256) last.
A download checks every hash and never picks an object without a whole sidecar or manifest. The composition
follows Composer's autoresume (step-named objects and a pointer written after the upload) and
torch.distributed.checkpoint (metadata last).

A store that does not answer is retried with a doubling wait for `retry_s` seconds, then the job stops with one
`DurableStoreError` naming the store; the local checkpoint is whole either way. s3fs (the `durable` extra) is
imported by fsspec only for s3:// roots.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from electra_ablate.common import io

log = logging.getLogger(__name__)
KEY = "paths.durable_root"
POINTER = "checkpoints/latest.json"
_STEP_OBJECT = re.compile(r"step-(\d+)\.ckpt")
T = TypeVar("T")


class DurableStoreError(RuntimeError):
    """The durable store cannot be used (a bad URL, credentials, a missing bucket) or stopped answering."""


class _NotWhole(DurableStoreError):
    """A downloaded object that does not match its recorded SHA-256."""


@dataclass(frozen=True)
class Settings:
    """`paths.durable_*`: the root URL, the checkpoints kept, the lease's lifetime, the seconds spent retrying."""

    root: str
    keep: int = 3
    lease_s: float = 600.0
    retry_s: float = 120.0

    @classmethod
    def of(cls, paths) -> Settings | None:
        root = paths.get("durable_root")
        if root in (None, ""):
            return None
        try:
            return cls(str(root).rstrip("/"), int(paths.get("durable_keep", 3)),
                       float(paths.get("durable_lease_s", 600)), float(paths.get("durable_retry_s", 120)))
        except (TypeError, ValueError):
            raise DurableStoreError("paths.durable_keep, paths.durable_lease_s and paths.durable_retry_s must be "
                                    "numbers (the checkpoints kept; seconds)") from None

    def problems(self) -> list[str]:
        out = []
        if "://" not in self.root:
            out.append(f"{KEY}={self.root} is not a URL: give one with its scheme, e.g. s3://bucket/prefix or "
                       "file:///mnt/shared/electra (any fsspec URL)")
        if self.keep < 1:
            out.append(f"paths.durable_keep={self.keep} must be at least 1 (the checkpoints kept in the store)")
        if not 0 < 2 * self.retry_s < self.lease_s:
            out.append(f"paths.durable_retry_s={self.retry_s:g} must be positive and under half of "
                       f"paths.durable_lease_s={self.lease_s:g}: a job retrying a store must still renew its lease")
        return out


def filesystem(url: str, fresh: bool = False):
    """(fsspec filesystem, path) of `url`, or DurableStoreError naming the key and the fix; `fresh`: a new client,
    not one fsspec cached with the credentials of before."""
    import fsspec

    try:
        return fsspec.core.url_to_fs(url, **({"skip_instance_cache": True} if fresh else {}))
    except ImportError as error:
        raise DurableStoreError(f"{KEY}={url} needs the package {error.name or 'of its scheme'}: install it with "
                                "pip install 'electra-ablate[durable]' (s3fs for s3://)") from None
    except ValueError as error:
        raise DurableStoreError(f"{KEY}={url}: {error}; give an fsspec URL such as s3://bucket/prefix") from None


def is_local(fs) -> bool:
    """Whether `fs` is a file system of folders (local or mounted), where a write is seen before it is whole."""
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def _what_is_wrong(url: str, error: BaseException) -> str:
    """The fix for an error of the first contact with the store."""
    name = type(error).__name__
    text = str(error).splitlines()[0] if str(error) else name
    if name in ("NoCredentialsError", "PartialCredentialsError") or "credential" in text.lower():
        return (f"{KEY}={url}: no usable credentials ({text}); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                "(or AWS_PROFILE) for the store, and AWS_ENDPOINT_URL for a server other than AWS")
    if isinstance(error, PermissionError):
        return (f"{KEY}={url}: the store refused the credentials ({text}); check AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and that they may write under this prefix")
    if isinstance(error, FileNotFoundError):
        return (f"{KEY}={url}: the bucket or folder does not exist ({text}); create it (e.g. aws s3 mb "
                "s3://<bucket>) or name an existing one")
    return (f"{KEY}={url}: the store did not answer ({name}: {text}); check the URL, the network and, for a server "
            "other than AWS, AWS_ENDPOINT_URL")


def check(settings: Settings) -> None:
    """Bad input before compute: the URL parses, its package is installed, and a probe object can be written, read
    and removed under the root (credentials, bucket, permissions, the server answering)."""
    problems = settings.problems()
    if problems:
        raise DurableStoreError("; ".join(problems))
    fs, root = filesystem(settings.root, fresh=True)
    probe = f"{root}/.probe-{socket.gethostname()}-{os.getpid()}"
    try:
        if is_local(fs):  # a mounted file system: the folder above the root must exist (a typo makes no tree)
            if not fs.isdir(root.rsplit("/", 1)[0] or "/"):
                raise FileNotFoundError(f"no folder {root.rsplit('/', 1)[0]}")
            fs.makedirs(root, exist_ok=True)
        fs.pipe_file(probe, b"probe")
        if fs.cat_file(probe) != b"probe":
            raise OSError("a probe object read back different bytes")
        fs.rm_file(probe)
    except DurableStoreError:
        raise
    except Exception as error:  # noqa: BLE001 - every client error is a store that cannot be used: say which
        raise DurableStoreError(_what_is_wrong(settings.root, error)) from None


def whole_locally(path: Path, step: int | None = None) -> str:
    """The end of a failed upload's line: what is safe, and how to go on."""
    what = f"the checkpoint of step {step} at {path}" if step is not None else str(path)
    return f"; {what} is whole on the local disk: bring the store back and run the same command to resume"


class RunArea:
    """One run's area under the durable root: its checkpoints, their pointer and its exported directories."""

    def __init__(self, settings: Settings, relative: str):
        self.settings = settings
        self.url = f"{settings.root}/{relative.strip('/')}"
        self.fs, self.path = filesystem(self.url)

    def __str__(self) -> str:
        return self.url

    # --- retries ------------------------------------------------------------------------------------------------

    def retried(self, what: str, action: Callable[[], T], after: str = "") -> T:
        """`action()`, retried with a doubling wait (1 s, 2 s, ... at most 30 s) for `retry_s` seconds; then one
        DurableStoreError naming the store, what was not done and `after` (what is whole and how to go on)."""
        started, wait, tries = time.monotonic(), 1.0, 0
        while True:
            tries += 1
            try:
                return action()
            except DurableStoreError:
                raise
            except Exception as error:  # noqa: BLE001 - a client error of any kind: the store did not take it
                spent = time.monotonic() - started
                cause = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                if spent + wait > self.settings.retry_s:
                    raise DurableStoreError(
                        f"the durable store {self.url} ({KEY}) failed {what} in {tries} tries over {spent:.0f} s "
                        f"({cause}){after}") from None
                log.warning("durable store %s: %s failed (%s); trying again in %.0f s", self.url, what, cause, wait)
                time.sleep(wait)
                wait = min(2 * wait, 30.0)

    def _put_whole(self, relative: str, data: bytes) -> None:
        """One small object written whole: one PUT on an object store; a temporary and a rename on a file system."""
        target = f"{self.path}/{relative}"
        if is_local(self.fs):
            self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            tmp = f"{target}.tmp-{os.getpid()}"
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, target)
        else:
            self.fs.pipe_file(target, data)

    def _read_json(self, relative: str) -> dict | None:
        try:
            return json.loads(self.fs.cat_file(f"{self.path}/{relative}"))
        except FileNotFoundError:
            return None
        except ValueError:  # not whole (a store that shows partial objects): as if absent
            return None

    # --- checkpoints --------------------------------------------------------------------------------------------

    def pointer(self) -> dict | None:
        """The newest complete checkpoint's record, or None when there is none."""
        return self.retried("reading the checkpoint pointer", lambda: self._read_json(POINTER))

    def upload_checkpoint(self, local: Path, step: int, run_id: str | None) -> None:
        """Upload `local` (the whole checkpoint of `step`) as a step-named object, then its sidecar, then the
        pointer; then drop what is past the newest `keep`."""
        name = f"checkpoints/step-{step:010d}.ckpt"
        digest, size = io.sha256_file(local), local.stat().st_size
        after = whole_locally(local, step)

        def upload() -> None:
            if is_local(self.fs):
                self.fs.makedirs(f"{self.path}/checkpoints", exist_ok=True)
            self.fs.put_file(str(local), f"{self.path}/{name}")
            if self.fs.size(f"{self.path}/{name}") != size:
                raise OSError(f"{name} holds {self.fs.size(f'{self.path}/{name}')} bytes, not {size}")
            self._put_whole(f"{name}.sha256", digest.encode())
            self._put_whole(POINTER, json.dumps({
                "step": step, "object": name, "sha256": digest, "bytes": size, "mlflow_run_id": run_id,
                "host": socket.gethostname(), "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode())

        self.retried(f"uploading checkpoint step {step}", upload, after)
        self.retried("removing old checkpoints", lambda: self._prune(step), after)
        log.info("checkpoint of step %d uploaded to %s/%s", step, self.url, name)

    def _steps(self) -> dict[int, str]:
        """Step -> object name of the step-named checkpoints under the area (whole or not)."""
        try:
            names = self.fs.ls(f"{self.path}/checkpoints", detail=False, refresh=True)
        except FileNotFoundError:
            return {}
        found = (_STEP_OBJECT.fullmatch(n.rsplit("/", 1)[-1]) for n in names)
        return {int(m.group(1)): f"checkpoints/{m.group(0)}" for m in found if m}

    def _prune(self, pointed: int) -> None:
        steps = self._steps()
        kept = sorted((s for s in steps if s <= pointed), reverse=True)[: self.settings.keep]
        for step, name in steps.items():
            if step not in kept:
                for path in (f"{self.path}/{name}", f"{self.path}/{name}.sha256"):
                    if self.fs.exists(path):
                        self.fs.rm_file(path)

    def download_checkpoint(self, dest: Path, newer_than: int | None) -> int | None:
        """Put the newest complete checkpoint whose hash checks at `dest` (whole or not at all) when its step is above
        `newer_than`; returns its step, or None when nothing newer is whole in the store."""
        pointer = self.pointer()
        if pointer is None:
            return None
        candidates = [(pointer["step"], pointer["object"], pointer["sha256"])]
        for step, name in sorted(self._steps().items(), reverse=True):  # older kept ones, by their sidecars
            if step < pointer["step"]:
                sidecar = self.retried("reading a checkpoint's hash", lambda n=name: self._sidecar(n))
                candidates += [(step, name, sidecar)] if sidecar else []
        for step, name, digest in candidates:
            if newer_than is not None and step <= newer_than:
                return None
            try:
                with io.atomic_file(dest) as tmp:
                    self.retried(f"downloading checkpoint step {step}", lambda n=name, t=tmp: self._get(n, t))
                    if io.sha256_file(tmp) != digest:
                        raise _NotWhole(name)
            except _NotWhole:
                log.warning("%s/%s does not match its SHA-256: not used; trying an older one", self.url, name)
                continue
            log.info("checkpoint of step %d downloaded from %s/%s; its SHA-256 checks", step, self.url, name)
            return step
        return None

    def _sidecar(self, name: str) -> str | None:
        try:
            text = self.fs.cat_file(f"{self.path}/{name}.sha256").decode().strip()
        except FileNotFoundError:
            return None
        return text if re.fullmatch(r"[0-9a-f]{64}", text) else None

    def _get(self, name: str, local: Path) -> None:
        """Download one object; a missing one is not whole (removed by hand, or pruned since it was listed)."""
        try:
            self.fs.get_file(f"{self.path}/{name}", str(local))
        except FileNotFoundError:
            raise _NotWhole(name) from None

    # --- exported directories -----------------------------------------------------------------------------------

    def upload_dir(self, local: Path, name: str, step: int) -> None:
        """Upload the directory `local` as `pretrained/<name>/`, its manifest last (removed first when it is
        uploaded again, so a half-replaced directory is never listed as whole); nothing when the store's manifest
        already lists these files."""
        files = {p.relative_to(local).as_posix(): p for p in sorted(local.rglob("*")) if p.is_file()}
        record = {"step": step, "files": {rel: io.sha256_file(p) for rel, p in files.items()}}
        manifest = json.dumps(record).encode()
        target = f"{self.path}/pretrained/{name}"
        if self.manifest(name) == record:
            return  # the store holds these very files already

        def upload() -> None:
            if self.fs.exists(f"{target}.json"):
                self.fs.rm_file(f"{target}.json")
            for rel, path in files.items():
                if is_local(self.fs):
                    self.fs.makedirs(f"{target}/{rel}".rsplit("/", 1)[0], exist_ok=True)
                self.fs.put_file(str(path), f"{target}/{rel}")
            self._put_whole(f"pretrained/{name}.json", manifest)

        self.retried(f"uploading the exported network {name}", upload, whole_locally(local))
        log.info("exported network %s uploaded to %s/pretrained/%s", name, self.url, name)

    def manifest(self, name: str) -> dict | None:
        """The manifest of the exported directory `name` (its step and each file's SHA-256), or None."""
        return self.retried(f"reading the manifest of {name}", lambda: self._read_json(f"pretrained/{name}.json"))

    def download_dirs(self, dest: Path, wanted: Callable[[str], bool]) -> dict[str, tuple[int, Path]]:
        """Each exported directory of the store that `wanted(name)` and whose manifest is whole, put at
        `dest/<name>` (whole or not at all) once every file's hash checks: name -> (step, directory)."""
        def names() -> list[str]:
            try:
                listed = self.fs.ls(f"{self.path}/pretrained", detail=False, refresh=True)
            except FileNotFoundError:
                return []
            return [n.rsplit("/", 1)[-1][: -len(".json")] for n in listed if n.endswith(".json")]

        restored = {}
        for name in self.retried("listing the exported networks", names):
            manifest = self.manifest(name)
            if manifest is None or not wanted(name):
                continue
            try:
                with io.atomic_dir(dest / name) as tmp:
                    for rel, digest in manifest["files"].items():
                        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                        self.retried(f"downloading {name}/{rel}",
                                     lambda r=rel, t=tmp: self._get(f"pretrained/{name}/{r}", t / r))
                        if io.sha256_file(tmp / rel) != digest:
                            raise _NotWhole(f"pretrained/{name}/{rel}")
            except _NotWhole as missing:
                log.warning("%s/%s is not whole in the store: not restored", self.url, missing)
                continue
            restored[name] = (int(manifest["step"]), dest / name)
            log.info("exported network %s restored from %s", name, self.url)
        return restored
