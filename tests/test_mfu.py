"""train/mfu: the paper's FLOPs of each logged window per second, over the device's peak at the run's precision
(common/peaks.py: the GPU datasheet table, or the matmul probe on a CPU)."""

from __future__ import annotations

import pytest
import torch
from mlflow.tracking import MlflowClient

from electra_ablate import pretrain
from electra_ablate.common import peaks


@pytest.mark.parametrize("name, precision, matmul, tflops", [
    ("NVIDIA H100 80GB HBM3", "bf16-mixed", "high", 989.4),  # the SXM part, as torch names it
    ("NVIDIA H100 PCIe", "bf16-mixed", "high", 756.5),
    ("NVIDIA H100 NVL", "32-true", "highest", 60.0),
    ("NVIDIA H200", "bf16-mixed", "high", 989.4),
    ("NVIDIA H200 NVL", "bf16-mixed", "high", 835.5),
    ("NVIDIA A100-SXM4-80GB", "32-true", "high", 156.0),  # TF32 where matmul_precision allows it
    ("NVIDIA A100-SXM4-80GB", "32-true", "highest", 19.5),
    ("NVIDIA L4", "16-mixed", "high", 121.0),
    ("NVIDIA L40S", "bf16-mixed", "high", 366.5),
])
def test_gpu_peaks_come_from_the_datasheet_row_of_that_part(name, precision, matmul, tflops):
    peak = peaks.gpu_peak(name, precision, matmul)
    assert peak.flops == pytest.approx(tflops * 1e12) and "datasheet" in peak.source


def test_an_unknown_device_is_probed_once_per_process():
    assert peaks.gpu_peak("NVIDIA GeForce GTX 1080", "32-true") is None
    peaks.probe.cache_clear()
    first = peaks.device_peak(torch.device("cpu"), "32-true")
    again = peaks.device_peak(torch.device("cpu"), "32-true")
    assert first == again and peaks.probe.cache_info().hits == 1
    assert 1e8 < first.flops < 1e14 and "float32 matmul" in first.source


def test_every_window_logs_its_model_flops_utilisation(tmp_path, pretrain_cfg):
    """mfu x peak = FLOPs per step x steps per second, with steps per second from the window's own tokens/s."""
    cfg = pretrain_cfg(tmp_path, "objective=electra", "trainer.max_steps=12", "logger.log_every_n_steps=4")
    run_id = pretrain.train(cfg)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")

    def history(key):
        return {m.step: m.value for m in client.get_metric_history(run_id, key)}

    mfu, tokens_per_s, flops = history("train/mfu"), history("train/tokens_per_s"), history("train/flops")
    (peak,) = history("runtime/peak_flops").values()
    assert sorted(mfu) == [4, 8, 12]
    tokens_per_step = cfg.data.batch_size * cfg.data.max_seq_length  # hermetic rows fill the length
    for step, value in mfu.items():
        assert 0 < value < 1
        assert value * peak == pytest.approx(flops[12] / 12 * tokens_per_s[step] / tokens_per_step, rel=1e-3)
