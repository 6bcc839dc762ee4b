"""The benchmark's markdown (reports/benchmarks.md) for a fixed set of measurements, byte for byte.

The expected files in tests/fixtures/ were rendered by the benchmark as it was before measurement and rendering
were split into modules (commit b3a6efb, `electra_ablate/bench/runner.py`), from the same measurements as below.
Hermetic: no data and no timing; the CPU's bf16 flags are pinned so `auto` resolves the same on every machine."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from electra_ablate.bench.render import render
from electra_ablate.bench.settings import Report, Settings
from electra_ablate.common import precision

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def fixed_report(settings_cls, report_cls, device: str) -> Report:
    """Measurements of every section, chosen to reach each formatting branch: a target met and one missed,
    a missing peak-memory cell, a NaN loader ratio, an empty and a non-empty sync table, a build of a prefix."""
    gpu = device == "cuda"
    precisions = ("bf16-mixed",) if gpu else ("32-true", "bf16-mixed")
    models = ("tiny",) if gpu else ("tiny", "small")
    s = settings_cls(
        models=models, device=torch.device(device), batch_size=128 if gpu else 32, seq_len=128, warmup=2, reps=5,
        piece_reps=5, threads=2, data_dir=Path("/data"), cache_dir=Path("/cache"), overrides=(),
        sections=("pretrain", "equal", "shapes", "pieces", "compile", "bert", "finetune", "data", "memory", "sync",
                  "build"),
        quick=False, compile_models=("tiny",), accumulate=4, command="python -m electra_ablate.bench --models tiny,small",
        precisions=precisions, build_paths=(), build_workers=2, build_max_docs=None if gpu else 1000,
    )
    rep = report_cls(s)
    rep.machine = {
        "date": "2026-01-02 03:04 UTC", "cpu": "Test CPU @ 2.00GHz", "cpu_bf16": "Test CPU @ 2.00GHz (no bf16 instructions)",
        "isa": "avx2, avx512f", "cores": 2, "threads": 2, "gpu": "Test GPU 80GB" if gpu else None,
        "python": "3.12.0", "torch": "2.0.0", "transformers": "4.0.0", "lightning": "2.0.0", "os": "Linux-test",
        "commit": "abc1234 (with uncommitted changes)", "load_start": (1.5, 1.25, 1.0), "load_end": (2.0, 1.75, 1.125),
    }
    for mi, model in enumerate(models):
        flops = 3.2e9 * (mi + 1)
        rep.peaks[model] = {}
        for pi, p in enumerate(precisions):
            shapes = {(4096, 256, 256): 1.1e11 * (pi + 1), (4096, 256, 1024): 1.3e11 * (pi + 1),
                      (614, 128, 30522): 9.5e10 * (pi + 1)}
            rep.peaks[model][p] = {"shapes": shapes, "peak": max(shapes.values())}
            for impl, key, slow in (("this harness", "ours", 1.0), ("transformers", "transformers", 3.5 - mi)):
                step_s = (0.25 + 0.5 * mi) * slow / (1 + 0.6 * pi)
                executed = flops * (1.0 if key == "ours" else 2.7)
                peak = rep.peaks[model][p]["peak"]
                rep.pretrain.append({
                    "model": model, "impl": impl, "key": key, "precision": p, "batch": f"{s.batch_size} x 128",
                    "step_s": step_s, "steps": [step_s * (1 + 0.01 * i) for i in range(3)],
                    "tokens_per_s": s.batch_size * 128 / step_s, "flops_paper": flops, "flops_executed": executed,
                    "achieved_paper": flops / step_s, "share_paper": flops / step_s / peak,
                    "achieved_executed": executed / step_s, "share_executed": executed / step_s / peak,
                })
        rep.equal.append({"model": model, "values": {"total": (10.123456, 10.123457), "generator MLM": (7.5, 7.500001),
                                                     "discriminator": (0.523456, 0.523455)},
                          "rel": {"total": 1e-7, "generator MLM": 1.3e-7, "discriminator": 1.9e-6}, "grad_rel": 2.5e-5,
                          "grads_compared": 58, "passed": mi == 0, "masked": 612, "replaced": 181})
        # peak memory of the main rows at the default precision; the second model has none (an empty cell)
        if mi == 0:
            for impl in ("ours", "transformers"):
                rep.memory.append({"model": model, "impl": impl, "batch_size": s.batch_size, "accumulate": 1, "steps": 2,
                                   "peak_mib": 812.4 if impl == "ours" else 1530.6, "kind": "RSS", "step_s": 0.41,
                                   "precision": precisions[0], "global_batch": s.batch_size})
        rep.finetune += [{"model": model, "task": "SST2", "precision": p, "variant": v, "batch": 32,
                          "padded_len": 25.5, "step_s": 0.1 + 0.05 * pi + 0.02 * vi + mi,
                          "examples_per_s": 32 / (0.1 + 0.05 * pi + 0.02 * vi + mi)}
                         for pi, p in enumerate(precisions) for vi, v in enumerate(("fast dropout", "torch dropout"))]
    rep.memory.append({"model": models[-1], "impl": "ours", "batch_size": s.batch_size, "accumulate": 4, "steps": 2,
                       "peak_mib": 2048.0, "kind": "RSS", "step_s": 1.7, "precision": precisions[0],
                       "global_batch": s.batch_size * 4})
    rep.shapes = [{"model": "tiny", "batch_size": b, "seq_len": t, "precision": p, "step_s": 0.01 * b * t / 4096 / (1 + pi),
                   "tokens_per_s": 4096 * (1 + pi) / 0.01} for b, t in ((32, 64), (128, 128))
                  for pi, p in enumerate(precisions)]
    rep.pieces = [{"model": models[-1], "piece": name, "default": f"{name} on", "switched": f"{name} off",
                   "default_s": 0.5, "switched_s": 0.5 + 0.1 * i}
                  for i, name in enumerate(("masked_only_logits", "sampler", "fused_adam"))]
    rep.compiled = [{"model": "tiny", "variant": v, "step_s": st, "compile_s": c}
                    for v, st, c in (("eager", 0.3, 0.0), ("compiled, fast dropout", 0.2, 41.25),
                                     ("compiled, torch dropout", 0.25, 39.0))]
    rep.bert = [{"model": models[-1], "variant": v, "step_s": st, "ratio": st / 0.4}
                for v, st in (("bert", 0.4), ("electra, generator 1/4", 0.5), ("electra, generator 1/1", 0.8))]
    if not gpu:
        rep.finetune_padding = [
            {"task": "SST2", "batching": "shuffled, padded to the batch's longest (default)", "examples": 2000,
             "real_tokens": 26000, "padded_tokens": 51000},
            {"task": "SST2", "batching": "length buckets (`glue_data.length_buckets=true`)", "examples": 2000,
             "real_tokens": 26000, "padded_tokens": 27100},
        ]
    rep.data = [{"model": m, "workers": w, "batch": s.batch_size, "batches_per_s": 40.0 * (w + 1),
                 "tokens_per_s": 40.0 * (w + 1) * s.batch_size * 128} for m in (models[-1], "base") for w in (0, 2)]
    rep.syncs = [] if gpu else [
        {"model": models[-1], "op": "aten::index", "why": "boolean-mask indexing: output size depends on the data",
         "site": "electra_ablate/objectives/base.py:10 `x[mask]`", "lib": "", "count": 3, "cuda": "yes"},
        {"model": models[-1], "op": "aten::_local_scalar_dense", "why": "reads a value on the host (.item(), bool(), float())",
         "site": "optimizer step", "lib": "torch/optim/adamw.py:1 `step`", "count": 2,
         "cuda": "no: the for-loop optimizer keeps its step counters on the host"},
    ]
    rep.build = [{"corpus": "enwiki_sample_5mb.txt" + ("" if gpu else " (first 1000 documents)"),
                  "mb": 5.0 if gpu else math.nan, "workers": 2, "shards": 4, "tokens": 1234567, "examples": 9876,
                  "wall_s": 12.34, "cpu_s": 23.45, "load": 1.5, "tokens_per_s": 1234567 / 12.34,
                  "tokens_per_cpu_s": 1234567 / 23.45}]
    rep.notes = ["A first note.", "A second note with `code`."]
    return rep


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_render_is_unchanged_for_fixed_measurements(monkeypatch, device):
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2"}))  # `auto` -> 32-true on any CPU
    expected = (FIXTURES / f"bench_render_{device}.md").read_text(encoding="utf-8")
    assert render(fixed_report(Settings, Report, device)) == expected


def test_throughput_section_gives_each_attention_path_and_layout_per_cpu_hour(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2"}))
    rep = fixed_report(Settings, Report, "cpu")
    rep.throughput = [
        {"kind": "attention", "objective": "bert", "attention": "sdpa", "step_s": 0.5, "tokens_per_s": 8192 / 0.5,
         "batch": (128, 64)},
        {"kind": "attention", "objective": "bert", "attention": "math", "step_s": 0.4, "tokens_per_s": 8192 / 0.4,
         "batch": (128, 64)},
        {"kind": "layout", "layout": "one 1-thread job", "jobs": 1, "threads": 1, "per_job": [20000.0],
         "tokens_per_s": 20000.0, "tokens_per_cpu_hour": 7.2e7, "cores_used": 1},
        {"kind": "layout", "layout": "2 1-thread jobs side by side", "jobs": 2, "threads": 1,
         "per_job": [15000.0, 14000.0], "tokens_per_s": 29000.0, "tokens_per_cpu_hour": 29000.0 * 1800,
         "cores_used": 2},
    ]
    text = render(rep)
    section = text.split("## Tokens per CPU-hour at the sweep's shape")[1].split("## Notes")[0]
    assert "`experiment=cpu_regime` (conf/experiment/cpu_regime.yaml" in section
    assert "| bert | 128 x 64 | sdpa | 0.500 | 16384 | 58.98 M | 1.00x |" in section
    assert "| bert | 128 x 64 | math | 0.400 | 20480 | 73.73 M | 1.25x |" in section
    assert "| 2 1-thread jobs side by side | 15000, 14000 | 29000 | 52.20 M | 0.72x |" in section
    rep.throughput = []
    assert "Tokens per CPU-hour" not in render(rep)  # a run without the section renders none
