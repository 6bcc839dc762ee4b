"""Speed-only pieces of the training step (config group `runtime`): cheap dropout masks on CPU and the
attention that uses them, installed on a network by `apply_runtime`. Nothing here changes what is computed.

Why: torch's CPU dropout draws one random number per element through `bernoulli_`, on one thread whatever
`torch.set_num_threads` says (~170M numbers/s on the 2-core development machine when idle, far less under
load), then divides and multiplies in two more passes; in the transformers reference step its masks take
21-31% of the time (torch.profiler). `FastDropout` fills 64 random bits per call of torch's
full-range `random_()` (~1.2G 16-bit lanes/s on the same machine) and cuts them into four 16-bit lanes;
an element is dropped when its lane is below a threshold. Same semantics as `torch.nn.Dropout`: every element is zeroed independently with probability p
and the survivors are scaled by 1 / (1 - p). The rate is exact to 1/65536: the mask drops with probability
round(p * 65536) / 65536 (p = 0.1 becomes 0.100006; tests/test_bench.py checks rate, scaling and
independence). The mask is kept as one byte per element for the backward pass (torch keeps a float).

Attention-probability dropout lives inside `F.scaled_dot_product_attention`; on CPU, SDPA with dropout runs
its unfused math path and draws the mask with `bernoulli_` anyway, so with fast dropout on CPU the same
math is written out (softmax(Q K^T / sqrt(d) + bias), dropout, times V) with the cheap mask. Without dropout
it is written out too (`runtime.cpu_attention=math`), because torch's fused CPU kernel is the slower there
(`_attention`). On CUDA both fall back to torch: its dropout and flash/memory-efficient SDPA kernels draw
their masks in-kernel (Philox).
"""

from __future__ import annotations

import functools
import logging
import math
import time

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn

from electra_ablate.models.encoder import ElectraSelfAttention

log = logging.getLogger(__name__)

LANE_BITS = 16
LANES = 1 << LANE_BITS  # 65536: dropout rates are multiples of 1/65536


def drop_threshold(p: float) -> int:
    """The signed 16-bit threshold below which a uniform lane is dropped: P(lane < t) = round(p * 65536) / 65536."""
    return -(LANES // 2) + round(p * LANES)


def effective_rate(p: float) -> float:
    """The dropout rate the 16-bit lanes realise for a requested rate p (within 1/131072 of p)."""
    return round(p * LANES) / LANES


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """(shape) bool: True = keep, each element independently with probability 1 - round(p * 65536) / 65536."""
    n = math.prod(shape)
    # random_(-2**63, None) fills all 64 bits uniformly (torch's full-range path): 4 independent 16-bit lanes.
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), None)
    lanes = words.view(torch.int16)[:n].view(shape)
    return lanes >= drop_threshold(p)


class _MaskedScale(torch.autograd.Function):
    """y = x * keep / (1 - p); the gradient is masked and scaled the same way. Saves only the byte mask."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None, None


def fast_dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """`F.dropout(x, p, training)` with masks from 16-bit random lanes on CPU; torch's own dropout on CUDA."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0 or x.device.type != "cpu" or torch.compiler.is_compiling():
        # Compiled (runtime.compile): inductor generates torch's dropout with its own random numbers, fused into
        # the neighbouring kernels; the lanes' in-place `random_` would break the graph.
        return F.dropout(x, p, training)
    return _MaskedScale.apply(x, keep_mask(x.shape, p, x.device), 1.0 / (1.0 - effective_rate(p)))


class FastDropout(nn.Dropout):
    """A drop-in `nn.Dropout` (same `p`, no parameters, no state-dict keys) drawing its masks with `fast_dropout`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            raise ValueError("FastDropout does not support inplace=True; use torch.nn.Dropout for in-place dropout")
        return fast_dropout(x, self.p, self.training)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
               dropout_p: float = 0.0, *, fast_masks: bool, written_out: bool) -> torch.Tensor:
    """SDPA's signature and result. On CPU the math is written out (softmax(Q K^T / sqrt(d) + bias), dropout,
    times V) when dropout is on and `fast_masks` (its mask from `fast_dropout`), or when dropout is off and
    `written_out`; otherwise, and always on CUDA, it is torch's `F.scaled_dot_product_attention`.

    Why written out without dropout: torch's fused CPU kernel (flash attention for CPU) is slow in backward at
    the small head sizes of the tiny and Small models; at the cpu_regime shape (4 x 128, 2 heads of 64, sequence
    64, batch 128, one thread, bf16-mixed) torch.profiler put it second only to the matmuls in a BERT step, and
    writing it out makes the step faster (reports/benchmarks_throughput.md, `runtime.cpu_attention`).
    q, k, v: (B, nh, T, hd); attn_mask: additive, broadcastable to (B, nh, T, T).
    """
    on_cpu = q.device.type == "cpu"
    if not on_cpu or not ((dropout_p and fast_masks) or (not dropout_p and written_out)):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (B, nh, T, T)
    if attn_mask is not None:
        scores = scores + attn_mask
    probs = scores.softmax(dim=-1)
    return (fast_dropout(probs, dropout_p) if dropout_p else probs) @ v  # (B, nh, T, hd)


# The attention functions `set_fast_dropout` installs, by (fast masks, written out without dropout).
scaled_dot_product_attention = functools.partial(_attention, fast_masks=True, written_out=True)
fast_masks_fused_without_dropout = functools.partial(_attention, fast_masks=True, written_out=False)
written_out_without_dropout = functools.partial(_attention, fast_masks=False, written_out=True)
CPU_ATTENTION = ("math", "sdpa")  # runtime.cpu_attention: written out without dropout, or torch's fused kernel


def attention_function(fast_masks: bool, cpu_attention: str):
    """The attention an `ElectraSelfAttention` gets for these runtime choices (see `_attention`)."""
    if cpu_attention not in CPU_ATTENTION:
        raise ValueError(f"runtime.cpu_attention={cpu_attention!r} must be one of {', '.join(CPU_ATTENTION)}")
    written_out = cpu_attention == "math"
    return {(True, True): scaled_dot_product_attention, (True, False): fast_masks_fused_without_dropout,
            (False, True): written_out_without_dropout,
            (False, False): F.scaled_dot_product_attention}[(fast_masks, written_out)]


def set_fast_dropout(module: nn.Module, enabled: bool, attention: bool | None = None,
                     cpu_attention: str = "math") -> nn.Module:
    """Switch the dropouts of `module` between torch's and the fast one, in place.

    `enabled` covers the `nn.Dropout` children (hidden dropout); `attention` (default: same as `enabled`)
    the attention-probability dropout of every `ElectraSelfAttention`. Module names, parameters and
    state-dict keys stay as they are; only the class of the dropout children and the attention function change.
    """
    attention = enabled if attention is None else attention
    for parent in module.modules():
        for name, child in list(parent.named_children()):
            if enabled and type(child) is nn.Dropout and not child.inplace:
                setattr(parent, name, FastDropout(child.p).train(child.training))
            elif not enabled and type(child) is FastDropout:
                setattr(parent, name, nn.Dropout(child.p).train(child.training))
        if isinstance(parent, ElectraSelfAttention):
            parent.sdpa = attention_function(bool(attention), cpu_attention)
    return module


# runtime.compile: what torch.compile captures. false: nothing (eager); networks (or true): each network compiled in
# place, forward and backward, one graph per network call; step: the whole loss (masking, the generator, sampling,
# the discriminator, both losses and the metric sums) as one graph with fullgraph=True, on batches of one shape.
COMPILE = ("false", "networks", "step")
# runtime.compile_mode: torch.compile's mode. auto = reduce-overhead for the compiled step on CUDA (the graph
# replayed as CUDA graphs: a few launches per step instead of one per kernel; the step is bound by the host there),
# default elsewhere (compiled networks keep the mode they always had).
COMPILE_MODES = ("auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_scope(runtime) -> str:
    """runtime.compile as one of COMPILE (true means networks, as it always has); ValueError naming the fix."""
    value = runtime.compile
    scope = {False: "false", True: "networks"}.get(value, value) if isinstance(value, bool) else str(value)
    if scope not in COMPILE:
        raise ValueError(f"runtime.compile={value!r} must be one of {', '.join(COMPILE)} (true = networks)")
    return scope


def compile_mode(runtime, device_type: str) -> str:
    """runtime.compile_mode resolved for a device: auto = reduce-overhead for the compiled step on CUDA, else default."""
    mode = str(runtime.get("compile_mode", "auto"))
    if mode not in COMPILE_MODES:
        raise ValueError(f"runtime.compile_mode={mode!r} must be one of {', '.join(COMPILE_MODES)}")
    if mode == "auto":
        return "reduce-overhead" if device_type == "cuda" and compile_scope(runtime) == "step" else "default"
    return mode


def static_shapes(runtime) -> bool:
    """runtime.static_shapes resolved: auto = on when the step is compiled (a new shape would recompile it)."""
    value = runtime.get("static_shapes", "auto")
    if value == "auto":
        return compile_scope(runtime) == "step"
    if not isinstance(value, bool):
        raise ValueError(f"runtime.static_shapes={value!r} must be auto, true or false")
    return value


def apply_runtime(runtime, *modules: nn.Module | None, device_type: str = "cpu") -> None:
    """Install the runtime group's speed-only choices on networks built by `training.build.build_networks`, in place.

    `runtime.fast_dropout`: hidden and attention dropout draw their masks from 16-bit random lanes on CPU
    (module docstring); on CUDA the modules defer to torch, so the setting is harmless there.
    `runtime.cpu_attention`: without dropout, CPU attention written out (math) or torch's fused SDPA (sdpa).
    `runtime.compile=networks` (or true): `nn.Module.compile()` on each network with parameters (in place, so
    parameter names and state-dict keys do not change); the compile happens in the first steps, which
    `CompileTimer` logs. `runtime.compile=step` is the training system's (`PretrainSystem.compile_step`).
    Non-neural generators (no dropout, no parameters) and None pass through unchanged.
    """
    for module in modules:
        if not isinstance(module, nn.Module):
            continue
        set_fast_dropout(module, bool(runtime.fast_dropout), cpu_attention=str(runtime.cpu_attention))
        if compile_scope(runtime) == "networks" and any(True for _ in module.parameters()):
            module.compile(mode=compile_mode(runtime, device_type))


class CompileTimer(pl.Callback):
    """Logs how long `torch.compile` took: the first training steps (where compiling happens) minus as many
    steady steps. Sent as `runtime/compile_s` through the module's `metrics_sink` (MLflow) when it has one."""

    def __init__(self, warm_steps: int = 2):
        self.warm_steps = warm_steps  # compile, then usually one recompile for dynamic sequence lengths
        self.durations: list[float] = []
        self._t0 = 0.0
        self.compile_s: float | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.compile_s is not None:
            return
        self.durations.append(time.perf_counter() - self._t0)
        if len(self.durations) < 2 * self.warm_steps:
            return
        warm, steady = self.durations[: self.warm_steps], self.durations[self.warm_steps :]
        self.compile_s = max(0.0, sum(warm) - self.warm_steps * min(steady))
        log.info("torch.compile: %.1f s of compiling in the first %d steps (steady step %.3f s)",
                 self.compile_s, self.warm_steps, min(steady))
        sink = getattr(pl_module, "metrics_sink", None)
        if sink is not None:
            sink({"runtime/compile_s": self.compile_s}, trainer.global_step)
