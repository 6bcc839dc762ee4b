"""The captured training step (runtime.compile=step): one graph with no breaks, batches of one shape, and the
same loss curve as the eager step. On CPU, where inductor compiles C++; a GPU adds CUDA-graph replay on top
(scripts/gpu_check.sh measures it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch._dynamo

from electra_ablate.probes import pilot
from electra_ablate.objectives.base import Batch
from electra_ablate.training import build
from electra_ablate.training.checks import ConfigError, validate
from tests.conftest import TINY_PRETRAIN


def _built(cfg):
    build.seeded(cfg)
    dm = build.data_module(cfg)
    dm.prepare()
    return dm, *build.trained_system(cfg, dm)


def test_the_step_is_one_graph_with_no_breaks(tmp_path, pretrain_cfg):
    """The default fast path (fast dropout masks, written-out attention, inverse-CDF sampling) traced as one graph:
    what fullgraph=True demands of runtime.compile=step."""
    cfg = pretrain_cfg(tmp_path, "objective=electra", "model.hidden_dropout_prob=0.1",
                       "model.attention_probs_dropout_prob=0.1")
    dm, _, _, system = _built(cfg)
    system.train()
    batch = next(iter(dm.train_dataloader()))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(system._objective_forward)(**batch)
    assert explained.graph_break_count == 0, [str(r.reason)[:200] for r in explained.break_reasons]
    assert explained.graph_count == 1


def test_static_shapes_pad_every_batch_to_the_sequence_length(tmp_path, pretrain_cfg):
    """With a captured step every batch has the shape (batch, max_seq_length); without it, batches of short rows
    are cut to their longest row (so the sample here must have some, or the test proves nothing)."""
    shapes = {}
    for label, extra in (("dynamic", ()), ("step", ("runtime.compile=step",))):
        cfg = pretrain_cfg(tmp_path / label, "data.batch_size=2", *extra)
        dm = build.data_module(cfg)
        dm.prepare()
        loader = iter(dm.train_dataloader())
        shapes[label] = {tuple(next(loader)["input_ids"].shape) for _ in range(60)}
    assert len(shapes["dynamic"]) > 1, "no short batch in the sample: nothing to pad"
    assert shapes["step"] == {(2, 64)}


def test_a_captured_step_is_refused_where_it_cannot_run(tmp_path, pretrain_cfg):
    with pytest.raises(ConfigError) as refused:
        validate(pretrain_cfg(tmp_path, "runtime.compile=everything"))
    assert str(refused.value) == "runtime.compile='everything' must be one of false, networks, step (true = networks)"
    with pytest.raises(ConfigError, match=r"runtime.compile_mode='fast' must be one of auto, default, reduce-overhead"):
        validate(pretrain_cfg(tmp_path, "runtime.compile_mode=fast"))
    with pytest.raises(ConfigError, match=r"runtime.compile=step captures the joint training step; "
                                          r"algorithm=two_stage .* use runtime.compile=networks"):
        validate(pretrain_cfg(tmp_path, "objective=electra", "algorithm=two_stage", "sharing=none",
                              "runtime.compile=step"))


def _pilot(tmp: Path, data_dir: Path, cache: Path, *extra: str) -> list[dict]:
    settings = {**TINY_PRETRAIN, "paths.root_dir": str(tmp), "paths.data_dir": str(data_dir),
                "paths.cache_dir": str(cache), "objective": "electra", "trainer.max_steps": "6",
                "logger.log_every_n_steps": "1", "optim.warmup_steps": "2", "runtime.precision": "32-true", "runtime.static_shapes": "true",
                "model.hidden_dropout_prob": "0.1", "model.attention_probs_dropout_prob": "0.1"}
    settings.update(o.split("=", 1) for o in extra)
    return pilot.main([tmp.name, *[f"{k}={v}" for k, v in settings.items()], "--out", str(tmp / "curve.csv")])


@pytest.mark.slow
def test_the_captured_step_draws_the_eager_loss_curve(tmp_path, data_dir, token_cache):
    """Six steps of Lightning training, eager and compiled as one graph, from the same seed and batches. Inductor
    draws its own random numbers unless told to take torch's (fallback_random), and a compiled graph drops out with
    torch's dropout (fast.fast_dropout), so the eager run takes torch's dropout too: then the masks, samples and
    dropout are the same and every logged value must agree to float32 rounding."""
    import torch._inductor.config as inductor

    torch._dynamo.reset()
    eager = _pilot(tmp_path / "eager", data_dir, token_cache, "runtime.fast_dropout=false")
    with inductor.patch(fallback_random=True):  # inductor's own config patch: restored exactly afterwards
        captured = _pilot(tmp_path / "step", data_dir, token_cache, "runtime.compile=step")
    torch._dynamo.reset()  # later tests compile without this setting
    assert [r["step"] for r in captured] == [r["step"] for r in eager] == [1, 2, 3, 4, 5, 6]
    for key in ("loss", "mlm_loss", "disc_loss", "masked_lm_accuracy", "disc_accuracy", "replaced_fraction"):
        got, want = [r[key] for r in captured], [r[key] for r in eager]
        # Inductor's fused kernels sum in another order than eager's, by the CPU's vector width, and the rounding
        # grows with each optimizer step (1.8e-5 relative by step 4 on a CPU without bf16); a different mask,
        # sample or dropout moves these values by percents.
        assert got == pytest.approx(want, rel=1e-4, abs=1e-6), key
    assert eager[-1]["loss"] < eager[0]["loss"]  # the curve moves: the comparison is of training, not of a constant
