"""sharing=gdes (DeBERTaV3's gradient-disentangled embedding sharing): each loss trains only its own table,
the discriminator starts from the generator's embeddings, pre-training runs and exports a plain ELECTRA
discriminator (E_G + E_delta folded in) that fine-tuning and transformers load, and impossible configs are
refused with their key."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
import torch
from mlflow.tracking import MlflowClient

from electra_ablate.algorithms.adversarial import Adversarial
from electra_ablate.generators.base import GeneratorKind
from electra_ablate.generators.neural import NeuralGenerator
from electra_ablate.models import checkpoint, flops
from electra_ablate.models.encoder import ElectraForPretraining, EncoderConfig, Networks
from electra_ablate.common.tokens import SpecialIds
from electra_ablate.objectives.base import Batch, rtd_loss
from electra_ablate.objectives.electra import Electra
from electra_ablate.sharing.embeddings import EmbeddingSharing
from electra_ablate.sharing.gdes import TABLES, DisentangledEmbedding, GradientDisentangledSharing, fold
from electra_ablate.tracking import runs as tracking
from electra_ablate.training import build, checks

SPECIAL = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
VOCAB = 50


class WideEmbeddingGenerator(GeneratorKind):
    """A generator kind whose network has twice the discriminator's embedding size (for the size check)."""

    label = "wide"
    display_name = "generator with its own embedding size"
    paper = "not in the paper (a test of sharing=gdes)"
    neural = True

    @classmethod
    def size_multipliers(cls, gen_cfg):
        return 1.0, 1.0

    @classmethod
    def network_config(cls, disc, gen_cfg):
        return replace(disc, embedding_size=2 * disc.embedding_size)


def networks(sharing, seed: int = 0):
    torch.manual_seed(seed)
    config = EncoderConfig(vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=64, max_position_embeddings=16)
    model = ElectraForPretraining(config, disc_head=True)
    generator = NeuralGenerator(config, torch.ones(VOCAB), SPECIAL, hidden_size=0.5)
    sharing.tie(generator, model)
    return model, generator


def batch() -> Batch:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, VOCAB, (4, 12), generator=g)
    ids[:, 0], ids[:, -1] = SPECIAL.cls, SPECIAL.sep
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    ids[1, 9:] = SPECIAL.pad
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    return Batch(ids, mask, types)


def losses(model, generator):
    """(generator's MLM loss, discriminator's replaced-token loss) of one ELECTRA step, as objectives/electra.py."""
    torch.manual_seed(2)
    objective = Electra("electra", SPECIAL, VOCAB, mask_prob=0.3)
    x = batch()
    fake = objective.corrupt(x, generator)
    logits = model.disc_logits(model(fake.input_ids, x.attention_mask, x.token_type_ids))
    return fake.gen_loss, rtd_loss(logits, fake.replaced, x.attention_mask.bool())


def grad_of(p: torch.nn.Parameter) -> float:
    return 0.0 if p.grad is None else p.grad.abs().sum().item()


def test_each_loss_trains_only_its_own_table():
    model, generator = networks(GradientDisentangledSharing("gdes"))
    gen_tables = [getattr(generator.electra.embeddings, t).weight for t in TABLES]
    deltas = [getattr(model.electra.embeddings, t).delta for t in TABLES]

    gen_loss, _ = losses(model, generator)
    gen_loss.backward()
    assert all(grad_of(w) > 0 for w in gen_tables)  # E_G: trained by the generator's MLM loss
    assert all(d.grad is None for d in deltas)  # E_delta: untouched by it

    generator.zero_grad(set_to_none=True)
    _, disc_loss = losses(model, generator)
    disc_loss.backward()
    assert all(w.grad is None for w in gen_tables)  # stop_gradient(E_G): no gradient from the discriminator
    assert all(grad_of(d) > 0 for d in deltas)

    # The same discriminator loss does reach E_G when the tables are simply shared: the stop-gradient is what
    # separates them.
    model, generator = networks(EmbeddingSharing("embeddings"))
    _, disc_loss = losses(model, generator)
    disc_loss.backward()
    assert grad_of(generator.electra.embeddings.word_embeddings.weight) > 0


@torch.no_grad()
def test_at_init_the_discriminator_embeds_with_the_generators_tables():
    model, generator = networks(GradientDisentangledSharing("gdes"))
    ids = batch().input_ids
    for table in TABLES:
        ours, theirs = getattr(model.electra.embeddings, table), getattr(generator.electra.embeddings, table)
        assert isinstance(ours, DisentangledEmbedding) and not ours.delta.abs().sum()
        lookup = ids if table == "word_embeddings" else ids % theirs.num_embeddings
        assert torch.equal(ours(lookup), theirs(lookup))
        assert torch.equal(ours.folded(), theirs.weight)
    # E_G belongs to the generator only: no parameter is in both networks.
    assert not {id(p) for p in model.parameters()} & {id(p) for p in generator.parameters()}
    # The embedding LayerNorm is each network's own.
    assert model.electra.embeddings.LayerNorm.weight is not generator.electra.embeddings.LayerNorm.weight


def test_adversarial_optimizers_own_each_parameter_once():
    model, generator = networks(GradientDisentangledSharing("gdes"))
    system = Adversarial(name="adversarial", model=model, generator=generator,
                         objective=Electra("electra", SPECIAL, VOCAB), lr=1e-3, betas=(0.9, 0.999), eps=1e-6,
                         weight_decay=0.01, warmup_steps=1, max_steps=10, max_grad_norm=1.0)
    (gen_opt, disc_opt), _ = system.configure_optimizers()
    owned = [[id(p) for g in opt.param_groups for p in g["params"]] for opt in (gen_opt, disc_opt)]
    every = {id(p) for p in system.parameters()}
    assert sorted(owned[0] + owned[1]) == sorted(every)  # each parameter in exactly one optimizer
    word = generator.electra.embeddings.word_embeddings.weight
    assert id(word) in owned[0] and id(model.electra.embeddings.word_embeddings.delta) in owned[1]


@torch.no_grad()
def test_fold_gives_a_plain_network_with_the_same_outputs():
    model, generator = networks(GradientDisentangledSharing("gdes"))
    for table in TABLES:
        getattr(model.electra.embeddings, table).delta.normal_(std=0.05)
    model.eval()
    state = torch.get_rng_state()
    plain = fold(model)
    assert torch.equal(torch.get_rng_state(), state)  # draws no random numbers (exact resume)
    assert not any(isinstance(m, DisentangledEmbedding) for m in plain.modules())
    x = batch()
    assert torch.equal(plain.disc_logits(plain(*x)), model.disc_logits(model(*x)))
    nets = Networks(model, generator)
    assert EmbeddingSharing("embeddings").exported(nets) is nets  # other modes save what they trained


def test_pretraining_with_gdes_exports_a_plain_discriminator(tmp_path, pretrain_cfg):
    cfg = pretrain_cfg(tmp_path, "sharing=gdes", "trainer.max_steps=4", "optim.warmup_steps=2",
                       "logger.log_every_n_steps=2")
    trained = {}

    class Keep(pl.Callback):
        def on_train_end(self, trainer, pl_module):
            trained["system"] = pl_module

    from electra_ablate.training.pretraining import train

    run_id = train(cfg, callbacks=[Keep()])
    client = MlflowClient(cfg.logger.tracking_uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["sharing"] == "gdes"
    system = trained["system"]
    model, generator = system.model.cpu().eval(), system.generator.cpu()
    deltas = {t: getattr(model.electra.embeddings, t).delta for t in TABLES}
    assert deltas["word_embeddings"].abs().sum() > 0  # E_delta was trained

    final = Path(run.data.tags[tracking.TAG_CHECKPOINT])
    saved, info = checkpoint.load_pretrained(final)
    assert info["sharing"] == "gdes" and info["model"]["disc_head"] and not info["model"]["mlm_head"]
    for table in TABLES:
        expected = getattr(generator.electra.embeddings, table).weight + deltas[table]
        assert torch.equal(getattr(saved.electra.embeddings, table).weight, expected.detach())
    saved_gen, _ = checkpoint.load_pretrained(final, "generator")
    assert torch.equal(saved_gen.electra.embeddings.word_embeddings.weight,
                       generator.electra.embeddings.word_embeddings.weight.detach())

    # FLOPs: charged as any sharing mode (flops.py does not count the E_G + E_delta add).
    per_step = client.get_metric_history(run_id, "flops/total")[-1].value / 4
    assert per_step == pytest.approx(flops.pretrain_flops_per_step(
        saved.config, saved_gen.config, Electra.flops, cfg.data.batch_size, cfg.data.max_seq_length))

    x = batch_for(saved.config.vocab_size)
    with torch.no_grad():
        assert torch.allclose(saved.eval().disc_logits(saved(*x)), model.disc_logits(model(*x)), atol=1e-5)
    if not _has_transformers():
        return
    os.environ["HF_HUB_OFFLINE"] = "1"
    import transformers

    from electra_ablate.hf import exporting as hf

    written = hf.export_pretrained(final, tmp_path / "hf")
    disc, loading = transformers.ElectraForPreTraining.from_pretrained(written["discriminator"],
                                                                       output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    with torch.no_grad():
        theirs = disc.eval()(input_ids=x.input_ids, attention_mask=x.attention_mask, token_type_ids=x.token_type_ids).logits
        ours = model.disc_logits(model(*x))
    real = x.attention_mask.bool()
    assert (theirs - ours)[real].abs().max().item() <= 1e-5


def batch_for(vocab_size: int) -> Batch:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, vocab_size, (2, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    return Batch(ids, mask, types)


def _has_transformers() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("overrides, key", [
    (["algorithm=two_stage", "generator.hidden_size=1.0"], "sharing=gdes"),
    ([f"generator._target_={__name__}.WideEmbeddingGenerator"], "model.embedding_size=32"),
    (["objective=replace_mlm"], "objective=replace_mlm"),
    (["objective=bert"], "objective=bert"),
    (["generator=uniform"], "generator=uniform"),
], ids=["two_stage", "embedding_size", "tied_mlm_head", "no_generator", "fixed_generator"])
def test_impossible_configs_are_refused_with_their_key(tmp_path, pretrain_cfg, overrides, key):
    cfg = pretrain_cfg(tmp_path, "sharing=gdes", *overrides)
    with pytest.raises(checks.ConfigError, match=key):
        checks.validate(cfg)


def test_adversarial_with_gdes_builds_a_system_that_trains_both_tables(tmp_path, pretrain_cfg):
    cfg = pretrain_cfg(tmp_path, "sharing=gdes", "algorithm=adversarial")
    checks.validate(cfg)  # accepted, unlike two-stage: each optimizer owns one table (E_G or E_delta)
    data = SimpleNamespace(vocab_size=VOCAB, token_counts=torch.ones(VOCAB))
    model, generator, objective = build.build_networks(cfg, data, SPECIAL)
    system = build.system(cfg, model, generator, objective)
    assert isinstance(system, Adversarial)
    (gen_opt, disc_opt), _ = system.configure_optimizers()
    owned = [{id(p) for g in opt.param_groups for p in g["params"]} for opt in (gen_opt, disc_opt)]
    for table in TABLES:
        disentangled = getattr(model.electra.embeddings, table)
        assert isinstance(disentangled, DisentangledEmbedding)
        assert id(disentangled.delta) in owned[1] and id(disentangled.delta) not in owned[0]
        assert id(getattr(generator.electra.embeddings, table).weight) in owned[0] - owned[1]
