"""The pre-training loop of a pilot: a config trained exactly as `python -m electra_ablate.pretrain` trains it
(training/build.py builds the data, the networks, the algorithm and the Trainer from the same config), but without
the run store, every train/* window written to a CSV as it closes. The bench's `loop` section times it against the
step alone (bench/sections_capture.py); the pilot command (probes/pilot.py) runs it on its own.
"""

from __future__ import annotations

import csv
import io
import tempfile
import time
from pathlib import Path

import torch
from omegaconf import DictConfig

from electra_ablate.bench.settings import BenchError, log
from electra_ablate.common.io import write_text
from electra_ablate.data.cache import load_cache
from electra_ablate.training import build


METRICS = ("mlm_loss", "masked_lm_accuracy", "masked_lm_accuracy_at_mask", "masked_lm_accuracy_at_kept",
           "sampled_masked_lm_accuracy", "disc_loss", "disc_accuracy", "disc_precision", "disc_recall", "disc_auc",
           "replaced_fraction", "loss", "tokens_per_s", "mfu", "lr")
COLUMNS = ("name", "step", "tokens", "seconds", *METRICS)
# The cache entry's settings (meta.json) that must be the data config's, as data.<key>.
CACHE_KEYS = ("max_seq_length", "train_vocab_size", "max_docs", "lowercase")


def cache_problems(cfg: DictConfig, meta: dict) -> list[str]:
    """Where a built cache entry's settings differ from the data config's (an empty list when they agree)."""
    return [f"data.{k}={cfg.data.get(k)} but the cache entry was built with {meta.get(k)}"
            for k in CACHE_KEYS if k in cfg.data and meta.get(k) != cfg.data.get(k)]


class CsvRows:
    """The windows a pilot's system logs, rewritten atomically to `out` as each closes."""

    def __init__(self, name: str, out: Path, tokens_per_step: int):
        self.name, self.out, self.tokens_per_step = name, out, tokens_per_step
        self.rows: list[dict] = []
        self.started = time.perf_counter()

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        if not any(f"train/{k}" in metrics for k in METRICS):
            return  # not a window (runtime/compile_s, sent once by fast.CompileTimer)
        row = {"name": self.name, "step": step, "tokens": step * self.tokens_per_step,
               "seconds": round(time.perf_counter() - self.started, 2)}
        row |= {k: metrics.get(f"train/{k}", "") for k in METRICS}
        self.rows.append(row)
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(self.rows)
        write_text(self.out, text.getvalue())


def run(name: str, cfg: DictConfig, out: Path, cache: Path | None = None) -> list[dict]:
    """Train `cfg` as pre-training does and return (and write to `out`) its windows."""
    if cache is not None:
        entry = load_cache(cache)  # refused in one line when it is not a cache entry
        problems = cache_problems(cfg, entry.meta)
        if problems:
            raise BenchError(f"--cache {cache}: " + "; ".join(problems) + " (build that entry with these settings, or "
                             "pass the data config it was built with)")
    build.seeded(cfg)  # as pre-training builds (training/pretraining.py), so the curves are its own
    dm = build.data_module(cfg)
    if cache is not None:
        dm._cache = entry
    dm.prepare()
    model, generator, system = build.trained_system(cfg, dm, build.sharing_mode(cfg))
    with tempfile.TemporaryDirectory(prefix=f"pilot-{name}-") as store:
        trainer = build.trainer(cfg, Path(store), system.automatic_optimization, [])
        global_batch = build.count_flops(cfg, system, model, generator, trainer)
        rows = CsvRows(name, out, global_batch * cfg.data.max_seq_length)
        system.metrics_sink = rows
        log(f"pilot {name}: {cfg.trainer.max_steps} steps at {build.resolve_precision(cfg)} on "
            f"{torch.cuda.get_device_name() if build.on_gpu(cfg) else 'cpu'} -> {out}")
        trainer.fit(system, datamodule=dm)
    return rows.rows
