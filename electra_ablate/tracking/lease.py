"""One owner per run across machines: a lease object in the run's durable area (`lease.json`: host, pid, since,
renewed, token).

The local `IdentityLock` (tracking/store.py) keeps two processes of one machine apart; two machines that share only
the bucket need this. The lease is taken by a conditional create (S3's `If-None-Match: *`, a file system's
exclusive create); a store that cannot create conditionally gets create-then-verify: the lease is written, read
back after a settling pause and kept only if it is still ours. The owner renews it (the job's Lightning callback
at step ends, and every checkpoint); a lease not renewed for `lease_s` seconds has expired and the next job takes it
over, again written then verified. A lease of this machine whose process is gone is stale at once (the same command
run again after a SIGKILL). Expiry compares the owner's clock with the reader's: machines with clocks more than a
fraction of `lease_s` apart can take a lease over early.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid

import psutil

from electra_ablate.tracking.durable import DurableStoreError, RunArea, is_local

log = logging.getLogger(__name__)
NAME = "lease.json"
SETTLE_S = 1.0  # create-then-verify: how long a write is given to be overwritten by a racing one


class LeaseHeld(DurableStoreError):
    """Another job, on this machine or another, owns the run's lease."""


def _exists_error(error: BaseException) -> bool:
    """Whether a conditional create failed because the object is there (FileExistsError, S3's 412)."""
    return isinstance(error, FileExistsError) or "pre-condition" in str(error) or "PreconditionFailed" in str(error)


class Lease:
    """The lease of one run's durable area, held by this process between `acquire` and `release`."""

    def __init__(self, area: RunArea, what: str, clock=time.time):
        self.area, self.what, self.clock = area, what, clock
        self.path = f"{area.path}/{NAME}"
        self.ttl = area.settings.lease_s
        self.token = uuid.uuid4().hex
        self.since = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        self._due = 0.0

    def _record(self) -> bytes:
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": self.since,
                           "renewed": self.clock(), "lease_s": self.ttl, "token": self.token,
                           "what": self.what}).encode()

    def _read(self, tries: int = 3) -> dict | None:
        try:
            return json.loads(self.area.fs.cat_file(self.path))
        except FileNotFoundError:
            return None
        except ValueError:  # a store showing a lease being written: read it again after the pause
            if tries <= 1:
                raise DurableStoreError(
                    f"the lease {self.area.url}/{NAME} is not a lease record (unreadable after {3 * SETTLE_S:.0f} s); "
                    "if no job of this run is running, delete it and run the command again") from None
            time.sleep(SETTLE_S)
            return self._read(tries - 1)

    def _create(self) -> bool:
        """Create the lease if there is none; True when it is ours."""
        try:
            self.area.fs.pipe_file(self.path, self._record(), mode="create")
            return True
        except (NotImplementedError, TypeError, ValueError):
            if self.area.fs.exists(self.path):
                return False
            return self._write_and_verify()
        except Exception as error:  # noqa: BLE001 - the client's own type for "already there"
            if _exists_error(error):
                return False
            raise

    def _write_and_verify(self) -> bool:
        self.area.fs.pipe_file(self.path, self._record())
        time.sleep(SETTLE_S)
        held = self._read()
        return held is not None and held.get("token") == self.token

    def stale(self, held: dict) -> str | None:
        """Why `held` may be taken over (it expired, or its process on this machine is gone), else None."""
        age = self.clock() - float(held.get("renewed", 0))
        if age > float(held.get("lease_s", self.ttl)):
            return f"not renewed for {age:.0f} s"
        if held.get("host") == socket.gethostname() and not psutil.pid_exists(int(held.get("pid", -1))):
            return f"its process {held.get('pid')} on this machine is gone"
        return None

    def owner(self, held: dict) -> str:
        age = self.clock() - float(held.get("renewed", 0))
        left = float(held.get("lease_s", self.ttl)) - age
        return (f"host {held.get('host', '?')}, pid {held.get('pid', '?')}, since {held.get('since', '?')} (renewed "
                f"{age:.0f} s ago; it expires in {left:.0f} s unless renewed)")

    def acquire(self) -> None:
        """Take the lease, or raise LeaseHeld naming its owner."""
        def take() -> bool:
            if self._create():
                return True
            held = self._read()
            if held is None:  # released between the create and the read
                return self._create()
            why = self.stale(held)
            if why is None:
                raise LeaseHeld(f"{self.what} is owned by another job: {self.owner(held)}; lease "
                                f"{self.area.url}/{NAME}. "
                                "Wait for it to finish, or stop it: its lease is taken over once it expires")
            log.warning("taking over the lease of %s from %s: %s", self.what, self.owner(held), why)
            return self._write_and_verify()

        if is_local(self.area.fs):
            self.area.fs.makedirs(self.area.path, exist_ok=True)
        if not self.area.retried("taking the run's lease", take):
            held = self._read() or {}
            raise LeaseHeld(f"{self.what} was taken by another job at the same moment: {self.owner(held)}")
        self._due = self.clock() + self.ttl / 4

    def renew(self, force: bool = False, after: str = "") -> None:
        """Write the lease again when a quarter of its lifetime has passed (or `force`); a lease another job took
        over (this one was paused past its expiry) stops this job before it writes anything more."""
        if not force and self.clock() < self._due:
            return

        def renewal() -> None:
            held = self._read()
            if held is None or held.get("token") != self.token:
                who = self.owner(held) if held else "nobody (the lease was removed)"
                raise DurableStoreError(f"{self.what} lost its lease in {self.area.url} (now {who}): this job stops "
                                        "so that two jobs never write the same run; its local checkpoint is whole")
            self.area.fs.pipe_file(self.path, self._record())

        self.area.retried("renewing the run's lease", renewal, after)
        self._due = self.clock() + self.ttl / 4

    def release(self) -> None:
        """Remove the lease if it is still ours (a stopped job hands the run on at once)."""
        try:
            held = self._read()
            if held is not None and held.get("token") == self.token:
                self.area.fs.rm_file(self.path)
        except Exception as error:  # noqa: BLE001 - the store gone at the end: the lease expires on its own
            log.warning("the lease %s/%s was not removed (%s); it expires in %.0f s", self.area.url, NAME, error,
                        self.ttl)

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
