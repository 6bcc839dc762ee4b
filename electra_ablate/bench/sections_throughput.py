"""Tokens per CPU-hour at a sweep's own shape (section `throughput`): what limits every CPU experiment.

Two measurements at the shape of `--throughput-experiment` (default `cpu_regime`: the tiny pre-LN encoder, batch
128 x 64, bf16-mixed where the CPU has it):

- the attention path (`runtime.cpu_attention`): torch's fused SDPA against the same math written out, for BERT
  and ELECTRA, interleaved step by step in this process on one thread;
- the process layout on this machine's cores: one 1-thread job alone, one 1-thread job per core side by side
  (what a sweep with `hydra.launcher.n_jobs=<cores>` runs), one job with a thread per core, and one 1-thread job
  more than there are cores (time-sliced). Each layout runs
  in fresh processes (`--probe`) that build, warm up, wait for each other and then time the same number of
  steps, so side-by-side jobs overlap while they are timed.

Tokens per CPU-hour = tokens/s of all the layout's jobs x 3600 / the cores it occupies (at most all of them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from electra_ablate.bench.builds import FastPath, OursRunner, compose_config, load_data, tokens
from electra_ablate.bench.measure import interleaved, median, paper_flops
from electra_ablate.bench.settings import (LAYOUT_STEPS_PER_REP, PROBE_TAG, REPO, BenchError, Report, Settings, log,
                                           settings_from_dict, settings_to_dict)
from electra_ablate.bench.step_costs import step_shape
from electra_ablate.common import precision as precision_lib

OBJECTIVES = ("bert", "electra")
ATTENTION = ("sdpa", "math")  # before (torch's fused kernel without dropout), after (written out)


def _config(s: Settings, objective: str, attention: str):
    # The experiment brings the sweep's batch and sequence length; the bench's own --batch-size/--seq-len do not apply.
    return compose_config(s, "tiny", f"experiment={s.throughput_experiment}", f"objective={objective}",
                          f"runtime.cpu_attention={attention}", keep_shape=True)


def section_throughput(s: Settings, rep: Report) -> None:
    _attention_rows(s, rep)
    _layout_rows(s, rep)


def _attention_rows(s: Settings, rep: Report) -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for objective in OBJECTIVES:
            runners, batches = {}, None
            for attention in ATTENTION:
                cfg = _config(s, objective, attention)
                data = load_data(cfg, s.device, 3)
                batches = data.batches
                runners[attention] = OursRunner(cfg, data, s.device, FastPath.from_runtime(cfg, s.device))
            steps = {a: (lambda i, r=r: r.step([batches[i]])) for a, r in runners.items()}
            timed, _ = interleaved(steps, len(batches), s.warmup, s.piece_reps, s.device)
            n = tokens(batches[0])
            for attention in ATTENTION:
                step_s = median(timed[attention])
                shape = tuple(batches[0]["input_ids"].shape)
                cfg, runner = runners[attention].cfg, runners[attention]
                rep.throughput.append({"kind": "attention", "objective": objective, "attention": attention,
                                       "step_s": step_s, "tokens_per_s": n / step_s, "batch": shape,
                                       "experiment": s.throughput_experiment,
                                       "vocab": runner.system.model.config.vocab_size,
                                       "flops": paper_flops(runner, cfg, *shape),
                                       **step_shape(cfg, precision_lib.resolve(cfg.runtime.precision, s.device.type))})
                log(f"throughput {objective} attention={attention}: {step_s:.3f} s/step")
    finally:
        torch.set_num_threads(previous)


def _layout_rows(s: Settings, rep: Report) -> None:
    cores = os.cpu_count() or 1
    layouts = [("one 1-thread job", 1, 1)]
    if cores > 1:
        layouts += [(f"{cores} 1-thread jobs side by side", cores, 1), (f"one {cores}-thread job", 1, cores)]
    # One job more than cores (a launcher's n_jobs above the core count): the jobs share the cores by time slices.
    layouts.append((f"{cores + 1} 1-thread jobs on {cores} core{'s' if cores > 1 else ''}", cores + 1, 1))
    for label, jobs, threads in layouts:
        results = run_side_by_side(s, jobs, threads)
        total = sum(r["tokens_per_s"] for r in results)
        used = min(jobs * threads, cores)
        rep.throughput.append({"kind": "layout", "layout": label, "jobs": jobs, "threads": threads,
                               "per_job": [r["tokens_per_s"] for r in results], "tokens_per_s": total,
                               "tokens_per_cpu_hour": total * 3600 / used, "cores_used": used})
        log(f"throughput {label}: {total:.0f} tokens/s")


def run_side_by_side(s: Settings, jobs: int, threads: int) -> list[dict]:
    """`jobs` fresh processes of `threads` threads each, timed together (a barrier after their warm-up)."""
    barrier = Path(tempfile.mkdtemp(prefix="bench_throughput_"))
    procs = []
    for i in range(jobs):
        spec = {"kind": "throughput", "settings": settings_to_dict(s), "threads": threads, "barrier": str(barrier),
                "jobs": jobs, "index": i}
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": str(threads)}
        argv = [sys.executable, "-m", "electra_ablate.bench", "--probe", json.dumps(spec)]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                                      env=env))
    out = []
    for p in procs:
        stdout, stderr = p.communicate()
        line = next((x for x in stdout.splitlines() if x.startswith(PROBE_TAG)), None)
        if line is None:
            raise BenchError(f"throughput probe failed (exit {p.returncode}):\n{stderr[-3000:]}")
        out.append(json.loads(line[len(PROBE_TAG):]))
    return out


def throughput_probe(spec: dict) -> dict:
    """One job of a layout, in this fresh process: build, warm up, wait for the others, time BERT steps."""
    s = settings_from_dict(spec["settings"])
    torch.set_num_threads(int(spec["threads"]))
    cfg = _config(s, "bert", "math")
    data = load_data(cfg, s.device, 3)
    runner = OursRunner(cfg, data, s.device, FastPath.from_runtime(cfg, s.device))
    for i in range(s.warmup):
        runner.step([data.batches[i % 3]])
    barrier = Path(spec["barrier"])
    (barrier / f"ready_{spec['index']}").touch()
    deadline = time.monotonic() + 600
    while len(list(barrier.glob("ready_*"))) < int(spec["jobs"]):
        if time.monotonic() > deadline:
            raise BenchError("throughput probe: the other jobs never became ready")
        time.sleep(0.05)
    steps = LAYOUT_STEPS_PER_REP * s.piece_reps
    t0 = time.perf_counter()
    for i in range(steps):
        runner.step([data.batches[i % 3]])
    wall = time.perf_counter() - t0
    return {"tokens_per_s": steps * tokens(data.batches[0]) / wall, "wall_s": wall}
