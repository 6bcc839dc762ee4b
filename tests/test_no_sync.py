"""The training step's code path never synchronises with the device.

A synchronisation is anything that makes the host wait for a device result: reading a value (`.item()`,
`bool()`, `int()`, `float()`, `.tolist()`), or an op whose output shape depends on the data (boolean-mask
indexing, `nonzero`, `masked_select`, `unique`). On a CUDA machine the step runs under
`torch.cuda.set_sync_debug_mode("error")`; everywhere, it runs on CPU with those Python entry points made to
raise, for every objective, generator kind, position sampling and the adversarial algorithm.
"""

from __future__ import annotations

import pytest
import torch

from electra_ablate.algorithms.adversarial import Adversarial
from electra_ablate.common import syncs
from electra_ablate.common.variants import option_class, options
from electra_ablate.generators.neural import NeuralGenerator
from electra_ablate.objectives.base import Batch
from electra_ablate.objectives.electra import Electra
from electra_ablate.training.auc import BinnedAUC
from electra_ablate.weighting.learned import LearnedWeights
from electra_ablate.common.cli import CONF_DIR
from tests.test_objectives import SPECIAL, V, make_batch, nets_for


class Synchronised(AssertionError):
    pass


def _refuse(what: str) -> None:
    raise Synchronised(f"{what} waits on the device")


def no_host_reads():
    """Every synchronising Python entry point raises inside the block (electra_ablate.common.syncs)."""
    return syncs.host_reads(_refuse)


def step(objective, nets, batch: Batch, auc: BinnedAUC) -> None:
    """One training step's device work: forward, backward, metric sums and the AUC histogram."""
    out = objective(batch, nets)
    out.loss.backward()
    sums = {k: v + v for k, v in out.sums.items()}  # the system adds pairs up over a window
    if out.disc_probs is not None:
        auc.update(out.disc_probs, out.disc_labels, out.disc_weights)
    return out, sums


# Every option of conf/objective and conf/generator: a new variant is covered without editing this file.
OBJECTIVES = {o: option_class(CONF_DIR, "objective", o) for o in options(CONF_DIR, "objective")}
GENERATORS = {g: option_class(CONF_DIR, "generator", g) for g in options(CONF_DIR, "generator")}
CASES = [(o, g, s) for o in OBJECTIVES for g in (GENERATORS if OBJECTIVES[o].needs_generator else ["none"])
         for s in ("without_replacement", "reference")]


def build(objective: str, generator: str, sampling: str):
    cls = OBJECTIVES[objective]
    kw = {"position_sampling": sampling}
    if cls.needs_generator:
        kw["disallow_correct"] = sampling == "reference"  # both values of the flag are covered
    obj = cls(objective, SPECIAL, V, **kw)
    return obj, nets_for(obj, generator_cls=GENERATORS.get(generator, NeuralGenerator))


@pytest.mark.parametrize("objective, generator, sampling", CASES, ids=["-".join(c) for c in CASES])
def test_a_training_step_reads_nothing_back_from_the_device(objective, generator, sampling):
    torch.manual_seed(0)
    obj, nets = build(objective, generator, sampling)
    batch = make_batch()
    auc = BinnedAUC()
    with no_host_reads():
        out, _ = step(obj, nets, batch, auc)
    assert torch.isfinite(out.loss)  # outside the guard: reading the value is the host's choice


def test_a_step_with_a_learned_lambda_reads_nothing_back_from_the_device():
    torch.manual_seed(0)
    obj = Electra("electra", SPECIAL, V, weighting=LearnedWeights("learned", 1.0, 50.0))
    nets, batch = nets_for(obj), make_batch()
    with no_host_reads():
        out, sums = step(obj, nets, batch, BinnedAUC())
    assert "disc_weight" in sums and torch.isfinite(out.loss)


def test_the_guard_catches_what_the_old_masking_did():
    x, mask = torch.randn(4, 6), torch.rand(4, 6) > 0.5
    with no_host_reads():
        for read in (lambda: x[mask], lambda: int(mask.sum()), lambda: mask.nonzero(), lambda: x.sum().item(),
                     lambda: bool(mask.any()), lambda: x.masked_select(mask), lambda: torch.where(mask),
                     lambda: torch.as_tensor(1.0, device=x.device)):
            with pytest.raises(Synchronised):
                read()


def test_host_reads_counts_by_kind_and_restores_torch():
    x, mask = torch.randn(4, 6), torch.rand(4, 6) > 0.5
    getitem = torch.Tensor.__getitem__
    counts = syncs.count_host_reads(lambda: (x[mask], x[0], int(mask.sum()), torch.as_tensor(1.0), torch.as_tensor(x)))
    assert counts == {"boolean-mask indexing": 1, "Tensor.__int__": 1, "torch.as_tensor of host data": 1}
    assert torch.Tensor.__getitem__ is getitem and "__getitem__" not in vars(torch.Tensor)
    assert syncs.count_host_reads(lambda: x[mask]) == {"boolean-mask indexing": 1}


def test_the_adversarial_step_reads_nothing_back_from_the_device():
    torch.manual_seed(0)
    obj = Electra("electra", SPECIAL, V)
    nets = nets_for(obj, sharing="none")
    system = Adversarial(name="adversarial", model=nets.model, generator=nets.generator, objective=obj, lr=1e-3,
                         betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, warmup_steps=0, max_grad_norm=1.0,
                         max_steps=10)
    batch = make_batch()
    with no_host_reads():
        out = system.losses(batch)
        out.loss.backward()
        system.auroc.update(out.disc_probs, out.disc_labels, out.disc_weights)
    assert torch.isfinite(out.loss)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device for torch.cuda.set_sync_debug_mode")
@pytest.mark.parametrize("objective, generator, sampling", CASES, ids=["-".join(c) for c in CASES])
def test_a_cuda_training_step_never_synchronises(objective, generator, sampling):
    torch.manual_seed(0)
    obj, nets = build(objective, generator, sampling)
    obj, nets = obj.cuda(), type(nets)(nets.model.cuda(), None if nets.generator is None else nets.generator.cuda())
    batch = Batch(*(t.cuda() for t in make_batch()))
    auc = BinnedAUC().cuda()
    step(obj, nets, batch, auc)  # warm-up: first-call allocations and lazy initialisation may synchronise
    torch.cuda.synchronize()
    assert syncs.cuda_syncs(lambda: step(obj, nets, batch, auc)) == 0
