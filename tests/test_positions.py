"""The fixed-size prediction slots (objectives/positions.py): the same masking as boolean selection gave,
the reference's cap and position sampling, disallow_correct, gather/scatter, losses over the same positions,
and the device-side AUC."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from electra_ablate.objectives import positions as slots
from electra_ablate.objectives.base import mask_tokens, maskable
from electra_ablate.objectives.bert import Bert
from electra_ablate.objectives.electra import Electra
from electra_ablate.training.auc import BinnedAUC
from tests.test_objectives import SPECIAL, V, make_batch, nets_for


def boolean_selection(candidates: torch.Tensor, mask_prob: float) -> torch.Tensor:
    """The selection as it was made before slots: the k lowest of T uniform scores by double argsort."""
    n = candidates.sum(dim=1, keepdim=True)
    k = torch.minimum(torch.clamp(torch.round(n.float() * mask_prob), min=1).long(), n)
    scores = torch.rand(candidates.shape)
    scores.masked_fill_(~candidates, 2.0)
    return scores.argsort(dim=1).argsort(dim=1) < k


@pytest.mark.parametrize("T", [8, 24, 64, 128])
def test_slots_select_exactly_what_boolean_selection_did_from_the_same_draws(T):
    batch = make_batch(B=256, T=T, seed=3)
    cand = maskable(batch.input_ids, SPECIAL)
    torch.manual_seed(5)
    before = boolean_selection(cand, 0.15)
    torch.manual_seed(5)
    m = mask_tokens(batch.input_ids, SPECIAL, V, 0.15, 0.85, 0.0)  # default: no cap below today's count
    assert torch.equal(m.selected, before)
    # Every used slot holds a selected position, in ascending order, and its target is the original id.
    w = m.positions.weights
    assert torch.equal(w.sum(1), before.sum(1))
    assert torch.equal(slots.gather(m.selected, m.positions.index) & w, w)
    idx = m.positions.index.masked_fill(~w, T)
    assert (idx[:, 1:] >= idx[:, :-1]).all()
    assert torch.equal(m.targets[w], batch.input_ids.gather(1, m.positions.index)[w])


def test_the_default_cap_is_the_reference_formula_and_never_lowers_the_count():
    # configure_pretraining.py: int((mask_prob + 0.005) x max_seq_length): 19 at 128, 79 at 512.
    assert slots.max_predictions(0.15, 128) == 19 and slots.max_predictions(0.15, 512) == 79
    for p in (0.05, 0.15, 0.25, 0.5):
        for T in range(2, 600):
            assert slots.max_predictions(p, T) >= max(1, round(p * T)), (p, T)
            if T >= 100:  # long enough that the reference formula is never raised
                assert slots.max_predictions(p, T) == int((p + 0.005) * T)
    assert slots.max_predictions(0.15, 128, cap=5) == 5 and slots.max_predictions(0.15, 4, cap=50) == 4


def test_an_explicit_cap_limits_the_predictions_per_sequence():
    torch.manual_seed(0)
    batch = make_batch(B=128, T=64)
    n = maskable(batch.input_ids, SPECIAL).sum(1)
    m = mask_tokens(batch.input_ids, SPECIAL, V, 0.15, 0.85, 0.0, max_predictions_per_seq=3)
    assert m.positions.index.shape == (128, 3)
    expect = torch.clamp(torch.round(n.float() * 0.15), min=1).clamp(max=3).long()
    assert torch.equal(m.selected.sum(1), expect) and torch.equal(m.positions.weights.sum(1), expect)


def test_reference_sampling_draws_with_replacement_uniformly_over_candidates():
    torch.manual_seed(0)
    B, T = 4000, 32
    ids = torch.randint(5, V, (B, T))
    ids[:, 0], ids[:, -1] = SPECIAL.cls, SPECIAL.sep
    ids[:, 10] = SPECIAL.sep  # two segments: 29 candidates, 32 tokens
    m = mask_tokens(ids, SPECIAL, V, 0.15, 0.85, 0.0, position_sampling="reference")
    pos = m.positions
    k = round(0.15 * T)  # the reference counts the input mask (all 32 tokens), not the candidates
    assert (pos.weights.sum(1) == k).all()
    used = pos.index[pos.weights]
    assert maskable(ids, SPECIAL).gather(1, pos.index)[pos.weights].all(), "only candidates are drawn"
    counts = torch.bincount(used, minlength=T).float()
    cand_counts = counts[maskable(ids[:1], SPECIAL)[0]]
    assert stats.chisquare(cand_counts.numpy()).pvalue > 1e-3, "uniform over the candidates"
    # With replacement: distinct positions per row average n (1 - (1 - 1/n)^k), n = 29 candidates.
    distinct = m.selected.sum(1).float().mean()
    n = 29
    assert abs(distinct - n * (1 - (1 - 1 / n) ** k)) < 0.05
    assert torch.equal(pos.first.sum(1), m.selected.sum(1)), "a repeated position is replaced once"


def test_reference_sampling_predicts_a_repeated_position_twice_and_replaces_it_once():
    torch.manual_seed(0)
    batch = make_batch(B=64, T=24)
    obj = Electra("electra", SPECIAL, V, position_sampling="reference")
    nets = nets_for(obj)
    fake = obj.corrupt(batch, nets.generator)
    pos = fake.masked.positions
    assert (pos.weights & ~pos.first).any(), "some position drawn twice in 64 rows"
    sampled = fake.sampled.view_as(pos.index)
    first_sample = slots.scatter(torch.zeros_like(batch.input_ids), pos, sampled)
    assert torch.equal(fake.input_ids[fake.masked.selected], first_sample[fake.masked.selected])


def test_mask_proportions_hold_on_the_slots():
    torch.manual_seed(0)
    batch = make_batch(B=512, T=64)
    m = mask_tokens(batch.input_ids, SPECIAL, V, 0.15, 0.8, 0.1)
    w = m.positions.weights
    corrupted = slots.gather(m.input_ids, m.positions.index)[w]
    original = m.targets[w]
    assert abs((corrupted == SPECIAL.mask).float().mean() - 0.8) < 0.02
    assert abs((corrupted == original).float().mean() - 0.1 - 0.1 / V) < 0.02


@pytest.mark.parametrize("sampler", ["gumbel", "inverse_cdf"])
def test_disallow_correct_never_samples_the_original(sampler):
    torch.manual_seed(0)
    batch = make_batch(B=32)
    orig = batch.input_ids

    class Oracle(torch.nn.Module):  # all mass on the original: without the option every sample is correct
        trainable = False

        def masked_logits(self, input_ids, attention_mask, token_type_ids, positions):
            return F.one_hot(orig.gather(1, positions).reshape(-1), V).float() * 20

    for disallow in (False, True):
        obj = Electra("electra", SPECIAL, V, sampler=sampler, disallow_correct=disallow)
        fake = obj.corrupt(batch, Oracle())
        w = fake.masked.positions.weights.reshape(-1)
        hits = (fake.sampled == fake.masked.targets.reshape(-1))[w]
        assert hits.all() if not disallow else not hits.any()
        if disallow:
            assert torch.equal(fake.replaced, fake.masked.selected)


def test_losses_cover_the_same_positions_as_boolean_indexing():
    torch.manual_seed(0)
    batch = make_batch(B=16, T=24)
    obj = Bert("bert", SPECIAL, V, 0.15, 0.8, 0.1)
    nets = nets_for(obj)
    torch.manual_seed(1)
    out = obj(batch, nets)
    torch.manual_seed(1)
    m = obj.mask(batch)
    hidden = nets.model(m.input_ids, batch.attention_mask, batch.token_type_ids)
    expect = F.cross_entropy(nets.model.mlm_logits(hidden[m.selected]).float(), batch.input_ids[m.selected])
    assert torch.allclose(out.loss, expect, rtol=1e-5, atol=1e-6)


def test_scatter_leaves_unused_slots_alone_and_gather_reads_rows():
    seq = torch.arange(12).view(2, 6)
    pos = slots.Positions(torch.tensor([[1, 4, 0], [5, 5, 0]]), torch.tensor([[True, True, False], [True, True, False]]),
                          torch.tensor([[True, True, False], [True, False, False]]))
    out = slots.scatter(seq, pos, torch.tensor([[-1, -2, -3], [-4, -5, -6]]))
    assert out.tolist() == [[0, -1, 2, 3, -2, 5], [6, 7, 8, 9, 10, -4]]
    assert slots.gather(seq, pos.index).tolist() == [[1, 4, 0], [11, 11, 6]]
    hidden = torch.randn(2, 6, 3)
    assert torch.equal(slots.gather(hidden, pos.index)[1, 0], hidden[1, 5])


def test_binned_auc_matches_the_exact_auc_and_honours_weights():
    torch.manual_seed(0)
    n = 20000
    labels = torch.rand(n) < 0.3
    probs = torch.sigmoid(torch.randn(n) + 1.5 * labels.float())
    pos, neg = probs[labels], probs[~labels]
    exact = stats.mannwhitneyu(pos.numpy(), neg.numpy()).statistic / (len(pos) * len(neg))
    auc = BinnedAUC(bins=200)
    keep = torch.rand(n) < 0.5
    noise = torch.rand(n)  # left out by weight: would pull the area towards 1/2
    auc.update(torch.where(keep, probs, noise), labels, keep)
    auc.update(torch.where(keep, noise, probs), labels, ~keep)
    assert abs(float(auc.compute()) - exact) < 2e-3
    assert auc.update_count == 2
    auc.reset()
    assert auc.update_count == 0 and int(auc.counts.sum()) == 0
    assert math.isclose(float(BinnedAUC(4).compute()), 0.0)
