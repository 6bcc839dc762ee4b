"""What `runtime.precision: auto` means on this machine: the precision it trains fastest in.

On a GPU that is bf16-mixed. On a CPU it depends on the instruction set: with AVX512-BF16 (AMD Zen 4+,
Intel Cooper Lake) or AMX (Intel Sapphire Rapids+), oneDNN runs bf16 matmuls 2.5-10x faster than fp32 and
an ELECTRA-Small step ~1.6x faster under bf16-mixed (reports/benchmarks.md); without them bf16 is emulated
and about 6x slower, so fp32 is chosen. Precision is a speed setting (runtime group): it is never part of a
run's identity, and every run records the resolved value as the `runtime.resolved_precision` parameter; a
resumed run keeps its own precision whatever `auto` means on its machine (tracking/attempts.py).
"""

from __future__ import annotations

import contextlib
import functools
import platform
from pathlib import Path

import torch

AUTO = "auto"
FP32 = "32-true"
BF16 = "bf16-mixed"
# CPU flags (as /proc/cpuinfo names them) that give native bf16 matmuls.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of this machine (Linux /proc/cpuinfo; empty elsewhere)."""
    info = Path("/proc/cpuinfo")
    if not info.is_file():
        return frozenset()
    for line in info.read_text(errors="replace").splitlines():
        if line.startswith("flags") and ":" in line:
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


@functools.cache
def cpu_name() -> str:
    """The CPU's model name, recorded with benchmarks (the CPU changes from machine to machine)."""
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_has_fast_bf16(flags: frozenset[str] | None = None) -> bool:
    return bool(set(BF16_CPU_FLAGS) & (cpu_flags() if flags is None else flags))


def resolve(requested: str, device_type: str, flags: frozenset[str] | None = None) -> str:
    """Lightning's precision string for `runtime.precision=requested` on a `device_type` ("cpu" | "cuda")."""
    requested = str(requested)
    if requested != AUTO:
        return requested
    if device_type == "cuda":
        return BF16
    return BF16 if cpu_has_fast_bf16(flags) else FP32


def training_device(accelerator: str) -> str:
    """The device type Lightning will train on for `trainer.accelerator`."""
    return "cuda" if torch.cuda.is_available() and str(accelerator) in ("auto", "gpu", "cuda") else "cpu"


def on_gpu(cfg) -> bool:
    """Whether a run of `cfg` trains on a GPU (`trainer.accelerator` and this machine)."""
    return training_device(cfg.trainer.accelerator) == "cuda"


def for_config(cfg) -> str:
    """Lightning's precision for a run of `cfg` (pre-training, fine-tuning) on this machine; the benchmark,
    which names its device itself, resolves with `resolve(cfg.runtime.precision, device_type)`."""
    return resolve(cfg.runtime.precision, training_device(cfg.trainer.accelerator))


def autocast(precision: str, device_type: str):
    """The context that runs code at Lightning's `precision` outside Lightning (a benchmark step, test-set
    predictions): nothing for fp32, bf16 autocast for bf16-mixed; ValueError for others."""
    if precision in ("32-true", "32"):
        return contextlib.nullcontext()
    if precision == BF16:
        return torch.autocast(device_type, dtype=torch.bfloat16)
    raise ValueError(f"runtime.precision={precision} is not supported here; use 32-true or bf16-mixed")


def describe_cpu() -> str:
    """One line naming the CPU and whether it has native bf16, for benchmark and report provenance."""
    fast = [f for f in BF16_CPU_FLAGS if f in cpu_flags()]
    return f"{cpu_name()} ({', '.join(fast) if fast else 'no bf16 instructions'})"
