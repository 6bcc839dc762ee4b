"""The peak FLOP/s of the device a run trains on, at its precision: the denominator of `train/mfu`.

Model FLOPs utilisation (MFU, PaLM, Chowdhery et al. 2022, appendix B) is the FLOP/s a run achieves by the
model's own FLOP count (here the paper's accounting, models/flops.py) over the device's peak. The GPUs' peaks are
the vendors' datasheet figures for dense matrix math (without the 2:4 sparsity that doubles the headline number),
per precision: bf16-mixed runs its matmuls in bf16; 32-true in TF32 where torch.set_float32_matmul_precision allows
it (runtime.matmul_precision high or medium, on Ampere and later), else in plain fp32. A GPU not in the table, and
every CPU, gets the best rate of a few square matmuls in the run's dtype, measured once per process (`probe`):
a practical peak, lower than a datasheet's, so a CPU's MFU reads high beside a GPU's.
"""

from __future__ import annotations

import functools
import time
from typing import NamedTuple

import torch

TFLOPS = 1e12


class Peak(NamedTuple):
    flops: float  # FLOP/s
    source: str  # where the number comes from, for the run's log and the benchmark report


# Dense tensor-core peaks in TFLOP/s: (name fragment as torch.cuda.get_device_name has it, bf16, tf32, fp32). The
# first fragment that the device name contains wins, so the specific ones come first.
GPU_PEAKS = (
    # NVIDIA H200 NVL datasheet (nvidia.com/en-us/data-center/h200): 1671 bf16 / 835 tf32 with sparsity, 60 fp32.
    ("H200 NVL", 835.5, 417.5, 60.0),
    # NVIDIA H200 SXM datasheet: 1979 bf16 / 989 tf32 with sparsity (the H100 SXM's rates), 67 fp32.
    ("H200", 989.4, 494.7, 66.9),
    # NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100), PCIe column: 1513 bf16 / 756 tf32 sparse, 51 fp32.
    ("H100 PCIe", 756.5, 378.0, 51.2),
    # The same datasheet, NVL column: 1671 bf16 / 835 tf32 sparse, 60 fp32.
    ("H100 NVL", 835.5, 417.5, 60.0),
    # The same datasheet, SXM column (torch names it "NVIDIA H100 80GB HBM3"): 1979 bf16 / 989 tf32 sparse, 67 fp32.
    ("H100", 989.4, 494.7, 66.9),
    # NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100), SXM and PCIe alike: 312 bf16, 156 tf32, 19.5 fp32.
    ("A100", 312.0, 156.0, 19.5),
    # NVIDIA L40S datasheet: 733 bf16 / 366 tf32 with sparsity, 91.6 fp32.
    ("L40S", 366.5, 183.0, 91.6),
    # NVIDIA L4 datasheet (nvidia.com/en-us/data-center/l4): 242 bf16 / 120 tf32 with sparsity, 30.3 fp32.
    ("L4", 121.0, 60.0, 30.3),
    # NVIDIA A10 datasheet: 250 bf16 / 125 tf32 with sparsity, 31.2 fp32.
    ("A10", 125.0, 62.5, 31.2),
)


def gpu_peak(name: str, precision: str, matmul_precision: str = "highest") -> Peak | None:
    """The datasheet peak of the GPU called `name` at Lightning's `precision`, or None when it is not in the table."""
    for fragment, bf16, tf32, fp32 in GPU_PEAKS:
        if fragment in name:
            if precision.startswith("bf16"):
                return Peak(bf16 * TFLOPS, f"{fragment} datasheet, dense bf16")
            if precision.startswith("16"):  # fp16 tensor cores run at the bf16 rate on these parts
                return Peak(bf16 * TFLOPS, f"{fragment} datasheet, dense fp16")
            if matmul_precision in ("high", "medium"):
                return Peak(tf32 * TFLOPS, f"{fragment} datasheet, dense tf32 (matmul_precision {matmul_precision})")
            return Peak(fp32 * TFLOPS, f"{fragment} datasheet, fp32")
    return None


def dtype_of(precision: str) -> torch.dtype:
    """The dtype a run at Lightning's `precision` does its matmuls in."""
    if precision.startswith("bf16"):
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    return torch.float32


@functools.lru_cache(maxsize=8)
def probe(device_type: str, dtype: torch.dtype, threads: int, size: int = 1024, reps: int = 5) -> float:
    """The best FLOP/s of a (size x size) @ (size x size) matmul in `dtype` on this process's device, over `reps`
    runs after one warm-up: a practical peak. Cached per process (keyed by the thread count, which it depends on)."""
    device = torch.device(device_type)
    rng = torch.Generator(device).manual_seed(0)  # its own: the run's masks and samples must not see the probe
    a = torch.randn(size, size, device=device, generator=rng).to(dtype)
    b = torch.randn(size, size, device=device, generator=rng).to(dtype)
    best = float("inf")
    for _ in range(reps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best


def device_peak(device: torch.device, precision: str) -> Peak:
    """The peak FLOP/s of `device` for a run at `precision`: the datasheet table for a known GPU, else the probe."""
    matmul_precision = torch.get_float32_matmul_precision()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        known = gpu_peak(name, precision, matmul_precision)
        if known is not None:
            return known
        what = name
    else:
        from electra_ablate.common.precision import cpu_name

        what = cpu_name()
    dtype, threads = dtype_of(precision), torch.get_num_threads()
    size = 4096 if device.type == "cuda" else 1024  # a GPU needs a larger product to come near its peak
    flops = probe(device.type, dtype, threads, size)
    where = f" on {threads} thread(s)" if device.type == "cpu" else ""
    return Peak(flops, f"{what}: best {size}^3 {str(dtype).removeprefix('torch.')} matmul{where}, measured by the run")
