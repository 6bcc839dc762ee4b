"""The BERT/ELECTRA Transformer encoder and its pre-training heads, in one file.

Module and config names copy Hugging Face's `modeling_electra.py` (ElectraModel, ElectraForPreTraining,
ElectraForMaskedLM) so that a state dict converts to and from transformers key by key. The architecture is
the one in Clark et al. (2020) and google-research/electra: factorized embeddings (`embedding_size` may be
smaller than `hidden_size`, with a linear projection), learned positions and token types, post-LayerNorm
blocks, GELU. Attention goes through `F.scaled_dot_product_attention` so the GPU gets fused kernels.

Beyond the paper, for small-compute regimes: `layer_norm="pre"` normalises each sub-layer's input instead of
its output and adds a final LayerNorm after the last block (Xiong et al. 2020; the layout Cramming, Geiping &
Goldstein 2023, found to learn fastest per FLOP), and `linear_bias=False` drops the biases of the Transformer
blocks' linear layers (Cramming again). The paper's layout, post-LN with biases, is the default; transformers'
ELECTRA classes have no pre-LN layout, so hf/exporting.py refuses such a network.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

LAYER_NORMS = ("post", "pre")


@dataclass(frozen=True)
class EncoderConfig:
    """Sizes of one encoder; field names follow transformers.ElectraConfig."""

    vocab_size: int = 30522
    embedding_size: int = 128
    hidden_size: int = 256
    num_hidden_layers: int = 12
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    layer_norm: str = "post"  # "post" (BERT, ELECTRA) or "pre" (normalise each sub-layer's input)
    linear_bias: bool = True  # biases of the Transformer blocks' linear layers

    def __post_init__(self):
        assert self.hidden_size % self.num_attention_heads == 0, (
            f"hidden_size={self.hidden_size} is not a multiple of num_attention_heads={self.num_attention_heads}"
        )
        assert self.layer_norm in LAYER_NORMS, f"layer_norm={self.layer_norm!r}; choose one of {LAYER_NORMS}"

    @property
    def pre_ln(self) -> bool:
        return self.layer_norm == "pre"

    def to_dict(self) -> dict:
        return asdict(self)

    def scaled(self, hidden_multiplier: float, layer_multiplier: float = 1.0) -> EncoderConfig:
        """A generator's config: a fraction of this (discriminator) config.

        Heads = max(1, hidden // 64) and FFN = 4 x hidden, as in the reference `get_generator_config`;
        multipliers of 1 give exactly this config (what sharing=all needs).
        """
        if hidden_multiplier == 1 and layer_multiplier == 1:
            return self
        hidden = max(1, int(round(self.hidden_size * hidden_multiplier)))
        heads = max(1, hidden // 64)
        while hidden % heads:  # keep heads a divisor of hidden for odd fractions
            heads -= 1
        return replace(
            self,
            hidden_size=hidden,
            num_attention_heads=heads,
            intermediate_size=4 * hidden,
            num_hidden_layers=max(1, int(round(self.num_hidden_layers * layer_multiplier))),
        )


class ElectraEmbeddings(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.embedding_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.embedding_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.embedding_size)
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        T = input_ids.shape[1]
        positions = torch.arange(T, device=input_ids.device)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions) + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))  # (B, T, E)


class ElectraSelfAttention(nn.Module):
    # The attention kernel, SDPA's signature; `fast.apply_runtime` swaps in one with cheap CPU dropout masks.
    sdpa = staticmethod(F.scaled_dot_product_attention)

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        bias = config.linear_bias
        self.query = nn.Linear(config.hidden_size, config.hidden_size, bias=bias)
        self.key = nn.Linear(config.hidden_size, config.hidden_size, bias=bias)
        self.value = nn.Linear(config.hidden_size, config.hidden_size, bias=bias)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor | None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (
            proj(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
            for proj in (self.query, self.key, self.value)
        )
        y = self.sdpa(q, k, v, attn_mask=attn_bias, dropout_p=self.dropout_p if self.training else 0.0)
        return y.transpose(1, 2).reshape(B, T, C)


class ElectraSelfOutput(nn.Module):
    """A sub-layer's output projection and residual. Post-LN (BERT): LayerNorm(dropout(dense(h)) + residual).
    Pre-LN: this LayerNorm normalises the sub-layer's input instead (`normalize_input`), and the residual
    stream is left unnormalised."""

    def __init__(self, config: EncoderConfig, in_size: int):
        super().__init__()
        self.pre_ln = config.pre_ln
        self.dense = nn.Linear(in_size, config.hidden_size, bias=config.linear_bias)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def normalize_input(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(x) if self.pre_ln else x

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        out = self.dropout(self.dense(h)) + residual
        return out if self.pre_ln else self.LayerNorm(out)


class ElectraAttention(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.self = ElectraSelfAttention(config)
        self.output = ElectraSelfOutput(config, config.hidden_size)

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor | None) -> torch.Tensor:
        return self.output(self.self(self.output.normalize_input(x), attn_bias), x)


class ElectraIntermediate(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.linear_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))


class ElectraLayer(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.attention = ElectraAttention(config)
        self.intermediate = ElectraIntermediate(config)
        self.output = ElectraSelfOutput(config, config.intermediate_size)

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor | None) -> torch.Tensor:
        x = self.attention(x, attn_bias)
        return self.output(self.intermediate(self.output.normalize_input(x)), x)


class ElectraEncoder(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.layer = nn.ModuleList(ElectraLayer(config) for _ in range(config.num_hidden_layers))
        if config.pre_ln:  # the residual stream is never normalised inside the blocks: once, at the end
            self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, attn_bias: torch.Tensor | None) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, attn_bias)
        return self.LayerNorm(x) if hasattr(self, "LayerNorm") else x


def attention_bias(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """(B, T) 1/0 padding mask -> additive (B, 1, 1, T) bias for SDPA; None when nothing is padded."""
    if attention_mask is None:
        return None
    bias = torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device)
    bias.masked_fill_(attention_mask == 0, torch.finfo(dtype).min)
    return bias[:, None, None, :]


class ElectraModel(nn.Module):
    """The encoder (transformers' `ElectraModel`): embeddings -> optional projection -> Transformer layers."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        self.embeddings = ElectraEmbeddings(config)
        if config.embedding_size != config.hidden_size:
            self.embeddings_project = nn.Linear(config.embedding_size, config.hidden_size)
        self.encoder = ElectraEncoder(config)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        T = input_ids.shape[1]
        assert T <= self.config.max_position_embeddings, (
            f"sequence length {T} > max_position_embeddings={self.config.max_position_embeddings}; "
            "shorten data.max_seq_length or raise model.max_position_embeddings"
        )
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, E)
        if hasattr(self, "embeddings_project"):
            x = self.embeddings_project(x)  # (B, T, H)
        return self.encoder(x, attention_bias(attention_mask, x.dtype))  # (B, T, H)


class ElectraGeneratorPredictions(nn.Module):
    """MLM transform: dense hidden -> embedding_size, GELU, LayerNorm (transformers' names)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(h)))


class ElectraDiscriminatorPredictions(nn.Module):
    """Per-token binary head: dense, GELU, dense -> 1 logit (transformers' names)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dense_prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.dense_prediction(F.gelu(self.dense(h))).squeeze(-1)  # (..., )


class ElectraForPretraining(nn.Module):
    """An encoder with the heads an objective asks for.

    `mlm_head` adds `generator_predictions` + `generator_lm_head` (output weights tied to the input word
    embeddings, plus a bias); `disc_head` adds `discriminator_predictions`. With only the MLM head the state
    dict is transformers' `ElectraForMaskedLM`; with only the discriminator head, `ElectraForPreTraining`.
    """

    def __init__(self, config: EncoderConfig, mlm_head: bool = False, disc_head: bool = False):
        super().__init__()
        assert mlm_head or disc_head, "a pre-training network needs at least one head"
        self.config = config
        self.electra = ElectraModel(config)
        if mlm_head:
            self.generator_predictions = ElectraGeneratorPredictions(config)
            self.generator_lm_head = nn.Linear(config.embedding_size, config.vocab_size)
        if disc_head:
            self.discriminator_predictions = ElectraDiscriminatorPredictions(config)
        self.apply(self._init_weights)
        self.tie_weights()

    @property
    def has_mlm_head(self) -> bool:
        return hasattr(self, "generator_lm_head")

    @property
    def has_disc_head(self) -> bool:
        return hasattr(self, "discriminator_predictions")

    def tie_weights(self) -> None:
        """Tie the MLM output projection to the (possibly shared) input word embeddings."""
        if self.has_mlm_head:
            self.generator_lm_head.weight = self.electra.embeddings.word_embeddings.weight

    def _init_weights(self, module: nn.Module) -> None:
        # BERT/ELECTRA init: N(0, 0.02) for weights, zeros for biases, LayerNorm (1, 0).
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        return self.electra(input_ids, attention_mask, token_type_ids)  # (B, T, H)

    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) hidden states -> (..., V) logits. Pass only the positions you need (see `gather`)."""
        return self.generator_lm_head(self.generator_predictions(hidden))

    def disc_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, T, H) -> (B, T) replaced-token logits."""
        return self.discriminator_predictions(hidden)


class Networks(NamedTuple):
    """What an objective is given: the network that gets fine-tuned and, if any, the generator."""

    model: ElectraForPretraining
    generator: nn.Module | None


def gather(hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(B, T, H) states at a (B, T) boolean mask -> (N, H), row-major order."""
    return hidden[positions]


def num_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
