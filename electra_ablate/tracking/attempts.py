"""What each attempt of a run trained in and on: its precision and the machine, and which precision a resumed run
keeps.

Precision is a speed setting, out of the run identity, so a stopped run resumes on any machine. It is still a
property of the run: `auto` is resolved once, on the run's first attempt (the `runtime.resolved_precision`
param), and every later attempt trains in the precision the run has, whatever `auto` means on its machine. Only
an explicit `runtime.precision=32-true|bf16-mixed` switches it. Each attempt writes what it ran in and on as
`attempt.<n>.*` tags (one batched write with the attempt's other tags), so the record never claims what did not
run; `precision` and `hardware.*` say the newest attempt's.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Mapping
from typing import NamedTuple

from electra_ablate.common import precision

PARAM_RESOLVED_PRECISION = "runtime.resolved_precision"  # the first attempt's precision (params never change)
TAG_PRECISION = "precision"  # the precision the run (or the sweep's jobs) trains in now
TAG_PRECISION_HOW = "precision.how"  # why: resolved from `auto`, kept from the first attempt, or switched
TAG_CPU = "hardware.cpu"  # CPU model name
TAG_CPU_CORES = "hardware.cpu_cores"  # os.cpu_count() of the machine
TAG_CPU_BF16 = "hardware.cpu_bf16"  # native bf16 flags present (avx512_bf16, amx_bf16) or "none"
TAG_GPU = "hardware.gpu"  # the GPUs' names (nvidia-smi), or "none"
ATTEMPT_PREFIX = "attempt."  # attempt.<n>.precision, attempt.<n>.cpu, ... : what attempt n ran in and on
ATTEMPT_FIELDS = ("precision", "cpu", "cpu_cores", "cpu_bf16", "gpu")
# How much slower a bf16-mixed step is on a CPU without native bf16 than a fp32 one (reports/benchmarks.md).
EMULATED_BF16_SLOWDOWN = 6


def gpu_names() -> str:
    """The names of this machine's NVIDIA GPUs, comma-separated, or "none" (no driver, no GPU)."""
    names = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=30).stdout.strip().replace("\n", ", ")
    return names or "none"


def hardware() -> dict[str, str]:
    """The `hardware.*` tags of this machine."""
    fast = [f for f in precision.BF16_CPU_FLAGS if f in precision.cpu_flags()]
    return {TAG_CPU: precision.cpu_name(), TAG_CPU_CORES: str(os.cpu_count()), TAG_CPU_BF16: ",".join(fast) or "none",
            TAG_GPU: gpu_names()}


class Choice(NamedTuple):
    """The precision an attempt trains in, and why (`how`), with the one-line `warning` to print, if any."""

    precision: str
    how: str
    warning: str | None = None


def recorded_precision(tags: Mapping[str, str], params: Mapping[str, str]) -> str | None:
    """The precision a run trained in last: its newest `attempt.<n>.precision`, else (runs recorded before
    attempts were) its `runtime.resolved_precision` param; None when neither is recorded."""
    per_attempt = attempt_values(tags, "precision")
    if per_attempt:
        return per_attempt[max(per_attempt)]
    return params.get(PARAM_RESOLVED_PRECISION)


def attempt_values(tags: Mapping[str, str], field: str) -> dict[int, str]:
    """`attempt.<n>.<field>` of a run's tags, by attempt number."""
    out = {}
    for key, value in tags.items():
        n, _, name = key.removeprefix(ATTEMPT_PREFIX).partition(".")
        if key.startswith(ATTEMPT_PREFIX) and name == field and n.isdigit():
            out[int(n)] = value
    return out


def choose(requested: str, device_type: str, previous=None, flags: frozenset[str] | None = None) -> Choice:
    """The precision of an attempt of a run with `runtime.precision=requested` on a `device_type` device of this
    machine; `previous`: the run it continues (an mlflow Run), or None for a new run."""
    requested = str(requested)
    before = recorded_precision(previous.data.tags, previous.data.params) if previous is not None else None
    if requested == precision.AUTO and before is not None:
        how = f"kept from the run's earlier attempts (runtime.precision=auto would be " \
              f"{precision.resolve(requested, device_type, flags)} here)"
        chosen = before
    elif requested == precision.AUTO:
        chosen = precision.resolve(requested, device_type, flags)
        how = f"runtime.precision=auto resolved on {device_type}"
    else:
        chosen = requested
        how = (f"runtime.precision={requested} given: switched from {before}" if before not in (None, requested)
               else f"runtime.precision={requested} given")
    return Choice(chosen, how, slow_warning(chosen, device_type, how, flags))


def slow_warning(chosen: str, device_type: str, how: str, flags: frozenset[str] | None = None,
                 switch: str = "runtime.precision=32-true") -> str | None:
    """One line when this machine is much slower at `chosen` than at fp32: bf16 on a CPU without native bf16;
    `switch`: the override that would change it."""
    if device_type != "cpu" or not chosen.startswith("bf16") or precision.cpu_has_fast_bf16(flags):
        return None
    return (f"precision {chosen} ({how}) on {precision.cpu_name()}, a CPU without "
            f"{' or '.join(precision.BF16_CPU_FLAGS)}: bf16 is emulated here, about {EMULATED_BF16_SLOWDOWN}x slower "
            f"than 32-true; going on ({switch} would switch to fp32, and the record says so)")


def attempt_tags(attempt: int, choice: Choice, machine: Mapping[str, str] | None = None) -> dict[str, str]:
    """The tags an attempt writes with its others: what it runs in and on, as `attempt.<n>.*` and as the run's
    current `precision` and `hardware.*`."""
    machine = dict(machine or hardware())
    values = {"precision": choice.precision, "cpu": machine[TAG_CPU], "cpu_cores": machine[TAG_CPU_CORES],
              "cpu_bf16": machine[TAG_CPU_BF16], "gpu": machine[TAG_GPU]}
    return {**{f"{ATTEMPT_PREFIX}{attempt}.{k}": v for k, v in values.items()}, **machine,
            TAG_PRECISION: choice.precision, TAG_PRECISION_HOW: choice.how[:5000]}
