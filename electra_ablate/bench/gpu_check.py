"""The GPU check: one command for a lent GPU machine that measures what the GPU path needs and writes
reports/benchmarks_gpu.md, in about 8 minutes (scripts/gpu_check.sh runs it there; docs/gpu.md says how).

Its parts, each a fresh process with its own time limit, so one that fails or runs long leaves the others and the
report standing (the report is rewritten after every part):

1. `speed`: this harness against transformers at ELECTRA-Small and -Base (bf16, 128 x 128 on a GPU), with the
   matmul peak and the host-device syncs of a step (`python -m electra_ablate.bench`).
2. `capture`: the eager step against the captured one (`runtime.compile=step`) at ELECTRA-Small, with compile time,
   peak memory and the gap between the two loss curves (the bench's `capture` section).
3. `loop`: the Lightning loop against the step alone, eager and captured (the bench's `loop` section).
4. `pilot`: a 2-minute ELECTRA-Small pilot on the Wikipedia sample (`python -m electra_ablate.probes.pilot`), its
   steps sized from part 1's step time.
5. `sweep`: the quick sweep with one fine-tuning seed, at smoke size, end to end (pre-training, fine-tuning,
   report) through the `joblib_gpu` launcher and MLflow, the product's main surface.

`--device cpu --smoke` runs every part at the tiny size on a CPU: how the tests check it (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

from electra_ablate.bench.gpu_check_report import (Part, Plan, pilot_summary, render, rows_of, shown,
                                                  sweep_summary)
from electra_ablate.bench.settings import REPO, BenchError, default_data_dir, log, resolve_device
from electra_ablate.common import cli
from electra_ablate.common.io import write_text
from electra_ablate.common.precision import cpu_name

DEFAULT_OUT = REPO / "reports" / "benchmarks_gpu.md"
# The tiny shape the smoke run uses everywhere (conftest's TINY_PRETRAIN).
TINY = ("model.hidden_size=64", "model.embedding_size=32", "model.num_hidden_layers=2", "model.num_attention_heads=2",
        "model.intermediate_size=128")


def bench_args(p: Plan, sections: str, out: Path, models: str, reps: int) -> list[str]:
    shape = (["--quick", "--batch-size", "8", "--seq-len", "64", "--override", "data.max_docs=400",
              *[x for o in TINY for x in ("--override", o)]] if p.smoke else ["--reps", str(reps)])
    return [sys.executable, "-m", "electra_ablate.bench", "--device", p.device.type, "--models", models,
            "--compile-models", p.capture_model, "--sections", sections, "--data-dir", str(p.data_dir),
            "--cache-dir", str(p.work / "cache"), "--out", str(out), "--json", str(out.with_suffix(".json")), *shape]


def pilot_args(p: Plan, steps: int) -> list[str]:
    shape = ([*TINY, "data.batch_size=8", "data.max_seq_length=64", "data.max_docs=400", "logger.log_every_n_steps=1",
              "trainer.checkpoint_every_n_steps=1000"] if p.smoke else ["logger.log_every_n_steps=50"])
    return [sys.executable, "-m", "electra_ablate.probes.pilot", "gpu-small", "experiment=small", "data=wiki_sample",
            f"trainer.max_steps={steps}", f"optim.warmup_steps={max(1, steps // 10)}", f"paths.data_dir={p.data_dir}",
            f"paths.cache_dir={p.work / 'cache'}", f"paths.root_dir={p.work}",
            f"trainer.accelerator={'gpu' if p.device.type == 'cuda' else 'cpu'}", "trainer.enable_progress_bar=false",
            *shape, "--out", str(p.work / "pilot.csv")]


def sweep_args(p: Plan) -> list[str]:
    pre = [*TINY, "data=wiki_sample", "data.max_docs=400", "data.max_seq_length=64",
           "data.batch_size=16" if p.smoke else "data.batch_size=128", "optim.warmup_steps=2",
           "trainer.max_steps=4" if p.smoke else "trainer.max_steps=200", "logger.log_every_n_steps=2",
           f"trainer.accelerator={'gpu' if p.device.type == 'cuda' else 'cpu'}"]
    fine = ["glue_data.max_train_examples=64" if p.smoke else "glue_data.max_train_examples=2000",
            "glue_data.max_eval_examples=64" if p.smoke else "glue_data.max_eval_examples=872",
            "glue_data.max_seq_length=64", "task.epochs=1",
            f"trainer.accelerator={'gpu' if p.device.type == 'cuda' else 'cpu'}"]

    def hydra_list(key: str, values: list[str]) -> str:
        return f"{key}=[" + ",".join(f"'{v}'" for v in values) + "]"

    return [sys.executable, "-m", "electra_ablate.sweep", f"sweep={p.work / SMOKE_SWEEP}",
            "hydra/launcher=joblib_gpu", "hydra.launcher.n_jobs=1", f"paths.root_dir={p.work / 'sweep'}",
            f"paths.data_dir={p.data_dir}", f"report_dir={p.work / 'sweep' / 'reports'}",
            hydra_list("pretrain_overrides", pre), hydra_list("finetune_overrides", fine)]


SMOKE_SWEEP = "gpu_smoke.yaml"


def write_smoke_sweep(work: Path) -> Path:
    """sweeps/quick.yaml with one fine-tuning seed (5 jobs: ELECTRA and BERT pre-trained, each arm fine-tuned once),
    as its own sweep file: the path every sweep takes, at the fewest jobs."""
    from omegaconf import OmegaConf

    spec = OmegaConf.load(REPO / "sweeps" / "quick.yaml")
    spec.name, spec.seeds = "gpu_smoke", [0]
    spec.description = "The quick sweep with one fine-tuning seed: the GPU check's end-to-end smoke run"
    path = work / SMOKE_SWEEP
    write_text(path, OmegaConf.to_yaml(spec))
    return path


def run_part(part: Part, env: dict[str, str], work: Path) -> None:
    log(f"gpu check: {part.name} (at most {part.limit_s} s): {shown(part.argv)}")
    log_path = work / f"{part.name}.log"
    t0 = time.perf_counter()
    with open(log_path, "w") as f:
        try:
            proc = subprocess.run(part.argv, stdout=f, stderr=subprocess.STDOUT, cwd=str(REPO), env=env,
                                  timeout=part.limit_s)
            part.status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
        except subprocess.TimeoutExpired:
            part.status = f"timed out after {part.limit_s} s"
    part.seconds = time.perf_counter() - t0
    text = log_path.read_text(errors="replace")
    part.log_tail = "\n".join(line for line in text.splitlines()[-25:])
    log(f"gpu check: {part.name} {part.status} in {part.seconds:.0f} s")


# ------------------------------------------------------------------------------------------- the command line


def machine(p: Plan) -> dict:
    import datetime
    import platform

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit.strip() or "? (no git here)", "cpu": cpu_name(), "cores": os.cpu_count(),
            "device": torch.cuda.get_device_name(p.device) if p.device.type == "cuda" else "CPU only",
            "python": platform.python_version(), "torch": torch.__version__}


def plan_parts(p: Plan, pilot_steps: int) -> list[Part]:
    # Limits: 9 minutes 10 s in all if every part ran to its limit; the parts usually end sooner. Compiling on a CPU
    # is slow, so the smoke run's limits are looser.
    scale = 1 if not p.smoke else 3
    return [
        Part("speed", "ours vs transformers, matmul peak, host-device syncs",
             bench_args(p, "pretrain,sync", p.work / "speed.md", p.models, 10), 100 * scale),
        Part("capture", "eager vs captured step, with compile time, peak memory and the loss gap",
             bench_args(p, "capture", p.work / "capture.md", p.capture_model, 20), 120 * scale),
        Part("loop", "the Lightning loop vs the step alone, eager and captured",
             bench_args(p, "loop", p.work / "loop.md", p.capture_model, 20), 120 * scale),
        Part("pilot", "a 2-minute ELECTRA-Small pilot", pilot_args(p, pilot_steps), 120 * scale),
        Part("sweep", "the quick sweep, one seed, smoke size, joblib_gpu + MLflow", sweep_args(p), 90 * scale),
    ]


def pilot_steps_from(speed: dict, smoke: bool, seconds: float = 90.0) -> int:
    """Steps that fill about `seconds` of training at part 1's eager ELECTRA-Small step time (1,100 if it was not
    measured); start-up and the data cache take the rest of the part's 2 minutes."""
    if smoke:
        return 4
    for r in speed.get("pretrain", []):
        if r["model"] == "small" and r["key"] == "ours":
            return max(100, int(seconds / r["step_s"]))
    return 1100


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(prog="python -m electra_ablate.bench.gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", help="auto (cuda when available), cuda or cpu")
    ap.add_argument("--smoke", action="store_true", help="every part at the tiny size (a dry run, e.g. on a CPU)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the report (default reports/benchmarks_gpu.md)")
    ap.add_argument("--work", type=Path, default=REPO / "outputs" / "gpu_check", help="scratch folder: caches, "
                                                                                     "logs, the sweep's store")
    ap.add_argument("--data-dir", type=Path, default=None, help="the data folder (default: $ELECTRA_ABLATE_DATA or "
                                                                "../shared/data)")
    ap.add_argument("--parts", default="speed,capture,loop,pilot,sweep", help="comma-separated subset of the parts")
    a = ap.parse_args(argv)
    device = resolve_device(a.device)
    if device.type == "cpu" and not a.smoke:
        raise BenchError("--device cpu measures nothing of the GPU path: add --smoke for the dry run")
    data_dir = (a.data_dir or default_data_dir()).resolve()
    if not (data_dir / "corpus" / "enwiki_sample_5mb.txt").is_file():
        raise BenchError(f"no corpus/enwiki_sample_5mb.txt under {data_dir}; pass --data-dir (docs/gpu.md: the data "
                         "folder carried to the GPU machine)")
    command = "python -m electra_ablate.bench.gpu_check " + shlex.join(argv if argv is not None else sys.argv[1:])
    p = Plan(device, a.smoke, a.work.resolve(), data_dir, a.out, command)
    p.work.mkdir(parents=True, exist_ok=True)
    wanted = [x for x in a.parts.split(",") if x]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "ELECTRA_ABLATE_DATA": str(data_dir),
           "ELECTRA_ABLATE_HOME": str(p.work / "sweep" / "outputs")}
    info = machine(p)
    write_smoke_sweep(p.work)
    parts = plan_parts(p, 0)
    unknown = sorted(set(wanted) - {x.name for x in parts})
    if unknown:
        raise BenchError(f"--parts {unknown} unknown; valid: {', '.join(x.name for x in parts)}")
    for i, part in enumerate(parts):
        if part.name not in wanted:
            continue
        if part.name == "pilot":
            parts[i] = part = plan_parts(p, pilot_steps_from(rows_of(p.work / "speed.json"), p.smoke))[i]
        run_part(part, env, p.work)
        if part.name == "pilot":
            part.outputs["pilot"] = pilot_summary(p.work / "pilot.csv")
        if part.name == "sweep":
            part.outputs["sweep"] = sweep_summary(p.work)
        write_text(p.out, render(p, [x for x in parts if x.name in wanted], info))  # partial results survive
    log(f"gpu check: wrote {p.out}")
    return p.out


@cli.one_line_errors
def cli_main() -> None:
    main()


if __name__ == "__main__":
    cli_main()
