"""Training FLOPs: the paper's Table 1 figures, the reference's equal-compute Base pair, and the per-layer
count against torch's own FLOP counter on the real encoder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from torch.utils.flop_counter import FlopCounterMode

from electra_ablate.models import flops
from electra_ablate.models.encoder import ElectraForPretraining, EncoderConfig
from electra_ablate.objectives.all_tokens_mlm import AllTokensMLM
from electra_ablate.objectives.bert import Bert
from electra_ablate.objectives.electra import Electra
from electra_ablate.objectives.electra_15 import Electra15
from electra_ablate.objectives.replace_mlm import ReplaceMLM
from electra_ablate.report.paper import load_paper_results

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
MODEL_KEYS = ("embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def model_config(name: str) -> EncoderConfig:
    """EncoderConfig of conf/model/<name>.yaml with BERT's 30522-token vocabulary."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("pretrain", overrides=[f"model={name}"])
    return EncoderConfig(vocab_size=30522, **{k: cfg.model[k] for k in MODEL_KEYS})


def test_table1_small_models_match_the_paper_within_10_percent():
    paper = load_paper_results()["table1_small"]["rows"]
    small = model_config("small")
    gen = small.scaled(small_fraction := 0.25)  # paper Table 6: generator 1/4 of ELECTRA-Small
    assert (gen.hidden_size, gen.num_attention_heads, gen.intermediate_size) == (64, 1, 256), small_fraction
    # Paper Table 1 / reference MODEL_FLOPS: ELECTRA-Small 1M steps, BERT-Small 1.45M steps, batch 128, seq 128.
    electra = flops.pretrain_flops(small, gen, Electra.flops, batch_size=128, seq_len=128, steps=1_000_000)
    bert = flops.pretrain_flops(small, gen, Bert.flops, batch_size=128, seq_len=128, steps=1_450_000)
    assert electra == pytest.approx(paper["electra"]["train_flops"], rel=0.10)
    assert bert == pytest.approx(paper["bert"]["train_flops"], rel=0.10)
    # The generator is a small share of ELECTRA-Small's step (it is why BERT gets 1.45x the steps).
    split = flops.step_flops(small, gen, Electra.flops, 128, 128)
    assert 0.1 < split.generator / split.total < 0.3


def test_reference_equal_compute_base_pair():
    # The reference trains ELECTRA-Base 766k steps against BERT-Base's 1M at batch 256, seq 512 (paper
    # Table 8): the two totals agree to 0.1% only if generator, embeddings and heads are all counted right.
    base = model_config("base")
    gen = EncoderConfig(vocab_size=30522, embedding_size=768, hidden_size=256, num_hidden_layers=12,
                        num_attention_heads=4, intermediate_size=1024)
    electra = flops.pretrain_flops(base, gen, Electra.flops, 256, 512, 766_000)
    bert = flops.pretrain_flops(base, None, Bert.flops, 256, 512, 1_000_000)
    assert electra == pytest.approx(bert, rel=1e-3)
    assert bert == pytest.approx(6.4e19, rel=0.01)


def attention_product_flops(batch: int, heads: int, seq: int, head_dim: int) -> int:
    """What torch counts for the two attention products (scores and weighted values) of one layer."""
    q = torch.randn(batch, heads, seq, head_dim)
    with FlopCounterMode(display=False) as counter:
        p = q @ q.transpose(-1, -2)
        p @ q
    return counter.get_total_flops()


def test_layer_count_agrees_with_torch_flop_counter():
    cfg = EncoderConfig(vocab_size=1000, embedding_size=64, hidden_size=128, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=512)
    net = ElectraForPretraining(cfg, disc_head=True).eval()
    B, T = 3, 64
    with FlopCounterMode(display=False) as counter:
        net.electra.encoder(torch.randn(B, T, cfg.hidden_size), None)
    # The CPU attention kernel is not counted by FlopCounterMode; add its two products explicitly.
    counted = counter.get_total_flops() + cfg.num_hidden_layers * attention_product_flops(
        B, cfg.num_attention_heads, T, cfg.hidden_size // cfg.num_attention_heads)
    ours = B * cfg.num_hidden_layers * flops.block_flops(cfg, T)
    # Ours also counts the element-wise work (softmax, GELU, LayerNorm, dropout): a few percent more.
    assert counted < ours < 1.05 * counted


def test_attention_term_grows_quadratically_with_length():
    cfg = model_config("tiny")
    d = lambda s: flops.block_flops(cfg, s) / s  # per-token cost, linear in s through attention only
    assert d(256) - d(128) == pytest.approx(2 * (d(128) - d(64)), rel=1e-12)
    # Per token: 4*h*s for the two products plus 10*heads*s for softmax, dropout and scaling.
    assert d(256) - d(128) == 128 * (4 * cfg.hidden_size + 10 * cfg.num_attention_heads)


def test_objectives_count_the_networks_they_run():
    disc = model_config("tiny")
    gen = disc.scaled(0.25)
    classes = {"bert": Bert, "electra": Electra, "electra_15": Electra15, "replace_mlm": ReplaceMLM,
               "all_tokens_mlm": AllTokensMLM}
    step = lambda objective, g=gen, **kw: flops.step_flops(disc, g, classes[objective].flops, 8, 128, **kw)
    assert step("bert").generator == 0 and step("bert", None) == step("bert")  # BERT has no generator
    assert step("electra", None).generator == 0  # unigram / uniform generators sample from a fixed table
    assert step("electra") == step("electra_15")
    # All-Tokens MLM predicts every token; Replace MLM only the masked 15.625%.
    assert step("all_tokens_mlm").discriminator > step("replace_mlm").discriminator == step("bert").discriminator
    assert step("replace_mlm").generator == step("electra").generator > 0
    # Two-stage: stage one trains the generator only; stage two runs it forward (1x) and trains the discriminator.
    joint, stage1, stage2 = step("electra"), step("electra", stage="generator"), step("electra", stage="discriminator")
    assert stage1 == (joint.generator, 0.0)
    assert stage2 == (joint.generator / 2, joint.discriminator)


@pytest.mark.parametrize(
    "kwargs, message",
    [({"stage": "both"}, "stage='both'"), ({"batch_size": 0}, "must be positive")],
)
def test_bad_input_names_the_problem(kwargs, message):
    args = {"disc": model_config("tiny"), "gen": None, "heads": Electra.flops, "batch_size": 8, "seq_len": 128, **kwargs}
    with pytest.raises(ValueError, match=message):
        flops.pretrain_flops_per_step(**args)
