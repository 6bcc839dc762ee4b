"""Block layouts beyond the paper (`model.layer_norm`, `model.linear_bias`): what the blocks compute, that they
pre-train and fine-tune, that the paper's layout keeps its run identities, and that export refuses them."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from electra_ablate import pretrain
from electra_ablate.hf.convert import HFInteropError, electra_config
from electra_ablate.models.checkpoint import load_pretrained
from electra_ablate.models.encoder import ElectraForPretraining, EncoderConfig
from electra_ablate.training import checks
from electra_ablate.tracking.runs import config_hash

SIZES = dict(vocab_size=50, embedding_size=16, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _attention(layer, x):
    a = layer.attention.self
    B, T, C = x.shape
    q, k, v = (p(x).view(B, T, a.num_heads, a.head_dim).transpose(1, 2) for p in (a.query, a.key, a.value))
    w = torch.softmax(q @ k.transpose(-1, -2) / a.head_dim**0.5, dim=-1)
    return (w @ v).transpose(1, 2).reshape(B, T, C)


def _block(layer, x, pre: bool):
    """One Transformer block written out: pre-LN x + f(LN(x)), post-LN LN(x + f(x))."""
    att_ln, ffn_ln = layer.attention.output.LayerNorm, layer.output.LayerNorm
    if pre:
        x = x + layer.attention.output.dense(_attention(layer, att_ln(x)))
        return x + layer.output.dense(F.gelu(layer.intermediate.dense(ffn_ln(x))))
    x = att_ln(x + layer.attention.output.dense(_attention(layer, x)))
    return ffn_ln(x + layer.output.dense(F.gelu(layer.intermediate.dense(x))))


@pytest.mark.parametrize("layer_norm", ["post", "pre"])
def test_blocks_compute_their_layout(layer_norm):
    torch.manual_seed(0)
    net = ElectraForPretraining(EncoderConfig(**SIZES, layer_norm=layer_norm), mlm_head=True).eval()
    for p in net.parameters():  # move LayerNorm off its (1, 0) init so that its placement matters
        p.data.add_(0.1 * torch.randn_like(p))
    ids = torch.randint(1, 50, (3, 7))
    x = net.electra.embeddings(ids)
    for layer in net.electra.encoder.layer:
        x = _block(layer, x, layer_norm == "pre")
    if layer_norm == "pre":
        x = net.electra.encoder.LayerNorm(x)
    else:
        assert not hasattr(net.electra.encoder, "LayerNorm")
    torch.testing.assert_close(net(ids), x, rtol=1e-5, atol=1e-5)


def test_no_linear_bias_drops_the_blocks_biases_only():
    net = ElectraForPretraining(EncoderConfig(**SIZES, linear_bias=False), mlm_head=True, disc_head=True)
    names = {n for n, _ in net.named_parameters()}
    assert not any(n.startswith("electra.encoder.") and n.endswith("dense.bias") for n in names)
    assert not any(n.endswith(("query.bias", "key.bias", "value.bias")) for n in names)
    assert "electra.encoder.layer.0.attention.output.LayerNorm.bias" in names  # LayerNorm keeps its shift
    assert "generator_lm_head.bias" in names and "discriminator_predictions.dense.bias" in names  # heads keep theirs


def test_pre_ln_pretrains_saves_and_reloads(tmp_path, pretrain_cfg):
    cfg = pretrain_cfg(tmp_path, "objective=bert", "model.layer_norm=pre", "model.linear_bias=false",
                       "model.hidden_dropout_prob=0", "model.attention_probs_dropout_prob=0", "trainer.max_steps=4",
                       "optim.warmup_steps=0")
    from mlflow.tracking import MlflowClient

    run = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(pretrain.train(cfg))
    assert run.data.params["model.layer_norm"] == "pre" and run.data.params["model.linear_bias"] == "False"
    net, _ = load_pretrained(run.data.tags["checkpoint_path"])
    assert net.config.layer_norm == "pre" and not net.config.linear_bias
    with pytest.raises(HFInteropError, match="model.layer_norm=pre"):
        electra_config(net.config)


def test_paper_layout_keeps_identities_and_other_layouts_change_them(tmp_path, pretrain_cfg):
    base = pretrain_cfg(tmp_path, "objective=electra")
    stripped = OmegaConf.create(OmegaConf.to_container(base))  # a config from before the options existed
    del stripped.model["layer_norm"], stripped.model["linear_bias"]
    assert config_hash(base) == config_hash(stripped)
    assert config_hash(pretrain_cfg(tmp_path, "objective=electra", "model.layer_norm=pre")) != config_hash(base)
    assert config_hash(pretrain_cfg(tmp_path, "objective=electra", "model.linear_bias=false")) != config_hash(base)


@pytest.mark.parametrize("override, message", [
    ("model.layer_norm=middle", "model.layer_norm='middle' must be one of post, pre"),
    ("model.linear_bias=maybe", "model.linear_bias='maybe' must be true or false"),
])
def test_bad_layout_is_refused_before_compute(tmp_path, pretrain_cfg, override, message):
    problems = checks.value_problems(pretrain_cfg(tmp_path, override))
    assert any(message in p for p in problems), problems


def test_pre_ln_fine_tunes_with_its_final_layer_norm_at_the_top_layers_rate():
    from electra_ablate.glue import tasks as glue
    from electra_ablate.finetuning.system import FinetuneSystem, OptimSettings
    from electra_ablate.models.encoder import ElectraModel

    config = EncoderConfig(**SIZES, layer_norm="pre")
    optim = OptimSettings(1e-3, 0.5, True, (0.9, 0.999), 1e-6, 0.0, 0.1)
    system = FinetuneSystem(ElectraModel(config), glue.TASKS["sst2"], optim, dev_labels={})
    system._trainer = types.SimpleNamespace(estimated_stepping_batches=20)  # what configure_optimizers reads
    groups = system.configure_optimizers()["optimizer"].param_groups
    lr_of = {id(p): g["initial_lr"] for g in groups for p in g["params"]}
    named = dict(system.named_parameters())
    assert set(lr_of) == {id(p) for p in named.values()}  # every parameter has a rate
    top = lr_of[id(named["encoder.encoder.layer.1.output.dense.weight"])]
    assert lr_of[id(named["encoder.encoder.LayerNorm.weight"])] == top == pytest.approx(1e-3 * 0.5**2)
    x = torch.randint(0, 50, (2, 5))
    assert system(x, torch.ones_like(x), torch.zeros_like(x)).shape == (2, 2)


def _compose_pretrain(tmp_path, *overrides: str):
    from hydra import compose, initialize_config_dir

    from electra_ablate.common.cli import CONF_DIR
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("pretrain", overrides=[f"paths.output_dir={tmp_path}/run", *overrides])


def test_the_cpu_regime_preset_is_pre_ln_without_dropout_and_its_name_is_a_label(tmp_path):
    cfg = _compose_pretrain(tmp_path, "experiment=cpu_regime", "objective=bert")
    assert (cfg.model.name, cfg.model.layer_norm, cfg.model.hidden_dropout_prob,
            cfg.model.attention_probs_dropout_prob) == ("tiny", "pre", 0.0, 0.0)
    assert (cfg.data.max_docs, cfg.data.train_vocab_size, cfg.data.max_seq_length, cfg.data.batch_size) == (
        40000, 2000, 64, 128)
    assert (cfg.optim.lr, cfg.optim.warmup_steps, cfg.trainer.max_steps) == (2e-3, 120, 6000)
    assert cfg.preset == "cpu_regime" and _compose_pretrain(tmp_path, "objective=bert").preset is None
    spelt = _compose_pretrain(tmp_path, "objective=bert", "data=wiki", "model.layer_norm=pre",
                              "model.hidden_dropout_prob=0.0", "model.attention_probs_dropout_prob=0.0",
                              "data.max_docs=40000", "data.train_vocab_size=2000", "data.max_seq_length=64",
                              "data.batch_size=128", "optim.lr=2e-3", "optim.warmup_steps=120",
                              "trainer.max_steps=6000")
    assert config_hash(spelt) == config_hash(cfg)  # the same settings spelt out are the same run
    assert _compose_pretrain(tmp_path, "experiment=cpu_regime", "trainer.max_steps=10").trainer.max_steps == 10
