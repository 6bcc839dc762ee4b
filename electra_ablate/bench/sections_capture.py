"""The captured step and the loop around it: what `runtime.compile=step` buys over the eager step (`capture`), and
what Lightning's loop costs per step on top of the step alone (`loop`).

`capture`: the eager step against the step compiled as one graph (`PretrainSystem.compile_step`, mode as
`runtime.compile_mode=auto` resolves it: CUDA graphs on a GPU), from the same initial weights on the same padded
batches, interleaved; with the compile time, the peak GPU memory and how far apart the two loss curves are (the
random numbers differ: inductor draws its own, so the gap is sampling noise plus rounding, not zero).

`loop`: the same config trained by Lightning exactly as pre-training trains it (bench/loop.py, the pilot's loop: the
Trainer, its checkpoint cadence, the data loader with the runtime's workers and pinned memory, the metric windows),
its tokens/s read off the windows after the first (which holds start-up and compiling), against the isolated step's.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from omegaconf import OmegaConf

from electra_ablate.bench import loop
from electra_ablate.bench.builds import FastPath, OursRunner, compose_config, load_data, tokens
from electra_ablate.bench.measure import interleaved, median, sync
from electra_ablate.bench.settings import CONF_DIR, Report, Settings, log
from electra_ablate.models import fast


def _reset_peak(device: torch.device) -> int:
    """Start a peak-memory window on a GPU; returns the bytes already allocated (the other variant's runner)."""
    if device.type != "cuda":
        return 0
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def _peak_mib(device: torch.device, before: int) -> float | None:
    """This variant's own peak: weights, gradients, optimizer state, activations and any CUDA-graph pool."""
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20 if device.type == "cuda" else None


def section_capture(s: Settings, rep: Report, model: str) -> None:
    import torch._dynamo

    cfg = compose_config(s, model, "runtime.compile=step")  # static shapes follow (runtime.static_shapes=auto)
    data = load_data(cfg, s.device, 2)
    captured = FastPath.from_runtime(cfg, s.device)
    b = data.batches
    runners, first, losses, peaks = {}, {}, {}, {}
    for label, fp in (("eager", replace(captured, capture=None)), (f"step, {captured.capture}", captured)):
        torch._dynamo.reset()
        before = _reset_peak(s.device)
        torch.manual_seed(0)  # the same initial weights for both
        runner = runners[label] = OursRunner(cfg, data, s.device, fp)
        first[label], losses[label] = [], []
        for i in range(max(3, s.warmup)):  # compiling, recording the CUDA graphs, and a steady replay
            sync(s.device)
            t0 = time.perf_counter()
            losses[label].append(float(runner.step([b[i % len(b)]])))  # read now: a graph replay reuses it
            first[label].append(time.perf_counter() - t0)
        peaks[label] = _peak_mib(s.device, before)
    steps = {k: (lambda r, out: lambda i: out.append(float(r.step([b[i]]))))(r, losses[k]) for k, r in runners.items()}
    timed, _ = interleaved(steps, len(b), 0, s.reps, s.device)
    eager = losses["eager"]
    for label in runners:
        step_s = median(timed[label])
        gap = max(abs(x - y) / abs(y) for x, y in zip(losses[label], eager))
        rep.capture.append({
            "model": model, "variant": label, "batch": f"{b[0]['input_ids'].shape[0]} x {b[0]['input_ids'].shape[1]}",
            "precision": str(OmegaConf.select(cfg, "runtime.precision")), "step_s": step_s,
            "tokens_per_s": tokens(b[0]) / step_s,
            "compile_s": max(0.0, sum(first[label]) - len(first[label]) * step_s) if label != "eager" else 0.0,
            "peak_mib": peaks[label], "loss_gap": gap, "steps_compared": len(eager),
        })
        log(f"capture {model} {label}: step {step_s:.4f}s, loss gap {gap:.2%}")
    del runners


def _default_workers() -> int:
    return int(OmegaConf.load(CONF_DIR / "runtime" / "default.yaml").num_workers)


def section_loop(s: Settings, rep: Report, model: str) -> None:
    window = 2 if s.quick else 20
    windows = 3 if s.quick else 5
    for label, extra in (("eager", ()), ("step compiled", ("runtime.compile=step",))):
        shape = (f"runtime.num_workers={_default_workers()}", "runtime.pin_memory=auto",
                 f"logger.log_every_n_steps={window}", f"trainer.max_steps={window * windows}",
                 f"optim.warmup_steps={window}",  # speed does not depend on it; it must fit in max_steps
                 f"trainer.accelerator={'gpu' if s.device.type == 'cuda' else 'cpu'}", *extra)
        cfg = compose_config(s, model, *shape)
        # The isolated step: the same config, its batches already on the device.
        data = load_data(cfg, s.device, 2)
        runner = OursRunner(cfg, data, s.device, FastPath.from_runtime(cfg, s.device))
        b = data.batches
        for i in range(max(3, s.warmup)):
            runner.step([b[i % len(b)]])
        timed, _ = interleaved({"step": lambda i: runner.step([b[i]])}, len(b), 0, s.reps, s.device)
        step_s = median(timed["step"])
        step_tps = statistics.mean(tokens(x) for x in b) / step_s  # padded B x T, as train/tokens_per_s counts
        del runner, data
        # The loop: Lightning, the data loader and the checkpoint cadence, as pre-training runs them.
        with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:
            rows = loop.run(f"loop-{label}", cfg, Path(tmp) / "loop.csv")
        steady = [r["tokens_per_s"] for r in rows[1:]]
        loop_tps = statistics.median(steady) if steady else float("nan")
        rep.loop.append({"model": model, "variant": label, "step_s": step_s, "step_tokens_per_s": step_tps,
                         "loop_tokens_per_s": loop_tps, "ratio": loop_tps / step_tps, "windows": len(steady),
                         "window": window, "workers": cfg.runtime.num_workers,
                         "checkpoint_every": cfg.trainer.checkpoint_every_n_steps,
                         "mfu": statistics.median(r["mfu"] for r in rows[1:]) if steady else float("nan")})
        log(f"loop {model} {label}: step alone {step_tps:,.0f} tokens/s, loop {loop_tps:,.0f} tokens/s "
            f"({loop_tps / step_tps:.0%})")
