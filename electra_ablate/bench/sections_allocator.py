"""What keeping freed memory buys (section `allocator`): BERT and ELECTRA steps at the `cpu_regime` and
`cpu_regime_30k` presets at each precision of --precisions, each in a fresh process with glibc's defaults
(ELECTRA_ABLATE_KEEP_FREED_MEMORY=0) and one with freed memory kept as every entry point keeps it
(electra_ablate/common/allocator.py), started one after the other (default, kept) for each step. Beside the seconds
per step: the minor page faults, the system (kernel) and user time per step, from getrusage over the timed steps
(CPU time moves less with the load of a shared machine than wall time does), and the process's peak resident set
(ru_maxrss), the memory the setting keeps.
"""

from __future__ import annotations

import os
import resource
import statistics
import time

import torch

from electra_ablate.bench.builds import FastPath, OursRunner, compose_config, load_data
from electra_ablate.bench.measure import run_probe
from electra_ablate.bench.settings import Report, Settings, log, settings_from_dict
from electra_ablate.common import allocator
from electra_ablate.common import precision as precision_lib

PRESETS = ("cpu_regime", "cpu_regime_30k")
OBJECTIVES = ("bert", "electra")
SETTINGS = ("default", "kept")  # glibc's defaults; freed memory kept (the product's default)


def allocator_probe(spec: dict) -> dict:
    """Time one preset's step in this fresh process: seconds, minor faults and system time per timed step."""
    s = settings_from_dict(spec["settings"])
    torch.set_num_threads(s.threads)
    cfg = compose_config(s, "tiny", f"experiment={spec['preset']}", f"objective={spec['objective']}",
                         f"runtime.precision={spec['precision']}", keep_shape=True)
    data = load_data(cfg, s.device, 3)
    runner = OursRunner(cfg, data, s.device, FastPath.from_runtime(cfg, s.device))
    seconds, faults, system, user = [], [], [], []
    for i in range(s.warmup + s.piece_reps):
        before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        runner.step([data.batches[i % len(data.batches)]])
        elapsed, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        if i >= s.warmup:
            seconds.append(elapsed)
            faults.append(after.ru_minflt - before.ru_minflt)
            system.append(after.ru_stime - before.ru_stime)
            user.append(after.ru_utime - before.ru_utime)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
    return {"step_s": statistics.median(seconds), "steps": seconds, "faults_per_step": statistics.mean(faults),
            "sys_s_per_step": statistics.mean(system), "user_s_per_step": statistics.mean(user),
            "peak_rss_mib": peak_kib / 1024,
            "allocator": allocator.state(), "vocab": runner.system.model.config.vocab_size,
            "batch": tuple(data.batches[0]["input_ids"].shape),
            "precision": precision_lib.resolve(cfg.runtime.precision, s.device.type)}


def probe_env(setting: str) -> dict[str, str]:
    """The environment of a probe: none of glibc's malloc variables; the switch off (default) or on (kept), so
    that the probe's own entry point sets what a user's command sets."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    env[allocator.ENV_SWITCH] = "0" if setting == "default" else "1"
    return env


def section_allocator(s: Settings, rep: Report) -> None:
    """Every preset's BERT and ELECTRA step at each of --precisions, default then kept, each in its own process."""
    for precision in s.precisions:
        for preset in PRESETS:
            for objective in OBJECTIVES:
                for setting in SETTINGS:
                    spec = {"kind": "allocator", "preset": preset, "objective": objective, "impl": setting,
                            "model": "tiny", "precision": precision}
                    result = run_probe(s, spec, env=probe_env(setting))
                    rep.allocator.append({**spec, **result})
                    log(f"allocator {preset} {objective} {precision} {setting}: {result['step_s']:.3f} s/step, "
                        f"{result['faults_per_step']:.0f} minor faults/step, peak RSS {result['peak_rss_mib']:.0f} MiB")
