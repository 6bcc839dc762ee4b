"""The command line the entry points share: overrides checked before Hydra starts, and refusals in one line.

Hydra answers `optim.learning_rate=1` with "To append to your config use +optim.learning_rate=1", which
adds a key that nothing reads: the run then trains with the default learning rate. Here every `key=value`
override of an existing config group's keys is looked up in the config it would change, and an unknown one
stops the command with the closest existing keys instead; an unknown group option or an override that does
not parse stops it the same way.

A refused input (a bad value, a missing file, a sweep that cannot work) ends the command with one line
`error: <message>` on stderr and exit status 1 (`one_line_errors`), not Hydra's "Error executing job" and a
stack; HYDRA_FULL_ERROR=1 keeps the stack. Inside a multirun the error is left to the launcher, which records
the job FAILED and reports the first failure once the other jobs have run (the multirun then exits 1); the job's
own log gets the message. A refused command leaves no run folder behind (`RunDirRecord`): the outputs folder is
as it was.

A stop (Ctrl-C, SIGTERM) ends the command with one line `stopped by <signal>: <what was stopped, where, and that
the same command resumes it>` on stderr and exit status 130 or 143 (common/stops.py), also when it stops a
multirun: its jobs end KILLED and the multirun with the stop's status and one line naming them (jobs in other
processes hand their stop to the multirun's own process: common/job_stops.py).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import io
import logging
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from electra_ablate.common import allocator, console, job_stops, stops

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
PACKAGE = __name__.split(".")[0]
F = TypeVar("F", bound=Callable)
log = logging.getLogger(__name__)


def _leaf_keys(container: dict) -> list[str]:
    out: list[str] = []

    def walk(node, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
                out.append(f"{prefix}{k}")

    walk(container, "")
    return out


def _has_key(container, key: str) -> bool:
    """Whether the dotted `key` (list items by index) names a node of the unresolved `container`. A required
    value (`???`) counts as present, and so does anything below an interpolation, which cannot be told here."""
    node = container
    for part in key.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return isinstance(node, str) and (node == "???" or "${" in node)
    return True


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _composed(config_name: str, overrides: Sequence[str]) -> dict | None:
    """The unresolved config (its `hydra` node included) these overrides compose, or None when they do not."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name, overrides=[*overrides, "paths.output_dir=."], return_hydra_config=True)
        return OmegaConf.to_container(cfg, resolve=False)
    except Exception:  # noqa: BLE001 - anything wrong with the groups: Hydra says what itself
        return None
    finally:
        GlobalHydra.instance().clear()


def _options_with(config_name: str, groups: Sequence[str], key: str) -> list[str]:
    """`group=option` for each option of the group `key` starts with whose config has `key`."""
    group = key.split(".")[0]
    if "." not in key or not (CONF_DIR / group).is_dir():
        return []
    others = [g for g in groups if g.split("=")[0] != group]
    return [f"{group}={o}" for o in _options(group)
            if _has_key(_composed(config_name, [*others, f"{group}={o}"]) or {}, key)]


def _one_line(text: str) -> str:
    """A multi-line message (Hydra's lists options one per indented line) as one line."""
    parts: list[str] = []
    for raw in text.strip().splitlines():
        line = raw.strip()
        if not line:
            continue
        if parts and raw[:1].isspace():
            parts[-1] += (" " if parts[-1].endswith(":") else ", ") + line
        else:
            parts.append(line)
    last = len(parts) - 1
    return " ".join(p if i == last or p.endswith((".", ":", ";")) else f"{p};" for i, p in enumerate(parts))


def _syntax_hint(word: str) -> str:
    key, _, value = word.partition("=")
    if value.startswith("[") and value.endswith("]") and "=" in value:  # pretrain_overrides=[trainer=ddp]
        items = ",".join(f'"{item.strip()}"' for item in value[1:-1].split(","))
        return f"an item holding `=` goes in quotes: '{key}=[{items}]'"
    return "see https://hydra.cc/docs/advanced/override_grammar/basic/"


def _hydra_flags(args: Sequence[str]):
    """The command line as Hydra's own parser reads it (flags such as `--cfg job` apart from the overrides), or
    None when it does not parse."""
    from hydra._internal.utils import get_args_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return get_args_parser().parse_args(list(args))
    except SystemExit:
        return None


def unknown_key_message(config_name: str, args: Sequence[str]) -> str | None:
    """The message for the first override the command cannot mean: a `key=value` naming no key of
    `config_name`, an option its group does not have, or one that does not parse; else None."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    flags = _hydra_flags(args)
    if flags is None:
        return None  # a flag Hydra does not know: its usage message says what it does know
    words = flags.overrides
    parser = OverridesParser.create()
    try:
        overrides = parser.parse_overrides(words)
    except HydraException:
        for word in words:
            try:
                parser.parse_overrides([word])
            except HydraException as e:
                return f"{word!r} is not a valid override ({str(e).splitlines()[0]}); {_syntax_hint(word)}"
        return None
    if any(o.type != OverrideType.CHANGE for o in overrides if "." not in o.key_or_group):
        return None  # `+group=...` configs (generated sweep variants) may bring keys of their own
    # Another config, config directory or search path may add groups and options this check cannot see.
    extended = any(o.key_or_group.startswith("hydra.searchpath") for o in overrides) or any(
        (flags.config_dir, flags.config_path, flags.config_name))
    groups, values = [], []
    for o in overrides:
        key = o.key_or_group
        if key.startswith("hydra") or o.type != OverrideType.CHANGE:
            continue
        if "." not in key and (CONF_DIR / key).is_dir():
            try:
                chosen = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
            except Exception:  # noqa: BLE001 - glob() and ranges: Hydra expands and checks them itself
                continue
            unknown = [c for c in chosen if c != "null" and not (CONF_DIR / key / f"{c}.yaml").is_file()]
            if unknown and not extended:
                close = difflib.get_close_matches(unknown[0], _options(key), n=1, cutoff=0.6)
                hint = f"did you mean {key}={close[0]}? " if close else ""
                return (f"{key}={unknown[0]} is not an option of {key}; {hint}its options (conf/{key}/): "
                        f"{', '.join(_options(key))}")
            groups.append(f"{key}={chosen[0]}")
        else:
            values.append(key)
    if not values or extended:
        return None
    if GlobalHydra.instance().is_initialized():
        return None  # inside a running Hydra app: nothing to check
    container = _composed(config_name, groups)
    if container is None:
        return None
    choices = container.pop("hydra")["runtime"]["choices"]
    for key in values:
        if _has_key(container, key):
            continue
        parent, _, leaf = key.rpartition(".")
        group = key.split(".")[0]
        elsewhere = _options_with(config_name, groups, key)
        keys = _leaf_keys(container)
        close = difflib.get_close_matches(key, keys, n=3, cutoff=0.75)
        if not close:  # the same name under another parent (model.lr -> optim.lr)
            close = [k for k in keys if k.rsplit(".", 1)[-1] == leaf][:3]
        siblings = sorted(k.rsplit(".", 1)[-1] for k in keys if k.rpartition(".")[0] == parent and k != parent)
        if elsewhere:  # a key of another option of the same group (data.paths with data=wiki_sample)
            hint = (f" with {group}={choices.get(group)}; {' and '.join(elsewhere)} "
                    f"{'has' if len(elsewhere) == 1 else 'have'} it")
        elif close:
            hint = f"; did you mean {' or '.join(close)}?"
        elif parent and siblings:
            hint = f"; {parent} has: {', '.join(siblings)}"
        else:
            hint = f"; see conf/{config_name}.yaml and its groups"
        return (f"{key} is not a key of the {config_name} config{hint} (a `+{key}=...` would only add a key "
                "that nothing reads)")
    return None


def check_args(config_name: str, args: Sequence[str] | None = None) -> None:
    """Exit with one message when the command line sets a key the config does not have."""
    message = unknown_key_message(config_name, sys.argv[1:] if args is None else args)
    if message:
        sys.exit(f"error: {message}")


# --- refusals in one line -----------------------------------------------------------------------------------


def refusal_message(error: BaseException) -> str | None:
    """The one-line message of an error that refuses an input, else None (a bug: its stack is worth keeping).

    Refusals are the exceptions this package defines (each raised with what is wrong and the fix), Hydra's
    composition errors raised inside a run (a sweep's variant naming an unknown option) and a required `???`
    value left unset; an instantiation error counts when what it wraps does."""
    from hydra.errors import CompactHydraException, InstantiationException
    from omegaconf.errors import MissingMandatoryValue

    if isinstance(error, InstantiationException):
        return refusal_message(error.__cause__) if error.__cause__ is not None else None
    if any(c.__module__.split(".")[0] == PACKAGE for c in type(error).__mro__):
        return _one_line(str(error))
    if isinstance(error, CompactHydraException):
        return _one_line(str(error))
    if isinstance(error, MissingMandatoryValue) and error.full_key:
        key = error.full_key
        return f"{key} has no value (??? in its config): give it, e.g. {key}=... on the command line"
    return None


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _multirun_command(argv: Sequence[str] | None = None) -> bool:
    return any(a in ("-m", "--multirun") for a in (sys.argv[1:] if argv is None else argv))


_depth = 0  # entry points running in this process


def one_line_errors(main: F) -> F:
    """Decorate an entry point (a Hydra task function or a console `main`): a refusal ends the command with
    `error: <message>` and exit status 1, having left no run folder behind; a stop (Ctrl-C, SIGTERM) with one
    `stopped by <signal>: ...` line and exit status 130 or 143 (common/stops.py). Other errors, any error inside
    a multirun (the launcher records the job FAILED and goes on), and every error under HYDRA_FULL_ERROR=1
    propagate with their stack; a stopped multirun ends with the stop's status."""

    @functools.wraps(main)
    def run(*args, **kwargs):
        global _depth, _existed
        task = bool(args) and isinstance(args[0], DictConfig)  # a Hydra task function (a run or a job)
        if task:  # the job's own config may give freed memory back (common/allocator.py); its line in the log only
            console.setup()
            allocator.for_job(args[0])
        elif _depth == 0:  # the command itself: freed memory kept before any tensor exists
            allocator.keep_freed_memory()
            stops.mark_entry_process()
            _existed = None
        _depth += 1
        multirun = not task and _multirun_command()
        try:
            with stops.handled(multirun_parent=multirun, also=stops.scheduler_signals() if task else ()):
                try:
                    if stops.received() is not None:  # a stopped process starts nothing more (a pool's next job)
                        stops.forget_reports()
                        stops.report("this job was not started; the same command runs it")
                        raise stops.Stopped(stops.received())
                    with stops.job_running() if task and not stops.in_entry_process() else contextlib.nullcontext():
                        result = main(*args, **kwargs)
                except BaseException as error:
                    stopped = _end(error, task, multirun)
                    if stopped is not None:
                        return stopped  # a job in a launcher's worker: its record tells the multirun
                    raise
                if multirun:
                    job_stops.end_multirun()
                return result
        finally:
            _depth -= 1

    return run  # type: ignore[return-value]


def _end(error: BaseException, task: bool, multirun: bool = False) -> job_stops.StoppedJob | None:
    """How an entry point ends on `error`: exits (SystemExit) with the command's status and line, returns a
    stopped job's result for its launcher, or returns None to let `error` propagate."""
    signum = stops.signal_of(error)
    job = task and _in_multirun()
    if multirun:  # a multirun's own process: its jobs that stopped in other processes
        gathered = job_stops.gather()
        if isinstance(error, (Exception, SystemExit)):  # a job failed, which Hydra has reported (exit 1), or a bug
            if stops.received() or gathered:
                print(stops.line(stops.received() or gathered), file=sys.stderr, flush=True)
            if isinstance(error, SystemExit) and stops.received() is not None:
                sys.exit(stops.exit_status(stops.received()))
            return None
        signum = gathered if signum is None else signum
    if signum is not None:
        if isinstance(error, SystemExit) and not task:
            sys.exit(stops.exit_status(signum))  # the line is out already (the run's)
        text = stops.line(signum)
        log.info("%s", text)
        if job:
            if stops.in_entry_process():
                raise stops.Stopped(signum) from None  # jobs run here (basic launcher): the multirun stops
            stops.hand_off(signum)  # submitit's time limit or preemption: it requeues the job (and exits)
            return job_stops.record(signum)  # the launcher gathers the other jobs; the multirun says the line
        print(text, file=sys.stderr, flush=True)
        sys.exit(stops.exit_status(signum))
    if not isinstance(error, Exception):
        return
    message = refusal_message(error)
    if job:
        # The job's own log says why it did not run (Hydra reports only the first failure, at the end).
        if message is None:
            log.exception("the job failed")
        else:
            log.error("error: %s", message)
        return
    if message is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
        return
    if task:
        _remove_run_dir()
    # SystemExit passes Hydra's job runner, which catches Exception only.
    sys.exit(f"error: {message}")


# --- a refused command leaves no run folder -------------------------------------------------------------------

_existed: Path | None = None  # the deepest folder on the run folder's path that existed when the command started


class RunDirRecord(Callback):
    """Hydra callback (conf/hydra/default.yaml): notes, before Hydra makes the run folder, which of the folders
    on its path already existed, so that a refused command can remove what Hydra made for it and nothing else."""

    def on_run_start(self, config, **kwargs) -> None:
        global _existed
        try:
            path = Path(str(config.hydra.run.dir)).absolute()
        except Exception:  # noqa: BLE001 - a run dir that does not resolve: Hydra says so itself
            return
        _existed = next((p for p in (path, *path.parents) if p.exists()), None)


def _remove_run_dir() -> None:
    """Remove the run folder Hydra made for this command (its .hydra/ and log) and the folders made for it, when
    it did not exist before (a run folder named by hand may hold earlier runs: it is left as it is)."""
    from hydra.core.hydra_config import HydraConfig

    global _existed
    existed, _existed = _existed, None
    if existed is None or not HydraConfig.initialized():
        return
    run_dir = Path(HydraConfig.get().runtime.output_dir).absolute()
    if run_dir == existed or existed not in run_dir.parents:
        return
    for handler in list(logging.getLogger().handlers):
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == run_dir:
            logging.getLogger().removeHandler(handler)
            handler.close()
    shutil.rmtree(run_dir / ".hydra", ignore_errors=True)
    for path in run_dir.glob("*.log"):
        path.unlink(missing_ok=True)
    for folder in (run_dir, *run_dir.parents):
        if folder == existed:
            break
        try:
            folder.rmdir()  # only when empty: another command's run may have appeared beside it
        except OSError:
            break
