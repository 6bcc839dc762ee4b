"""A phase's multirun as the user watches it: its whole output kept in a log file beside the multirun's job
folders, its warnings and errors on the console, one line each time a job ends (jobs done of the jobs launched,
elapsed time), and at most once a minute one line with every running job's step of its total and its time left.

The jobs report through the progress file (common/console.py): `job` appends a record when a job ends, and the
training loops' heartbeat (training/heartbeat.py) appends its step, its total and its recent seconds per step every
half minute. That works under any launcher whose jobs share this machine's file system; the console never
depends on parsing their log lines except for the `warning:`/`error:` prefix that common/console.py gives the
lines meant for the user. What the console shows of the phase (this module's own lines) goes into the log as well,
so the log alone says how far the jobs got; it grows by at most one progress line a minute.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path

from electra_ablate.common import console

POLL_S = 2.0
TAIL_LINES = 8  # of the log, shown when the multirun fails
STALE_REPORTS = 3  # a job whose last heartbeat is this many of its intervals old is shown with the report's age


def duration(seconds: float) -> str:
    """'42 s', '3 min 05 s', '1 h 02 min'."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def job_progress(record: dict, age_s: float, stale_s: float) -> str:
    """One running job as the progress line shows it: `bert-s0 1,200/9,000 (13%), 4 h 20 min left`, from its last
    heartbeat `record`, read `age_s` seconds ago (the time left counts down from it)."""
    step, total, rate = int(record.get("step", 0)), int(record.get("total") or 0), record.get("seconds_per_step")
    name = record.get("job")
    text = f"{name} {step:,}/{total:,} ({100 * step / total:.0f}%)" if total else f"{name} step {step:,}"
    if rate is not None and total:
        text += f", {duration(max(0.0, (total - step) * float(rate) - age_s))} left"
    elif total:
        text += ", time left not known yet"
    if age_s > stale_s:
        text += f" (no report for {duration(age_s)})"
    return text


class PhaseConsole:
    """Watches one phase's multirun process. `launched` is the number of jobs the multirun starts, `todo` those of
    them with work to do (a multirun is a product: the others find their work done and end at once). `every_s`:
    seconds between progress lines (default ELECTRA_ABLATE_PROGRESS_EVERY_S, else 60), handed on to the jobs,
    which report every half of it. `clock`: seconds, for the elapsed times and the interval (tests pass a fake)."""

    def __init__(self, phase: str, launched: int, log_path: Path, verbose: bool | None = None,
                 todo: int | None = None, every_s: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.phase, self.launched, self.log_path = phase, launched, Path(log_path)
        self.todo = launched if todo is None else todo
        self.progress_path = self.log_path.with_suffix(".progress.jsonl")
        self.verbose = console.verbose() if verbose is None else verbose
        self.every_s = console.progress_every() if every_s is None else float(every_s)
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.seen: list[dict] = []  # the jobs' end records, in the order they ended
        self.running: dict[str, tuple[dict, float]] = {}  # job -> (its last heartbeat, when it was read)
        self._offset = 0  # of the progress file, read up to here
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the log file is written by the output's copy and by this console's lines
        self._poll_lock = threading.Lock()  # poll() runs in the watch thread and in finish()
        self._log = None
        self.clock = clock
        self._tic = self._last_line = clock()

    def popen_kwargs(self, env: dict[str, str]) -> dict:
        """What `subprocess.Popen` needs so that this console sees the multirun's output and its jobs' progress."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.progress_path.unlink(missing_ok=True)
        env = {**env, console.PROGRESS_ENV: str(self.progress_path), console.PROGRESS_EVERY_ENV: repr(self.every_s)}
        return {"env": env, "stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "bufsize": 1,
                "errors": "replace"}

    def start(self, proc: subprocess.Popen) -> None:
        """Open the log and watch `proc`: its output copied to the log, the progress file polled."""
        self.open()
        self._threads = [threading.Thread(target=self._copy, args=(proc.stdout,), daemon=True),
                         threading.Thread(target=self._watch, daemon=True)]
        for t in self._threads:
            t.start()

    def open(self) -> None:
        """Open the phase's log and say what was launched (`start` does; a test then calls `poll` itself)."""
        self._log = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in finish()
        rest = f" ({self.launched} in the multirun, the others already done)" if self.launched != self.todo else ""
        self._say(f"{self.phase}: {self.todo} job(s) launched{rest}; log: {self.log_path}")
        self._tic = self._last_line = self.clock()

    def finish(self, returncode: int) -> None:
        """Wait for the output to end, show the last progress, and on failure the log's last lines."""
        if self._threads:
            self._threads[0].join(timeout=30)
            self._stop.set()
            self._threads[1].join(timeout=10)
        with self._poll_lock:
            self._report_new()
        ended = Counter(r.get("status") for r in self.seen)
        summary = f"{self.phase}: {ended.pop('done', 0)}/{self.launched} job(s) done"
        summary += "".join(f", {n} {status}" for status, n in sorted(ended.items(), key=str))
        self._say(f"{summary} in {duration(self.clock() - self._tic)}")
        with self._lock:
            if self._log is not None:
                self._log.close()
            self._log = None
        if returncode and not self.verbose:
            print(f"{self.phase}: the multirun exited with {returncode}; the end of {self.log_path}:", flush=True)
            for line in self.tail:
                print(f"  | {line}", flush=True)

    def _say(self, text: str) -> None:
        """A line of this console: on the console and in the phase's log."""
        print(text, flush=True)
        self._write(text + "\n")

    def _write(self, text: str) -> None:
        with self._lock:
            if self._log is not None:
                self._log.write(text)
                self._log.flush()

    def _copy(self, stream) -> None:
        for line in stream:
            self._write(line)
            text = line.rstrip("\n")
            if text.strip():
                self.tail.append(text)
            if self.verbose or text.lower().startswith(("warning:", "error:")):
                print(text, flush=True)

    def _watch(self) -> None:
        while not self._stop.wait(min(POLL_S, self.every_s / 4)):
            self.poll()

    def poll(self) -> None:
        """Read the jobs' new reports: a line for each job that ended, and the running jobs' line when it is due."""
        with self._poll_lock:
            self._report_new()
            self._show_running()

    def _records(self) -> list[dict]:
        """The whole records appended to the progress file since the last read (a line still being written waits
        for the next read; a line no JSON reads, e.g. torn on a file system without atomic appends, is skipped)."""
        try:
            with open(self.progress_path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self._offset += end
        records = []
        for line in data[:end].splitlines():
            try:
                records.append(json.loads(line))
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
        return [r for r in records if isinstance(r, dict)]

    def _report_new(self) -> None:
        now = self.clock()
        for record in self._records():
            job = str(record.get("job"))
            if "status" not in record:  # a heartbeat: the job's step so far
                if "step" in record:
                    self.running[job] = (record, now)
                continue
            self.running.pop(job, None)
            self.seen.append(record)
            status = "" if record.get("status") == "done" else f" ({record.get('status')})"
            self._say(f"  {self.phase} {len(self.seen)}/{self.launched}: {job}{status}, "
                      f"{duration(now - self._tic)} elapsed")

    def _show_running(self) -> None:
        """One line for every running job, at most once every `every_s` seconds."""
        now = self.clock()
        if not self.running or now - self._last_line < self.every_s:
            return
        self._last_line = now
        stale_s = STALE_REPORTS * self.every_s / 2
        jobs = [job_progress(record, now - seen, stale_s) for record, seen in self.running.values()]
        self._say(f"  {self.phase} running: {'; '.join(jobs)}")


def pythonpath_env(root: Path) -> dict[str, str]:
    """The environment of a phase's multirun: this one, with the checkout first on PYTHONPATH so that the jobs
    import electra_ablate from it whatever the working directory."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    return env
