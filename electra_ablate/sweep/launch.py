"""Launching a phase: the multirun command line (`python -m electra_ablate.<entry> -m ...`) that any Hydra
launcher places (basic = one job after the other, joblib = in parallel on this machine, submitit = SLURM,
Ray), the runner's own launcher overrides handed on to it, a check that the launcher's plugin is installed, and
the child process that runs it (stopped with the runner)."""

from __future__ import annotations

import logging
import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir

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


def launch(cmd: Sequence[str], dry_run: bool, watch: PhaseConsole | None = None) -> int:
    """Run a phase's multirun and return its exit status; `watch` keeps its output in a log file and shows
    progress (sweep/progress.py), else the output goes to this console as it is."""
    log.info("launching: %s", shell_join(cmd))
    if dry_run:
        print(shell_join(cmd))
        return 0
    env = pythonpath_env(REPO_ROOT)
    proc = subprocess.Popen(list(cmd), **(watch.popen_kwargs(env) if watch else {"env": env}))
    if watch:
        watch.start(proc)

    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    # A runner stopped by SIGTERM (a scheduler, `kill`) stops its multirun too instead of orphaning it.
    previous = signal.signal(signal.SIGTERM, stop) if threading.current_thread() is threading.main_thread() else None
    try:
        returncode = proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
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
