"""How the benchmark measures: interleaved step timing, the matmul peak at the model's shapes, FLOPs (paper
accounting and executed), the operations that make a CUDA device synchronise with the host, and peak memory in a
fresh process per configuration."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from hydra.utils import get_class
from omegaconf import DictConfig
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from electra_ablate.bench.builds import FastPath, OursRunner, TransformersRunner, compose_config, load_data
from electra_ablate.bench.settings import PROBE_TAG, REPO, BenchError, Settings, settings_from_dict, settings_to_dict
from electra_ablate.common import precision as precision_lib
from electra_ablate.models.encoder import ElectraForPretraining
from electra_ablate.models.flops import pretrain_flops_per_step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved(
    steps: dict[str, Callable[[int], object]], n_batches: int, warmup: int, reps: int, device: torch.device
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds per step of each callable, run A B A B ...; returns (timed, warm-up) lists per name.

    Each callable gets the index of the batch to use; every implementation sees the same batch in a round.
    """
    timed: dict[str, list[float]] = {k: [] for k in steps}
    warm: dict[str, list[float]] = {k: [] for k in steps}
    for r in range(warmup + reps):
        for name, f in steps.items():
            sync(device)
            t0 = time.perf_counter()
            f(r % n_batches)
            sync(device)
            (warm if r < warmup else timed)[name].append(time.perf_counter() - t0)
    return timed, warm


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def matmul_peak(shapes: list[tuple[int, int, int]], device: torch.device, reps: int,
                dtype: torch.dtype = torch.float32) -> dict[tuple[int, int, int], float]:
    """Best matmul FLOP/s in `dtype` over `reps` runs for each (m, k, n): the machine's practical peak at these
    shapes (bf16 for bf16-mixed rows: autocast runs the step's matmuls in bf16)."""
    out = {}
    for m, k, n in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        torch.mm(a, b)
        best = math.inf
        for _ in range(reps):
            sync(device)
            t0 = time.perf_counter()
            torch.mm(a, b)
            sync(device)
            best = min(best, time.perf_counter() - t0)
        out[(m, k, n)] = 2 * m * k * n / best
    return out


def model_shapes(cfg: DictConfig, tokens_per_step: int, vocab: int) -> list[tuple[int, int, int]]:
    """The matmul shapes of a step: projections and FFN of both networks, and the masked vocabulary projection."""
    m = cfg.model
    h, i, e = m.hidden_size, m.intermediate_size, m.embedding_size
    g = max(1, round(h * cfg.generator.get("hidden_size", 1.0)))
    shapes = {(tokens_per_step, h, h), (tokens_per_step, h, i), (tokens_per_step, i, h), (tokens_per_step, e, h),
              (tokens_per_step, g, 4 * g), (round(tokens_per_step * 0.15), e, vocab)}
    return sorted(shapes)


def executed_flops(step: Callable[[], object]) -> float:
    """FLOPs one step executes (matrix multiplies and attention, forward and backward), counted by torch."""
    with FlopCounterMode(display=False) as counter:
        step()
    return float(counter.get_total_flops())


def paper_flops(runner: OursRunner, cfg: DictConfig, batch_size: int, seq_len: int) -> float:
    gen = runner.nets.generator
    gen_cfg = gen.config if isinstance(gen, ElectraForPretraining) else None
    return pretrain_flops_per_step(runner.nets.model.config, gen_cfg, get_class(cfg.objective._target_).flops, batch_size, seq_len)


# --- host-device synchronisation ---------------------------------------------------------------------

_SYNC_OPS = {
    "aten::_local_scalar_dense": "reads a value on the host (.item(), bool(), float())",
    "aten::nonzero": "output size depends on the data",
    "aten::masked_select": "output size depends on the data",
    "aten::_unique2": "output size depends on the data",
    "aten::unique_consecutive": "output size depends on the data",
    "aten::repeat_interleave": "output size depends on the data",
}
# Host reads that a CPU run sees but a CUDA run does not make (or makes on host tensors): call-site marker -> why.
_HOST_ONLY = {
    'device.type == "cpu"': "no: a CPU-only branch",
    "torchmetrics/utilities/compute.py": "no: torchmetrics takes a sync-free torch.where branch off the CPU",
    "torch/optim/": "no: the for-loop optimizer keeps its step counters on the host; fused AdamW (CUDA default) has none",
}


class SyncFinder(TorchDispatchMode):
    """Records the operations that make a CUDA device wait for the host, with the line that issued them.

    Boolean-mask indexing (`x[mask]`, and its backward) is one: its output size is known only after a count
    on the device. On a CUDA run only reads of CUDA tensors are counted; on a CPU run every host read is
    listed and the ones a CUDA run would not make are marked (`_HOST_ONLY`).
    """

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device
        self.found: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        why = _SYNC_OPS.get(name)
        if why is None and name in ("aten::index", "aten::index_put", "aten::index_put_"):
            indices = args[1] if len(args) > 1 else []
            if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
                why = "boolean-mask indexing: output size depends on the data"
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if why is not None and not (self.device.type == "cuda" and first is not None and not first.is_cuda):
            self.found[(name, why, *_call_site())] += 1
        return func(*args, **(kwargs or {}))


def _call_site() -> tuple[str, str]:
    """(where in this package, innermost library frame) of the current operation, for the report."""
    frames = [f for f in traceback.extract_stack()[:-3]
              if not any(x in f.filename for x in ("torch/_dynamo", "torch/_compile", "torch/utils/_python_dispatch"))]
    pkg = str(Path(__file__).parents[1])

    def fmt(f) -> str:
        path = str(Path(f.filename).relative_to(REPO)) if f.filename.startswith(str(REPO) + "/electra_ablate") \
            else f.filename.split("site-packages/")[-1]
        return f"{path}:{f.lineno} `{(f.line or '').strip()[:80]}`"

    ours = next((f for f in reversed(frames) if f.filename.startswith(pkg) and "/bench/" not in f.filename), None)
    lib = next((f for f in reversed(frames) if "site-packages" in f.filename), None)
    if ours is None and lib is not None:  # called from the step itself: name the phase
        phase = next((v for k, v in (("torch/autograd", "backward pass"), ("torch/optim", "optimizer step"),
                                     ("torch/nn/utils/clip_grad", "gradient clipping")) if k in lib.filename), "?")
        return phase, fmt(lib)
    site = fmt(ours) if ours is not None else "?"
    return site, (fmt(lib) if lib is not None and frames.index(lib) > (frames.index(ours) if ours else -1) else "")


def on_cuda(site: str, lib: str) -> str:
    for marker, why in _HOST_ONLY.items():
        if marker in site or marker in lib:
            return why
    return "yes"


# --- memory ---------------------------------------------------------------------------------------------


def _status_kib(field_name: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    m = re.search(rf"^{field_name}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else None


def memory_probe(spec: dict) -> dict:
    """Peak memory of training one configuration for a few steps, in this (fresh) process.

    CPU: resident-set high-water mark minus the resident set before the networks were built (so torch's
    own libraries and the memory-mapped data are left out). CUDA: torch.cuda.max_memory_allocated.
    """
    s = settings_from_dict(spec["settings"])
    torch.set_num_threads(s.threads)
    device = s.device
    cfg = compose_config(s, spec["model"], *spec.get("extra", []), batch_size=spec["batch_size"])
    data = load_data(cfg, device, spec["accumulate"] * 2)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with contextlib.suppress(OSError):  # Linux: reset the high-water mark to the current resident set
        Path("/proc/self/clear_refs").write_text("5")
    before_kib = _status_kib("VmRSS")
    fp = FastPath.from_runtime(cfg, device)
    if spec["impl"] == "ours":
        runner = OursRunner(cfg, data, device, fp)
    else:
        runner = TransformersRunner(cfg, data, device, fp.fused_adam)
    k = spec["accumulate"]
    times = []
    for i in range(spec["steps"]):
        sync(device)
        t0 = time.perf_counter()
        runner.step([data.batches[(i * k + j) % len(data.batches)] for j in range(k)])
        sync(device)
        times.append(time.perf_counter() - t0)
    resolved = precision_lib.resolve(cfg.runtime.precision, device.type)
    if device.type == "cuda":
        return {"peak_mib": torch.cuda.max_memory_allocated(device) / 2**20, "kind": "max_memory_allocated",
                "step_s": times[-1], "precision": resolved}
    peak_kib = _status_kib("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_mib": (peak_kib - (before_kib or 0)) / 1024, "kind": "RSS high-water above pre-build RSS",
            "step_s": times[-1], "precision": resolved}


def run_probe(s: Settings, spec: dict, env: dict[str, str] | None = None) -> dict:
    """Run `spec` in a fresh `python -m electra_ablate.bench --probe` (with `env`, else this environment)."""
    spec = {**spec, "settings": settings_to_dict(s)}
    proc = subprocess.run(
        [sys.executable, "-m", "electra_ablate.bench", "--probe", json.dumps(spec)],
        capture_output=True, text=True, cwd=str(REPO), env={**(os.environ if env is None else env),
                                                             "PYTHONWARNINGS": "ignore"},
    )
    for line in proc.stdout.splitlines():
        if line.startswith(PROBE_TAG):
            return json.loads(line[len(PROBE_TAG):])
    raise BenchError(f"{spec.get('kind', 'memory')} probe {spec['impl']} {spec['model']} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
