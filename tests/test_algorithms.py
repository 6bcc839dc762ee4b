"""Training algorithms (paper section 3.2 and Appendix F) and the learned loss weight.

Two-stage: at the switch the discriminator's encoder equals the generator's, the generator does not change
afterwards, what is exported before the switch is the generator, FLOPs follow the stages, and a run resumes
exactly after the switch. Adversarial: on a toy policy REINFORCE estimates the exact gradient, the learned
baseline fits its target and cuts the variance, and end to end both optimizers step once per batch. Learned
lambda starts at the paper's 50, moves, stays finite and is not weight-decayed. Bad combinations fail before
any data is built. End-to-end runs use the tiny hermetic corpus (conftest) with a tiny model.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from mlflow.tracking import MlflowClient

from electra_ablate import pretrain
from electra_ablate.algorithms.adversarial import baseline_loss, reinforce_loss
from electra_ablate.algorithms.two_stage import TwoStage
from electra_ablate.common.tokens import SpecialIds
from electra_ablate.models import flops
from electra_ablate.models.checkpoint import load_pretrained
from electra_ablate.objectives.electra import Electra
from electra_ablate.sweep.compose import make_context
from electra_ablate.sweep.jobs import PretrainJob
from electra_ablate.training import checks
from electra_ablate.weighting.learned import LearnedWeights


TWO_STAGE = ["algorithm=two_stage", "sharing=none", "generator.hidden_size=1.0", "generator.layers=1.0"]






@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Speed only: on 2 shared, oversubscribed cores every small op with 2 intra-op threads waits ~10 ms for
    # the other thread; these tiny models run several times faster on one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def finished_run(tmp: Path, run_id: str):
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    history = {k: {m.step: m.value for m in client.get_metric_history(run_id, k)} for k in run.data.metrics}
    return run, history


class Snapshot(pl.Callback):
    """Keeps the system's state at the start and end of training, its optimizers and the number of batches."""

    def __init__(self):
        self.start: dict[str, torch.Tensor] = {}
        self.end: dict[str, torch.Tensor] = {}
        self.batches = 0
        self.system = None

    def on_train_start(self, trainer, pl_module):
        self.start = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches += 1

    def on_train_end(self, trainer, pl_module):
        self.end = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        self.system = pl_module


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --- two-stage --------------------------------------------------------------------------------------------


def test_two_stage_initialises_the_discriminator_from_the_generator_then_freezes_it(
    tmp_path, pretrain_cfg, monkeypatch
):
    at_switch: dict = {}
    switch = TwoStage.switch

    def spy(self):
        switch(self)
        at_switch["step"] = self.global_step
        at_switch["disc"] = {k: v.clone() for k, v in self.model.electra.state_dict().items()}
        at_switch["gen"] = {k: v.clone() for k, v in self.generator.state_dict().items()}

    monkeypatch.setattr(TwoStage, "switch", spy)
    cfg = pretrain_cfg(tmp_path, *TWO_STAGE, "trainer.max_steps=16", "logger.log_every_n_steps=3",
                      "trainer.export_fractions=[0.5]")
    run, hist = finished_run(tmp_path, pretrain.train(cfg))

    assert at_switch["step"] == 8
    gen_encoder = {k.removeprefix("electra."): v for k, v in at_switch["gen"].items() if k.startswith("electra.")}
    assert same(at_switch["disc"], gen_encoder), "at the switch the discriminator's encoder must equal the generator's"

    # Before the switch the exported network is the generator (an MLM model); after it, the discriminator.
    before, info = load_pretrained(Path(run.data.tags["checkpoint_path"]).parent / "step_8")
    assert info["step"] == 8 and before.has_mlm_head and not before.has_disc_head
    assert same(before.state_dict(), at_switch["gen"])
    final, _ = load_pretrained(run.data.tags["checkpoint_path"])
    final_gen, _ = load_pretrained(run.data.tags["checkpoint_path"], which="generator")
    assert final.has_disc_head
    assert not same(final.electra.state_dict(), at_switch["disc"]), "stage two trains the discriminator"
    assert same(final_gen.state_dict(), at_switch["gen"]), "the generator must not change in stage two"

    assert run.data.tags["algorithm"] == "two_stage"
    assert hist["train/switch_step"] == {8: 8.0}
    # The switch closes the window at step 8, so no logged average mixes the two stages.
    assert set(hist["train/mlm_loss"]) == {3, 6, 8} and set(hist["train/disc_loss"]) == {9, 12, 15}
    assert hist["train/stage"] == {3: 1.0, 6: 1.0, 8: 1.0, 9: 2.0, 12: 2.0, 15: 2.0}
    # Stage one: the generator's forward and backward; stage two: its forward + the discriminator's both.
    args = (final.config, final_gen.config, Electra.flops, 16, 64)
    gen_step = flops.pretrain_flops_per_step(*args, stage="generator")
    disc_step = flops.pretrain_flops_per_step(*args, stage="discriminator")
    assert hist["train/flops"][6] == pytest.approx(6 * gen_step)
    assert hist["train/flops"][12] == pytest.approx(8 * gen_step + 4 * disc_step)
    assert hist["flops/total"][16] == pytest.approx(8 * gen_step + 8 * disc_step)


def test_two_stage_resumes_exactly_after_the_switch(tmp_path, pretrain_cfg, stop_at):
    # Switch at 6, checkpoints every 4: the crash at 9 resumes from step 8, after the switch, so a second
    # copy of the generator into the trained discriminator would change every later loss.
    common = [*TWO_STAGE, "trainer.max_steps=12", "trainer.checkpoint_every_n_steps=4", "logger.log_every_n_steps=2"]
    straight = tmp_path / "straight"
    _, expected = finished_run(straight, pretrain.train(pretrain_cfg(straight, *common)))

    crashed = tmp_path / "crashed"
    cfg = pretrain_cfg(crashed, *common)
    with pytest.raises(RuntimeError, match="simulated crash"):
        pretrain.train(cfg, callbacks=[stop_at(9)])
    _, got = finished_run(crashed, pretrain.train(cfg))
    for name in ("train/loss", "train/disc_loss", "train/mlm_loss", "train/switch_step", "train/lr"):
        assert got[name].keys() == expected[name].keys(), name
        for step, value in expected[name].items():
            assert got[name][step] == pytest.approx(value, rel=1e-5, abs=1e-6), (name, step, got[name], expected[name])


@pytest.mark.parametrize("scale", ["tiny", "cpu", "small", "base"])
def test_every_training_algorithms_variant_passes_the_algorithm_checks(scale, tmp_path, data_dir):
    paths = {"root_dir": str(tmp_path), "data_dir": str(data_dir), "output_root": str(tmp_path / "outputs"),
             "cache_dir": str(tmp_path / "cache")}
    ctx = make_context("training_algorithms", scale, paths, f"sqlite:///{tmp_path}/mlflow.db")
    algorithms = set()
    for v in ctx.spec.pretrained_variants:
        cfg = ctx.compose_pretrain(PretrainJob(v.label, 0))
        checks.validate(cfg)  # raises ConfigError naming the fix
        algorithms.add(cfg.algorithm.name)
    assert algorithms == {"joint", "two_stage", "adversarial"}


@pytest.mark.parametrize(
    "overrides, fix",
    [
        (["algorithm=two_stage"], "generator.hidden_size=1.0 generator.layers=1.0"),  # the defaults: 1/2 size
        (["algorithm=two_stage"], "sharing=none"),
        (["algorithm=two_stage", "generator=unigram", "sharing=none"], "generator=neural"),
        ([*TWO_STAGE, "weighting=learned"], "use weighting=fixed"),
        (["objective=bert", "weighting=learned"], "objective=bert does not have"),
        ([*TWO_STAGE, "trainer.accumulate_grad_batches=2"], "trainer.accumulate_grad_batches=1"),
        ([*TWO_STAGE, "trainer=ddp"], "trainer.strategy=ddp_find_unused_parameters_true"),
        (["algorithm=adversarial", "generator=unigram"], "use generator=neural"),
        (["algorithm=adversarial", "objective=bert"], "objective=electra or objective=electra_15"),
    ],
)
def test_impossible_algorithm_configs_fail_before_any_data_is_built(tmp_path, pretrain_cfg, overrides, fix):
    cfg = pretrain_cfg(tmp_path, *overrides, "trainer.max_steps=10", f"paths.cache_dir={tmp_path}/cache")
    with pytest.raises(checks.ConfigError, match=fix.replace(".", r"\.")):
        pretrain.train(cfg)
    assert not (tmp_path / "cache").exists()


# --- adversarial ------------------------------------------------------------------------------------------

# A toy policy over 5 tokens; the "discriminator" gives the right label probability q for each token, so the
# reward (its loss) is -log q: the same form as the real reward.
TOY_LOGITS = torch.tensor([0.5, -0.3, 1.2, 0.0, -1.0])
TOY_REWARD = -torch.log(torch.tensor([0.2, 0.1, 0.15, 0.25, 0.12]))


def reinforce_estimates(baseline: torch.Tensor | None, batches: int = 4000, per_batch: int = 32) -> torch.Tensor:
    """(batches, V) REINFORCE estimates of grad E[R], each from `per_batch` draws, through reinforce_loss."""
    V = TOY_LOGITS.numel()
    theta = TOY_LOGITS.expand(batches, V).clone().requires_grad_()  # one copy of the logits per batch
    actions = torch.multinomial(torch.softmax(TOY_LOGITS, -1), batches * per_batch, replacement=True)
    log_probs = torch.log_softmax(theta, -1).repeat_interleave(per_batch, dim=0)  # (batches * per_batch, V)
    b = None if baseline is None else baseline.expand(actions.shape)
    loss = reinforce_loss(log_probs, actions, TOY_REWARD[actions], b)
    (grad,) = torch.autograd.grad(loss, theta)
    return -grad * batches  # the loss is a mean over every draw; each batch's own mean, as an ascent direction


def exact_gradient() -> torch.Tensor:
    theta = TOY_LOGITS.clone().requires_grad_()
    (grad,) = torch.autograd.grad((torch.softmax(theta, -1) * TOY_REWARD).sum(), theta)
    return grad


def fitted_baseline() -> torch.Tensor:
    """b = -log sigmoid(w), w fitted with baseline_loss on rewards of the policy's samples."""
    torch.manual_seed(1)
    w = torch.zeros(1, requires_grad=True)
    opt = torch.optim.Adam([w], lr=0.05)
    probs = torch.softmax(TOY_LOGITS, -1)
    for _ in range(400):
        actions = torch.multinomial(probs, 256, replacement=True)
        loss = baseline_loss(w.expand(256), TOY_REWARD[actions])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return -F.logsigmoid(w.detach())


@pytest.mark.parametrize("with_baseline", [False, True])
def test_reinforce_estimator_matches_the_exact_gradient(with_baseline):
    torch.manual_seed(0)
    estimates = reinforce_estimates(fitted_baseline() if with_baseline else None)
    mean, stderr = estimates.mean(0), estimates.std(0) / math.sqrt(len(estimates))
    exact = exact_gradient()
    assert exact.abs().max() > 0.05  # a gradient worth estimating
    assert torch.all((mean - exact).abs() < 5 * stderr + 1e-4), (mean, exact, stderr)


def test_learned_baseline_fits_its_target_and_reduces_the_variance():
    b = fitted_baseline()
    # Cross-entropy against exp(-R) is minimised at sigmoid(w) = E[exp(-R)], i.e. b = -log E[q].
    probs = torch.softmax(TOY_LOGITS, -1)
    assert b.item() == pytest.approx(-math.log((probs * torch.exp(-TOY_REWARD)).sum().item()), abs=0.05)
    torch.manual_seed(2)
    plain = reinforce_estimates(None).var(0).sum()
    torch.manual_seed(2)
    with_baseline = reinforce_estimates(b).var(0).sum()
    assert with_baseline < 0.25 * plain, (with_baseline, plain)


def test_adversarial_steps_both_optimizers_once_per_batch(tmp_path, pretrain_cfg):
    snap = Snapshot()
    cfg = pretrain_cfg(tmp_path, "algorithm=adversarial", "trainer.max_steps=12", "logger.log_every_n_steps=4")
    run, hist = finished_run(tmp_path, pretrain.train(cfg, callbacks=[snap]))
    assert snap.batches == 12, "one batch must be one global step even though two optimizers step"

    for name in ("generator.electra.encoder.layer.0.attention.self.query.weight",
                 "generator.generator_predictions.dense.weight", "baseline.weight",
                 "model.electra.encoder.layer.0.attention.self.query.weight",
                 "model.discriminator_predictions.dense.weight", "model.electra.embeddings.word_embeddings.weight"):
        assert not torch.equal(snap.start[name], snap.end[name]), f"{name} did not change"
    # Every trainable parameter is stepped by exactly one optimizer; the shared embeddings by the discriminator's.
    system = snap.system
    gen_opt, disc_opt = system.trainer.optimizers
    owned = [{id(p) for g in opt.param_groups for p in g["params"]} for opt in (gen_opt, disc_opt)]
    assert not owned[0] & owned[1]
    assert owned[0] | owned[1] == {id(p) for p in system.parameters()}
    assert id(system.model.electra.embeddings.word_embeddings.weight) in owned[1]

    assert run.data.tags["algorithm"] == "adversarial"
    assert {"train/masked_lm_accuracy", "train/gen_entropy", "train/gen_reward", "train/baseline_loss",
            "train/disc_loss", "train/disc_auc", "train/mlm_loss"} <= set(hist)
    vocab = system.model.config.vocab_size
    assert all(0 < h <= math.log(vocab) + 1e-4 for h in hist["train/gen_entropy"].values())
    joint_step = flops.pretrain_flops_per_step(system.model.config, system.generator.config, Electra.flops, 16, 64)
    assert hist["flops/total"][12] == pytest.approx(12 * joint_step)


# --- learned lambda ---------------------------------------------------------------------------------------

SPECIAL = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)


def test_learned_lambda_starts_at_the_fixed_weights():
    objective = Electra("electra", SPECIAL, 50, weighting=LearnedWeights("learned", 1.0, 50.0))
    gen_loss = torch.tensor(3.0, requires_grad=True)
    disc_loss = torch.tensor(0.4, requires_grad=True)
    loss = objective.combine(gen_loss, disc_loss)
    loss.backward()
    assert gen_loss.grad.item() == pytest.approx(1.0) and disc_loss.grad.item() == pytest.approx(50.0)
    # d/ds (exp(-s) L + s) = 1 - exp(-s) L: both weights start above 1 / their loss, so both fall.
    assert objective.weighting.log_var_bias.grad.tolist() == pytest.approx([1 - 3.0, 1 - 50 * 0.4])
    with pytest.raises(ValueError, match="add weighting=learned"):  # the old spelling names the new one
        Electra("electra", SPECIAL, 50, disc_weight="learned")


def test_learned_lambda_moves_stays_finite_and_is_not_decayed(tmp_path, pretrain_cfg):
    snap = Snapshot()
    cfg = pretrain_cfg(tmp_path, "weighting=learned", "trainer.max_steps=20", "logger.log_every_n_steps=5")
    assert cfg.weighting.name == "learned" and cfg.objective.disc_weight == 50.0
    run, hist = finished_run(tmp_path, pretrain.train(cfg, callbacks=[snap]))
    assert run.data.tags["algorithm"] == "joint"

    trajectory = [hist["train/disc_weight"][s] for s in (5, 10, 15, 20)]
    assert all(math.isfinite(v) for v in trajectory)
    assert trajectory[0] == pytest.approx(50.0, rel=0.01)
    assert len(set(trajectory)) == 4, trajectory
    start, end = snap.start["objective.weighting.log_var_bias"], snap.end["objective.weighting.log_var_bias"]
    assert torch.all(end > start), "both loss weights must fall towards 1 / loss"
    (opt,) = snap.system.trainer.optimizers
    (group,) = [g for g in opt.param_groups if any(p is snap.system.objective.weighting.log_var_bias for p in g["params"])]
    assert group["weight_decay"] == 0.0
