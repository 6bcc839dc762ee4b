"""Freed memory kept in the process (Linux with glibc): without it a CPU pre-training step at a 30k vocabulary
spends much of its time in the kernel, zeroing pages it had just given back.

glibc serves a block over its mmap threshold (128 KiB, rising to at most 32 MiB as such blocks are freed) with its
own mmap and unmaps it when it is freed, and gives the heap's top back above the trim threshold. A step's largest
temporaries (the 30,522-way logits: hundreds of MB at `cpu_regime_30k`) are over any threshold, so every step maps
them again and the kernel zeroes each page on its first touch: hundreds of thousands of minor faults a step
(`python -m electra_ablate.bench --sections allocator`, docs/usage.md). Two of glibc's settings end it:

- M_MMAP_MAX=0 (glibc manual: "setting this to zero disables all use of mmap"): every block of the main thread, where
  a step runs, comes from the heap, where a freed block is reused by the next step (other threads' arenas still map
  a block larger than their 64 MiB heaps). It takes no size, unlike a raised M_MMAP_THRESHOLD: mallopt takes that as
  an int (2 GiB at most) and some glibc versions refuse values over HEAP_MAX_SIZE / 2 (32 MiB); glibc 2.36 (Debian
  12) took 256 MiB and served a 100 MiB block from the heap.
- M_TRIM_THRESHOLD=-1 ("disables trimming completely", man mallopt): the heap's top is never given back, where a
  finite threshold (MALLOC_TRIM_THRESHOLD_=4GiB, say) trims whenever the heap's free top grows past it.

They are set with mallopt in this process, at the start of every entry point (common/cli.py's `one_line_errors`,
before any tensor exists), and exported as glibc's environment variables, so that the processes it starts (joblib's
loky workers, submitit and Ray jobs, spawned data-loader workers) begin with them; forked ones inherit them anyway.
The price is memory: a process keeps its peak heap until it ends (the bench section gives peak RSS beside the time).

ELECTRA_ABLATE_KEEP_FREED_MEMORY=0 leaves glibc as it is, everywhere (the A/B baseline: glibc's own defaults);
`runtime.keep_freed_memory: false` in a job's config gives freed memory back in that job from its start (glibc's
static thresholds: its dynamic mmap threshold stays off once a setting has been made) and exports nothing further.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

ENV_SWITCH = "ELECTRA_ABLATE_KEEP_FREED_MEMORY"
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # malloc.h
# (mallopt parameter, environment variable, value that keeps freed memory, glibc's default)
SETTINGS = (
    (M_MMAP_MAX, "MALLOC_MMAP_MAX_", 0, 65536),
    (M_TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", -1, 128 * 1024),
)
SIZE_MAX = 2**64 - 1  # what mallopt makes of -1; the environment variable takes it unsigned
log = logging.getLogger(__name__)
_state: str | None = None  # "kept", "given back", "off" (ELECTRA_ABLATE_KEEP_FREED_MEMORY=0) or why it is unavailable


def _env_value(value: int) -> str:
    return str(SIZE_MAX if value < 0 else value)


def _mallopt():
    """glibc's mallopt, or None (another C library, another OS)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - glibc only (musl has a mallopt that does nothing)
        return libc.mallopt
    except (OSError, AttributeError):
        return None


def switched_off() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off")


def keep_freed_memory(keep: bool = True) -> str:
    """Keep freed memory in this process and the ones it starts (`keep`), or give it back from now on; returns
    what holds now (also `state()`). Nothing is changed under ELECTRA_ABLATE_KEEP_FREED_MEMORY=0."""
    global _state
    if switched_off():
        _state = "off"
        return _state
    mallopt = _mallopt()
    if mallopt is None:
        log.info("freed memory: left to the allocator (no glibc on %s)", sys.platform)
        _state = f"unavailable (no glibc on {sys.platform})"
        return _state
    gave_back = False
    for param, env, kept, default in SETTINGS:
        if keep and env not in os.environ:  # set: glibc read it at this process's start (a user's own value too)
            mallopt(param, kept)
            os.environ[env] = _env_value(kept)
        elif not keep and os.environ.get(env) == _env_value(kept):  # ours, set here or by the parent process
            mallopt(param, default)
            del os.environ[env]
            gave_back = True
    if gave_back:
        log.info("freed memory: given back to the OS in this job (runtime.keep_freed_memory=false)")
    _state = "kept" if keep else "given back"
    return _state


def for_job(cfg) -> str:
    """Apply a job's `runtime.keep_freed_memory` (true where its config has none: a sweep's, a report's) and say in
    its log what holds."""
    from omegaconf import OmegaConf

    keep = OmegaConf.select(cfg, "runtime.keep_freed_memory", default=True) is not False
    now = keep_freed_memory(keep)
    if now == "kept":
        settings = ", ".join(f"{env}={os.environ.get(env)}" for _, env, _, _ in SETTINGS)
        log.info("freed memory: kept in the process (%s); runtime.keep_freed_memory=false gives it back", settings)
    elif now == "off":
        log.info("freed memory: glibc's defaults (%s=0)", ENV_SWITCH)
    return now


def state() -> str:
    """What this process does with freed memory: kept, given back, off, unavailable (...) or glibc's default."""
    return _state or "glibc's default"
