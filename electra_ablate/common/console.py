"""What the entry points show on the console, and what only their log file keeps.

Every command (pretrain, finetune, sweep, report) writes its whole log to the file Hydra gives the job
(`<run dir>/<job name>.log`). The console, by default, shows the user's part of it: the outcome the command
prints, progress, and every warning or error of this project or of a library (a run that learned nothing, a
missing corpus, a fallback). Library chatter stays in the file: Lightning's start-up banners ("GPU available",
"Seed set to"), MLflow's database messages and library deprecation warnings. `--verbose` on the command line (or
ELECTRA_ABLATE_VERBOSE=1, which a sweep hands on to its jobs) shows everything, as before.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
import time
from pathlib import Path

VERBOSE_ENV = "ELECTRA_ABLATE_VERBOSE"
VERBOSE_FLAGS = ("--verbose", "-v")
PACKAGE_DIR = str(Path(__file__).resolve().parents[1])
# Libraries that give their loggers a console handler of their own (Lightning when imported before Hydra sets
# logging up, MLflow always): their records go through the root logger's handlers instead, so the file keeps them.
LIBRARY_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric",
                   "mlflow")


def take_verbose_flag(argv: list[str] | None = None) -> bool:
    """Remove `--verbose`/`-v` from the command line (Hydra does not know it) and remember it in the environment,
    which the jobs a sweep starts inherit; True when verbose output is on."""
    argv = sys.argv if argv is None else argv
    if any(a in VERBOSE_FLAGS for a in argv[1:]):
        argv[1:] = [a for a in argv[1:] if a not in VERBOSE_FLAGS]
        os.environ[VERBOSE_ENV] = "1"
    return verbose()


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


class ConsoleFilter(logging.Filter):
    """Passes warnings and errors, and info records marked `console` (extra={"console": True}); a Python warning
    (captured into the `py.warnings` logger) only when it was raised by this package's own code."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "py.warnings":
            return PACKAGE_DIR in str(record.args[0] if record.args else record.getMessage())
        return record.levelno >= logging.WARNING or bool(getattr(record, "console", False))


class ConsoleFormatter(logging.Formatter):
    """A record as the user reads it: the message, with `warning:` or `error:` before it."""

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        if record.name == "py.warnings":
            message = message.strip().splitlines()[0]
        if record.levelno >= logging.ERROR:
            return f"error: {message}"
        return f"warning: {message}" if record.levelno >= logging.WARNING else message


def _is_console(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)


def setup() -> None:
    """Route library loggers and Python warnings through the root logger (so Hydra's log file keeps them) and,
    unless verbose, filter the root logger's console handlers down to what the user needs. Call it first thing
    in a Hydra task function, after Hydra has configured logging."""
    import mlflow  # noqa: F401 - imported now, its logger's own handler is added now and removed below

    for name in LIBRARY_LOGGERS:
        lib = logging.getLogger(name)
        for handler in [h for h in lib.handlers if _is_console(h)]:
            lib.removeHandler(handler)
        lib.propagate = True
    logging.captureWarnings(True)
    if verbose():
        return
    for handler in logging.getLogger().handlers:
        if _is_console(handler) and not any(isinstance(f, ConsoleFilter) for f in handler.filters):
            handler.addFilter(ConsoleFilter())
            handler.setFormatter(ConsoleFormatter())


def say(logger: logging.Logger, message: str, *args) -> None:
    """An info record the console shows too (progress, where a result went)."""
    logger.info(message, *args, extra={"console": True})


# --- progress of a sweep's jobs --------------------------------------------------------------------------------

PROGRESS_ENV = "ELECTRA_ABLATE_PROGRESS"  # set by the sweep runner: the file its jobs append their records to
# Seconds between a sweep's progress lines (sweep/progress.py; default 60); its jobs report their step every half
# of it. The sweep's jobs inherit it with the rest of the environment.
PROGRESS_EVERY_ENV = "ELECTRA_ABLATE_PROGRESS_EVERY_S"
PROGRESS_EVERY_S = 60.0
_job: contextvars.ContextVar[str | None] = contextvars.ContextVar("job", default=None)  # the job `job` is around


class ConsoleError(ValueError):
    """A console setting (an environment variable) that cannot work."""


def progress_every() -> float:
    """Seconds between progress lines: ELECTRA_ABLATE_PROGRESS_EVERY_S, else 60."""
    raw = os.environ.get(PROGRESS_EVERY_ENV, "").strip()
    try:
        value = float(raw) if raw else PROGRESS_EVERY_S
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConsoleError(f"{PROGRESS_EVERY_ENV}={raw!r} must be a positive number of seconds (default "
                           f"{PROGRESS_EVERY_S:g}); unset it or give e.g. {PROGRESS_EVERY_ENV}=60")
    return value


def _append(record: dict) -> None:
    """One record as one short O_APPEND write to the sweep runner's progress file (whole even with jobs writing
    side by side), if there is one."""
    path = os.environ.get(PROGRESS_ENV)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


@contextlib.contextmanager
def job(name: str):
    """Around one job of a multirun: its heartbeats (`heartbeat`) carry `name`, and when it ends
    `{"job", "status", "seconds"}` is appended to the sweep runner's progress file, if there is one: "done",
    "stopped" (a signal or Ctrl-C: its run resumes) or "failed"."""
    tic = time.perf_counter()
    status = "failed"
    token = _job.set(name)
    try:
        yield
        status = "done"
    except KeyboardInterrupt:  # stops.Stopped is one
        status = "stopped"
        raise
    finally:
        _job.reset(token)
        _append({"job": name, "status": status, "seconds": round(time.perf_counter() - tic, 1)})


def reporting() -> bool:
    """Whether this process runs a job of a sweep that reads its heartbeats (inside `job`, with a progress file)."""
    return _job.get() is not None and bool(os.environ.get(PROGRESS_ENV))


def heartbeat(step: int, total: int, seconds_per_step: float | None) -> None:
    """How far the running job has got: `{"job", "step", "total", "seconds_per_step"}` appended to the sweep
    runner's progress file (a sweep's console shows it, sweep/progress.py); nothing outside a `job` or a sweep."""
    if not reporting():
        return
    try:
        _append({"job": _job.get(), "step": int(step), "total": int(total),
                 "seconds_per_step": None if seconds_per_step is None else round(float(seconds_per_step), 4)})
    except OSError as error:  # a shared file system's hiccup costs the console a line, never the job
        logging.getLogger(__name__).debug("heartbeat not written: %s", error)
