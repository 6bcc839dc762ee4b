"""Label rules, loss masks, masking proportions, sampling and gradient flow of every objective."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from electra_ablate.common.variants import option_class, options
from electra_ablate.generators.fixed import UniformGenerator, UnigramGenerator
from electra_ablate.generators.neural import NeuralGenerator
from electra_ablate.models.encoder import ElectraForPretraining, EncoderConfig, Networks
from electra_ablate.sharing.all import AllSharing
from electra_ablate.sharing.embeddings import EmbeddingSharing
from electra_ablate.sharing.none import NoSharing
from electra_ablate.objectives.all_tokens_mlm import AllTokensMLM, copy_distribution, copy_log_prob
from electra_ablate.common.tokens import SpecialIds
from electra_ablate.objectives.base import Batch, mask_tokens, maskable, sample_tokens
from electra_ablate.objectives.bert import Bert
from electra_ablate.objectives.electra import Electra
from electra_ablate.objectives.electra_15 import Electra15
from electra_ablate.objectives.replace_mlm import ReplaceMLM
from electra_ablate.common.cli import CONF_DIR

SPECIAL = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
V = 50
CFG = EncoderConfig(vocab_size=V, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=32)


# Every option of conf/sharing: a new sharing mode is tied in these tests without editing this file.
SHARING = {o: option_class(CONF_DIR, "sharing", o) for o in options(CONF_DIR, "sharing")}


def make_batch(B: int = 8, T: int = 24, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    attn = (torch.arange(T)[None] < lengths[:, None]).long()
    ids[:, 0] = SPECIAL.cls
    ids[torch.arange(B), lengths - 1] = SPECIAL.sep
    ids[attn == 0] = SPECIAL.pad
    return Batch(ids, attn, torch.zeros_like(ids))


def nets_for(objective, generator_cls=NeuralGenerator, sharing="embeddings", fraction=0.5):
    model = ElectraForPretraining(CFG, **objective.model_heads)
    gen = None
    if objective.needs_generator:
        if generator_cls is NeuralGenerator:
            gen = NeuralGenerator(CFG, torch.ones(V), SPECIAL, hidden_size=fraction)
            SHARING[sharing](sharing).tie(gen, model)
        else:
            gen = generator_cls(CFG, torch.arange(V).float(), SPECIAL)
    return Networks(model, gen)


def electra(**kw):
    return Electra("electra", SPECIAL, V, **kw)


def test_masking_proportions_bert_80_10_10_and_electra_85_15():
    torch.manual_seed(0)
    batch = make_batch(B=512, T=64)
    m = mask_tokens(batch.input_ids, SPECIAL, V, 0.15, 0.8, 0.1)
    sel = m.selected
    n_cand = maskable(batch.input_ids, SPECIAL).sum(1).float()
    # Reference: round(0.15 x #candidates) per sequence, at least one.
    assert torch.equal(sel.sum(1).float(), torch.clamp(torch.round(n_cand * 0.15), min=1))
    assert not (sel & ~maskable(batch.input_ids, SPECIAL)).any(), "[CLS]/[SEP]/[PAD] must never be selected"
    masked = (m.input_ids == SPECIAL.mask)[sel].float().mean()
    unchanged = (m.input_ids == batch.input_ids)[sel].float().mean()
    assert abs(masked - 0.8) < 0.02 and abs(unchanged - 0.1 - 0.1 / V) < 0.02  # random may redraw the original
    assert torch.equal(m.labels[sel], batch.input_ids[sel]) and (m.labels[~sel] == -100).all()
    assert torch.equal(m.input_ids[~sel], batch.input_ids[~sel])

    m = mask_tokens(batch.input_ids, SPECIAL, V, 0.15, 0.85, 0.0)
    assert abs((m.input_ids == SPECIAL.mask)[m.selected].float().mean() - 0.85) < 0.02
    assert torch.equal((m.input_ids != SPECIAL.mask)[m.selected], (m.input_ids == batch.input_ids)[m.selected])


@pytest.mark.parametrize("method", ["gumbel", "inverse_cdf"])
def test_samplers_draw_from_the_softmax(method):
    torch.manual_seed(1)
    logits = torch.tensor([2.0, 0.0, -1.0, 1.0, -5.0])
    n = 60000
    draws = sample_tokens(logits.expand(n, -1), temperature=1.0, method=method)
    counts = torch.bincount(draws, minlength=5).numpy()
    expected = torch.softmax(logits, -1).numpy() * n
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    hot = sample_tokens(logits.expand(2000, -1), temperature=0.05, method=method)
    assert (hot == 0).float().mean() > 0.99  # low temperature -> argmax


def test_electra_labels_a_sample_equal_to_the_original_as_original():
    torch.manual_seed(0)
    batch = make_batch()
    obj = electra()
    # A "generator" that puts all mass on the original token: every sample equals the original.
    nets = nets_for(obj)
    orig = batch.input_ids

    class Oracle(torch.nn.Module):
        trainable = False

        def masked_logits(self, input_ids, attention_mask, token_type_ids, positions):
            return torch.nn.functional.one_hot(orig.gather(1, positions).reshape(-1), V).float() * 100

    fake = obj.corrupt(batch, Oracle())
    assert not fake.replaced.any()
    assert torch.equal(fake.input_ids, orig)
    out = obj(batch, Networks(nets.model, Oracle()))
    assert out.disc_labels.sum() == 0

    # A generator that never proposes the original: exactly the selected positions are replaced.
    class Anti(Oracle):
        def masked_logits(self, input_ids, attention_mask, token_type_ids, positions):
            return -torch.nn.functional.one_hot(orig.gather(1, positions).reshape(-1), V).float() * 100

    fake = obj.corrupt(batch, Anti())
    assert torch.equal(fake.replaced, fake.masked.selected)


def test_generator_accuracy_is_split_into_mask_and_kept_positions_so_copying_shows():
    torch.manual_seed(0)
    batch = make_batch(B=64, T=24)
    obj = electra()

    class Copier(torch.nn.Module):
        """Predicts whatever token its input holds at each slot: right exactly where the original was kept."""
        trainable = False

        def masked_logits(self, input_ids, attention_mask, token_type_ids, positions):
            return torch.nn.functional.one_hot(input_ids.gather(1, positions).reshape(-1), V).float() * 100

    sums = obj.generator_sums(obj.corrupt(batch, Copier()), batch)
    value = {k: (v[0] / v[1]).item() for k, v in sums.items()}
    assert value["masked_lm_accuracy_at_kept"] == 1.0 and value["masked_lm_accuracy_at_mask"] == 0.0
    assert 0.08 < value["masked_lm_accuracy"] < 0.25  # the 15% kept share: what the combined number hides
    # The two shares add up to every used slot (no random replacement in ELECTRA's masking).
    assert sums["masked_lm_accuracy_at_mask"][1] + sums["masked_lm_accuracy_at_kept"][1] == sums["masked_lm_accuracy"][1]

    # A generator that knows the original everywhere scores 100% at both: the split is not of the input alone.
    orig = batch.input_ids

    class Oracle(Copier):
        def masked_logits(self, input_ids, attention_mask, token_type_ids, positions):
            return torch.nn.functional.one_hot(orig.gather(1, positions).reshape(-1), V).float() * 100

    sums = obj.generator_sums(obj.corrupt(batch, Oracle()), batch)
    assert all(v[0] == v[1] for k, v in sums.items() if k.startswith("masked_lm_accuracy"))
    # A masking with no kept share logs no accuracy at kept positions rather than a 0 of nothing.
    assert "masked_lm_accuracy_at_kept" not in electra(mask_token_prob=1.0).generator_sums(
        electra(mask_token_prob=1.0).corrupt(batch, Copier()), batch)


def test_bert_and_replace_mlm_log_the_split_of_the_network_that_sees_mask():
    torch.manual_seed(0)
    batch = make_batch()
    bert = Bert("bert", SPECIAL, V, 0.15, 0.8, 0.1)
    out = bert(batch, nets_for(bert))
    assert {"masked_lm_accuracy_at_mask", "masked_lm_accuracy_at_kept"} <= set(out.sums)
    replace = ReplaceMLM("replace_mlm", SPECIAL, V)
    out = replace(batch, nets_for(replace))
    # Its model never sees [MASK]: only its generator's accuracy is split.
    assert {"gen_masked_lm_accuracy_at_mask", "gen_masked_lm_accuracy_at_kept"} <= set(out.sums)
    assert "masked_lm_accuracy_at_mask" not in out.sums


def test_electra_disc_loss_covers_all_non_pad_tokens_and_electra_15_only_selected():
    torch.manual_seed(0)
    batch = make_batch()
    for cls, expect in ((Electra, "all"), (Electra15, "selected")):
        obj = cls(cls.__name__.lower(), SPECIAL, V)
        nets = nets_for(obj)
        fake = obj.corrupt(batch, nets.generator)
        w = obj.disc_weights(batch, fake)
        if expect == "all":
            assert torch.equal(w, batch.attention_mask.bool())
        else:
            assert torch.equal(w, fake.masked.selected)
        # Gradient of the disc loss w.r.t. the discriminator's per-token logits is zero outside w.
        hidden = nets.model(fake.input_ids, batch.attention_mask, batch.token_type_ids)
        logits = nets.model.disc_logits(hidden).detach().requires_grad_(True)
        from electra_ablate.objectives.base import rtd_loss

        rtd_loss(logits, fake.replaced, w).backward()
        assert (logits.grad[~w] == 0).all() and (logits.grad[w] != 0).all()


def test_no_disc_gradient_reaches_the_generator():
    torch.manual_seed(0)
    batch = make_batch()
    obj = electra(gen_weight=0.0)  # only the discriminator loss
    nets = nets_for(obj, sharing="none")
    out = obj(batch, nets)
    out.loss.backward()
    gen_grads = [p.grad for p in nets.generator.parameters() if p.grad is not None]
    assert all((g == 0).all() for g in gen_grads), "disc loss must not backpropagate through the samples"
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in nets.model.parameters())


def test_total_loss_is_gen_weight_mlm_plus_disc_weight_disc():
    batch = make_batch()
    obj = electra(gen_weight=1.0, disc_weight=50.0)
    nets = nets_for(obj)
    nets.model.eval(), nets.generator.eval()  # no dropout: the replay below sees the same networks
    torch.manual_seed(0)
    out = obj(batch, nets)
    # The same masks and samples again, and both losses by hand: the generator's mean cross-entropy over the
    # used prediction slots, the discriminator's mean sigmoid cross-entropy over the non-pad tokens.
    torch.manual_seed(0)
    fake = obj.corrupt(batch, nets.generator)
    masked = fake.masked
    with torch.no_grad():
        gen_logits = nets.generator.masked_logits(masked.input_ids, batch.attention_mask, batch.token_type_ids,
                                                  masked.positions.index)  # (B x N, V)
        used = masked.positions.weights.reshape(-1).bool()
        mlm = F.cross_entropy(gen_logits[used], masked.targets.reshape(-1)[used])
        logits = nets.model.disc_logits(nets.model(fake.input_ids, batch.attention_mask, batch.token_type_ids))
        real = batch.attention_mask.bool()
        disc = F.binary_cross_entropy_with_logits(logits[real], fake.replaced[real].float())
    assert fake.replaced.any() and mlm > 0 and disc > 0
    assert torch.allclose(out.loss.detach(), mlm + 50 * disc, rtol=1e-5)
    assert torch.allclose(out.sums["mlm_loss"][0], mlm, rtol=1e-5)
    assert torch.allclose(out.sums["disc_loss"][0], disc, rtol=1e-5)


def test_all_tokens_mlm_output_is_a_distribution_and_loss_matches_it():
    torch.manual_seed(0)
    N = 40
    copy_logit, logits = torch.randn(N), torch.randn(N, V)
    inputs, targets = torch.randint(0, V, (N,)), torch.randint(0, V, (N,))
    targets[:10] = inputs[:10]
    p = copy_distribution(copy_logit, logits, inputs)
    assert torch.allclose(p.sum(-1), torch.ones(N), atol=1e-5) and (p >= 0).all()
    log_q = torch.log_softmax(logits, -1).gather(1, targets[:, None]).squeeze(1)
    ours = copy_log_prob(copy_logit, log_q, inputs == targets)
    assert torch.allclose(ours, torch.log(p.gather(1, targets[:, None]).squeeze(1)), atol=1e-5)

    batch = make_batch()
    obj = AllTokensMLM("all_tokens_mlm", SPECIAL, V)
    nets = nets_for(obj)
    nets.model.eval(), nets.generator.eval()  # no dropout: the recomputation below sees the same activations
    assert nets.model.has_mlm_head and nets.model.has_disc_head
    torch.manual_seed(3)
    out = obj(batch, nets)
    # The loss is -mean log p(original token) under the full copy distribution at every non-pad position,
    # plus gen_weight x the generator's MLM loss; the same seed gives the same corrupted inputs.
    torch.manual_seed(3)
    fake = obj.corrupt(batch, nets.generator)
    pos = batch.attention_mask.bool()
    h = nets.model(fake.input_ids, batch.attention_mask, batch.token_type_ids)[pos]
    p = copy_distribution(nets.model.disc_logits(h), nets.model.mlm_logits(h), fake.input_ids[pos])
    expected = -torch.log(p.gather(1, batch.input_ids[pos][:, None])).mean()
    assert (fake.input_ids[pos] != batch.input_ids[pos]).any()  # some positions must be predicted, not copied
    assert torch.allclose(out.sums["mlm_loss"][0].detach(), expected, atol=1e-5)
    assert torch.allclose(out.loss.detach(), expected + obj.gen_weight * fake.gen_loss.detach(), atol=1e-5)


def test_replace_mlm_model_never_sees_mask_and_bert_uses_no_generator():
    torch.manual_seed(0)
    batch = make_batch()
    obj = ReplaceMLM("replace_mlm", SPECIAL, V)
    nets = nets_for(obj)
    fake = obj.corrupt(batch, nets.generator)
    assert not (fake.input_ids == SPECIAL.mask).any()
    assert (fake.masked.input_ids == SPECIAL.mask).any()  # the generator does see [MASK]
    assert not Bert.needs_generator and Bert.model_heads == {"mlm_head": True}
    out = Bert("bert", SPECIAL, V, 0.15, 0.8, 0.1)(batch, nets_for(Bert("bert", SPECIAL, V)))
    assert set(out.sums) == {"loss", "mlm_loss", "masked_lm_accuracy", "masked_lm_accuracy_at_mask",
                             "masked_lm_accuracy_at_kept"}


@pytest.mark.parametrize("cls", [UniformGenerator, UnigramGenerator])
def test_non_neural_generators_propose_no_special_tokens(cls):
    torch.manual_seed(0)
    batch = make_batch(B=512, T=64)
    obj = electra()
    nets = nets_for(obj, generator_cls=cls)  # token counts 0, 1, ..., V - 1
    fake = obj.corrupt(batch, nets.generator)
    assert fake.gen_loss is None
    specials = [SPECIAL.pad, SPECIAL.cls, SPECIAL.sep, SPECIAL.mask]
    assert not torch.isin(fake.sampled, torch.tensor(specials)).any()
    # Proposals follow the generator's distribution over the other ids ([UNK] included): uniform, or the
    # add-one-smoothed counts (count + 1 = id + 1).
    weights = torch.ones(V, dtype=torch.float64) if cls is UniformGenerator else torch.arange(V).double() + 1
    weights[specials] = 0
    allowed = weights > 0
    counts = torch.bincount(fake.sampled, minlength=V)[allowed].numpy()
    expected = (weights[allowed] / weights.sum() * fake.sampled.numel()).numpy()
    assert stats.chisquare(counts, expected).pvalue > 1e-3


def test_sharing_modes_make_the_very_same_parameters():
    model = ElectraForPretraining(CFG, disc_head=True)
    gen = NeuralGenerator(CFG, torch.ones(V), SPECIAL, hidden_size=0.25)
    EmbeddingSharing("embeddings").tie(gen, model)
    assert gen.electra.embeddings.word_embeddings.weight is model.electra.embeddings.word_embeddings.weight
    assert gen.electra.embeddings.LayerNorm.weight is model.electra.embeddings.LayerNorm.weight
    assert gen.generator_lm_head.weight is model.electra.embeddings.word_embeddings.weight  # tied output layer
    assert gen.electra.embeddings_project is not model.electra.embeddings_project  # own projection (16 -> 8)
    assert gen.electra.encoder is not model.electra.encoder

    gen_all = NeuralGenerator(CFG, torch.ones(V), SPECIAL, hidden_size=1.0)
    AllSharing("all").tie(gen_all, model)
    assert gen_all.electra is model.electra
    assert gen_all.electra.encoder.layer[0].attention.self.query.weight is model.electra.encoder.layer[0].attention.self.query.weight

    gen_none = NeuralGenerator(CFG, torch.ones(V), SPECIAL, hidden_size=0.5)
    NoSharing("none").tie(gen_none, model)
    assert gen_none.electra.embeddings.word_embeddings.weight is not model.electra.embeddings.word_embeddings.weight

    with pytest.raises(ValueError, match="sharing=all needs a generator the same size"):
        AllSharing("all").tie(NeuralGenerator(CFG, torch.ones(V), SPECIAL, hidden_size=0.5), model)


def test_generator_size_follows_the_reference_rule():
    base = EncoderConfig(hidden_size=768, embedding_size=768, num_attention_heads=12, intermediate_size=3072)
    g = base.scaled(1 / 3)
    assert (g.hidden_size, g.num_attention_heads, g.intermediate_size, g.num_hidden_layers) == (256, 4, 1024, 12)
    assert base.scaled(0.25, 0.5).num_hidden_layers == 6


@pytest.mark.parametrize("sharing", sorted(SHARING))
def test_every_sharing_mode_ties_generator_and_discriminator_and_trains(sharing):
    """Each option of conf/sharing (found, not listed): tied at equal sizes, one step back-propagates into the
    discriminator's word embeddings (directly, or through the generator's they are tied to)."""
    torch.manual_seed(0)
    obj = electra()
    nets = nets_for(obj, sharing=sharing, fraction=1.0)
    obj(make_batch(), nets).loss.backward()
    grads = [p.grad for p in nets.model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
