"""Gradient-disentangled embedding sharing (GDES; He et al. 2021, "DeBERTaV3: Improving DeBERTa using
ELECTRA-Style Pre-Training with Gradient-Disentangled Embedding Sharing", arXiv:2111.09543, section 3.2).

DeBERTaV3 found that with shared embeddings (sharing=embeddings, the ELECTRA paper's default) the generator's
MLM loss and the discriminator's replaced-token loss pull the shared table in opposite directions ("tug of
war"). GDES re-parameterises the discriminator's embedding as

    E_D = stop_gradient(E_G) + E_delta,

where the generator owns E_G, trained only by the generator's loss, and E_delta starts at zero and is trained
only by the discriminator's loss. At initialisation E_D = E_G; the two never exchange gradients.

Tables covered: the token (word) embedding, which the paper re-parameterises, plus the position and
token-type tables. microsoft/DeBERTa's `apps/models/replaced_token_detection_model.py` applies GDES to every
embedding table its encoder has (word and, with absolute positions, position embeddings; DeBERTaV3 has no
token-type table); ELECTRA's encoder has all three, and these are the tables sharing=embeddings ties, so this
arm differs from sharing=embeddings only in the gradient disentanglement. The embedding LayerNorm is not a
table: each network keeps its own. The generator and discriminator must therefore have equal embedding
sizes (and equal position and token-type table sizes), checked before anything is built.

Algorithms. Joint training (paper section 2): one optimizer; E_G belongs to the generator and E_delta to
the discriminator, so each parameter is updated once. Adversarial training (paper Appendix F): the
generator's optimizer takes the generator's parameters (E_G) and the discriminator's takes the
discriminator's (E_delta): each parameter belongs to exactly one optimizer, and the generator's loss that
trains E_G is there the REINFORCE surrogate. Two-stage training (paper section 3.2) copies the generator's
whole encoder into the discriminator at the switch and freezes the generator, which leaves nothing to share:
like every sharing mode (`shares_weights`) it is refused there (use sharing=none). The discriminator's tied
MLM output layer of objectives whose fine-tuned network has an MLM head (bert, replace_mlm, all_tokens_mlm)
cannot follow a re-parameterised table, so GDES needs objective=electra or electra_15; and it needs a neural
generator (a uniform or unigram generator has no embedding).

FLOPs (models/flops.py). The discriminator looks up both tables and adds them: per token, one add of
`embedding_size` values per table (3 x embedding_size), against the 2 x embedding_size x vocab_size that the
paper's accounting charges for the word lookup alone (a one-hot multiply; google-research/electra
`flops_computation.py`), i.e. a relative 1.5 / vocab_size (5e-5 with the 30522-token vocabulary) of the
embedding cost and far less of the step. flops.py does not count it, so sharing=gdes is charged exactly what
sharing=none and sharing=embeddings are: the backward of E_delta replaces that of the discriminator's own
tables, and E_G gets no gradient from the discriminator.

Export. Fine-tuning, models/checkpoint.py and the transformers export expect a plain ELECTRA discriminator, so
`exported` folds E_G + E_delta into ordinary tables (`fold`) before pre-training saves.
"""

from __future__ import annotations

from dataclasses import fields

import torch
import torch.nn.functional as F
from hydra.utils import get_class
from omegaconf import DictConfig
from torch import nn

from electra_ablate.generators.base import generator_multipliers
from electra_ablate.models.encoder import ElectraForPretraining, EncoderConfig, Networks
from electra_ablate.sharing.base import SharingMode

# The embedding tables GDES re-parameterises (attribute names of models.encoder.ElectraEmbeddings).
TABLES = ("word_embeddings", "position_embeddings", "token_type_embeddings")
# The config fields that size those tables: they must agree between generator and discriminator.
TABLE_SIZES = ("embedding_size", "max_position_embeddings", "type_vocab_size")


class DisentangledEmbedding(nn.Module):
    """The discriminator's table: lookups of stop_gradient(E_G) plus lookups of a zero-initialised E_delta.

    E_G is held outside the module tree (in a tuple), so it is not among the discriminator's parameters, its
    state dict or its optimizer: only the generator owns it. Reading `source.weight` at every call follows the
    generator's table wherever Lightning moves it."""

    def __init__(self, source: nn.Embedding):
        super().__init__()
        self._source = (source,)
        self.padding_idx = source.padding_idx
        self.delta = nn.Parameter(torch.zeros_like(source.weight.detach()))

    @property
    def source(self) -> nn.Embedding:
        return self._source[0]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # Look up, then add: embedding_size adds per token rather than a vocabulary-sized table add per step.
        shared = F.embedding(ids, self.source.weight.detach(), self.padding_idx)
        return shared + F.embedding(ids, self.delta, self.padding_idx)

    def folded(self) -> torch.Tensor:
        """E_G + E_delta: the table a plain ELECTRA discriminator would hold (no gradient)."""
        return (self.source.weight + self.delta).detach()


def _disc_config(cfg: DictConfig) -> EncoderConfig:
    # The vocabulary size is the corpus's and does not change any table's width; 2 stands in for it here.
    sizes = {f.name: cfg.model[f.name] for f in fields(EncoderConfig) if f.name in cfg.model and f.name != "vocab_size"}
    return EncoderConfig(vocab_size=2, **sizes)


def fold(model: ElectraForPretraining) -> ElectraForPretraining:
    """A plain network equal to `model` with each DisentangledEmbedding folded into an nn.Embedding holding
    E_G + E_delta (`model` itself when it has none). Built on the meta device and filled with copies, so it
    draws no random numbers (exact resume) and leaves the trained network untouched."""
    embeddings = model.electra.embeddings
    gdes = {name: m for name in TABLES if isinstance(m := getattr(embeddings, name), DisentangledEmbedding)}
    if not gdes:
        return model
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    for name, module in gdes.items():
        del state[f"electra.embeddings.{name}.delta"]
        state[f"electra.embeddings.{name}.weight"] = module.folded().cpu().clone()
    with torch.device("meta"):
        plain = ElectraForPretraining(model.config, mlm_head=model.has_mlm_head, disc_head=model.has_disc_head)
    plain.load_state_dict(state, strict=True, assign=True)
    plain.tie_weights()
    return plain.train(model.training)


class GradientDisentangledSharing(SharingMode):
    display_name = "gradient-disentangled embeddings"
    paper = "not in the ELECTRA paper: DeBERTaV3 (He et al. 2021), section 3.2"

    @classmethod
    def config_problems(cls, cfg: DictConfig) -> list[str]:
        name = f"sharing={cfg.sharing.name}"
        objective = get_class(cfg.objective._target_)
        if not objective.needs_generator:
            return [f"{name} shares the generator's embeddings with the discriminator, but objective="
                    f"{cfg.objective.name} has no generator; use sharing=none"]
        problems = []
        if objective.model_heads.get("mlm_head"):
            problems.append(
                f"{name} re-parameterises the discriminator's word embeddings, which objective={cfg.objective.name}'s "
                "network also uses as its tied MLM output layer; use objective=electra or objective=electra_15 "
                "(DeBERTaV3 section 3.2 shares into a replaced-token discriminator), or sharing=embeddings")
        if generator_multipliers(cfg) is None:
            return problems + [
                f"{name} shares a neural generator's embeddings, but generator={get_class(cfg.generator._target_).label} "
                "has none; use generator=neural, or sharing=none"]
        disc = _disc_config(cfg)
        gen = get_class(cfg.generator._target_).network_config(disc, cfg.generator)
        for key in TABLE_SIZES:
            if getattr(gen, key) != getattr(disc, key):
                problems.append(
                    f"{name} adds the discriminator's E_delta to the generator's embedding table, so model.{key}="
                    f"{getattr(disc, key)} must equal the generator's {key} ({getattr(gen, key)}); give the "
                    f"generator the discriminator's {key}, or use sharing=none")
        return problems

    def tie(self, generator: ElectraForPretraining, model: ElectraForPretraining) -> None:
        for key in TABLE_SIZES:
            if getattr(generator.config, key) != getattr(model.config, key):
                raise ValueError(f"sharing={self.name} needs the generator's {key} to equal the discriminator's; got "
                                 f"{getattr(generator.config, key)} and {getattr(model.config, key)}")
        gen, disc = generator.electra.embeddings, model.electra.embeddings
        for name in TABLES:
            # The discriminator's own table is dropped: at initialisation E_D = E_G (E_delta = 0).
            setattr(disc, name, DisentangledEmbedding(getattr(gen, name)))

    def exported(self, nets: Networks) -> Networks:
        return Networks(fold(nets.model), nets.generator)
