"""Stopping by signal: Ctrl-C (SIGINT) and SIGTERM (a scheduler's time limit or preemption, Kubernetes, systemd,
`kill`) stop a command at a safe point, record what they stopped KILLED, and the command ends with one line and
exit status 128 + the signal (130, 143): a stop is never a success.

Every entry point runs under `handled()` (common/cli.py's `one_line_errors`). The first stop signal
- outside training raises `Stopped` where the program is, as Ctrl-C does;
- inside `fit` (Lightning's training loop) is recorded: training stops after the current step (pre-training
  saves its checkpoint at that step first), then `Stopped` is raised;
- inside `deferred()` (a file being put in place, a run's end being written) is recorded and raised when the
  block is over, so nothing is left half-written.
A later SIGTERM is ignored (the process is stopping already; a scheduler's SIGKILL ends it), a later Ctrl-C
raises at once. Whatever error ends the work after a stop (a DataLoader worker that a SIGTERM to the whole process
group ended first) is the stop's: `received()` says so, and the run is recorded KILLED, not FAILED.

A multirun's own process (`-m`) whose jobs run in processes of their own (joblib's loky workers, submitit's
jobs) hands the stop on to them: each job stops as above and fails its launcher's record of it; the multirun
then ends with the same exit status. A signal ignored when the process started (SIGINT in a script's background
job) stays ignored.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Seconds a multirun's own process waits for its stopped jobs (each ends its run after the current step) before
# it kills what is left of them.
STOP_GRACE_S = 60.0


class Stopped(KeyboardInterrupt):
    """A stop signal ended the work here; `step` is the training step it stopped after, when it stopped one."""

    def __init__(self, signum: int = signal.SIGINT, step: int | None = None):
        super().__init__(f"stopped by {name(signum)}")
        self.signum, self.step = int(signum), step


class _State:
    def __init__(self) -> None:
        self.received: int | None = None  # the first stop signal this process got
        self.pending = False  # a stop that arrived inside deferred(), raised when the block ends
        self.graceful: tuple[int, ...] = ()  # signals only recorded (inside fit)
        self.deferred = 0
        self.reports: list[str] = []  # what the stop ended and how to go on, for the one line
        self.multirun_parent = False  # a multirun's own process: jobs run in its job-host children
        self.signals: tuple[int, ...] = SIGNALS  # the stop signals handled now
        self.handoff: dict[int, Callable] = {}  # a scheduler's signal -> its own handler, called once stopped


_state = _State()


def name(signum: int) -> str:
    return signal.Signals(signum).name


def exit_status(signum: int) -> int:
    """The shell's status of a command a signal ended: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + int(signum)


def received() -> int | None:
    """The stop signal this process received, or None."""
    return _state.received


def reset() -> None:
    """Forget a stop (for tests that run entry points in their own process)."""
    global _state
    _state = _State()


def report(text: str) -> None:
    """Say what a stop ended and how the same command goes on; the entry point's one line carries it."""
    _state.reports.append(text)
    log.info("stopped: %s", text)


def forget_reports() -> None:
    """A new job of this process: what earlier jobs reported is theirs."""
    _state.reports.clear()


def what() -> str:
    """What the stop ended and how the same command goes on."""
    return "; ".join(_state.reports) or "no run was in progress; the same command does what is not done yet"


def line(signum: int) -> str:
    """The one console line of a stopped command."""
    return f"stopped by {name(signum)}: {what()}"


def signal_of(error: BaseException) -> int | None:
    """The stop signal behind `error`: the one received, else SIGINT for a KeyboardInterrupt (Ctrl-C with no
    handler of ours), else None (not a stop)."""
    if _state.received is not None:
        return _state.received
    if isinstance(error, Stopped):
        return error.signum
    if isinstance(error, KeyboardInterrupt):
        return signal.SIGINT
    return None


# --- the handler ------------------------------------------------------------------------------------------


def _handle(signum: int, frame) -> None:
    first = _state.received is None
    if first:
        _state.received = signum
        log.info("received %s: stopping", name(signum))
        _quiet_dataloader_workers()
        if _state.multirun_parent and _stop_job_hosts(signum):
            return
    elif signum != signal.SIGINT or _state.deferred:
        return  # already stopping: SIGTERM again (a scheduler, the sweep runner) changes nothing
    if first and signum in _state.graceful:
        return  # training stops after the current step (fit)
    if _state.deferred:
        _state.pending = True
        return
    raise Stopped(signum)


def _quiet_dataloader_workers() -> None:
    """A signal sent to the whole process group (a terminal's Ctrl-C, `kill -TERM -<group>`, SLURM) ends the
    DataLoader workers too; torch's SIGCHLD handler would then raise in the middle of the step this process
    finishes before it stops. It reports nothing a stop needs: it is set aside."""
    handler = signal.getsignal(signal.SIGCHLD)
    if getattr(handler, "__module__", "").startswith("torch.utils.data"):
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


@contextlib.contextmanager
def handled(multirun_parent: bool = False, also: tuple[int, ...] = ()) -> Iterator[None]:
    """SIGINT and SIGTERM stop the work in this block (see the module's docstring); the previous handlers are
    back afterwards. `multirun_parent`: this process launches a multirun's jobs (hands a stop on to them). `also`:
    a scheduler's signals that stop the work the same way and whose own handler `hand_off` then calls."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = tuple(dict.fromkeys((*SIGNALS, *also)))
    previous = {s: signal.getsignal(s) for s in signals}
    for s, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(s, _handle)
    saved = _state.multirun_parent, _state.signals, dict(_state.handoff)
    _state.multirun_parent = multirun_parent or _state.multirun_parent
    _state.signals = tuple(dict.fromkeys((*_state.signals, *also)))
    _state.handoff.update({s: previous[s] for s in also if callable(previous[s])})
    try:
        yield
    finally:
        _state.multirun_parent, _state.signals, _state.handoff = saved
        for s, handler in previous.items():
            if handler is not signal.SIG_IGN:
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def scheduler_signals() -> tuple[int, ...]:
    """In a job submitit runs (hydra/launcher=submitit_*, slurm_gpu): its signal of a time limit or a preemption
    (SIGUSR2 unless SUBMITIT_PREEMPT_SIGNAL names another), a stop like SIGTERM that is then handed on to
    submitit, which requeues the job."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return ()
    sig = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)
    return (sig,) if sig is not None else ()


def hand_off(signum: int) -> None:
    """Once the work is stopped and recorded: a scheduler's signal goes on to the handler it had (submitit's
    requeues a preempted or timed-out job and exits)."""
    handler = _state.handoff.get(signum)
    if handler is not None:
        log.info("handing %s on to the scheduler's handler", name(signum))
        handler(signum, None)


@contextlib.contextmanager
def deferred(raise_after: bool = True) -> Iterator[None]:
    """A stop arriving in this block (a file being renamed into place, a run's end being written) waits until
    the block is over, then is raised; with `raise_after=False` the work the block finished stands (a run that
    ended FINISHED) and the stop only keeps this process from starting more."""
    _state.deferred += 1
    try:
        yield
    finally:
        _state.deferred -= 1
    if not _state.deferred and _state.pending:
        _state.pending = False
        if raise_after:
            raise Stopped(_state.received or signal.SIGTERM)


@contextlib.contextmanager
def _graceful(signals: tuple[int, ...]) -> Iterator[None]:
    outer, _state.graceful = _state.graceful, signals
    try:
        yield
    finally:
        _state.graceful = outer


# --- training -----------------------------------------------------------------------------------------------


def fit(trainer, *args, on_stop: Callable | None = None, **kwargs) -> None:
    """`trainer.fit(*args, **kwargs)`, stopped by a signal after the current step.

    Lightning stops after the step on SIGTERM by itself (broadcast to every process of a DDP run); a callback
    added here does the same for SIGINT in a single process. Before Lightning tears down, `on_stop(trainer)`
    runs (pre-training saves its checkpoint at that step). Returns when training ended by itself; a stop, and any
    error after one, raises `Stopped` with the step it stopped after."""
    import pytorch_lightning as pl
    from pytorch_lightning.utilities.exceptions import SIGTERMException

    class StopAfterStep(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            # Several processes (DDP) stop together only through Lightning's broadcast of SIGTERM.
            if _state.received is not None and trainer.world_size == 1:
                raise SIGTERMException()

        def on_exception(self, trainer, pl_module, exception):
            # Raised between two steps only (here or by Lightning), so the state is a whole step's.
            if isinstance(exception, SIGTERMException) and _state.received is not None and on_stop is not None:
                on_stop(trainer)

    if _state.received is not None:  # stopped while the run was being set up: no step is taken
        raise Stopped(_state.received)
    trainer.callbacks.append(StopAfterStep())
    single = trainer.world_size == 1
    try:
        with _graceful(_state.signals if single else (signal.SIGTERM,)):
            trainer.fit(*args, **kwargs)
    except BaseException as error:
        signum = signal_of(error)
        if signum is None:
            raise
        raise Stopped(signum, trainer.global_step) from error
    if _state.received is not None or trainer.interrupted:
        raise Stopped(_state.received or signal.SIGINT, trainer.global_step)


# --- a multirun's own process: hand the stop on to its jobs ------------------------------------------------


def processes() -> dict[int, tuple[int, int, str]]:
    """Every live process: pid -> (parent pid, process group, command line: its arguments joined by NUL), read
    through psutil, so on macOS as on Linux."""
    import psutil

    out = {}
    for proc in psutil.process_iter(["ppid", "status", "cmdline"]):
        info = proc.info
        if info["status"] in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD) or info["ppid"] is None:
            continue
        try:
            group = os.getpgid(proc.pid)
        except OSError:  # ended meanwhile, or not ours to see
            continue
        out[proc.pid] = (info["ppid"], group, _joined(info["cmdline"]))
    return out


def _joined(cmdline: list[str] | None) -> str:
    return "\0".join(cmdline or ())


def job_hosts(members: dict[int, tuple[int, str]]) -> list[int]:
    """Of `members` (pid -> (parent pid, command line)), the processes that run jobs: those whose parent is not a
    member or has another command line (the multirun itself, joblib's loky workers, submitit's jobs), not the
    copies a job forks (DataLoader workers), which end with it: a worker killed under a running job would fail
    its run instead of stopping it."""
    return [pid for pid, (ppid, cmdline) in members.items()
            if ppid not in members or members[ppid][1] != cmdline]


def descendants(root: int) -> dict[int, tuple[int, str]]:
    """The live descendants of process `root`: pid -> (parent pid, command line)."""
    table = processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = (table[child][0], table[child][2])
            todo.append(child)
    return found


def send(pids, sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _stop_job_hosts(signum: int) -> bool:
    """In a multirun's own process: SIGTERM to the processes running its jobs (not joblib's resource tracker);
    True when there are any. A pool's workers (joblib) live on after their job: the stopped jobs come back to the
    launcher as failed and the multirun ends by itself. Jobs in processes of their own (submitit) are waited for
    (at most STOP_GRACE_S, then killed), and then this process stops."""
    me = os.getpid()
    found = descendants(me)
    hosts = [p for p in job_hosts({me: (os.getppid(), _cmdline(me)), **found}) if p != me and p in found
             and "resource_tracker" not in found[p][1]]
    if not hosts:
        return False
    if any("loky" in found[p][1] for p in hosts):
        # A pool's idle worker would die of SIGTERM, and joblib would then kill the busy ones outright.
        send([p for p in hosts if _marker(p).exists()], signal.SIGTERM)
        log.info("handed %s on to the multirun's busy workers", name(signum))
        return True  # the workers stay; the multirun ends when every job has come back, stopped or not started
    log.info("handing %s on to the multirun's jobs (pids %s)", name(signum), hosts)
    send(hosts, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and any(p in descendants(me) for p in hosts):
        time.sleep(0.2)
    left = [p for p in descendants(me) if p in hosts or p in found]
    send(left, signal.SIGKILL)
    raise Stopped(signum)


def _marker(pid: int) -> Path:
    """The file that says process `pid` (this very process: its start time is in the name) runs a job now."""
    import psutil

    try:
        started = f"{psutil.Process(pid).create_time():.2f}"
    except psutil.Error:
        started = "gone"
    return Path(tempfile.gettempdir()) / f"electra_ablate_jobs_{os.getuid()}" / f"{pid}-{started}"


@contextlib.contextmanager
def job_running() -> Iterator[None]:
    """Marks this process (a launcher's worker) as running a job while the block runs: a stopped multirun hands
    the stop on to such workers only."""
    marker = _marker(os.getpid())
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    try:
        yield
    finally:
        marker.unlink(missing_ok=True)


def _cmdline(pid: int) -> str:
    import psutil

    try:
        return _joined(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


_entry_pid: int | None = None


def mark_entry_process() -> None:
    """This process is a command's own (not a launcher's worker, nor a DataLoader worker forked from it)."""
    global _entry_pid
    _entry_pid = os.getpid()


def in_entry_process() -> bool:
    return _entry_pid == os.getpid()
