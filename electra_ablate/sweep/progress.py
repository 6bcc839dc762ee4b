"""A phase's multirun as the user watches it: its whole output kept in a log file beside the multirun's job
folders, its warnings and errors on the console, and one progress line each time a job ends (jobs done of the
jobs launched, elapsed time).

The jobs say when they end through the progress file (common/console.py `job`), which works under any
launcher that shares this machine's file system; the console never depends on parsing their log lines except
for the `warning:`/`error:` prefix that common/console.py gives the lines meant for the user.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections import deque
from pathlib import Path

from electra_ablate.common import console

POLL_S = 2.0
TAIL_LINES = 8  # of the log, shown when the multirun fails


def duration(seconds: float) -> str:
    """'42 s', '3 min 05 s', '1 h 02 min'."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class PhaseConsole:
    """Watches one phase's multirun process. `launched` is the number of jobs the multirun starts, `todo` those of
    them with work to do (a multirun is a product: the others find their work done and end at once)."""

    def __init__(self, phase: str, launched: int, log_path: Path, verbose: bool | None = None,
                 todo: int | None = None):
        self.phase, self.launched, self.log_path = phase, launched, Path(log_path)
        self.todo = launched if todo is None else todo
        self.progress_path = self.log_path.with_suffix(".progress.jsonl")
        self.verbose = console.verbose() if verbose is None else verbose
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.seen: list[dict] = []
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._tic = time.perf_counter()

    def popen_kwargs(self, env: dict[str, str]) -> dict:
        """What `subprocess.Popen` needs so that this console sees the multirun's output and its jobs' ends."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.progress_path.unlink(missing_ok=True)
        env = {**env, console.PROGRESS_ENV: str(self.progress_path)}
        return {"env": env, "stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "bufsize": 1,
                "errors": "replace"}

    def start(self, proc: subprocess.Popen) -> None:
        rest = f" ({self.launched} in the multirun, the others already done)" if self.launched != self.todo else ""
        print(f"{self.phase}: {self.todo} job(s) launched{rest}; log: {self.log_path}", flush=True)
        self._tic = time.perf_counter()
        self._threads = [threading.Thread(target=self._copy, args=(proc.stdout,), daemon=True),
                         threading.Thread(target=self._watch, daemon=True)]
        for t in self._threads:
            t.start()

    def finish(self, returncode: int) -> None:
        """Wait for the output to end, show the last progress, and on failure the log's last lines."""
        self._threads[0].join(timeout=30)
        self._stop.set()
        self._threads[1].join(timeout=10)
        self._report_new()
        failed = sum(1 for r in self.seen if r.get("status") != "done")
        summary = f"{self.phase}: {len(self.seen) - failed}/{self.launched} job(s) done"
        summary += f", {failed} failed" if failed else ""
        print(f"{summary} in {duration(time.perf_counter() - self._tic)}", flush=True)
        if returncode and not self.verbose:
            print(f"{self.phase}: the multirun exited with {returncode}; the end of {self.log_path}:", flush=True)
            for line in self.tail:
                print(f"  | {line}", flush=True)

    def _copy(self, stream) -> None:
        with open(self.log_path, "a", encoding="utf-8") as log:
            for line in stream:
                log.write(line)
                log.flush()
                text = line.rstrip("\n")
                if text.strip():
                    self.tail.append(text)
                if self.verbose or text.lower().startswith(("warning:", "error:")):
                    print(text, flush=True)

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            self._report_new()

    def _report_new(self) -> None:
        if not self.progress_path.is_file():
            return
        lines = self.progress_path.read_text(encoding="utf-8", errors="replace").splitlines()
        for line in lines[len(self.seen):]:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                break  # a line still being written: read again next time
            self.seen.append(record)
            status = "" if record.get("status") == "done" else f" ({record.get('status')})"
            print(f"  {self.phase} {len(self.seen)}/{self.launched}: {record.get('job')}{status}, "
                  f"{duration(time.perf_counter() - self._tic)} elapsed", flush=True)


def pythonpath_env(root: Path) -> dict[str, str]:
    """The environment of a phase's multirun: this one, with the checkout first on PYTHONPATH so that the jobs
    import electra_ablate from it whatever the working directory."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    return env
