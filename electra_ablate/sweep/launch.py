"""Launching a phase: the multirun command line (`python -m electra_ablate.<entry> -m ...`) that any Hydra
launcher places (basic = one job after the other, joblib = in parallel on this machine, submitit = SLURM,
Ray), the runner's own launcher overrides handed on to it, a check that the launcher's plugin is installed, and
the child process that runs it, in a process group of its own that the runner ends whole when it is stopped
(SIGINT or SIGTERM) or when the multirun ends."""

from __future__ import annotations

import logging
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir

from electra_ablate.common import stops
from electra_ablate.sweep.compose import SweepContext, fresh_hydra, quote
from electra_ablate.sweep.progress import PhaseConsole, pythonpath_env
from electra_ablate.sweep.spec import CONF_DIR, REPO_ROOT, SweepError

log = logging.getLogger(__name__)


def multirun_command(module: str, sweep_args: Sequence[str], ctx: SweepContext, launcher: Sequence[str],
                     extra: Sequence[str], sweep_dir: Path) -> list[str]:
    return [sys.executable, "-m", module, "-m", ctx.searchpath, *sweep_args, *ctx.base_overrides, *extra,
            *launcher, f"hydra.sweep.dir={quote(str(sweep_dir))}"]


_SHELL_PLAIN = re.compile(r"^[A-Za-z0-9_/.,:=+@%-]+$")


def shell_join(args: Sequence[str]) -> str:
    """A command line to copy into a shell: plain words as they are, others in double quotes when that is
    safe (Hydra overrides hold single quotes), else shlex quoting."""
    out = []
    for a in args:
        if _SHELL_PLAIN.match(a):
            out.append(a)
        elif not any(c in a for c in '"$`\\!'):
            out.append(f'"{a}"')
        else:
            out.append(shlex.quote(a))
    return " ".join(out)


# Seconds a stopped multirun's jobs get to end their runs KILLED (Lightning stops after the current step, the
# metrics are flushed) before every process left of it is killed.
STOP_GRACE_S = 60.0


def _group(pgid: int) -> dict[int, tuple[int, str]]:
    """The live processes of process group `pgid`: pid -> (parent pid, command line)."""
    return {pid: (ppid, cmdline) for pid, (ppid, pgrp, cmdline) in stops.processes().items() if pgrp == pgid}


def stop_multirun(proc: subprocess.Popen, grace_s: float | None = None) -> None:
    """End every process of the multirun `proc` (started in a session of its own): SIGTERM to the processes
    running jobs, again every few seconds (a loky worker that finished its stopped job may have taken the next
    one), until the group is empty or `grace_s` has passed; then SIGKILL to whatever is left. A second Ctrl-C
    skips the wait."""
    pgid = proc.pid
    deadline = time.monotonic() + (STOP_GRACE_S if grace_s is None else grace_s)
    next_term = 0.0
    try:
        while time.monotonic() < deadline:
            proc.poll()  # reap the multirun itself once it has ended
            members = _group(pgid)
            if not members:
                break
            if time.monotonic() >= next_term:
                stops.send(stops.job_hosts(members), signal.SIGTERM)
                next_term = time.monotonic() + 5.0
            time.sleep(0.2)
    except KeyboardInterrupt:
        log.warning("stopping the multirun now (SIGKILL)")
    for _ in range(50):  # bounded: SIGKILL cannot be refused
        members = _group(pgid)
        if not members:
            break
        stops.send(members, signal.SIGKILL)
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def launch(cmd: Sequence[str], dry_run: bool, watch: PhaseConsole | None = None) -> int:
    """Run a phase's multirun and return its exit status; `watch` keeps its output in a log file and shows
    progress (sweep/progress.py), else the output goes to this console as it is."""
    log.info("launching: %s", shell_join(cmd))
    if dry_run:
        print(shell_join(cmd))
        return 0
    env = pythonpath_env(REPO_ROOT)
    # A session of its own: the multirun and every process it starts (joblib's loky workers, DataLoader
    # workers) are one process group, which the runner ends whole; a Ctrl-C in the terminal reaches the runner
    # alone, which stops the group in order (stop_multirun).
    proc = subprocess.Popen(list(cmd), start_new_session=True, **(watch.popen_kwargs(env) if watch else {"env": env}))
    if watch:
        watch.start(proc)
    with stops.handled():  # SIGTERM stops the runner as Ctrl-C does (common/stops.py)
        try:
            returncode = proc.wait()
        except BaseException:
            stop_multirun(proc)
            raise
        stop_multirun(proc, grace_s=10.0)  # ended: only stragglers (idle loky workers) may be left
    if watch:
        watch.finish(returncode)
    return returncode


def check_launcher(launcher: Sequence[str]) -> None:
    """Fail before any job when the chosen launcher's plugin is not installed (e.g. Ray)."""
    if not launcher:
        return
    with fresh_hydra(), initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        hydra_cfg = compose("pretrain", overrides=["paths.root_dir=.", "paths.output_dir=.", *launcher],
                            return_hydra_config=True).hydra
    target = str(hydra_cfg.launcher._target_)
    try:
        __import__(target.rsplit(".", 1)[0])
    except ImportError as e:
        raise SweepError(
            f"the launcher {target} cannot be imported ({e}); install its plugin, e.g. pip install -e '.[ray]' "
            "for hydra/launcher=ray_gpu"
        ) from e


LAUNCHER_PREFIXES = ("hydra/launcher", "hydra.launcher", "hydra.callbacks")


def launcher_overrides(hydra_overrides: Sequence[str]) -> list[str]:
    """The runner's own `hydra/launcher=...`, `hydra.launcher.*` and `hydra.callbacks.*` overrides: handed on
    to every multirun (the runner itself launches nothing through Hydra)."""
    return [o for o in hydra_overrides if o.lstrip("+~").startswith(LAUNCHER_PREFIXES)]
