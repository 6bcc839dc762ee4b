"""Pre-training FLOPs counted the way the ELECTRA paper counts them ("Train FLOPs", Tables 1 and 8).

The accounting follows google-research/electra `flops_computation.py`: an operation is a mathematical
operation (a matrix multiply of m x n by n x k costs 2mnk), embedding lookups are counted as dense one-hot
multiplies, every sequence is assumed full length, the vocabulary softmax of an MLM head runs only on the
masked fraction of positions (`MASKED_FRACTION`, the reference's 20 predictions per 128 tokens), a
discriminator head runs on every position, and the backward pass is counted as costing as much as the
forward pass, so a trained network costs 2x its forward FLOPs. (A matrix multiply's backward really costs
twice its forward, i.e. ~3x in total; the paper's numbers use 2x, and so do we, so that curves and tables
compare with the paper's.) ELECTRA's step trains the generator and the discriminator; the count is per
optimizer step over the global batch. With these rules ELECTRA-Small (1M steps) and BERT-Small (1.45M
steps) both come to the paper's 1.4e18 (tests/test_flops.py).
"""

from __future__ import annotations

from typing import NamedTuple

from electra_ablate.models.encoder import EncoderConfig

# Per-element costs of the cheap operations, as the reference assumes them (they touch O(hidden) values, so
# the matrix multiplies dominate and these constants barely matter).
DROPOUT_FLOPS = 4  # random number, compare, mask multiply, 1 / (1 - p) rescale
LAYER_NORM_FLOPS = 5  # mean, variance (square + sum), shift, scale
ACTIVATION_FLOPS = 8  # tanh-approximated GELU
SOFTMAX_FLOPS = 5  # max-subtract, exp, sum, divide

# Fraction of positions that get the vocabulary softmax in an MLM head: the reference's `output_frac`
# (max_predictions_per_seq = 20 for 128 tokens), used for Small, Base and Large alike.
MASKED_FRACTION = 0.15625

# Forward + backward = 2 x forward (reference: "backward pass takes the same number of FLOPs as forward").
TRAIN_MULTIPLIER = 2


class Heads(NamedTuple):
    """What one objective computes per sequence (paper section 3.3): each objective class's `flops`."""

    main: str  # head of the network that gets fine-tuned: "mlm" (vocabulary softmax) or "disc" (binary)
    main_fraction: float  # fraction of positions the main head's softmax runs on ("mlm" only)
    generator: bool  # whether a generator network (when neural) runs before the main network


STAGES = ("joint", "generator", "discriminator")


class StepFlops(NamedTuple):
    """Training FLOPs of one optimizer step, split by network."""

    generator: float
    discriminator: float

    @property
    def total(self) -> float:
        return self.generator + self.discriminator


def block_flops(cfg: EncoderConfig, seq_len: int) -> float:
    """Forward FLOPs of one Transformer layer over one sequence of `seq_len` tokens."""
    h, i, s, heads = cfg.hidden_size, cfg.intermediate_size, seq_len, cfg.num_attention_heads
    per_token = (
        # self-attention: Q, K, V projections (h -> h each) with biases
        3 * 2 * h * h + 3 * h
        # scores Q K^T and the weighted sum of V: each token against all s tokens, summed over heads
        + 2 * h * s + 2 * h * s
        # softmax, dropout and 1/sqrt(d) scaling of the (heads, s) scores of this token
        + (SOFTMAX_FLOPS + DROPOUT_FLOPS + 1) * heads * s
        # output projection, bias, dropout, residual; the reference counts this LayerNorm once per token
        + 2 * h * h + h + DROPOUT_FLOPS * h + h + LAYER_NORM_FLOPS
        # feed-forward h -> i (GELU, bias) -> h (bias, dropout, residual, LayerNorm)
        + 2 * h * i + ACTIVATION_FLOPS * i + i
        + 2 * i * h + h + DROPOUT_FLOPS * h + h + LAYER_NORM_FLOPS * h
    )
    return float(per_token * s)


def input_embedding_flops(cfg: EncoderConfig, seq_len: int) -> float:
    """Forward FLOPs of the embeddings (dense one-hot lookups) and the projection when embedding != hidden."""
    e, h, v, s = cfg.embedding_size, cfg.hidden_size, cfg.vocab_size, seq_len
    per_token = (
        2 * e * v  # word embedding as a one-hot matrix multiply
        + 2 * e * (s + 2)  # position (s rows) and token-type (2 rows) lookups, as the reference counts them
        + 2 * e  # adding the three embeddings
        + LAYER_NORM_FLOPS * e
        + DROPOUT_FLOPS * e
    )
    if e != h:
        per_token += 2 * e * h + h  # embeddings_project
    return float(per_token * s)


def mlm_head_flops(cfg: EncoderConfig, seq_len: int, fraction: float) -> float:
    """Forward FLOPs of the MLM head (dense h -> e, GELU, LayerNorm, tied output layer, softmax) on
    `fraction` of the positions."""
    e, h, v = cfg.embedding_size, cfg.hidden_size, cfg.vocab_size
    per_token = (
        2 * h * e + e + ACTIVATION_FLOPS * e + LAYER_NORM_FLOPS * e  # generator_predictions
        + 2 * e * v  # generator_lm_head (tied to the word embeddings)
        + SOFTMAX_FLOPS * v + 2 * v  # softmax over the vocabulary and picking the target's probability
    )
    return float(fraction * per_token * seq_len)


def disc_head_flops(cfg: EncoderConfig, seq_len: int) -> float:
    """Forward FLOPs of the discriminator head (dense h -> h, GELU, dense h -> 1) on every position."""
    h = cfg.hidden_size
    return float((2 * h * h + h + ACTIVATION_FLOPS * h + 2 * h) * seq_len)


def forward_flops(cfg: EncoderConfig, seq_len: int, head: str, fraction: float = MASKED_FRACTION) -> float:
    """Forward FLOPs of one network (embeddings, layers, head) over one sequence."""
    if head not in ("mlm", "disc"):
        raise ValueError(f"head={head!r}; expected 'mlm' or 'disc'")
    head_flops = mlm_head_flops(cfg, seq_len, fraction) if head == "mlm" else disc_head_flops(cfg, seq_len)
    return cfg.num_hidden_layers * block_flops(cfg, seq_len) + input_embedding_flops(cfg, seq_len) + head_flops


def step_flops(
    disc: EncoderConfig,
    gen: EncoderConfig | None,
    heads: Heads,
    batch_size: int,
    seq_len: int,
    stage: str = "joint",
) -> StepFlops:
    """Training FLOPs of one optimizer step, split into generator and discriminator (or MLM model).

    `heads` is the objective class's `flops`. `disc` is the network that gets fine-tuned (the discriminator,
    or the MLM model for bert, replace_mlm and all_tokens_mlm); `gen` the neural generator's config, or None for the uniform and unigram
    generators (sampling from a fixed distribution is not counted) and for BERT (ignored there).
    `batch_size` is the global batch (sequences per optimizer step, all devices and accumulation steps).
    `stage` covers two-stage training (paper section 3.2): "generator" = stage one (only the generator is
    trained), "discriminator" = stage two (the frozen generator runs forward only to sample replacements),
    "joint" = both trained together (the default, and the adversarial algorithm).
    """
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r}; expected one of {STAGES}")
    if batch_size <= 0 or seq_len <= 0:
        raise ValueError(f"batch_size={batch_size} and seq_len={seq_len} must be positive")
    gen_flops = 0.0
    if heads.generator and gen is not None:
        gen_forward = forward_flops(gen, seq_len, "mlm", MASKED_FRACTION) * batch_size
        gen_flops = gen_forward * (1 if stage == "discriminator" else TRAIN_MULTIPLIER)
    disc_flops = 0.0
    if stage != "generator":
        disc_flops = TRAIN_MULTIPLIER * batch_size * forward_flops(disc, seq_len, heads.main, heads.main_fraction)
    return StepFlops(generator=gen_flops, discriminator=disc_flops)


def pretrain_flops_per_step(
    disc: EncoderConfig,
    gen: EncoderConfig | None,
    heads: Heads,
    batch_size: int,
    seq_len: int,
    stage: str = "joint",
) -> float:
    """Training FLOPs of one optimizer step (what pre-training logs as train/flops per step)."""
    return step_flops(disc, gen, heads, batch_size, seq_len, stage).total


def pretrain_flops(
    disc: EncoderConfig,
    gen: EncoderConfig | None,
    heads: Heads,
    batch_size: int,
    seq_len: int,
    steps: int,
) -> float:
    """Total training FLOPs of `steps` joint steps (the paper's "Train FLOPs" column)."""
    return pretrain_flops_per_step(disc, gen, heads, batch_size, seq_len) * steps
