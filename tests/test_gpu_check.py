"""The GPU check (bench/gpu_check.py): its report judges the targets from the parts' rows, sizes the pilot from the
measured step, and refuses to pass a CPU run off as a GPU measurement. Its dry run on a CPU (`--device cpu
--smoke`, every part end to end) is docs/gpu.md's command, run by tests/test_docs_commands.py (slow)."""

from __future__ import annotations

import json

import pytest
import torch

from electra_ablate.bench import gpu_check
from electra_ablate.bench.settings import BenchError


def _plan(tmp_path, smoke=False):
    return gpu_check.Plan(torch.device("cpu"), smoke, tmp_path, tmp_path, tmp_path / "out.md", "python -m ...")


def _pretrain(model, key, step_s, tokens_per_s, share):
    return {"model": model, "key": key, "impl": key, "precision": "bf16-mixed", "step_s": step_s,
            "tokens_per_s": tokens_per_s, "share_paper": share}


def _write_parts(tmp_path):
    speed = {"pretrain": [_pretrain("small", "ours", 0.076, 215_000, 0.08),
                          _pretrain("small", "transformers", 0.096, 171_000, 0.06),
                          _pretrain("base", "ours", 0.091, 181_000, 0.45),
                          _pretrain("base", "transformers", 0.114, 144_000, 0.36)]}
    capture = {
        "capture": [{"model": "small", "variant": "eager", "step_s": 0.08, "tokens_per_s": 204_800,
                     "compile_s": 0.0, "loss_gap": 0.0, "steps_compared": 13},
                    {"model": "small", "variant": "step, reduce-overhead", "step_s": 0.016, "tokens_per_s": 1_024_000,
                     "compile_s": 70.0, "loss_gap": 0.004, "steps_compared": 13}]}
    loop = {
        "loop": [{"model": "small", "variant": "eager", "ratio": 0.95, "loop_tokens_per_s": 194_560,
                  "step_tokens_per_s": 204_800},
                 {"model": "small", "variant": "step compiled", "ratio": 0.6, "loop_tokens_per_s": 614_400,
                  "step_tokens_per_s": 1_024_000}]}
    (tmp_path / "speed.json").write_text(json.dumps(speed))
    (tmp_path / "capture.json").write_text(json.dumps(capture))
    (tmp_path / "loop.json").write_text(json.dumps(loop))
    (tmp_path / "capture.md").write_text("# Benchmarks\n\n- header\n\n## The captured step (`x`)\n\n| a |\n\n## Notes\n")
    return speed


def test_the_report_judges_each_target_from_the_parts_rows(tmp_path):
    _write_parts(tmp_path)
    sweep = gpu_check.Part("sweep", "the quick sweep", ["python", "-m", "electra_ablate.sweep"], 100, status="ok")
    text = gpu_check.render(_plan(tmp_path), [sweep], {"date": "d", "commit": "c", "device": "NVIDIA H100",
                                                        "cpu": "x", "cores": 16, "python": "3.12", "torch": "2"})
    assert "| ELECTRA-Small at 1,000,000 tokens/s or more | 1,024,000 (best; eager 215,000; transformers 171,000) " \
           "| yes |" in text
    assert "| ELECTRA-Base at 40% or more of the matmul peak (bf16-mixed, paper FLOPs, eager) | 45% (transformers " \
           "36%) | yes |" in text
    assert "| the loop within 10% of the step (small, eager) | 95% (194,560 of 204,800 tokens/s) | yes |" in text
    assert "| the loop within 10% of the step (small, step compiled) | 60% (614,400 of 1,024,000 tokens/s) | no |" in text
    assert "| the captured step faster than eager (what would make `runtime.compile=step` the CUDA default) | 5.00x, " \
           "loss gap 0.40% over 13 steps, compile 70 s | yes |" in text
    assert "| the quick sweep at smoke size, end to end through joblib_gpu | ok | yes |" in text
    # The part's section, one level down, without the bench report's header and notes.
    assert "### The captured step (`x`)" in text and "- header" not in text and "Notes" not in text


def test_the_pilot_fills_its_minutes_at_the_measured_step(tmp_path):
    speed = _write_parts(tmp_path)
    assert gpu_check.pilot_steps_from(speed, smoke=False) == int(90 / 0.076)
    assert gpu_check.pilot_steps_from({}, smoke=False) == 1100  # part 1 failed: a guess that fits the part's limit
    assert gpu_check.pilot_steps_from(speed, smoke=True) == 4


def test_a_cpu_run_is_a_smoke_run_or_nothing(tmp_path, data_dir):
    with pytest.raises(BenchError, match="--device cpu measures nothing of the GPU path: add --smoke"):
        gpu_check.main(["--device", "cpu", "--data-dir", str(data_dir), "--work", str(tmp_path)])
    with pytest.raises(BenchError, match="no corpus/enwiki_sample_5mb.txt under .*; pass --data-dir"):
        gpu_check.main(["--device", "cpu", "--smoke", "--data-dir", str(tmp_path), "--work", str(tmp_path)])


def test_the_smoke_sweep_is_the_quick_sweep_with_one_seed(tmp_path):
    from omegaconf import OmegaConf

    spec = OmegaConf.load(gpu_check.write_smoke_sweep(tmp_path))
    quick = OmegaConf.load(gpu_check.REPO / "sweeps" / "quick.yaml")
    assert list(spec.seeds) == [0] and spec.variants == quick.variants and spec.scales == quick.scales
