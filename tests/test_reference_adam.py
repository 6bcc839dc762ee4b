"""The reference's optimizer and loss: `ReferenceAdam` against a numpy transcription of the update rule of
google-research/electra model/optimization.py (and of bias-corrected Adam, Kingma & Ba 2015 Algorithm 1 with
decoupled weight decay), the summed fine-tuning loss of run_finetuning.py, the composed configs, and the run
identities of the options."""

from __future__ import annotations

import copy
import types
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from hydra import compose, initialize_config_dir
from mlflow.tracking import MlflowClient

from electra_ablate import pretrain
from electra_ablate.finetuning import run as finetuning
from electra_ablate.glue import tasks as glue
from electra_ablate.finetuning.system import FinetuneSystem, OptimSettings
from electra_ablate.models.encoder import ElectraModel, EncoderConfig
from electra_ablate.tracking import runs as tracking
from electra_ablate.optim.adam import adam_over_parameters
from electra_ablate.optim.reference_adam import ReferenceAdam

REPO = Path(__file__).resolve().parents[1]
B1, B2, EPS = 0.9, 0.999, 1e-6


def numpy_step(p, g, m, v, t, lr, wd, bias_correction):
    """One update, written from the equations (float64). Reference (optimization.py _apply_gradients):
    next_m = b1 m + (1 - b1) g; next_v = b2 v + (1 - b2) g^2; update = next_m / (sqrt(next_v) + eps) + wd p;
    p - lr update. Bias-corrected Adam divides next_m by 1 - b1^t and next_v by 1 - b2^t first."""
    m = B1 * m + (1 - B1) * g
    v = B2 * v + (1 - B2) * g * g
    m_hat, v_hat = (m / (1 - B1**t), v / (1 - B2**t)) if bias_correction else (m, v)
    update = m_hat / (np.sqrt(v_hat) + EPS) + wd * p
    return p - lr * update, m, v


def run_both(bias_correction: bool, kernel: str, steps: int = 6, seed: int = 0):
    """Step ReferenceAdam and the transcription on the same gradients: a decayed weight (wd 0.01) and an
    excluded one (a LayerNorm or bias: wd 0) in two groups with their own lrs, under a changing schedule."""
    rng = np.random.default_rng(seed)
    init = {"decayed": rng.normal(size=(4, 3)), "excluded": rng.normal(size=(3,))}
    wd = {"decayed": 0.01, "excluded": 0.0}
    base_lr = {"decayed": 1e-3, "excluded": 3e-3}  # layer-wise lrs: one per group
    params = {k: torch.nn.Parameter(torch.tensor(v, dtype=torch.float32)) for k, v in init.items()}
    opt = ReferenceAdam([{"params": [params[k]], "lr": base_lr[k], "weight_decay": wd[k]} for k in init],
                        betas=(B1, B2), eps=EPS, bias_correction=bias_correction, **KERNELS[kernel])
    ref = {k: (v.copy(), np.zeros_like(v), np.zeros_like(v)) for k, v in init.items()}
    for t in range(1, steps + 1):
        factor = min(1.0, t / 3)  # warmup: the lr a scheduler writes into each group changes every step
        for group, k in zip(opt.param_groups, init):
            group["lr"] = base_lr[k] * factor
        for k in init:
            g = rng.normal(scale=10.0 ** rng.integers(-3, 2), size=init[k].shape)  # gradients of varied size
            params[k].grad = torch.tensor(g, dtype=torch.float32)
            p, m, v = ref[k]
            ref[k] = numpy_step(p, g.astype(np.float32).astype(np.float64), m, v, t, base_lr[k] * factor, wd[k],
                                bias_correction)
        opt.step()
    return params, ref, opt


KERNELS = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


@pytest.mark.parametrize("kernel", KERNELS)  # torch's three AdamW implementations, each used by some setting
@pytest.mark.parametrize("bias_correction", [False, True], ids=["reference", "bias-corrected"])
def test_update_matches_the_transcribed_rule(bias_correction, kernel):
    params, ref, opt = run_both(bias_correction, kernel)
    for k, p in params.items():
        np.testing.assert_allclose(p.detach().numpy(), ref[k][0], rtol=0, atol=1e-6, err_msg=k)
        state = opt.state[p]
        np.testing.assert_allclose(state["exp_avg"].numpy(), ref[k][1], rtol=1e-5, atol=1e-9, err_msg=k)
        np.testing.assert_allclose(state["exp_avg_sq"].numpy(), ref[k][2], rtol=1e-5, atol=1e-12, err_msg=k)
    # The weights moved by far more than the tolerance, so the comparison is not vacuous.
    init_params, _, _ = run_both(bias_correction, kernel, steps=0)
    assert all(np.abs(params[k].detach().numpy() - init_params[k].detach().numpy()).max() > 1e-4 for k in params)


def test_without_bias_correction_the_first_step_is_3_16_times_adams():
    """At t = 1, m = (1 - b1) g and v = (1 - b2) g^2: the reference steps lr (1 - b1) / sqrt(1 - b2) sign(g)
    = 3.16 lr sign(g) where Adam steps lr sign(g) (eps aside), the factor the module docstring gives."""
    g = torch.tensor([2.0, -0.5, 0.1])
    moved = {}
    for bias_correction in (False, True):
        p = torch.nn.Parameter(torch.zeros(3))
        opt = ReferenceAdam([p], lr=0.1, eps=EPS, bias_correction=bias_correction)
        p.grad = g.clone()
        opt.step()
        moved[bias_correction] = p.detach().numpy()
    np.testing.assert_allclose(moved[True], -0.1 * np.sign(g.numpy()), rtol=1e-3)
    np.testing.assert_allclose(moved[False], 0.1 / np.sqrt(0.001) * moved[True], rtol=1e-3)


def test_bias_corrected_matches_torch_adamw():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(5, 4))
    b = torch.nn.Parameter(a.detach().clone())
    ours = ReferenceAdam([a], lr=1e-2, eps=EPS, weight_decay=0.01, bias_correction=True)
    theirs = torch.optim.AdamW([b], lr=1e-2, eps=EPS, weight_decay=0.01)
    for _ in range(5):
        g = torch.randn(5, 4)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_state_dict_resume_continues_exactly():
    """A checkpointed run resumes the optimizer bit for bit (the step count and both moments are state)."""
    torch.manual_seed(0)
    grads = [torch.randn(6) for _ in range(6)]
    p = torch.nn.Parameter(torch.randn(6))
    q = torch.nn.Parameter(p.detach().clone())
    straight = ReferenceAdam([p], lr=1e-2, weight_decay=0.01)
    for g in grads:
        p.grad = g.clone()
        straight.step()
    first = ReferenceAdam([q], lr=1e-2, weight_decay=0.01)
    for g in grads[:3]:
        q.grad = g.clone()
        first.step()
    saved = copy.deepcopy(first.state_dict())
    resumed = ReferenceAdam([q], lr=1e-2, weight_decay=0.01)
    resumed.load_state_dict(saved)
    for g in grads[3:]:
        q.grad = g.clone()
        resumed.step()
    assert torch.equal(p, q)


def test_adam_over_parameters_picks_the_update():
    params = [("layer.weight", torch.nn.Parameter(torch.zeros(2, 2))), ("layer.bias", torch.nn.Parameter(torch.zeros(2)))]
    reference = adam_over_parameters(params, 1e-3, (0.9, 0.999), 1e-6, 0.01, fused=True, bias_correction=False)
    assert isinstance(reference, ReferenceAdam) and reference.param_groups[0]["fused"] is True
    assert [g["weight_decay"] for g in reference.param_groups] == [0.01, 0.0]  # no decay on the bias
    assert all(g["bias_correction"] is False for g in reference.param_groups)
    assert type(adam_over_parameters(params, 1e-3, (0.9, 0.999), 1e-6, 0.01)) is torch.optim.AdamW  # today's default


# --- the fine-tuning loss --------------------------------------------------------------------------------

TINY = EncoderConfig(vocab_size=40, embedding_size=16, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=32)


def settings(**kw) -> OptimSettings:
    return OptimSettings(1e-3, 0.8, True, (0.9, 0.999), 1e-6, 0.0, 0.1, **kw)


@pytest.mark.parametrize("task", ["rte", "stsb"])
def test_summed_loss_gives_batch_size_times_the_mean_gradient(task):
    torch.manual_seed(0)
    spec = glue.TASKS[task]
    grads = {}
    for reduction in ("sum", "mean"):
        torch.manual_seed(0)
        system = FinetuneSystem(ElectraModel(TINY), spec, settings(loss_reduction=reduction), dev_labels={}).eval()
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(1, 40, (6, 10), generator=g)
        labels = torch.rand(6, generator=g) * 5 if spec.is_regression else torch.randint(0, 2, (6,), generator=g)
        loss = system.loss(system(ids, torch.ones_like(ids), torch.zeros_like(ids)), labels)
        loss.backward()
        grads[reduction] = torch.cat([p.grad.flatten() for p in system.parameters() if p.grad is not None])
    assert grads["sum"].abs().max() > 0
    torch.testing.assert_close(grads["sum"], 6 * grads["mean"], rtol=1e-4, atol=1e-6)  # float32 round-off


def test_finetune_system_builds_the_configured_optimizer():
    for kw, kind in [({}, ReferenceAdam), ({"bias_correction": True, "loss_reduction": "mean"}, torch.optim.AdamW)]:
        system = FinetuneSystem(ElectraModel(TINY), glue.TASKS["rte"], settings(fused=False, **kw), dev_labels={})
        system._trainer = types.SimpleNamespace(estimated_stepping_batches=10)
        assert type(system.configure_optimizers()["optimizer"]) is kind


# --- configs and identities ------------------------------------------------------------------------------


def compose_cfg(name: str, *overrides: str):
    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        return compose(name, overrides=["paths.output_dir=/unused", *overrides])  # no Hydra run: nothing resolves it


def test_composed_configs_show_the_update_and_reduction():
    o = compose_cfg("finetune").finetune_optim
    assert (o.bias_correction, o.loss_reduction, o.lr_by_size.small, o.weight_decay) == (False, "sum", 3e-4, 0.0)
    released = compose_cfg("finetune", "finetune_optim=released_code").finetune_optim  # configure_finetuning.py
    assert (released.bias_correction, released.loss_reduction, dict(released.lr_by_size), released.weight_decay) == (
        False, "sum", {"small": 1e-4, "base": 1e-4, "large": 5e-5}, 0.01)
    assert compose_cfg("pretrain").optim.bias_correction is True  # pre-training keeps torch's AdamW by default


def test_identities_leave_out_the_options_only_at_torch_adamw_values():
    pre = compose_cfg("pretrain")
    assert "bias_correction" not in tracking.identity(pre)["optim"]
    ref = compose_cfg("pretrain", "optim.bias_correction=false")
    assert tracking.identity(ref)["optim"]["bias_correction"] is False
    assert tracking.config_hash(ref) != tracking.config_hash(pre)

    def ident(*overrides):
        cfg = compose_cfg("finetune", *overrides)
        return finetuning.run_identity(cfg, cfg.task, "none")

    default, legacy = ident(), ident("finetune_optim.bias_correction=true", "finetune_optim.loss_reduction=mean")
    assert (default["finetune_optim"]["bias_correction"], default["finetune_optim"]["loss_reduction"]) == (False, "sum")
    # torch's AdamW on the batch mean hashes as every run recorded before the options existed.
    assert "bias_correction" not in legacy["finetune_optim"] and "loss_reduction" not in legacy["finetune_optim"]
    before = copy.deepcopy(default)
    del before["finetune_optim"]["bias_correction"], before["finetune_optim"]["loss_reduction"]
    assert tracking.config_hash(legacy) == tracking.config_hash(before) != tracking.config_hash(default)
    hashes = {tracking.config_hash(ident(f"finetune_optim.bias_correction={b}", f"finetune_optim.loss_reduction={r}"))
              for b in ("true", "false") for r in ("sum", "mean")}
    assert len(hashes) == 4


# --- pre-training ----------------------------------------------------------------------------------------


class Optimizers(pl.Callback):
    def on_train_end(self, trainer, pl_module):
        self.optimizers = list(trainer.optimizers)


@pytest.mark.parametrize("algorithm", ["joint", "adversarial"])  # one optimizer (Lightning's clip), two (manual)
def test_pretraining_with_the_reference_update(tmp_path, pretrain_cfg, algorithm):
    seen = Optimizers()
    cfg = pretrain_cfg(tmp_path, f"algorithm={algorithm}", "optim.bias_correction=false", "trainer.max_steps=6", "optim.warmup_steps=2",
                       "logger.log_every_n_steps=3", "runtime.fused_adam=true")
    run_id = pretrain.train(cfg, callbacks=[seen])
    assert seen.optimizers and all(type(o) is ReferenceAdam for o in seen.optimizers)
    groups = [g for o in seen.optimizers for g in o.param_groups]
    assert all(g["bias_correction"] is False and g["fused"] is True for g in groups)
    assert all(o.state[p] for o in seen.optimizers for g in o.param_groups for p in g["params"])  # all stepped
    run = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(run_id)
    assert run.info.status == "FINISHED" and np.isfinite(run.data.metrics["train/loss"])
    assert run.data.params["optim.bias_correction"] == "False"
