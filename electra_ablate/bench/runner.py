"""Pre-training speed: this harness against a Hugging Face transformers script, and the fast path piece by piece.

`python -m electra_ablate.bench` writes reports/benchmarks.md. The reference is what a researcher
would write around transformers: `ElectraForPreTraining` + `ElectraForMaskedLM` with tied embeddings, SDPA
attention, dropout 0.1, MLM logits at every position (as `ElectraForMaskedLM` computes them), Gumbel-max
sampling over all positions (the reference implementation's `sample_from_softmax`), AdamW with the same
parameter groups, schedule and gradient clipping. Ours is the `electra` objective built exactly as
`training/build.py` builds it (`build_networks` + the configured algorithm's `PretrainSystem`), stepped as Lightning
steps it (training_step, backward, clip, optimizer and scheduler step). Both see the same real batches of the
Wikipedia sample, interleaved A B A B after warm-up; the report gives medians and their ratio.

Also measured in the same run: the fp32 matmul peak at the model's shapes (for the share of peak), FLOPs per
step (paper accounting, `electra_ablate.flops`, and the FLOPs actually executed, counted by
`torch.utils.flop_counter`), peak memory (a fresh process per configuration), an equal-work check (identical
weights and corrupted batch must give the same losses and gradients), each fast-path piece on/off,
`torch.compile`, BERT vs ELECTRA step time, fine-tuning examples/s, the data loader alone, the operations
in a training step that would make a CUDA device synchronise with the host, and a cold corpus build (word
pieces/s of `data=text_files`, section `build`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from electra_ablate.training import build, checks
from electra_ablate.models import fast
from electra_ablate.common import precision as precision_lib
from electra_ablate.data.module import PretrainDataModule
from electra_ablate.models.flops import pretrain_flops_per_step
from electra_ablate.hf.convert import electra_config, to_transformers_state_dict
from electra_ablate.models.encoder import ElectraForPretraining, ElectraModel, EncoderConfig, Networks
from electra_ablate.common.tokens import SpecialIds
from electra_ablate.objectives.base import Batch, mask_tokens
from electra_ablate.training.optim import adamw, linear_warmup_decay, unique_parameters

REPO = Path(__file__).resolve().parents[2]
CONF_DIR = REPO / "conf"
DEFAULT_OUT = REPO / "reports" / "benchmarks.md"
NO_GPU_NOTE = "no GPU was available in this session"
PROBE_TAG = "BENCH_MEMORY_PROBE "

# The speed targets: speed-up over the transformers reference (tokens/s) and share of the measured matmul peak.
TARGETS = {"tiny": (3.0, None), "small": (2.0, 0.5)}


class BenchError(ValueError):
    pass


# ------------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    models: tuple[str, ...]
    device: torch.device
    batch_size: int
    seq_len: int
    warmup: int
    reps: int
    piece_reps: int
    threads: int
    data_dir: Path
    cache_dir: Path
    overrides: tuple[str, ...]
    sections: tuple[str, ...]
    quick: bool
    compile_models: tuple[str, ...]
    accumulate: int
    command: str
    precisions: tuple[str, ...] = (precision_lib.FP32,)
    build_paths: tuple[str, ...] = ()
    build_workers: int = 0
    build_max_docs: int | None = None


# The precisions the benchmark knows how to run (as Lightning names them; `autocast` below).
PRECISIONS = (precision_lib.FP32, precision_lib.BF16)


def default_precisions(device_type: str) -> tuple[str, ...]:
    """bf16-mixed on CUDA; fp32 and bf16-mixed on a CPU with native bf16 (to show both); else fp32 only."""
    if device_type == "cuda":
        return (precision_lib.BF16,)
    return PRECISIONS if precision_lib.cpu_has_fast_bf16() else (precision_lib.FP32,)


SECTIONS = ("pretrain", "equal", "shapes", "pieces", "compile", "bert", "finetune", "data", "memory", "sync", "build")
# Batch sizes and sequence lengths of the shapes section (the tiny model's step at the sizes a CPU run would pick).
SHAPES = ((32, 64), (128, 64), (32, 128), (128, 128))


def default_data_dir() -> Path:
    return Path(os.environ.get("ELECTRA_ABLATE_DATA", REPO.parent / "shared" / "data")).resolve()


def compose_config(s: Settings, model: str, *extra: str, batch_size: int | None = None) -> DictConfig:
    """The real pre-training config (conf/pretrain.yaml) for one benchmark configuration."""
    overrides = [
        f"model={model}",
        f"data.batch_size={batch_size or s.batch_size}",
        f"data.max_seq_length={s.seq_len}",
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
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("pretrain", overrides=overrides)
    checks.validate(cfg)
    return cfg


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(cfg: DictConfig, device: torch.device):
    """Lightning's precision for this config, as a context: fp32 (CPU default) or bf16 autocast (GPU default)."""
    precision = precision_lib.resolve(cfg.runtime.precision, device.type)  # as pre-training resolves it
    if precision in ("32-true", "32"):
        return contextlib.nullcontext()
    if precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    raise BenchError(f"runtime.precision={precision} is not benchmarked; use 32-true or bf16-mixed")


# ------------------------------------------------------------------------------------------- data


class Data(NamedTuple):
    dm: PretrainDataModule
    special: SpecialIds
    batches: list[dict[str, torch.Tensor]]  # on the device


def load_data(cfg: DictConfig, device: torch.device, n_batches: int, num_workers: int = 0) -> Data:
    """The pre-training data module as training/build.py configures it, and its first `n_batches` real batches."""
    dm = instantiate(cfg.data, cache_dir=cfg.paths.cache_dir, seed=cfg.seed, num_workers=num_workers,
                     pin_memory=device.type == "cuda")
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

    @classmethod
    def from_runtime(cls, cfg: DictConfig, device: torch.device) -> FastPath:
        fused = cfg.runtime.fused_adam
        return cls(
            sampler=str(cfg.runtime.sampler),
            hidden_dropout=bool(cfg.runtime.fast_dropout),
            attention_dropout=bool(cfg.runtime.fast_dropout),
            # auto: as PretrainSystem resolves fused_adam=None (torch's fused kernel on CUDA)
            fused_adam=device.type == "cuda" if fused == "auto" else bool(fused),
        )


def encoder_configs(cfg: DictConfig, data: Data) -> tuple[EncoderConfig, EncoderConfig | None]:
    """The discriminator's and the neural generator's sizes, as `training.build.build_networks` derives them."""
    disc = EncoderConfig(vocab_size=data.dm.vocab_size, pad_token_id=data.special.pad,
                         **{k: cfg.model[k] for k in checks.MODEL_KEYS})
    gen = cfg.generator
    return disc, get_class(gen._target_).network_config(disc, gen)


def all_positions_logits(generator: ElectraForPretraining) -> None:
    """Make a neural generator compute its MLM logits at every position and then select (fast path off)."""

    def masked_logits(input_ids, attention_mask, token_type_ids, selected):
        hidden = generator(input_ids, attention_mask, token_type_ids)  # (B, T, H)
        return generator.mlm_logits(hidden)[selected]  # (B, T, V) -> (N, V)

    generator.masked_logits = masked_logits


class OursRunner:
    """One training step of this harness, as Lightning's automatic optimisation runs it."""

    label = "this harness"

    def __init__(self, cfg: DictConfig, data: Data, device: torch.device, fp: FastPath):
        self.cfg, self.device, self.fp = cfg, device, fp
        model, generator, objective = build.build_networks(cfg, data.dm, data.special)
        for net in (model, generator):
            if isinstance(net, torch.nn.Module):
                fast.set_fast_dropout(net, fp.hidden_dropout, fp.attention_dropout)
        objective.sampler = fp.sampler
        if not fp.masked_only_logits and isinstance(generator, ElectraForPretraining):
            all_positions_logits(generator)
        self.system = instantiate(
            cfg.algorithm, model=model, generator=generator, objective=objective, lr=cfg.optim.lr,
            betas=list(cfg.optim.betas), eps=cfg.optim.eps, weight_decay=cfg.optim.weight_decay,
            warmup_steps=cfg.optim.warmup_steps, max_grad_norm=cfg.optim.max_grad_norm,
            max_steps=cfg.trainer.max_steps, log_every_n_steps=cfg.logger.log_every_n_steps,
            fused_adam=fp.fused_adam, _recursive_=False,
        ).to(device)
        self.system.train()
        if fp.compile:
            for net in (self.system.model, self.system.generator):
                if isinstance(net, torch.nn.Module):
                    net.compile()  # in place: parameter names and state-dict keys unchanged
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


class TransformersRunner:
    """The reference: a pre-training step written around transformers' ELECTRA classes."""

    label = "transformers"

    def __init__(self, cfg: DictConfig, data: Data, device: torch.device, fused_adam: bool):
        import transformers

        self.cfg, self.device = cfg, device
        disc_cfg, gen_cfg = encoder_configs(cfg, data)
        if gen_cfg is None:
            raise BenchError("the transformers reference needs a neural generator (generator=neural)")
        # The objective's masking and loss-weight settings (the same config group our step uses).
        self.objective = instantiate(cfg.objective, special=data.special, vocab_size=data.dm.vocab_size)
        self.special, self.vocab_size = data.special, data.dm.vocab_size
        self.disc = transformers.ElectraForPreTraining(_hf_config(disc_cfg)).to(device)
        self.gen = transformers.ElectraForMaskedLM(_hf_config(gen_cfg)).to(device)
        # Embedding sharing (paper section 3.2) and the tied output layer, as our build does.
        self.gen.electra.embeddings = self.disc.electra.embeddings
        self.gen.generator_lm_head.weight = self.disc.electra.embeddings.word_embeddings.weight
        self.disc.train()
        self.gen.train()
        named = unique_parameters([self.disc, self.gen])
        o = cfg.optim
        self.optimizer = adamw(named, o.lr, tuple(o.betas), o.eps, o.weight_decay, fused=fused_adam)
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

    def step(self, micro_batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        k = len(micro_batches)
        o = self.objective
        for b in micro_batches:
            ids = b["input_ids"]
            with self.autocast():
                m = mask_tokens(ids, self.special, self.vocab_size, o.mask_prob, o.mask_token_prob, o.random_token_prob)
                am, tt = b["attention_mask"], b["token_type_ids"]
                gen_out = self.gen(input_ids=m.input_ids, attention_mask=am, token_type_ids=tt, labels=m.labels)
                with torch.no_grad():  # Gumbel-max over all B x T positions (reference sample_from_softmax)
                    logits = gen_out.logits.float() / o.temperature  # (B, T, V)
                    u = torch.rand_like(logits)
                    sampled = torch.argmax(logits - torch.log(-torch.log(u + 1e-9) + 1e-9), dim=-1)
                fake = torch.where(m.selected, sampled, ids)
                disc_out = self.disc(input_ids=fake, attention_mask=am, token_type_ids=tt, labels=(fake != ids).long())
                loss = o.gen_weight * gen_out.loss + o.disc_weight * disc_out.loss
            (loss / k).backward()
        torch.nn.utils.clip_grad_norm_(self.params, self.cfg.optim.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()


# ------------------------------------------------------------------------------------------- measuring


def interleaved(
    steps: dict[str, Callable[[int], object]], n_batches: int, warmup: int, reps: int, device: torch.device
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds per step of each callable, run A B A B ...; returns (timed, warm-up) lists per name.

    Each callable gets the index of the batch to use; every implementation sees the same batch in a round.
    """
    timed: dict[str, list[float]] = {k: [] for k in steps}
    warm: dict[str, list[float]] = {k: [] for k in steps}
    for r in range(warmup + reps):
        for name, f in steps.items():
            sync(device)
            t0 = time.perf_counter()
            f(r % n_batches)
            sync(device)
            (warm if r < warmup else timed)[name].append(time.perf_counter() - t0)
    return timed, warm


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def matmul_peak(shapes: list[tuple[int, int, int]], device: torch.device, reps: int,
                dtype: torch.dtype = torch.float32) -> dict[tuple[int, int, int], float]:
    """Best matmul FLOP/s in `dtype` over `reps` runs for each (m, k, n): the machine's practical peak at these
    shapes (bf16 for bf16-mixed rows: autocast runs the step's matmuls in bf16)."""
    out = {}
    for m, k, n in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        torch.mm(a, b)
        best = math.inf
        for _ in range(reps):
            sync(device)
            t0 = time.perf_counter()
            torch.mm(a, b)
            sync(device)
            best = min(best, time.perf_counter() - t0)
        out[(m, k, n)] = 2 * m * k * n / best
    return out


def model_shapes(cfg: DictConfig, tokens_per_step: int, vocab: int) -> list[tuple[int, int, int]]:
    """The matmul shapes of a step: projections and FFN of both networks, and the masked vocabulary projection."""
    m = cfg.model
    h, i, e = m.hidden_size, m.intermediate_size, m.embedding_size
    g = max(1, round(h * cfg.generator.get("hidden_size", 1.0)))
    shapes = {(tokens_per_step, h, h), (tokens_per_step, h, i), (tokens_per_step, i, h), (tokens_per_step, e, h),
              (tokens_per_step, g, 4 * g), (round(tokens_per_step * 0.15), e, vocab)}
    return sorted(shapes)


def executed_flops(step: Callable[[], object]) -> float:
    """FLOPs one step executes (matrix multiplies and attention, forward and backward), counted by torch."""
    with FlopCounterMode(display=False) as counter:
        step()
    return float(counter.get_total_flops())


def paper_flops(runner: OursRunner, cfg: DictConfig, batch_size: int, seq_len: int) -> float:
    gen = runner.nets.generator
    gen_cfg = gen.config if isinstance(gen, ElectraForPretraining) else None
    return pretrain_flops_per_step(runner.nets.model.config, gen_cfg, get_class(cfg.objective._target_).flops, batch_size, seq_len)


# --- host-device synchronisation ---------------------------------------------------------------------

_SYNC_OPS = {
    "aten::_local_scalar_dense": "reads a value on the host (.item(), bool(), float())",
    "aten::nonzero": "output size depends on the data",
    "aten::masked_select": "output size depends on the data",
    "aten::_unique2": "output size depends on the data",
    "aten::unique_consecutive": "output size depends on the data",
    "aten::repeat_interleave": "output size depends on the data",
}
# Host reads that a CPU run sees but a CUDA run does not make (or makes on host tensors): call-site marker -> why.
_HOST_ONLY = {
    'device.type == "cpu"': "no: a CPU-only branch",
    "torchmetrics/utilities/compute.py": "no: torchmetrics takes a sync-free torch.where branch off the CPU",
    "torch/optim/": "no: the for-loop optimizer keeps its step counters on the host; fused AdamW (CUDA default) has none",
}


class SyncFinder(TorchDispatchMode):
    """Records the operations that make a CUDA device wait for the host, with the line that issued them.

    Boolean-mask indexing (`x[mask]`, and its backward) is one: its output size is known only after a count
    on the device. On a CUDA run only reads of CUDA tensors are counted; on a CPU run every host read is
    listed and the ones a CUDA run would not make are marked (`_HOST_ONLY`).
    """

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device
        self.found: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        why = _SYNC_OPS.get(name)
        if why is None and name in ("aten::index", "aten::index_put", "aten::index_put_"):
            indices = args[1] if len(args) > 1 else []
            if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
                why = "boolean-mask indexing: output size depends on the data"
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if why is not None and not (self.device.type == "cuda" and first is not None and not first.is_cuda):
            self.found[(name, why, *_call_site())] += 1
        return func(*args, **(kwargs or {}))


def _call_site() -> tuple[str, str]:
    """(where in this package, innermost library frame) of the current operation, for the report."""
    frames = [f for f in traceback.extract_stack()[:-3]
              if not any(x in f.filename for x in ("torch/_dynamo", "torch/_compile", "torch/utils/_python_dispatch"))]
    pkg = str(Path(__file__).parents[1])

    def fmt(f) -> str:
        path = str(Path(f.filename).relative_to(REPO)) if f.filename.startswith(str(REPO) + "/electra_ablate") \
            else f.filename.split("site-packages/")[-1]
        return f"{path}:{f.lineno} `{(f.line or '').strip()[:80]}`"

    ours = next((f for f in reversed(frames) if f.filename.startswith(pkg) and "/bench/" not in f.filename), None)
    lib = next((f for f in reversed(frames) if "site-packages" in f.filename), None)
    if ours is None and lib is not None:  # called from the step itself: name the phase
        phase = next((v for k, v in (("torch/autograd", "backward pass"), ("torch/optim", "optimizer step"),
                                     ("torch/nn/utils/clip_grad", "gradient clipping")) if k in lib.filename), "?")
        return phase, fmt(lib)
    site = fmt(ours) if ours is not None else "?"
    return site, (fmt(lib) if lib is not None and frames.index(lib) > (frames.index(ours) if ours else -1) else "")


def on_cuda(site: str, lib: str) -> str:
    for marker, why in _HOST_ONLY.items():
        if marker in site or marker in lib:
            return why
    return "yes"


# --- memory ---------------------------------------------------------------------------------------------


def _status_kib(field_name: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    m = re.search(rf"^{field_name}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else None


def memory_probe(spec: dict) -> dict:
    """Peak memory of training one configuration for a few steps, in this (fresh) process.

    CPU: resident-set high-water mark minus the resident set before the networks were built (so torch's
    own libraries and the memory-mapped data are left out). CUDA: torch.cuda.max_memory_allocated.
    """
    s = settings_from_dict(spec["settings"])
    torch.set_num_threads(s.threads)
    device = s.device
    cfg = compose_config(s, spec["model"], *spec.get("extra", []), batch_size=spec["batch_size"])
    data = load_data(cfg, device, spec["accumulate"] * 2)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with contextlib.suppress(OSError):  # Linux: reset the high-water mark to the current resident set
        Path("/proc/self/clear_refs").write_text("5")
    before_kib = _status_kib("VmRSS")
    fp = FastPath.from_runtime(cfg, device)
    if spec["impl"] == "ours":
        runner = OursRunner(cfg, data, device, fp)
    else:
        runner = TransformersRunner(cfg, data, device, fp.fused_adam)
    k = spec["accumulate"]
    times = []
    for i in range(spec["steps"]):
        sync(device)
        t0 = time.perf_counter()
        runner.step([data.batches[(i * k + j) % len(data.batches)] for j in range(k)])
        sync(device)
        times.append(time.perf_counter() - t0)
    resolved = precision_lib.resolve(cfg.runtime.precision, device.type)
    if device.type == "cuda":
        return {"peak_mib": torch.cuda.max_memory_allocated(device) / 2**20, "kind": "max_memory_allocated",
                "step_s": times[-1], "precision": resolved}
    peak_kib = _status_kib("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_mib": (peak_kib - (before_kib or 0)) / 1024, "kind": "RSS high-water above pre-build RSS",
            "step_s": times[-1], "precision": resolved}


def run_probe(s: Settings, spec: dict) -> dict:
    spec = {**spec, "settings": settings_to_dict(s)}
    proc = subprocess.run(
        [sys.executable, "-m", "electra_ablate.bench", "--probe", json.dumps(spec)],
        capture_output=True, text=True, cwd=str(REPO), env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    for line in proc.stdout.splitlines():
        if line.startswith(PROBE_TAG):
            return json.loads(line[len(PROBE_TAG):])
    raise BenchError(f"memory probe {spec['impl']} {spec['model']} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def settings_to_dict(s: Settings) -> dict:
    d = {k: getattr(s, k) for k in s.__dataclass_fields__}
    d["device"], d["data_dir"], d["cache_dir"] = str(s.device), str(s.data_dir), str(s.cache_dir)
    return d


def settings_from_dict(d: dict) -> Settings:
    d = dict(d)
    d["device"], d["data_dir"], d["cache_dir"] = torch.device(d["device"]), Path(d["data_dir"]), Path(d["cache_dir"])
    for k in ("models", "overrides", "sections", "compile_models", "build_paths"):
        d[k] = tuple(d[k])
    d["precisions"] = tuple(d.get("precisions", (precision_lib.FP32,)))
    return Settings(**d)


# ------------------------------------------------------------------------------------------- sections


@dataclass
class Report:
    settings: Settings
    machine: dict = field(default_factory=dict)
    peaks: dict[str, dict] = field(default_factory=dict)
    pretrain: list[dict] = field(default_factory=list)
    equal: list[dict] = field(default_factory=list)
    pieces: list[dict] = field(default_factory=list)
    compiled: list[dict] = field(default_factory=list)
    bert: list[dict] = field(default_factory=list)
    finetune: list[dict] = field(default_factory=list)
    shapes: list[dict] = field(default_factory=list)
    finetune_padding: list[dict] = field(default_factory=list)
    data: list[dict] = field(default_factory=list)
    memory: list[dict] = field(default_factory=list)
    syncs: list[dict] = field(default_factory=list)
    build: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def section_shapes(s: Settings, rep: Report, model: str) -> None:
    """Our step's tokens/s by batch size and sequence length, each precision interleaved on the same batches."""
    for batch_size, seq_len in SHAPES:
        shaped = replace(s, seq_len=seq_len)
        runners, data = {}, None
        for p in s.precisions:
            cfg = compose_config(shaped, model, f"runtime.precision={p}", batch_size=batch_size)
            data = data or load_data(cfg, s.device, 2)
            runners[p] = OursRunner(cfg, data, s.device, FastPath.from_runtime(cfg, s.device))
        b = data.batches
        timed, _ = interleaved({p: (lambda r: lambda i: r.step([b[i]]))(r) for p, r in runners.items()},
                               len(b), 1, s.piece_reps, s.device)
        mean_tokens = statistics.mean(tokens(x) for x in b)
        for p in runners:
            rep.shapes.append({"model": model, "batch_size": batch_size, "seq_len": seq_len, "precision": p,
                               "step_s": median(timed[p]), "tokens_per_s": mean_tokens / median(timed[p])})
        log(f"shapes {model} {batch_size}x{seq_len}: " + ", ".join(f"{p} {median(v):.3f}s" for p, v in timed.items()))
        del runners


def section_pretrain(s: Settings, rep: Report, model: str) -> None:
    """Ours vs transformers at each precision, all interleaved on the same batches: step time, tokens/s, FLOPs,
    share of the matmul peak measured at the same precision."""
    runners: dict[tuple[str, str], OursRunner | TransformersRunner] = {}
    data = cfg = None
    for p in s.precisions:
        cfg = compose_config(s, model, f"runtime.precision={p}")
        data = data or load_data(cfg, s.device, max(2, min(4, s.warmup + s.reps)))
        fp = FastPath.from_runtime(cfg, s.device)
        runners[("ours", p)] = OursRunner(cfg, data, s.device, fp)
        runners[("transformers", p)] = TransformersRunner(cfg, data, s.device, fp.fused_adam)
    b = data.batches
    n_tok = tokens(b[0])
    rep.peaks[model] = {}
    for p in s.precisions:
        dtype = torch.bfloat16 if p == precision_lib.BF16 else torch.float32
        peaks = matmul_peak(model_shapes(cfg, n_tok, data.dm.vocab_size), s.device, reps=10 if not s.quick else 2,
                            dtype=dtype)
        rep.peaks[model][p] = {"shapes": peaks, "peak": max(peaks.values())}
    timed, _ = interleaved({f"{impl}|{p}": (lambda r: lambda i: r.step([b[i]]))(r) for (impl, p), r in runners.items()},
                           len(b), s.warmup, s.reps, s.device)
    first = s.precisions[0]
    ours0 = runners[("ours", first)]
    flops_paper = paper_flops(ours0, cfg, b[0]["input_ids"].shape[0], b[0]["input_ids"].shape[1])
    # Executed FLOPs do not depend on the precision: counted once per implementation.
    executed = {impl: executed_flops(lambda r=runners[(impl, first)]: r.step([b[0]])) for impl in ("ours", "transformers")}
    mean_tokens = statistics.mean(tokens(x) for x in b)
    for (impl, p), runner in runners.items():
        steps = timed[f"{impl}|{p}"]
        step_s = median(steps)
        peak = rep.peaks[model][p]["peak"]
        rep.pretrain.append({
            "model": model, "impl": runner.label, "key": impl, "precision": p,
            "batch": f"{cfg.data.batch_size} x {s.seq_len}", "step_s": step_s, "steps": steps,
            "tokens_per_s": mean_tokens / step_s, "flops_paper": flops_paper, "flops_executed": executed[impl],
            "achieved_paper": flops_paper / step_s, "share_paper": flops_paper / step_s / peak,
            "achieved_executed": executed[impl] / step_s, "share_executed": executed[impl] / step_s / peak,
        })
    log(f"pretrain {model}: " + ", ".join(f"{k} {median(v):.3f}s" for k, v in timed.items()))


def section_equal(s: Settings, rep: Report, model: str) -> None:
    """Identical weights and corrupted batch, dropout off: both implementations must agree on losses and gradients."""
    cfg = compose_config(s, model)
    data = load_data(cfg, s.device, 1)
    batch = data.batches[0]
    fp = FastPath.from_runtime(cfg, s.device)
    ours = OursRunner(cfg, data, s.device, fp)
    ref = TransformersRunner(cfg, data, s.device, fp.fused_adam)
    ref.load_from(ours)
    ours.system.eval()
    ref.disc.eval()
    ref.gen.eval()
    objective = ours.system.objective
    captured = {}
    corrupt = objective.corrupt

    def capture(b, generator):
        captured["fake"] = fake = corrupt(b, generator)
        return fake

    objective.corrupt = capture
    torch.manual_seed(1234)
    out = objective(Batch(**batch), ours.nets)
    out.loss.backward()
    fake = captured["fake"]
    gen_out, disc_out, ref_loss = ref.losses(batch, fake.masked.input_ids, fake.masked.labels, fake.input_ids, fake.replaced)
    ref_loss.backward()
    pairs = []
    for net, hf_net in ((ours.nets.model, ref.disc), (ours.nets.generator, ref.gen)):
        hf_params = dict(hf_net.named_parameters())
        pairs += [(p.grad, hf_params[n].grad) for n, p in net.named_parameters()
                  if n in hf_params and p.grad is not None and hf_params[n].grad is not None]
    # Difference relative to the tensor's largest gradient, floored at 1e-3 of the largest gradient anywhere:
    # some gradients are exactly zero in exact arithmetic (attention key biases: softmax ignores a constant
    # added to every score of a query) and only rounding noise in both implementations.
    floor = 1e-3 * max(float(b.abs().max()) for _, b in pairs)
    worst = max(float((a - b).abs().max()) / max(float(b.abs().max()), floor) for a, b in pairs)
    compared = len(pairs)
    values = {
        "total": (out.loss.item(), ref_loss.item()),
        "generator MLM": (out.sums["mlm_loss"][0].item(), gen_out.loss.item()),
        "discriminator": (out.sums["disc_loss"][0].item(), disc_out.loss.item()),
    }
    rel = {k: abs(a - b) / max(abs(b), 1e-12) for k, (a, b) in values.items()}
    passed = max(rel.values()) < 1e-4 and worst < 1e-3 and compared > 0
    rep.equal.append({"model": model, "values": values, "rel": rel, "grad_rel": worst, "grads_compared": compared,
                      "passed": passed, "masked": int(fake.masked.selected.sum()), "replaced": int(fake.replaced.sum())})
    log(f"equal work {model}: {'PASS' if passed else 'FAIL'} (loss rel {max(rel.values()):.2e}, grad rel {worst:.2e})")
    if not passed:
        raise BenchError(f"equal-work check failed for {model}: losses {values}, gradient rel diff {worst:.3g}")


# FastPath field -> (description when true / the default value, description of the other value).
PIECES = {
    "masked_only_logits": ("generator MLM logits only at the masked positions", "logits at all B x T positions, then selected"),
    "sampler": ("inverse-CDF sampling: one uniform per masked position", "Gumbel-max: one uniform per vocabulary entry"),
    "hidden_dropout": ("fast hidden-state dropout masks (16-bit lanes)", "torch dropout (`bernoulli_` masks)"),
    "attention_dropout": ("explicit softmax attention with fast dropout masks",
                          "torch SDPA with its own dropout (its math path on CPU)"),
    "fused_adam": ("fused AdamW", "for-loop AdamW"),
}


def _switched(name: str, value):
    return ("gumbel" if value == "inverse_cdf" else "inverse_cdf") if name == "sampler" else not value


def _describe(name: str, value) -> str:
    fast_label, other_label = PIECES[name]
    return fast_label if (value == "inverse_cdf" if name == "sampler" else value) else other_label


def section_pieces(s: Settings, rep: Report, model: str) -> None:
    """Our default step against the same step with one piece switched, interleaved on the same batches."""
    cfg = compose_config(s, model)
    data = load_data(cfg, s.device, 2)
    default = FastPath.from_runtime(cfg, s.device)
    b = data.batches
    base = OursRunner(cfg, data, s.device, default)
    for name in PIECES:
        if s.device.type == "cuda" and name in ("hidden_dropout", "attention_dropout"):
            continue  # on CUDA both settings are torch's own dropout and SDPA kernels
        value = getattr(default, name)
        switched = _switched(name, value)
        other = OursRunner(cfg, data, s.device, replace(default, **{name: switched}))
        timed, _ = interleaved({"default": lambda i: base.step([b[i]]), "switched": lambda i: other.step([b[i]])},
                               len(b), 1, s.piece_reps, s.device)
        rep.pieces.append({"model": model, "piece": name, "default": _describe(name, value),
                           "switched": _describe(name, switched), "default_s": median(timed["default"]),
                           "switched_s": median(timed["switched"])})
        log(f"piece {model} {name}: default {median(timed['default']):.3f}s switched {median(timed['switched']):.3f}s")
        del other


def section_compile(s: Settings, rep: Report, model: str) -> None:
    """Eager vs `torch.compile` (with our fast dropout, and with torch's dropout, which inductor generates itself).

    Dynamo is reset before each variant and inductor writes to an empty cache folder, so the compile time is a
    cold compile (kernels compiled for the first variant may still be reused in memory by the second).
    """
    import torch._dynamo

    cache = tempfile.mkdtemp(prefix="bench_inductor_")
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    try:
        _compile_variants(s, rep, model, torch._dynamo)
    finally:
        if previous is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


def _compile_variants(s: Settings, rep: Report, model: str, dynamo) -> None:
    cfg = compose_config(s, model)
    data = load_data(cfg, s.device, 2)
    full = FastPath.from_runtime(cfg, s.device)
    b = data.batches
    rows = {}
    for label, fp in (("eager", full), ("compiled, fast dropout", replace(full, compile=True)),
                      ("compiled, torch dropout", replace(full, compile=True, hidden_dropout=False, attention_dropout=False))):
        dynamo.reset()
        runner = OursRunner(cfg, data, s.device, fp)
        first = []
        for i in range(len(b)):  # one step per batch shape: the compile (and a recompile for a new T) happens here
            sync(s.device)
            t0 = time.perf_counter()
            runner.step([b[i]])
            sync(s.device)
            first.append(time.perf_counter() - t0)
        timed, _ = interleaved({label: lambda i: runner.step([b[i]])}, len(b), 0, s.piece_reps, s.device)
        step_s = median(timed[label])
        rows[label] = {"model": model, "variant": label, "step_s": step_s,
                       "compile_s": max(0.0, sum(first) - len(first) * step_s) if fp.compile else 0.0}
        log(f"compile {model} {label}: step {step_s:.3f}s, compile {rows[label]['compile_s']:.1f}s")
        del runner
    rep.compiled.extend(rows.values())


def section_bert(s: Settings, rep: Report, model: str) -> None:
    """Step time of ELECTRA with a 1/4-size and a same-size generator, relative to BERT (paper section 3.2)."""
    variants = {
        "bert": ("objective=bert",),
        "electra, generator 1/4": ("objective=electra", "generator.hidden_size=0.25"),
        "electra, generator 1/1": ("objective=electra", "generator.hidden_size=1.0"),
    }
    runners = {}
    data = None
    for label, extra in variants.items():
        cfg = compose_config(s, model, *extra)
        data = data or load_data(cfg, s.device, 2)
        runners[label] = OursRunner(cfg, data, s.device, FastPath.from_runtime(cfg, s.device))
    b = data.batches
    timed, _ = interleaved({k: (lambda r: lambda i: r.step([b[i]]))(r) for k, r in runners.items()},
                           len(b), 1, s.piece_reps, s.device)
    bert = median(timed["bert"])
    for k in variants:
        rep.bert.append({"model": model, "variant": k, "step_s": median(timed[k]), "ratio": median(timed[k]) / bert})
    log(f"bert vs electra {model}: " + ", ".join(f"{k} {median(v):.3f}s" for k, v in timed.items()))


def section_finetune(s: Settings, rep: Report, model: str, task_name: str = "sst2") -> None:
    """Fine-tuning examples/s: FinetuneSystem's forward and loss, backward, clipping, AdamW with layer-wise lrs,
    at each precision, with fast and with torch dropout masks (`runtime.fast_dropout`), all interleaved."""
    from electra_ablate.data.tokenizer import load_tokenizer
    from electra_ablate.glue.features import featurize
    from electra_ablate.glue.readers import read_tsv
    from electra_ablate.glue.tasks import get_task
    from electra_ablate.glue.system import (FinetuneSystem, LengthBucketBatchSampler, OptimSettings, collate,
                                                layerwise_param_groups)

    cfg = compose_config(s, model)
    task = get_task(task_name)
    batch_size = 32 if s.device.type == "cpu" else 128
    n_batches = 2 if s.quick else 4
    examples = read_tsv(task, s.data_dir / "glue", "train")
    if model == s.models[0]:  # padding of one epoch of the training split (no timing): once per run
        subset = examples[: 2000] if s.quick else examples
        lengths = featurize(subset, load_tokenizer(cfg.data.vocab_file, True), 128, task.is_regression).lengths
        shuffled = np.random.default_rng(0).permutation(len(lengths))
        for label, batches_of in (
            ("shuffled, padded to the batch's longest (default)",
             [shuffled[i : i + batch_size] for i in range(0, len(shuffled), batch_size)]),
            ("length buckets (`glue_data.length_buckets=true`)",
             list(LengthBucketBatchSampler(lengths, batch_size, seed=0))),
        ):
            padded = sum(len(ix) * int(lengths[ix].max()) for ix in batches_of)
            rep.finetune_padding.append({"task": task_name.upper(), "batching": label, "examples": len(lengths),
                                         "real_tokens": int(lengths.sum()), "padded_tokens": padded})
    order = np.random.default_rng(0).permutation(len(examples))[: batch_size * n_batches]
    features = featurize([examples[i] for i in order], load_tokenizer(cfg.data.vocab_file, True), 128,
                         task.is_regression)
    batches = []
    for j in range(n_batches):
        items = []
        for i in range(j * batch_size, (j + 1) * batch_size):
            a, e = features.offsets[i], features.offsets[i + 1]
            items.append((features.input_ids[a:e], features.token_type_ids[a:e], features.labels[i], i))
        batches.append({k: v.to(s.device) for k, v in collate(items).items()})
    disc_cfg, _ = encoder_configs(cfg, load_data(cfg, s.device, 1))
    optim = OptimSettings(lr=1e-4, layerwise_lr_decay=0.8, reference_off_by_one=True, betas=(0.9, 0.999), eps=1e-6,
                          weight_decay=0.01, warmup_fraction=0.1)
    steps, meta = {}, {}
    for p, (label, on) in ((p, v) for p in s.precisions for v in (("fast dropout", True), ("torch dropout", False))):
        pcfg = compose_config(s, model, f"runtime.precision={p}")
        system = FinetuneSystem(ElectraModel(disc_cfg), task, optim, {}).to(s.device)
        fast.set_fast_dropout(system, on)
        system.train()
        groups = layerwise_param_groups([(n, p) for n, p in system.named_parameters()], optim.lr,
                                        optim.layerwise_lr_decay, disc_cfg.num_hidden_layers, True, optim.weight_decay)
        opt = torch.optim.AdamW(groups, lr=optim.lr, betas=optim.betas, eps=optim.eps)

        def step(i, system=system, opt=opt, pcfg=pcfg):
            bt = batches[i]
            with autocast(pcfg, s.device):
                loss = system.loss(system(bt["input_ids"], bt["attention_mask"], bt["token_type_ids"]), bt["labels"])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(system.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        steps[f"{p}|{label}"] = step
        meta[f"{p}|{label}"] = (p, label)
    timed, _ = interleaved(steps, len(batches), 1, s.piece_reps, s.device)
    mean_len = statistics.mean(bt["input_ids"].shape[1] for bt in batches)
    for key, (p, label) in meta.items():
        rep.finetune.append({"model": model, "task": task_name.upper(), "precision": p, "variant": label,
                             "batch": batch_size, "padded_len": mean_len, "step_s": median(timed[key]),
                             "examples_per_s": batch_size / median(timed[key])})
    log(f"finetune {model}: " + ", ".join(f"{k} {batch_size / median(v):.1f} ex/s" for k, v in timed.items()))


def section_data(s: Settings, rep: Report, model: str) -> None:
    """The data loader on its own: batches/s and tokens/s after its workers have started."""
    cfg = compose_config(s, model)
    n = 10 if s.quick else 60
    for workers in (0, 2):
        dm = instantiate(cfg.data, cache_dir=cfg.paths.cache_dir, seed=cfg.seed, num_workers=workers,
                         pin_memory=s.device.type == "cuda")
        dm.prepare()
        it: Iterator = iter(dm.train_dataloader())
        next(it)  # worker start-up is paid once per run, not per step
        t0 = time.perf_counter()
        n_tokens = 0
        for _ in range(n):
            bt = next(it)
            if s.device.type == "cuda":
                bt = {k: v.to(s.device, non_blocking=True) for k, v in bt.items()}
            n_tokens += tokens(bt)
        sync(s.device)
        dt = time.perf_counter() - t0
        rep.data.append({"model": model, "workers": workers, "batch": cfg.data.batch_size,
                         "batches_per_s": n / dt, "tokens_per_s": n_tokens / dt})
        del it
    rates = [f"{d['workers']} workers {d['tokens_per_s']:.0f} tok/s" for d in rep.data[-2:]]
    log("data loader: " + ", ".join(rates))


def section_build(s: Settings, rep: Report) -> None:
    """A cold corpus build (data=text_files): word pieces per second, wall clock and per CPU-second."""
    from electra_ablate.data.corpus_build import build_or_load_corpus
    from electra_ablate.data.corpus_files import TextFiles

    if s.build_paths:
        paths = list(s.build_paths)
    else:
        paths = [str(s.data_dir / "corpus" / ("enwiki_sample_5mb.txt" if s.quick else "enwiki_2014_slice.txt.xz"))]
    source = TextFiles(paths)
    cache = tempfile.mkdtemp(prefix="bench_build_")  # cold: hashing, tokenizing and example building all timed
    try:
        load = os.getloadavg()
        cpu0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        built = build_or_load_corpus(source, vocab_file=s.data_dir / "vocab" / "bert-base-uncased-vocab.txt",
                                     cache_dir=cache, max_seq_length=s.seq_len, workers=s.build_workers,
                                     max_docs=s.build_max_docs)
        wall = time.perf_counter() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        # Worker processes are reaped when the build ends, so RUSAGE_CHILDREN holds their CPU time.
        cpu = sum(b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime for a, b in zip(cpu0, cpu1))
        meta = built.meta
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    rep.build.append({
        "corpus": ", ".join(Path(p).name for p in paths)
        + (f" (first {s.build_max_docs} documents)" if s.build_max_docs else ""),
        "mb": source.total_bytes / 2**20 if not s.build_max_docs else float("nan"),
        "workers": meta["build_workers"], "shards": meta["num_shards"], "tokens": meta["num_tokens"],
        "examples": meta["num_examples"], "wall_s": wall, "cpu_s": cpu, "load": load[0],
        "tokens_per_s": meta["num_tokens"] / wall, "tokens_per_cpu_s": meta["num_tokens"] / cpu,
    })
    log(f"corpus build: {meta['num_tokens'] / wall:.0f} word pieces/s with {meta['build_workers']} workers "
        f"({meta['num_tokens'] / cpu:.0f} per CPU-second)")


def section_memory(s: Settings, rep: Report, model: str) -> None:
    """Peak memory of each configuration in a fresh process; gradient accumulation at the paper's batch size."""
    specs = [{"model": model, "impl": impl, "batch_size": s.batch_size, "accumulate": 1, "steps": 2}
             for impl in ("ours", "transformers")]
    if s.accumulate > 1 and model == s.models[-1]:
        # The paper's batch (128 for Small) as one batch and as `accumulate` micro-batches.
        big = s.batch_size * s.accumulate
        specs += [{"model": model, "impl": "ours", "batch_size": big, "accumulate": 1, "steps": 2},
                  {"model": model, "impl": "ours", "batch_size": s.batch_size, "accumulate": s.accumulate, "steps": 2}]
    for spec in specs:
        result = run_probe(s, spec)
        rep.memory.append({**spec, **result, "global_batch": spec["batch_size"] * spec["accumulate"]})
        log(f"memory {model} {spec['impl']} {spec['batch_size']}x{spec['accumulate']}: {result['peak_mib']:.0f} MiB")


def section_sync(s: Settings, rep: Report, model: str) -> None:
    cfg = compose_config(s, model)
    data = load_data(cfg, s.device, 1)
    ours = OursRunner(cfg, data, s.device, FastPath.from_runtime(cfg, s.device))
    ours.step([data.batches[0]])  # optimizer state exists before the recorded step
    finder = SyncFinder(s.device)
    with finder:
        ours.step([data.batches[0]])
    for (op, why, site, lib), n in sorted(finder.found.items(), key=lambda kv: kv[0][2:]):
        rep.syncs.append({"model": model, "op": op, "why": why, "site": site, "lib": lib, "count": n,
                          "cuda": on_cuda(site, lib) if s.device.type == "cpu" else "yes"})
    log(f"sync points {model}: {sum(finder.found.values())}")


# ------------------------------------------------------------------------------------------- report


def machine_info(s: Settings) -> dict:
    import pytorch_lightning
    import transformers

    flags = precision_lib.cpu_flags()
    isa = ", ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags)
    gpu = torch.cuda.get_device_name(s.device) if s.device.type == "cuda" else None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                    text=True, cwd=REPO).stdout.strip())
    except OSError:
        commit, dirty = "?", False
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": precision_lib.cpu_name(), "cpu_bf16": precision_lib.describe_cpu(), "isa": isa,
        "cores": os.cpu_count(), "threads": torch.get_num_threads(), "gpu": gpu,
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "lightning": pytorch_lightning.__version__, "os": platform.platform(),
        "commit": commit + (" (with uncommitted changes)" if dirty else ""),
        "load_start": os.getloadavg(),
    }


def _f(x: float, digits: int = 3) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _si(x: float, unit: str = "") -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix}{unit}"
    return f"{x:.2f} {unit}"


def render(rep: Report) -> str:
    s, m = rep.settings, rep.machine
    dev = "GPU" if s.device.type == "cuda" else "CPU"
    L = [
        "# Benchmarks: pre-training speed against a transformers baseline",
        "",
        "Generated by `python -m electra_ablate.bench`; do not edit by hand. Re-run the command below to "
        "refresh it.",
        "",
        f"- Command: `{s.command}`",
        f"- Date: {m['date']}; git commit {m['commit']}",
        f"- Hardware: {m['cpu']} ({m['cores']} cores; {m['isa']}); torch threads: {m['threads']}; "
        f"GPU: {m['gpu'] or 'none (' + NO_GPU_NOTE + ')'}",
        f"- CPU bf16 support: {m['cpu_bf16']}; `runtime.precision=auto` resolves to "
        f"{precision_lib.resolve('auto', s.device.type)} here (`electra_ablate/common/precision.py`); precisions timed: "
        f"{', '.join(s.precisions)}",
        f"- Software: Python {m['python']}, torch {m['torch']}, transformers {m['transformers']}, "
        f"pytorch-lightning {m['lightning']}; {m['os']}",
        f"- Load average (1/5/15 min) at start: {', '.join(f'{x:.2f}' for x in m['load_start'])}; at end: "
        f"{', '.join(f'{x:.2f}' for x in m['load_end'])} (the machine is shared; A and B are interleaved so their "
        "ratio is robust to load)",
        f"- Timing: {s.warmup} warm-up steps, then {s.reps} timed steps per implementation, interleaved A B A B on "
        f"the same real batches of the Wikipedia sample (`data=wiki_sample`, sequence length {s.seq_len}); medians. "
        f"Piece-by-piece, compile, BERT and fine-tuning rows: 1 warm-up and {s.piece_reps} timed steps each; the "
        f"piece-by-piece, compile, BERT, memory and sync sections run at the runtime default precision "
        f"(`auto`: {precision_lib.resolve('auto', s.device.type)} here).",
        "",
    ]
    if rep.pretrain:
        L += [
            f"## Pre-training step ({dev}): this harness vs transformers",
            "",
            "Objective `electra`, `sharing=embeddings`, generator 1/4 of the discriminator (paper Table 6), at each "
            "precision of `--precisions` (`runtime.precision`; bf16-mixed = Lightning's bf16 autocast, fp32 "
            "weights and optimizer). Ours: the runtime defaults (MLM logits only at masked positions, inverse-CDF "
            "sampling, fast dropout masks on CPU, SDPA). transformers: `ElectraForPreTraining` + "
            "`ElectraForMaskedLM`, SDPA, dropout 0.1, logits and Gumbel noise at all positions. Same optimizer "
            "(AdamW, same parameter groups and fused setting, clipping 1.0). All rows of a config are interleaved "
            "step by step on the same batches; speed-up = the transformers step at the same precision / this row's "
            "step. FLOPs/step (paper) is "
            "`electra_ablate.models.flops.pretrain_flops_per_step` (paper accounting: backward = forward, embeddings as "
            "one-hot matmuls); executed FLOPs are counted by `torch.utils.flop_counter` over one step of that "
            "implementation (matmuls and attention, backward included). Share of peak = achieved FLOP/s divided "
            "by the best matmul rate measured at the model's shapes in this run, in the row's precision (fp32 "
            "matmuls for 32-true, bf16 for bf16-mixed). Peak memory: a fresh process per configuration, at the "
            "runtime default precision (see the memory section).",
            "",
            "| config | implementation | precision | batch | step (s) | tokens/s | speed-up | FLOPs/step (paper) "
            "| achieved (paper) | share of peak (paper) | FLOPs/step (executed) | achieved (executed) "
            "| share of peak (executed) | matmul peak | peak memory (MiB) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        by = {(r["model"], r["key"], r["precision"]): r for r in rep.pretrain}
        mem = {(r["model"], r["impl"], r.get("precision")): r["peak_mib"] for r in rep.memory
               if r["accumulate"] == 1 and r["batch_size"] == s.batch_size}
        for r in rep.pretrain:
            ref = by[(r["model"], "transformers", r["precision"])]
            speedup = ref["step_s"] / r["step_s"]
            L.append(
                f"| {r['model']} | {r['impl']} | {r['precision']} | {r['batch']} | {_f(r['step_s'])} | "
                f"{r['tokens_per_s']:.0f} | {speedup:.2f}x | {_si(r['flops_paper'])} | "
                f"{_si(r['achieved_paper'], 'FLOP/s')} | {100 * r['share_paper']:.0f}% | {_si(r['flops_executed'])} | "
                f"{_si(r['achieved_executed'], 'FLOP/s')} | {100 * r['share_executed']:.0f}% | "
                f"{_si(rep.peaks[r['model']][r['precision']]['peak'], 'FLOP/s')} | "
                f"{_f(mem.get((r['model'], r['key'], r['precision'])), 0)} |"
            )
        L += ["", "Per-step times (s), in order: " + "; ".join(
            f"{r['model']} {r['key']} {r['precision']}: {', '.join(f'{x:.3f}' for x in r['steps'])}"
            for r in rep.pretrain), ""]
        if len(s.precisions) > 1:
            L += [
                "**bf16-mixed against fp32** (same run, same batches, interleaved):",
                "",
                "| config | implementation | " + " | ".join(f"{p} step (s)" for p in s.precisions)
                + " | " + " | ".join(f"{p} / {s.precisions[0]} speed" for p in s.precisions[1:]) + " |",
                "|---|---|" + "---|" * (2 * len(s.precisions) - 1),
            ]
            for model in dict.fromkeys(r["model"] for r in rep.pretrain):
                for key in ("ours", "transformers"):
                    rows = [by[(model, key, p)] for p in s.precisions]
                    L.append(f"| {model} | {rows[0]['impl']} | " + " | ".join(_f(r["step_s"]) for r in rows) + " | "
                             + " | ".join(f"{rows[0]['step_s'] / r['step_s']:.2f}x" for r in rows[1:]) + " |")
            L.append("")
        L += ["**Targets (CPU):**", ""]
        for model, (target, share) in TARGETS.items():
            for p in s.precisions:
                if (model, "ours", p) not in by or dev != "CPU":
                    continue
                ours, ref = by[(model, "ours", p)], by[(model, "transformers", p)]
                speedup = ref["step_s"] / ours["step_s"]
                ok = speedup >= target and (share is None or ours["share_paper"] >= share)
                cond = f">= {target:.1f}x" + (f" at >= {100 * share:.0f}% of the matmul peak" if share else "")
                got = f"{speedup:.2f}x" + (f" at {100 * ours['share_paper']:.0f}% (paper FLOPs; "
                                           f"{100 * ours['share_executed']:.0f}% by executed FLOPs)" if share else "")
                L.append(f"- {model}, {p}: target {cond}: measured {got}: **{'met' if ok else 'MISSED'}**")
        L += ["", "Matmul peak (best of the runs, GFLOP/s) by shape (m x k x n): " + "; ".join(
            f"{model} {p}: " + ", ".join(f"{a}x{b}x{c} {v / 1e9:.0f}" for (a, b, c), v in pk["shapes"].items())
            for model, by_p in rep.peaks.items() for p, pk in by_p.items()), ""]
    L += [
        "## GPU",
        "",
        "| config | implementation | batch | precision | step (s) | tokens/s | speed-up | peak memory (MiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    if dev == "GPU":
        by = {(r["model"], r["key"], r["precision"]): r for r in rep.pretrain}
        for r in rep.pretrain:
            ref = by[(r["model"], "transformers", r["precision"])]
            L.append(f"| {r['model']} | {r['impl']} | {r['batch']} | {r['precision']} | {_f(r['step_s'])} | "
                     f"{r['tokens_per_s']:.0f} | {ref['step_s'] / r['step_s']:.2f}x | |")
    else:
        L += ["| small | this harness | 128 x 128 | bf16-mixed | | | | |",
              "| small | transformers | 128 x 128 | bf16-mixed | | | | |",
              "", f"Not measured: {NO_GPU_NOTE}. The GPU target (ELECTRA-Small >= 1.1M tokens/s in bf16) is "
              "neither met nor missed here; run this command with `--device cuda` on a GPU machine."]
    L.append("")
    if rep.equal:
        L += [
            "## Equal work: same weights, same corrupted batch, same losses and gradients",
            "",
            "Our weights are copied into the transformers models key by key (`hf.to_transformers_state_dict`); "
            "dropout is off (eval mode); both compute their losses on the batch our objective masked and our "
            "generator sampled (so masking and sampling randomness are shared); fp32. Then both backpropagate and "
            "every parameter gradient is compared (largest absolute difference over that tensor's largest "
            "gradient, or 1e-3 of the largest gradient anywhere if that is larger). Pass: losses within 1e-4 relative, "
            "gradients within 1e-3.",
            "",
            "| config | masked | replaced | loss | ours | transformers | relative difference | gradients compared "
            "| worst gradient difference | result |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rep.equal:
            for i, (k, (a, b)) in enumerate(r["values"].items()):
                tail = (f"{r['grads_compared']} | {r['grad_rel']:.1e} | {'pass' if r['passed'] else 'FAIL'} |"
                        if i == 0 else "| | |")
                L.append(f"| {r['model'] if i == 0 else ''} | {r['masked'] if i == 0 else ''} | "
                         f"{r['replaced'] if i == 0 else ''} | {k} | {a:.6f} | {b:.6f} | {r['rel'][k]:.1e} | {tail}")
        L.append("")
    if rep.shapes:
        L += [
            "## Our step by batch size and sequence length",
            "",
            "The same step as the main comparison (runtime defaults) at other shapes; the precisions of a shape are "
            "interleaved on the same batches, the shapes run one after another. tokens/s counts padded tokens.",
            "",
            "| config | batch | sequence | precision | step (s) | tokens/s | vs the shape's first precision |",
            "|---|---|---|---|---|---|---|",
        ]
        first = {}
        for r in rep.shapes:
            k = (r["model"], r["batch_size"], r["seq_len"])
            first.setdefault(k, r["step_s"])
            L.append(f"| {r['model']} | {r['batch_size']} | {r['seq_len']} | {r['precision']} | {_f(r['step_s'])} | "
                     f"{r['tokens_per_s']:.0f} | {first[k] / r['step_s']:.2f}x |")
        L.append("")
    if rep.pieces:
        L += [
            "## The fast path, piece by piece",
            "",
            "Each row: our default step (the runtime defaults of this device) against the same step with that "
            "one piece switched, interleaved on the same batches. switched / default > 1: the default is faster.",
            "",
            "| config | piece | default | switched to | default: s/step | switched: s/step | switched / default |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rep.pieces:
            L.append(f"| {r['model']} | `{r['piece']}` | {r['default']} | {r['switched']} | {_f(r['default_s'])} | "
                     f"{_f(r['switched_s'])} | {r['switched_s'] / r['default_s']:.2f}x |")
        L += ["", "Fast dropout granularity: rates are realised exactly to 1/65536 (16-bit lanes): p = 0.1 drops "
              f"with probability {fast.effective_rate(0.1):.6f}; survivors are scaled by 1/(1 - that).", ""]
    if rep.compiled:
        L += [
            "## torch.compile (`runtime.compile=true`)",
            "",
            "Networks compiled in place (`nn.Module.compile`, state-dict keys unchanged), dynamo reset and an "
            "empty inductor cache folder per run; compile time = the warm-up steps (one per batch) minus as many "
            "compiled steps.",
            "",
            "| config | variant | step (s) | vs eager | compile time (s) |",
            "|---|---|---|---|---|",
        ]
        eager = {r["model"]: r["step_s"] for r in rep.compiled if r["variant"] == "eager"}
        for r in rep.compiled:
            L.append(f"| {r['model']} | {r['variant']} | {_f(r['step_s'])} | {eager[r['model']] / r['step_s']:.2f}x | "
                     f"{_f(r['compile_s'], 1)} |")
        L.append("")
    if rep.bert:
        L += [
            "## BERT vs ELECTRA step time",
            "",
            "Our step, same batches; the paper (section 3.2) notes a same-size generator costs about twice a BERT "
            "step (our generator MLM head runs only on the masked positions).",
            "",
            "| config | objective | step (s) | / BERT |",
            "|---|---|---|---|",
        ]
        for r in rep.bert:
            L.append(f"| {r['model']} | {r['variant']} | {_f(r['step_s'])} | {r['ratio']:.2f}x |")
        L.append("")
    if rep.finetune:
        L += [
            "## Fine-tuning throughput",
            "",
            "`FinetuneSystem` (encoder + [CLS] classifier) forward, loss, backward, clipping and AdamW with "
            "layer-wise learning rates, on shuffled real training batches padded to their longest sequence; every "
            "row of a config interleaved on the same batches. Dropout masks: torch's own (what fine-tuning uses) "
            "or the fast masks and attention that pre-training installs with `runtime.fast_dropout=true`; "
            "/ fastest = this row's step over the config's fastest row.",
            "",
            "| config | task | precision | dropout masks | batch | mean padded length | step (s) | examples/s "
            "| / fastest |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        best = {}
        for r in rep.finetune:
            best[r["model"]] = min(best.get(r["model"], math.inf), r["step_s"])
        for r in rep.finetune:
            L.append(f"| {r['model']} | {r['task']} | {r.get('precision', '')} | {r['variant']} | {r['batch']} | "
                     f"{r['padded_len']:.0f} | {_f(r['step_s'])} | {r['examples_per_s']:.1f} | "
                     f"{r['step_s'] / best[r['model']]:.2f}x |")
        if rep.finetune_padding:
            L += ["", "Padding over one epoch of the training split (counted, not timed); the step's cost grows with "
                  "the padded tokens. Length buckets change which examples share a batch, so they are an option "
                  "(`glue_data.length_buckets`, part of the run identity), not a default.", "",
                  "| task | batching | examples | real tokens | padded tokens | padded / real |",
                  "|---|---|---|---|---|---|"]
            for r in rep.finetune_padding:
                L.append(f"| {r['task']} | {r['batching']} | {r['examples']} | {r['real_tokens']} | "
                         f"{r['padded_tokens']} | {r['padded_tokens'] / r['real_tokens']:.2f}x |")
        L.append("")
    if rep.data:
        need: dict[str, float] = {}  # the fastest of our training steps (any precision): what the loader must feed
        for r in rep.pretrain:
            if r["key"] == "ours":
                need[r["model"]] = max(need.get(r["model"], 0.0), r["tokens_per_s"])
        L += [
            "## Data loader alone",
            "",
            "`PretrainDataModule.train_dataloader()` (memory-mapped token cache, batches collated in the workers"
            + (", pinned memory and non-blocking copies" if dev == "GPU" else "") + "), after worker start-up.",
            "",
            "| config | workers | batch | batches/s | tokens/s | x the training step's tokens/s |",
            "|---|---|---|---|---|---|",
        ]
        for r in rep.data:
            ratio = r["tokens_per_s"] / need[r["model"]] if r["model"] in need else float("nan")
            L.append(f"| {r['model']} | {r['workers']} | {r['batch']} | {r['batches_per_s']:.1f} | "
                     f"{r['tokens_per_s']:.0f} | {_f(ratio, 0)} |")
        L.append("")
    if rep.memory:
        L += [
            "## Peak memory and gradient accumulation",
            "",
            "Each row is a fresh process that builds one configuration and trains it for 2 steps. CPU: the "
            "resident-set high-water mark minus the resident set just before the networks were built (so "
            "torch's libraries and the memory-mapped token cache are not counted); GPU: "
            "`torch.cuda.max_memory_allocated`. Accumulation = `trainer.accumulate_grad_batches`.",
            "",
            "| config | implementation | micro-batch | accumulation | global batch | peak memory (MiB) | step (s) |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rep.memory:
            L.append(f"| {r['model']} | {'this harness' if r['impl'] == 'ours' else 'transformers'} | "
                     f"{r['batch_size']} x {s.seq_len} | {r['accumulate']} | {r['global_batch']} | "
                     f"{r['peak_mib']:.0f} | {_f(r['step_s'])} |")
        L += ["", f"GPU memory at the paper's batch sizes: not measured ({NO_GPU_NOTE})." if dev == "CPU" else "", ""]
    if rep.syncs is not None and "sync" in s.sections:
        L += [
            "## Host-device synchronisation in the training step",
            "",
            "Operations in one training step (forward, backward, clipping, optimizer) that make a CUDA device "
            "wait for the host, found with a `TorchDispatchMode` on this run's device, with the line that issued "
            "them (and the library function they happened in). On CPU they cost nothing.",
            "",
            "| config | operation | why it synchronises | call site | inside | per step | syncs on CUDA |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rep.syncs:
            L.append(f"| {r['model']} | `{r['op']}` | {r['why']} | {r['site']} | {r['lib']} | {r['count']} | "
                     f"{r['cuda']} |")
        if not rep.syncs:
            L.append("| | none found | | | | | |")
        n_sync = sum(r["count"] for r in rep.syncs if r["cuda"] == "yes")
        L += ["", f"Synchronising operations per training step on a CUDA device: {n_sync}.", ""]
    if rep.build:
        L += [
            "## Corpus build",
            "",
            "A cold build of pre-training examples from text files (`data=text_files`, `electra_ablate.corpus`): "
            "content hashes, streaming decompression, tokenization in worker processes (`tokenizers`), the "
            f"reference's example builder (sequence length {s.seq_len}), the cache written. CPU seconds are those "
            "of the main process and its workers; word pieces per CPU-second x cores is the rate on that many "
            "otherwise idle cores.",
            "",
            "| corpus | MiB on disk | workers | shards | word pieces | examples | wall (s) | word pieces/s | "
            "CPU (s) | word pieces per CPU-second | load average at start |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rep.build:
            L.append(f"| {r['corpus']} | {_f(r['mb'], 1)} | {r['workers']} | {r['shards']} | {r['tokens']} | "
                     f"{r['examples']} | {r['wall_s']:.1f} | {r['tokens_per_s']:.0f} | {r['cpu_s']:.1f} | "
                     f"{r['tokens_per_cpu_s']:.0f} | {r['load']:.2f} |")
        L.append("")
    if rep.notes:
        L += ["## Notes", ""] + [f"- {n}" for n in rep.notes] + [""]
    return "\n".join(L)


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


# ------------------------------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None) -> tuple[Settings, Path]:
    p = argparse.ArgumentParser(prog="python -m electra_ablate.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny,small", help="conf/model options, comma-separated (default tiny,small)")
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    p.add_argument("--batch-size", type=int, default=None, help="default 32 on CPU, 128 on GPU")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=5, help="timed steps per implementation in the main comparison")
    p.add_argument("--piece-reps", type=int, default=5, help="timed steps per row in the other sections")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--accumulate", type=int, default=4,
                   help="gradient-accumulation probe: micro-batches of --batch-size per step (default 4: 32 x 4 = "
                        "the paper's ELECTRA-Small batch of 128)")
    p.add_argument("--precisions", default=None,
                   help="runtime.precision values to time side by side in the pre-training and fine-tuning sections "
                        "(default: 32-true,bf16-mixed on a CPU with avx512_bf16 or AMX, 32-true on other CPUs, "
                        "bf16-mixed on CUDA)")
    p.add_argument("--compile-models", default="tiny", help="configs for the torch.compile section (slow to compile)")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    p.add_argument("--data-dir", type=Path, default=None, help="the shared data folder (default: $ELECTRA_ABLATE_DATA "
                                                               "or ../shared/data)")
    p.add_argument("--cache-dir", type=Path, default=REPO / "outputs" / "cache", help="token cache (paths.cache_dir)")
    p.add_argument("--override", action="append", default=[], help="a Hydra override for every config (repeatable)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--quick", action="store_true", help="1 warm-up and 2 timed steps everywhere (tests, smoke runs)")
    p.add_argument("--build-paths", default="", help="comma-separated files, folders or globs for the corpus-build "
                                                     "section (default: the Wikipedia slice; --quick: the sample)")
    p.add_argument("--build-workers", type=int, default=None, help="tokenizer processes in the corpus-build section "
                                                                   "(default: --threads)")
    p.add_argument("--build-max-docs", type=int, default=None, help="stop the corpus build after this many documents")
    p.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.probe is not None:
        return None, a.probe  # type: ignore[return-value]
    device = torch.device("cuda" if a.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if a.device == "auto" else a.device))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BenchError("--device cuda, but torch sees no GPU; use --device cpu")
    sections = tuple(x for x in a.sections.split(",") if x)
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise BenchError(f"unknown --sections {unknown}; valid: {', '.join(SECTIONS)}")
    data_dir = (a.data_dir or default_data_dir()).resolve()
    if not (data_dir / "corpus").is_dir():
        raise BenchError(f"no corpus under {data_dir}; pass --data-dir or set ELECTRA_ABLATE_DATA to the shared data folder")
    models = tuple(x for x in a.models.split(",") if x)
    for m in models:
        if not (CONF_DIR / "model" / f"{m}.yaml").is_file():
            valid = ", ".join(sorted(f.stem for f in (CONF_DIR / "model").glob("*.yaml")))
            raise BenchError(f"unknown --models entry {m!r}; valid: {valid}")
    if a.precisions is None:
        precisions = default_precisions(device.type)
    else:
        requested = [x for x in a.precisions.split(",") if x]
        bad = sorted(set(requested) - set(PRECISIONS))
        precisions = tuple(p for p in PRECISIONS if p in requested)  # fp32 first: the base of the ratios
        if bad or not precisions:
            raise BenchError(f"--precisions {a.precisions!r}: {bad or 'empty'} not benchmarked; give a comma-separated "
                             f"subset of {','.join(PRECISIONS)}")
    quick = a.quick
    command = "python -m electra_ablate.bench " + " ".join(shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))
    s = Settings(
        models=models, device=device, batch_size=a.batch_size or (128 if device.type == "cuda" else 32),
        seq_len=a.seq_len, warmup=1 if quick else a.warmup, reps=2 if quick else a.reps,
        piece_reps=2 if quick else a.piece_reps, threads=a.threads, data_dir=data_dir,
        cache_dir=a.cache_dir.resolve(), overrides=tuple(a.override), sections=sections, quick=quick,
        compile_models=tuple(x for x in a.compile_models.split(",") if x), accumulate=a.accumulate, command=command,
        precisions=precisions,
        build_paths=tuple(x for x in a.build_paths.split(",") if x), build_workers=a.build_workers or a.threads,
        build_max_docs=a.build_max_docs,
    )
    return s, a.out


def run(s: Settings) -> Report:
    torch.set_num_threads(s.threads)
    torch.manual_seed(0)
    rep = Report(s)
    rep.machine = machine_info(s)
    for model in s.models:
        if "equal" in s.sections:
            section_equal(s, rep, model)
        if "pretrain" in s.sections:
            section_pretrain(s, rep, model)
    last = s.models[-1]
    if "shapes" in s.sections:
        section_shapes(s, rep, s.models[0])
    for name, fn in (("pieces", section_pieces), ("bert", section_bert), ("data", section_data), ("sync", section_sync)):
        if name in s.sections:
            fn(s, rep, last)
    if "finetune" in s.sections:
        for model in s.models:
            section_finetune(s, rep, model)
    if "compile" in s.sections:
        for model in s.compile_models:
            section_compile(s, rep, model)
    if "memory" in s.sections:
        for model in s.models:
            section_memory(s, rep, model)
    if "build" in s.sections:
        section_build(s, rep)
    rep.machine["load_end"] = os.getloadavg()
    rep.notes += [
        "The reference masks tokens with this package's `mask_tokens` (the same cost as ours) and computes no "
        "metrics; our step also accumulates its metric sums and AUROC counts on the device, as in training.",
        "Our step runs `PretrainSystem.training_step`, backward, `clip_grad_norm_`, the optimizer and the LR "
        "scheduler, i.e. what Lightning's automatic optimisation runs per step, without the trainer's own "
        "bookkeeping (a few milliseconds).",
        "The equal-work check uses our generator's samples for both implementations; that our inverse-CDF "
        "sampler draws from the same distribution as Gumbel-max is tested in tests/test_objectives.py.",
    ]
    if s.device.type == "cpu":
        rep.notes.append(f"GPU rows are empty: {NO_GPU_NOTE}.")
    return rep


def main(argv: list[str] | None = None) -> Report | None:
    s, out = parse_args(argv)
    if s is None:  # --probe: one memory measurement in this fresh process
        print(PROBE_TAG + json.dumps(memory_probe(json.loads(out))), flush=True)
        return None
    rep = run(s)
    write_atomic(out, render(rep))
    log(f"wrote {out}")
    return rep


if __name__ == "__main__":
    main()
