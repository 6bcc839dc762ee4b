"""Minor page faults, CPU time and peak memory per step of a real pre-training job, with glibc's defaults and with
freed memory kept (electra_ablate/common/allocator.py), nothing else set by the user.

Each setting runs `python -m electra_ablate.pretrain experiment=cpu_regime_30k data.max_docs=2000` twice in fresh
processes, to `--short` and to `--long` steps (warm-up 2 steps; outputs, store and run folder of its own under --out,
one token cache for all), and takes the difference of the two children's rusage (os.wait4): what a step costs once
the process has started and built its data and networks. Peak RSS: each child's ru_maxrss, the shorter run's and
the longer run's. The token cache is built first, by an untimed 2-step run.

    OMP_NUM_THREADS=1 python scripts/freed_memory_job.py --out /tmp/freed_memory_job
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MALLOC = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_")


def run(out: Path, name: str, steps: int, keep: bool, extra: list[str]) -> resource.struct_rusage:
    """One pre-training job in a child process; that child's own rusage (os.wait4)."""
    root = out / name
    shutil.rmtree(root, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k not in MALLOC}
    env["ELECTRA_ABLATE_KEEP_FREED_MEMORY"] = "1" if keep else "0"
    command = [sys.executable, "-m", "electra_ablate.pretrain", "experiment=cpu_regime_30k", "data.max_docs=2000",
               f"trainer.max_steps={steps}", "optim.warmup_steps=2", f"paths.output_root={root}",
               f"paths.cache_dir={out / 'cache'}", f"logger.tracking_uri=sqlite:///{root}/mlflow.db",
               f"hydra.run.dir={root}/hydra", *extra]
    root.mkdir(parents=True)
    with open(root / "console.txt", "w") as console:
        child = subprocess.Popen(command, cwd=REPO, env=env, stdout=console, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        sys.exit(f"error: {' '.join(command)} exited with {child.returncode} (its console: {root}/console.txt)")
    return usage


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="run folders, stores and the token cache go here")
    p.add_argument("--short", type=int, default=4)
    p.add_argument("--long", type=int, default=16)
    p.add_argument("overrides", nargs="*", help="more pre-training overrides (objective=bert, paths.data_dir=...)")
    a = p.parse_args()
    run(a.out, "build_cache", 2, False, a.overrides)
    print("| allocator | steps | minor faults/step | system s/step | user s/step | peak RSS (MiB) |")
    print("|---|---|---|---|---|---|")
    for keep in (False, True):
        label = "kept" if keep else "default"
        short = run(a.out, f"{label}_{a.short}", a.short, keep, a.overrides)
        long = run(a.out, f"{label}_{a.long}", a.long, keep, a.overrides)

        def per_step(field: str) -> float:
            return (getattr(long, field) - getattr(short, field)) / (a.long - a.short)

        print(f"| {label} | {a.short} -> {a.long} | {per_step('ru_minflt'):.0f} | {per_step('ru_stime'):.3f} "
              f"| {per_step('ru_utime'):.3f} | {short.ru_maxrss / 1024:.0f} -> {long.ru_maxrss / 1024:.0f} |",
              flush=True)

if __name__ == "__main__":
    main()
