"""What one benchmark run is asked to do and what it found: its settings (from the command line), the sections
it knows, the machine it ran on, and the measurements every section adds to (`Report`), which `render` turns into
reports/benchmarks.md."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from electra_ablate.common import precision as precision_lib

REPO = Path(__file__).resolve().parents[2]
CONF_DIR = REPO / "conf"
DEFAULT_OUT = REPO / "reports" / "benchmarks.md"
NO_GPU_NOTE = "no GPU was visible to torch on this machine"
PROBE_TAG = "BENCH_MEMORY_PROBE "
LAYOUT_STEPS_PER_REP = 4  # the throughput section's layout jobs time 4 x --piece-reps steps each (~10 s at cpu_regime)


class BenchError(ValueError):
    pass


# ------------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    models: tuple[str, ...]
    device: torch.device
    batch_size: int
    seq_len: int
    warmup: int
    reps: int
    piece_reps: int
    threads: int
    data_dir: Path
    cache_dir: Path
    overrides: tuple[str, ...]
    sections: tuple[str, ...]
    quick: bool
    compile_models: tuple[str, ...]
    accumulate: int
    command: str
    precisions: tuple[str, ...] = (precision_lib.FP32,)
    build_paths: tuple[str, ...] = ()
    build_workers: int = 0
    build_max_docs: int | None = None
    throughput_experiment: str = "cpu_regime"  # the conf/experiment whose shape the throughput section times


# The precisions the benchmark knows how to run (as Lightning names them; `builds.autocast`).
PRECISIONS = (precision_lib.FP32, precision_lib.BF16)


def default_precisions(device_type: str) -> tuple[str, ...]:
    """What `runtime.precision=auto` resolves to on this device (bf16-mixed on CUDA and on a CPU with native bf16,
    else fp32); on such a CPU fp32 as well, to show both."""
    auto = precision_lib.resolve(precision_lib.AUTO, device_type)
    return PRECISIONS if device_type == "cpu" and auto == precision_lib.BF16 else (auto,)


SECTIONS = ("pretrain", "equal", "shapes", "pieces", "compile", "bert", "finetune", "data", "memory", "sync", "build",
            "throughput", "presets", "allocator", "profile", "head", "capture", "loop")
# The sections a plain `python -m electra_ablate.bench` runs: capture and loop compile and train, for the GPU check
# (scripts/gpu_check.sh) or on request.
DEFAULT_SECTIONS = SECTIONS[:-2]


def resolve_device(name: str) -> torch.device:
    """--device: auto (cuda when torch sees a GPU, else cpu), cpu or cuda."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BenchError("--device cuda, but torch sees no GPU; use --device cpu")
    return device


def default_data_dir() -> Path:
    return Path(os.environ.get("ELECTRA_ABLATE_DATA", REPO.parent / "shared" / "data")).resolve()


def settings_to_dict(s: Settings) -> dict:
    d = {k: getattr(s, k) for k in s.__dataclass_fields__}
    d["device"], d["data_dir"], d["cache_dir"] = str(s.device), str(s.data_dir), str(s.cache_dir)
    return d


def settings_from_dict(d: dict) -> Settings:
    d = dict(d)
    d["device"], d["data_dir"], d["cache_dir"] = torch.device(d["device"]), Path(d["data_dir"]), Path(d["cache_dir"])
    for k in ("models", "overrides", "sections", "compile_models", "build_paths"):
        d[k] = tuple(d[k])
    d["precisions"] = tuple(d.get("precisions", (precision_lib.FP32,)))
    return Settings(**d)


# ------------------------------------------------------------------------------------------- results


@dataclass
class Report:
    settings: Settings
    machine: dict = field(default_factory=dict)
    peaks: dict[str, dict] = field(default_factory=dict)
    pretrain: list[dict] = field(default_factory=list)
    equal: list[dict] = field(default_factory=list)
    pieces: list[dict] = field(default_factory=list)
    compiled: list[dict] = field(default_factory=list)
    bert: list[dict] = field(default_factory=list)
    finetune: list[dict] = field(default_factory=list)
    shapes: list[dict] = field(default_factory=list)
    finetune_padding: list[dict] = field(default_factory=list)
    data: list[dict] = field(default_factory=list)
    memory: list[dict] = field(default_factory=list)
    syncs: list[dict] = field(default_factory=list)
    build: list[dict] = field(default_factory=list)
    throughput: list[dict] = field(default_factory=list)
    capture: list[dict] = field(default_factory=list)
    loop: list[dict] = field(default_factory=list)
    allocator: list[dict] = field(default_factory=list)
    profile: list[dict] = field(default_factory=list)
    head: list[dict] = field(default_factory=list)  # the vocabulary head three ways (sections_head.py)
    head_passes: list[dict] = field(default_factory=list)  # each pass over its logits alone
    notes: list[str] = field(default_factory=list)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------- machine


def machine_info(s: Settings) -> dict:
    import pytorch_lightning
    import transformers

    flags = precision_lib.cpu_flags()
    isa = ", ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags)
    gpu = torch.cuda.get_device_name(s.device) if s.device.type == "cuda" else None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                    text=True, cwd=REPO).stdout.strip())
    except OSError:
        commit, dirty = "?", False
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": precision_lib.cpu_name(), "cpu_bf16": precision_lib.describe_cpu(), "isa": isa,
        "cores": os.cpu_count(), "threads": torch.get_num_threads(), "gpu": gpu,
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "lightning": pytorch_lightning.__version__, "os": platform.platform(),
        "commit": commit + (" (with uncommitted changes)" if dirty else ""),
        "load_start": os.getloadavg(),
    }
