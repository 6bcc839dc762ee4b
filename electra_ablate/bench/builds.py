"""The two networks the benchmark times, built from the real configs: ours as pre-training builds it, and the
reference written around transformers' ELECTRA classes; the real batches both see.

Ours is the `electra` objective built by `training.build.build_networks` plus the configured algorithm's `PretrainSystem`,
stepped as Lightning steps it. The reference: `ElectraForPreTraining` + `ElectraForMaskedLM` with tied embeddings,
SDPA attention, dropout 0.1, MLM logits at every position, Gumbel-max sampling over all positions (the reference
implementation's `sample_from_softmax`), the same Adam update as ours (optim.bias_correction: torch's AdamW by
default, the reference's without bias correction when false), parameter groups, schedule and clipping. The reference
is the paper's ELECTRA only (`reference_problems` says what else it cannot be); probes/curve.py trains both side by
side."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig

from electra_ablate.bench.settings import CONF_DIR, REPO, BenchError, Settings
from electra_ablate.common import precision as precision_lib
from electra_ablate.common.tokens import SpecialIds
from electra_ablate.data.module import PretrainDataModule
from electra_ablate.hf.convert import electra_config, to_transformers_state_dict
from electra_ablate.models import fast
from electra_ablate.models.encoder import ElectraForPretraining, EncoderConfig, Networks
from electra_ablate.objectives import positions as slots
from electra_ablate.objectives.base import Batch, Masked
from electra_ablate.objectives.electra import Electra
from electra_ablate.optim.adam import adam_over_parameters
from electra_ablate.optim.groups import unique_parameters
from electra_ablate.optim.schedule import linear_warmup_decay
from electra_ablate.sharing.embeddings import EmbeddingSharing
from electra_ablate.training import build, checks
from electra_ablate.training.system import PretrainSystem


def compose_config(s: Settings, model: str, *extra: str, batch_size: int | None = None,
                   keep_shape: bool = False) -> DictConfig:
    """The real pre-training config (conf/pretrain.yaml) for one benchmark configuration; `keep_shape`: the batch
    and sequence length of the config (an `experiment=` in `extra`), not the bench's --batch-size / --seq-len."""
    shape = [] if keep_shape else [f"data.batch_size={batch_size or s.batch_size}", f"data.max_seq_length={s.seq_len}"]
    overrides = [
        f"model={model}",
        *shape,
        "runtime.num_workers=0",
        "runtime.compile=false",  # compiled separately, with its compile time measured
        f"paths.root_dir={REPO}",
        f"paths.data_dir={s.data_dir}",
        f"paths.cache_dir={s.cache_dir}",
        f"paths.output_dir={tempfile.gettempdir()}/electra_ablate_bench",
        "trainer.max_steps=1000000",
        *s.overrides,
        *extra,
    ]
    return compose_pretrain(overrides)


def compose_pretrain(overrides: Sequence[str]) -> DictConfig:
    """conf/pretrain.yaml with `overrides` (later ones win), checked as pre-training checks it (training/checks.py)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("pretrain", overrides=list(overrides))
    checks.validate(cfg)
    return cfg


def autocast(cfg: DictConfig, device: torch.device):
    """Lightning's precision for this config, as a context: fp32 (CPU default) or bf16 autocast (GPU default)."""
    precision = precision_lib.resolve(cfg.runtime.precision, device.type)  # as pre-training resolves it
    try:
        return precision_lib.autocast(precision, device.type)
    except ValueError:
        raise BenchError(f"runtime.precision={precision} is not benchmarked; use 32-true or bf16-mixed") from None


# ------------------------------------------------------------------------------------------- data


class Data(NamedTuple):
    dm: PretrainDataModule
    special: SpecialIds
    batches: list[dict[str, torch.Tensor]]  # on the device


def load_data(cfg: DictConfig, device: torch.device, n_batches: int, num_workers: int = 0) -> Data:
    """The pre-training data module as training/build.py configures it, and its first `n_batches` real batches."""
    dm = instantiate(cfg.data, cache_dir=cfg.paths.cache_dir, seed=cfg.seed, num_workers=num_workers,
                     pin_memory=device.type == "cuda", fixed_length=fast.static_shapes(cfg.runtime))
    dm.prepare()
    batches = []
    for b in dm.train_dataloader():
        batches.append({k: v.to(device, non_blocking=True) for k, v in b.items()})
        if len(batches) == n_batches:
            break
    return Data(dm, dm.special, batches)


def tokens(batch: dict[str, torch.Tensor]) -> int:
    return batch["input_ids"].numel()  # padded B x T, as train/tokens_per_s counts them


# ------------------------------------------------------------------------------------------- runners


@dataclass(frozen=True)
class FastPath:
    """The speed-only choices of our step; every field can be switched off for the piece-by-piece table."""

    masked_only_logits: bool = True  # the generator's MLM head runs only at the masked positions
    sampler: str = "inverse_cdf"  # one uniform per masked position (gumbel: one per vocabulary entry)
    hidden_dropout: bool = True  # fast dropout masks on the hidden states (CPU)
    attention_dropout: bool = True  # attention with fast dropout masks (CPU); else torch SDPA's own
    fused_adam: bool = False
    compile: bool = False
    cpu_attention: str = "math"  # without dropout: attention written out on CPU, or torch's fused SDPA ("sdpa")
    capture: str | None = None  # runtime.compile=step: the torch.compile mode of the captured step (None: eager)

    @classmethod
    def from_runtime(cls, cfg: DictConfig, device: torch.device) -> FastPath:
        fused = cfg.runtime.fused_adam
        return cls(
            sampler=str(cfg.runtime.sampler),
            hidden_dropout=bool(cfg.runtime.fast_dropout),
            attention_dropout=bool(cfg.runtime.fast_dropout),
            # auto: as PretrainSystem resolves fused_adam=None (torch's fused kernel on CUDA)
            fused_adam=device.type == "cuda" if fused == "auto" else bool(fused),
            cpu_attention=str(cfg.runtime.cpu_attention),
            capture=fast.compile_mode(cfg.runtime, device.type) if fast.compile_scope(cfg.runtime) == "step" else None,
        )


def encoder_configs(cfg: DictConfig, data: Data) -> tuple[EncoderConfig, EncoderConfig | None]:
    """The discriminator's and the neural generator's sizes, as `training.build.build_networks` derives them."""
    disc = EncoderConfig(vocab_size=data.dm.vocab_size, pad_token_id=data.special.pad,
                         **{k: cfg.model[k] for k in checks.MODEL_KEYS})
    gen = cfg.generator
    return disc, get_class(gen._target_).network_config(disc, gen)


def all_positions_logits(generator: ElectraForPretraining) -> None:
    """Make a neural generator compute its MLM logits at every position and then select (fast path off)."""

    def masked_logits(input_ids, attention_mask, token_type_ids, positions):
        hidden = generator(input_ids, attention_mask, token_type_ids)  # (B, T, H)
        return slots.flat(slots.gather(generator.mlm_logits(hidden), positions))  # (B, T, V) -> (B x N, V)

    generator.masked_logits = masked_logits


class OursRunner:
    """One training step of this harness, as Lightning's automatic optimisation runs it."""

    label = "this harness"

    def __init__(self, cfg: DictConfig, data: Data, device: torch.device, fp: FastPath):
        self.cfg, self.device, self.fp = cfg, device, fp
        model, generator, objective = build.build_networks(cfg, data.dm, data.special)
        for net in (model, generator):
            if isinstance(net, torch.nn.Module):
                fast.set_fast_dropout(net, fp.hidden_dropout, fp.attention_dropout, fp.cpu_attention)
        objective.sampler = fp.sampler
        if not fp.masked_only_logits and isinstance(generator, ElectraForPretraining):
            all_positions_logits(generator)
        self.system = instantiate(
            cfg.algorithm, model=model, generator=generator, objective=objective, lr=cfg.optim.lr,
            betas=list(cfg.optim.betas), eps=cfg.optim.eps, weight_decay=cfg.optim.weight_decay,
            warmup_steps=cfg.optim.warmup_steps, max_grad_norm=cfg.optim.max_grad_norm,
            max_steps=cfg.trainer.max_steps, log_every_n_steps=cfg.logger.log_every_n_steps,
            fused_adam=fp.fused_adam, bias_correction=cfg.optim.bias_correction, _recursive_=False,
        ).to(device)
        self.system.train()
        if fp.compile:
            for net in (self.system.model, self.system.generator):
                if isinstance(net, torch.nn.Module):
                    net.compile()  # in place: parameter names and state-dict keys unchanged
        if fp.capture is not None:
            self.system.compile_step(fp.capture)  # as training/build.py does for runtime.compile=step
        conf = self.system.configure_optimizers()
        self.optimizer, self.scheduler = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.autocast = lambda: autocast(cfg, device)
        self.calls = 0

    @property
    def nets(self) -> Networks:
        return self.system.nets

    def step(self, micro_batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        k = len(micro_batches)
        for b in micro_batches:
            with self.autocast():
                loss = self.system.training_step(b, self.calls)
            (loss / k).backward()  # Lightning divides by accumulate_grad_batches
            self.calls += 1
        torch.nn.utils.clip_grad_norm_(self.params, self.cfg.optim.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()


def _hf_config(config: EncoderConfig):
    hf = electra_config(config)
    hf._attn_implementation = "sdpa"
    return hf


def reference_problems(cfg: DictConfig) -> list[str]:
    """What the transformers reference cannot be in `cfg`, each with its key and the fix (empty when fine). It is
    the paper's ELECTRA: post-LayerNorm blocks with biases, replaced token detection over every token, a neural
    generator sharing the discriminator's embeddings, one loss with fixed weights, one optimizer."""
    m, obj, out = cfg.model, cfg.objective, []
    if m.layer_norm != "post":
        out.append(f"model.layer_norm={m.layer_norm}: transformers' ELECTRA classes have only the paper's "
                   "post-LayerNorm blocks, so the reference cannot be built; use model.layer_norm=post")
    if m.linear_bias is not True:
        out.append(f"model.linear_bias={str(m.linear_bias).lower()}: transformers' ELECTRA classes always have "
                   "linear biases (the paper's layout), so the reference cannot be built; use model.linear_bias=true")
    wants = (  # (group, the reference can be it, what the reference has, the paper's option)
        ("objective", get_class(obj._target_) is Electra, "replaced token detection over every token", "electra"),
        ("generator", get_class(cfg.generator._target_).neural, "a Transformer generator", "neural"),
        ("sharing", get_class(cfg.sharing._target_) is EmbeddingSharing, "shared embeddings", "embeddings"),
        ("weighting", not get_class(cfg.weighting._target_).learned, "fixed loss weights", "fixed"),
        ("algorithm", get_class(cfg.algorithm._target_) is PretrainSystem, "one optimizer for both networks", "joint"),
    )
    for group, ok, has, paper in wants:
        if not ok:
            cls = get_class(cfg[group]._target_)
            name = cfg[group].get("name") or getattr(cls, "label", cls.__name__)
            out.append(f"{group}={name}: the transformers reference is the paper's ELECTRA, with {has}; "
                       f"use {group}={paper}")
    if obj.get("disallow_correct", False):
        out.append("objective.disallow_correct=true: the reference samples the generator as it is; use "
                   "objective.disallow_correct=false (the reference's)")
    return out


class RefOutput(NamedTuple):
    """One batch through the reference (all but `loss` detached)."""

    loss: torch.Tensor  # gen_weight x MLM + disc_weight x disc
    mlm_loss: torch.Tensor  # mean cross-entropy at the selected positions
    gen_logits: torch.Tensor  # (B, T, V)
    disc_loss: torch.Tensor  # mean sigmoid cross-entropy over the non-pad tokens
    disc_logits: torch.Tensor  # (B, T)
    replaced: torch.Tensor  # (B, T) bool: the sample differs from the original


class TransformersRunner:
    """The reference: a pre-training step written around transformers' ELECTRA classes."""

    label = "transformers"

    def __init__(self, cfg: DictConfig, data: Data, device: torch.device, fused_adam: bool):
        import transformers

        problems = reference_problems(cfg)
        if problems:
            raise BenchError("; ".join(problems))
        self.cfg, self.device = cfg, device
        disc_cfg, gen_cfg = encoder_configs(cfg, data)
        # The objective's masking and loss-weight settings (the same config group our step uses).
        self.objective = instantiate(cfg.objective, special=data.special, vocab_size=data.dm.vocab_size)
        self.disc = transformers.ElectraForPreTraining(_hf_config(disc_cfg)).to(device)
        self.gen = transformers.ElectraForMaskedLM(_hf_config(gen_cfg)).to(device)
        # Embedding sharing (paper section 3.2) and the tied output layer, as our build does.
        self.gen.electra.embeddings = self.disc.electra.embeddings
        self.gen.generator_lm_head.weight = self.disc.electra.embeddings.word_embeddings.weight
        self.disc.train()
        self.gen.train()
        named = unique_parameters([self.disc, self.gen])
        o = cfg.optim
        self.optimizer = adam_over_parameters(named, o.lr, tuple(o.betas), o.eps, o.weight_decay, fused=fused_adam,
                                              bias_correction=o.bias_correction)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, linear_warmup_decay(o.warmup_steps, cfg.trainer.max_steps)
        )
        self.params = [p for _, p in named]
        self.autocast = lambda: autocast(cfg, device)

    def load_from(self, ours: OursRunner) -> None:
        """Copy our weights key by key (hf.to_transformers_state_dict); only index buffers may be missing."""
        for hf_net, net, head in ((self.disc, ours.nets.model, "disc"), (self.gen, ours.nets.generator, "mlm")):
            missing, unexpected = hf_net.load_state_dict(to_transformers_state_dict(net, head), strict=False)
            missing = [k for k in missing if not k.endswith(("position_ids", "token_type_ids"))]
            if missing or unexpected:
                raise BenchError(f"weights do not map key by key: missing {missing}, unexpected {unexpected}")

    def losses(self, batch: dict[str, torch.Tensor], masked_ids, labels, fake_ids, replaced):
        """(gen MLM loss, disc loss, total) of the reference on a given corrupted batch."""
        am, tt = batch["attention_mask"], batch["token_type_ids"]
        gen_out = self.gen(input_ids=masked_ids, attention_mask=am, token_type_ids=tt, labels=labels)
        disc_out = self.disc(input_ids=fake_ids, attention_mask=am, token_type_ids=tt, labels=replaced.long())
        o = self.objective
        return gen_out, disc_out, o.gen_weight * gen_out.loss + o.disc_weight * disc_out.loss

    def forward(self, batch: dict[str, torch.Tensor], m: Masked) -> RefOutput:
        """Generator on the masked batch, its samples at the selected positions, discriminator on the result."""
        ids, am, tt = batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
        o = self.objective
        gen_out = self.gen(input_ids=m.input_ids, attention_mask=am, token_type_ids=tt, labels=m.labels)
        with torch.no_grad():  # Gumbel-max over all B x T positions (reference sample_from_softmax)
            logits = gen_out.logits.float() / o.temperature  # (B, T, V)
            u = torch.rand_like(logits)
            sampled = torch.argmax(logits - torch.log(-torch.log(u + 1e-9) + 1e-9), dim=-1)
        fake = torch.where(m.selected, sampled, ids)
        replaced = fake != ids  # a sample equal to the original is labelled original
        disc_out = self.disc(input_ids=fake, attention_mask=am, token_type_ids=tt, labels=replaced.long())
        loss = o.gen_weight * gen_out.loss + o.disc_weight * disc_out.loss
        return RefOutput(loss, gen_out.loss.detach(), gen_out.logits.detach(), disc_out.loss.detach(),
                         disc_out.logits.detach(), replaced)

    def step(self, micro_batches: list[dict[str, torch.Tensor]],
             masks: Sequence[Masked] | None = None) -> list[RefOutput]:
        """One optimizer step; each micro-batch masked by the objective's `mask` unless `masks` gives its mask.
        Returns each micro-batch's outputs, detached."""
        k = len(micro_batches)
        outs = []
        for i, b in enumerate(micro_batches):
            with self.autocast():
                m = masks[i] if masks is not None else self.objective.mask(Batch(**b))
                out = self.forward(b, m)
            (out.loss / k).backward()
            outs.append(out._replace(loss=out.loss.detach()))
        torch.nn.utils.clip_grad_norm_(self.params, self.cfg.optim.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return outs
