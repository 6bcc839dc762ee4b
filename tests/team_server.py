"""A team's MLflow server for the slow tests: PostgreSQL (its `initdb`, `pg_ctl` and `postgres`, on PATH or in
/usr/local/bin or Debian's /usr/lib/postgresql/<version>/bin) in a test folder on a free loopback port, and
`mlflow server` on it with its artifacts in an S3 bucket (tests/s3_server.py), which clients reach through the
server (`--artifacts-destination`: they need no S3 credentials). Run as root, PostgreSQL's tools run as the
`postgres` user, as PostgreSQL requires."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from s3_server import Seaweed, free_ports
from test_reliability import Server


def pg_bin() -> Path | None:
    """The folder of PostgreSQL's server tools, or None where they are absent."""
    found = shutil.which("pg_ctl") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), reverse=True)),
                                           None)
    return Path(found).parent if found else None


def missing() -> str | None:
    """Why a test PostgreSQL cannot start here, or None."""
    if pg_bin() is None:
        return "no PostgreSQL server tools (initdb, pg_ctl): apt-get install postgresql"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "run as root, PostgreSQL needs a `postgres` user to run as (apt-get install postgresql makes one)"
    return None


def _as_owner() -> list[str]:
    """The prefix that runs PostgreSQL's tools as a user it accepts (not root)."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


class Postgres:
    """A PostgreSQL cluster in a temporary folder of its own (pytest's are private to their user, and PostgreSQL runs
    as `postgres` under root), on 127.0.0.1 only, trusting local connections: a throw-away test server."""

    def __init__(self):
        self.folder, self.bin = Path(tempfile.mkdtemp(prefix="electra-ablate-pg-")), pg_bin()
        (self.port,) = free_ports(1)
        self.data = self.folder / "data"

    def start(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres")
        run = _as_owner()
        subprocess.run([*run, str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                        "-E", "UTF8"], check=True, capture_output=True)
        subprocess.run([*run, str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.folder / "pg.log"), "-w",
                        "-o", f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder}", "start"],
                       check=True, capture_output=True)
        import psycopg2

        con = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres")
        con.autocommit = True
        con.cursor().execute("CREATE DATABASE mlflow")
        con.close()

    @property
    def uri(self) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/mlflow"

    def stop(self) -> None:
        subprocess.run([*_as_owner(), str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "stop"],
                       capture_output=True)
        shutil.rmtree(self.folder, ignore_errors=True)


def team_mlflow(folder: Path, pg: Postgres, s3: Seaweed, bucket: str = "runs") -> Server:
    """`mlflow server` on 127.0.0.1 (a free port): runs in PostgreSQL, artifacts in `s3://<bucket>/mlflow`."""
    return Server(folder, pg.uri, f"s3://{bucket}/mlflow", s3.env(MLFLOW_S3_ENDPOINT_URL=s3.endpoint))
