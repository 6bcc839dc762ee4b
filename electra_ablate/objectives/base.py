"""Pieces every pre-training objective shares: masking, sampling, the MLM and RTD losses, and the output type.

Masking follows google-research/electra `pretrain_helpers.mask`: a fixed share of the non-special tokens of
each sequence (round(mask_prob x n), at least 1, at most `max_predictions_per_seq`) is selected; selected
tokens become [MASK] with probability `mask_token_prob`, a uniformly random token with probability
`random_token_prob`, and stay unchanged otherwise. Labels: -100 = ignored; discriminator 1 = replaced.
Predictions are made in a fixed number of slots per sequence (objectives/positions.py), so no shape depends on
the data and the step never waits on the device.

Metrics are returned as (sum, count) pairs so the training system can add them up on the device over a
logging window and divide once, with no host-device synchronisation per step.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from hydra.utils import get_class
from omegaconf import DictConfig
from torch import nn

from electra_ablate.common.tokens import SpecialIds
from electra_ablate.common.values import is_integer, is_number
from electra_ablate.models.flops import Heads
from electra_ablate.objectives import positions as slots
from electra_ablate.objectives.positions import Positions


IGNORE = -100


class Batch(NamedTuple):
    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) 1 = token, 0 = pad
    token_type_ids: torch.Tensor  # (B, T)


class Masked(NamedTuple):
    input_ids: torch.Tensor  # (B, T) corrupted input
    selected: torch.Tensor  # (B, T) bool: positions chosen for prediction
    labels: torch.Tensor  # (B, T) original id at selected positions, IGNORE elsewhere
    positions: Positions  # (B, N) prediction slots: where, and which are used
    targets: torch.Tensor  # (B, N) original id in each slot


class ObjectiveOutput(NamedTuple):
    loss: torch.Tensor  # scalar, what the optimizer minimises
    sums: dict[str, torch.Tensor]  # name -> (2,) tensor [sum, count], detached
    disc_probs: torch.Tensor | None = None  # (N,) replaced-token probabilities, for disc_auc
    disc_labels: torch.Tensor | None = None  # (N,) 0/1 labels
    disc_weights: torch.Tensor | None = None  # (N,) bool: which of the N count (None: all)


def need(out: list[str], ok: bool, key: str, value, rule: str) -> None:
    """Add "key=value rule" to `out` unless `ok` (the form of every config problem)."""
    if not ok:
        out.append(f"{key}={value!r} {rule}")


def ratio(num: torch.Tensor, den: torch.Tensor | int | float) -> torch.Tensor:
    """A (2,) [sum, count] pair, detached and in fp32."""
    if torch.is_tensor(den):
        den = den.detach().to(device=num.device, dtype=torch.float32)
    else:  # a fill on the device: copying a host number there would wait for the copy
        den = torch.full((), float(den), device=num.device)
    return torch.stack([num.detach().float().sum(), den])


def maskable(input_ids: torch.Tensor, special: SpecialIds) -> torch.Tensor:
    """(B, T) bool: tokens that may be selected -- never [CLS], [SEP] or [PAD] (reference `_get_candidates_mask`)."""
    return (input_ids != special.cls) & (input_ids != special.sep) & (input_ids != special.pad)


def select_positions(candidates: torch.Tensor, mask_prob: float, max_predictions_per_seq: int | None = None) -> torch.Tensor:
    """(B, T) bool: round(mask_prob x #candidates) (at least one) positions per row, uniformly at random."""
    cap = slots.max_predictions(mask_prob, candidates.shape[1], max_predictions_per_seq)
    return slots.selected(slots.choose(candidates, candidates, mask_prob, cap), candidates.shape[1])


def mask_tokens(
    input_ids: torch.Tensor,
    special: SpecialIds,
    vocab_size: int,
    mask_prob: float,
    mask_token_prob: float,
    random_token_prob: float,
    max_predictions_per_seq: int | None = None,
    position_sampling: str = "without_replacement",
) -> Masked:
    cap = slots.max_predictions(mask_prob, input_ids.shape[1], max_predictions_per_seq)
    chosen = slots.choose(maskable(input_ids, special), input_ids != special.pad, mask_prob, cap, position_sampling)
    selected = slots.selected(chosen, input_ids.shape[1])
    # Decisions per position over (B, T), as before slots existed: the same draws give the same corruption.
    r = torch.rand(input_ids.shape, device=input_ids.device)
    to_mask = selected & (r < mask_token_prob)
    to_random = selected & (r >= mask_token_prob) & (r < mask_token_prob + random_token_prob)
    corrupted = input_ids.masked_fill(to_mask, special.mask)
    if random_token_prob > 0:
        random_ids = torch.randint(0, vocab_size, input_ids.shape, device=input_ids.device)
        corrupted = torch.where(to_random, random_ids, corrupted)
    labels = input_ids.masked_fill(~selected, IGNORE)
    return Masked(corrupted, selected, labels, chosen, slots.gather(input_ids, chosen.index))


@torch.no_grad()
def sample_tokens(
    logits: torch.Tensor, temperature: float = 1.0, method: str = "gumbel", disallow: torch.Tensor | None = None
) -> torch.Tensor:
    """Draw one token per row from softmax(logits / temperature), in fp32, with no gradient.

    `gumbel` is the reference's Gumbel-max (`pretrain_helpers.sample_from_softmax`): V uniforms per row.
    `inverse_cdf` draws the same distribution from one uniform per row (softmax, cumulative sum, search).
    `disallow` (N,) ids: each row's id gets 1000 subtracted from its tempered logit, as the reference's
    `disallow_correct` (run_pretraining.py `_get_fake_data`), so the original is (almost) never drawn.
    """
    logits = logits.float()  # (N, V); no copy when the caller passes the fp32 scores it already has
    if temperature != 1.0:  # x / 1 is x: skipping it saves a pass over the logits and changes no bit
        logits = logits / temperature
    if disallow is not None:
        logits = logits.scatter_add(1, disallow[:, None], torch.full_like(logits[:, :1], -1000.0))
    if method == "gumbel":
        u = torch.rand_like(logits)
        return torch.argmax(logits - torch.log(-torch.log(u + 1e-9) + 1e-9), dim=-1)
    if method == "inverse_cdf":
        cdf = torch.softmax(logits, dim=-1).cumsum_(dim=-1)  # (N, V)
        u = torch.rand(cdf.shape[0], 1, device=cdf.device) * cdf[:, -1:]
        return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=logits.shape[-1] - 1)
    raise ValueError(f"unknown sampler {method!r}; valid: gumbel, inverse_cdf (runtime.sampler)")


def fp32_scores(logits: torch.Tensor) -> torch.Tensor:
    """The (N, V) logits in fp32, made once per head and shared by its loss, argmax and sampler.

    Under bf16 autocast the head's logits are bf16; the loss takes them in fp32 anyway (`mlm_loss`), and an
    argmax over fp32 is ~4x faster on CPU than over bf16 (no vectorised bf16 reduction) while picking the same
    index (the upcast is exact), so one copy serves all three: the same numbers, two passes over the logits fewer.
    """
    return logits.float()


def mlm_loss(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy over the given (N, V) logits and (N,) targets, computed in fp32; with (N,) bool
    `weights`, the mean over the rows they keep (reference `_get_masked_lm_output`: weighted sum / count)."""
    if weights is None:
        return F.cross_entropy(logits.float(), targets)
    w = weights.float()
    losses = F.cross_entropy(logits.float(), targets, reduction="none")
    return (losses * w).sum() / w.sum().clamp(min=1.0)


def rtd_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Sigmoid cross-entropy averaged over the positions where `weights` is true (reference `_get_discriminator_output`)."""
    w = weights.float()
    losses = F.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction="none")
    return (losses * w).sum() / (w.sum() + 1e-6)


def copy_split_sums(correct: torch.Tensor, inputs: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor,
                    special: SpecialIds, mask_token_prob: float, random_token_prob: float,
                    prefix: str = "masked_lm_accuracy") -> dict[str, torch.Tensor]:
    """A masked LM's accuracy where its input was [MASK] and where its input kept the original token, apart.

    All tensors are (N,) over the prediction slots: `correct` the prediction's hits, `inputs` the token the
    network saw there, `targets` the original, `weights` the used slots. At a kept position copying the input is
    right, so a network that only copies scores 100% there and ~0 at [MASK]; the combined accuracy (the
    reference's `masked_lm_accuracy`) mixes the two in the masking's proportions (ELECTRA's 85/15: copying alone
    scores ~15%). A slot whose random replacement drew the original counts as kept: copying it is right too.
    A share the masking never produces (mask_token_prob 0; no kept share) is left out rather than logged as 0.
    """
    out = {}
    if mask_token_prob > 0:
        at_mask = weights & (inputs == special.mask)
        out[f"{prefix}_at_mask"] = ratio((correct & at_mask).sum(), at_mask.sum())
    if mask_token_prob + random_token_prob < 1:
        kept = weights & (inputs == targets)
        out[f"{prefix}_at_kept"] = ratio((correct & kept).sum(), kept.sum())
    return out


def disc_sums(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """Accuracy, precision, recall and replaced fraction of the discriminator as (sum, count) pairs."""
    w = weights
    pred = (logits > 0) & w
    lab = labels.bool() & w
    tp = (pred & lab).sum()
    return {
        "disc_accuracy": ratio(((pred == lab) & w).sum(), w.sum()),
        "disc_precision": ratio(tp, pred.sum()),
        "disc_recall": ratio(tp, lab.sum()),
        "replaced_fraction": ratio(lab.sum(), w.sum()),
    }


class Objective(nn.Module):
    """Turns a batch and the networks it is given into a loss and metrics. Subclasses are one small file each.

    Class attributes say what the objective needs, so the training system never branches on its name:
    `needs_generator`, the heads of the network that gets pre-trained and then fine-tuned, what its step
    costs (`flops`: the heads that run, in the paper's FLOPs accounting), whether it has a discriminator loss
    that `weighting` balances against the generator's (`weighted`), whether it is replaced token detection
    (`detects_replacements`), its place in the paper, and the checks of its own settings (`config_problems`).
    Its name is its config option (common/variants.py).
    Subclasses define `forward(batch: Batch, nets: Networks) -> ObjectiveOutput`.
    """

    display_name: ClassVar[str]
    paper: ClassVar[str]
    needs_generator: ClassVar[bool] = False
    model_heads: ClassVar[dict[str, bool]] = {"mlm_head": True}
    flops: ClassVar[Heads]
    weighted: ClassVar[bool] = False
    # A discriminator trained on the generator's samples (replaced token detection, `corrupt` + `disc_weights`
    # + `disc_weight`): what the algorithms with their own optimizers (algorithms/) build on.
    detects_replacements: ClassVar[bool] = False

    @classmethod
    def config_problems(cls, cfg: DictConfig) -> list[str]:
        """What makes `cfg` impossible for this objective, each with the key and the fix (empty when fine).
        Subclasses add the checks of their own settings to these."""
        obj, out = cfg.objective, []
        if "mask_prob" in obj:
            need(out, is_number(obj.mask_prob) and 0 < obj.mask_prob < 1, "objective.mask_prob", obj.mask_prob,
                 "must be in (0, 1) (the paper masks 0.15)")
        probs = [k for k in ("mask_token_prob", "random_token_prob") if k in obj]
        for key in probs:
            need(out, is_number(obj[key]) and 0 <= obj[key] <= 1, f"objective.{key}", obj[key],
                 "must be a probability in [0, 1]")
        if len(probs) == 2 and all(is_number(obj[k]) for k in probs) and obj.mask_token_prob + obj.random_token_prob > 1:
            out.append(f"objective.mask_token_prob + objective.random_token_prob = "
                       f"{obj.mask_token_prob + obj.random_token_prob} must be <= 1 (BERT: 0.8 + 0.1)")
        if "max_predictions_per_seq" in obj:
            cap = obj.max_predictions_per_seq
            need(out, cap is None or (is_integer(cap) and cap > 0), "objective.max_predictions_per_seq", cap,
                 "must be a positive integer, or null for the reference's int((mask_prob + 0.005) x max_seq_length)")
        if "position_sampling" in obj:
            need(out, obj.position_sampling in slots.SAMPLING, "objective.position_sampling", obj.position_sampling,
                 f"must be one of {', '.join(slots.SAMPLING)} (without_replacement: distinct positions; reference: "
                 "draws with replacement as pretrain_helpers.mask)")
        if get_class(cfg.weighting._target_).learned and not cls.weighted:
            out.append(f"weighting={cfg.weighting.name} learns the weight of a discriminator loss against the "
                       f"generator's, which objective={cfg.objective.name} does not have; use objective=electra or "
                       "electra_15, or weighting=fixed")
        return out

    def __init__(
        self,
        name: str,
        special: SpecialIds,
        vocab_size: int,
        mask_prob: float = 0.15,
        mask_token_prob: float = 0.85,
        random_token_prob: float = 0.0,
        sampler: str = "gumbel",
        *,
        max_predictions_per_seq: int | None = None,
        position_sampling: str = "without_replacement",
    ):
        super().__init__()
        assert 0 < mask_prob < 1, f"mask_prob={mask_prob} must be in (0, 1)"
        assert 0 <= mask_token_prob + random_token_prob <= 1, "mask_token_prob + random_token_prob must be <= 1"
        assert max_predictions_per_seq is None or max_predictions_per_seq >= 1, "max_predictions_per_seq must be >= 1"
        assert position_sampling in slots.SAMPLING, f"position_sampling={position_sampling!r}; valid: {slots.SAMPLING}"
        self.name = name
        self.special = special
        self.vocab_size = vocab_size
        self.mask_prob = mask_prob
        self.mask_token_prob = mask_token_prob
        self.random_token_prob = random_token_prob
        # gumbel, the reference's, when built by hand; a run passes runtime.sampler (inverse_cdf by default:
        # the same distribution from fewer random numbers), which is a speed setting outside the identity.
        self.sampler = sampler
        self.max_predictions_per_seq = max_predictions_per_seq
        self.position_sampling = position_sampling

    def mask(self, batch: Batch) -> Masked:
        return mask_tokens(
            batch.input_ids, self.special, self.vocab_size, self.mask_prob, self.mask_token_prob, self.random_token_prob,
            self.max_predictions_per_seq, self.position_sampling,
        )

    def slot_logits(self, head, hidden: torch.Tensor, masked: Masked) -> torch.Tensor:
        """(B x N, V) logits of `head` at the prediction slots of (B, T, H) `hidden`."""
        return head(slots.flat(slots.gather(hidden, masked.positions.index)))


class Fake(NamedTuple):
    """A batch corrupted by the generator (paper section 2, x^corrupt)."""

    masked: Masked  # the generator's input and the selected positions
    gen_loss: torch.Tensor | None  # generator MLM loss at the selected positions (None: nothing to train)
    gen_correct: torch.Tensor  # (B x N,) bool, generator argmax == original, per slot (used or not)
    sampled: torch.Tensor  # (B x N,) sampled ids per slot, row-major; `masked.positions.weights` says which count
    input_ids: torch.Tensor  # (B, T) the selected positions filled with samples
    replaced: torch.Tensor  # (B, T) bool, 1 only where the sample differs from the original


class GeneratorObjective(Objective):
    """An objective whose corrupted input comes from a generator: electra, electra_15, replace_mlm, all_tokens_mlm."""

    needs_generator = True

    @classmethod
    def config_problems(cls, cfg: DictConfig) -> list[str]:
        obj, out = cfg.objective, super().config_problems(cfg)
        if "disallow_correct" in obj:
            need(out, isinstance(obj.disallow_correct, bool), "objective.disallow_correct", obj.disallow_correct,
                 "must be true or false (the reference: false)")
        if "temperature" in obj:
            need(out, is_number(obj.temperature) and obj.temperature > 0, "objective.temperature", obj.temperature,
                 "must be a positive number (1.0 samples the generator as is)")
        if "gen_weight" in obj:
            need(out, is_number(obj.gen_weight) and obj.gen_weight >= 0, "objective.gen_weight", obj.gen_weight,
                 "must be a finite number >= 0 (the paper: gen_weight 1, disc_weight 50)")
        return out

    def __init__(self, *masking, temperature: float = 1.0, gen_weight: float = 1.0, disallow_correct: bool = False,
                 **masking_by_name):
        # The masking arguments (name, special, vocab_size, mask_prob, ...) are Objective's, defined there once.
        super().__init__(*masking, **masking_by_name)
        assert temperature > 0, f"temperature={temperature} must be > 0"
        self.temperature = temperature
        self.gen_weight = gen_weight
        self.disallow_correct = disallow_correct

    def corrupt(self, batch: Batch, generator: nn.Module) -> Fake:
        masked = self.mask(batch)
        targets = slots.flat(masked.targets)  # (B x N,)
        weights = slots.flat(masked.positions.weights)
        # (B x N, V): the generator predicts at every slot; unused slots carry weight 0.
        logits = fp32_scores(generator.masked_logits(masked.input_ids, batch.attention_mask, batch.token_type_ids,
                                                     masked.positions.index))
        gen_loss = mlm_loss(logits, targets, weights) if generator.trainable else None
        # Samples carry no gradient: the generator is trained by MLM only (paper section 2).
        disallow = targets if self.disallow_correct else None
        scores = logits.detach()
        sampled = sample_tokens(scores, self.temperature, self.sampler, disallow)
        fake_ids = slots.scatter(batch.input_ids, masked.positions, sampled.view_as(masked.targets))
        # A sample equal to the original is labelled original (paper section 2; reference `_get_fake_data`).
        replaced = fake_ids != batch.input_ids
        return Fake(masked, gen_loss, scores.argmax(-1) == targets, sampled, fake_ids, replaced)

    def generator_sums(self, fake: Fake, batch: Batch) -> dict[str, torch.Tensor]:
        weights = slots.flat(fake.masked.positions.weights)
        targets = slots.flat(fake.masked.targets)
        n = weights.sum()
        inputs = slots.flat(slots.gather(fake.masked.input_ids, fake.masked.positions.index))  # what the generator saw
        # Reference metric_fn: `masked_lm_accuracy` of the generator's argmax, `sampled_masked_lm_accuracy` of its
        # sample, both over the masked_lm_weights; the split by input is this project's (copying vs learning).
        return {
            "masked_lm_accuracy": ratio((fake.gen_correct & weights).sum(), n),
            **copy_split_sums(fake.gen_correct, inputs, targets, weights, self.special, self.mask_token_prob,
                              self.random_token_prob),
            "sampled_masked_lm_accuracy": ratio(((fake.sampled == targets) & weights).sum(), n),
        }
